#include "cohort/cuda/chunk.hpp"

#include "cohort/cuda/device.hpp"
#include "cohort/cuda/error.hpp"
#include "cohort/spawn_and_join.hpp"

#include "support/cuda_memory.hpp"
#include "support/harness.hpp"

#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

using namespace cohort;

const test::needs_device needs{"CUDA device", [] { return cuda::unavailable_reason(); }};

namespace cuda_chunk_tests {

constexpr std::uint32_t written_here = 0x600dcafe;
constexpr std::uint32_t written_there = 0xfeedbeef;

// In a rank: maps the chunk a ticket names on the device with UUID `id`,
// counts its words that are not `expect`, then sets them all to `reply`.
// Returns the count.
std::uint64_t check_and_reply(int, int kind, std::uint64_t size, int fd, std::vector<std::byte> handle,
                              std::string id, std::uint32_t expect, std::uint32_t reply) {
  const int device = test::device_by_uuid(id);
  cuda::chunk c = test::chunk_from(device, kind, size, fd, handle);
  if (fd >= 0) ::close(fd);  // the mapping holds the memory now
  if (c.size() != size || c.made_here()) throw std::logic_error("the chunk mapped is not the one sent");
  const std::uint64_t wrong = test::words_other_than(c, expect);
  test::fill_words(c, reply);
  return wrong;
}
COHORT_ENTRYPOINT(check_and_reply);

// Runs check_and_reply in a rank of its own (started by spawn: this process
// has initialised CUDA) for the chunk `ticket` names; closes its descriptor.
std::uint64_t check_and_reply_elsewhere(test::chunk_ticket ticket, std::uint32_t expect, std::uint32_t reply) {
  join_options options;
  if (ticket.fd >= 0) options.spawn.keep_fds = {ticket.fd};
  const std::string id = cuda::to_string(cuda::device_uuid(0));
  const auto wrong = spawn_and_join(
      check_and_reply, std::tuple{ticket.kind, ticket.size, ticket.fd, ticket.handle, id, expect, reply}, 1, options);
  if (ticket.fd >= 0) ::close(ticket.fd);
  return wrong.at(0);
}

// Whether device 0 exports memory as descriptors; says so where it does not.
bool exports_descriptors() {
  if (cuda::supports_file_descriptors(0)) return true;
  MESSAGE("device 0 cannot export memory as descriptors");
  return false;
}

}  // namespace cuda_chunk_tests

using namespace cuda_chunk_tests;

TEST_SUITE("cuda chunks") {
  TEST_CASE("a chunk is a positive multiple of its granularity and holds what is written to it") {
    const test::memory_mark mark(0);
    for (auto kind : test::kinds_on(0)) {
      CAPTURE(static_cast<int>(kind));
      const std::size_t step = cuda::granularity(0, kind);
      REQUIRE(step > 0);
      for (std::size_t size : {std::size_t{1}, step, step + 1, 3 * step}) {
        CAPTURE(size);
        auto c = cuda::chunk::create(0, size, kind);
        REQUIRE(c);
        CHECK(c.size() % step == 0);
        CHECK(c.size() >= size);
        CHECK(c.size() < size + step);
        CHECK(c.kind() == kind);
        CHECK(c.made_here());
        CHECK(c.device() == 0);
        test::fill_words(c, written_here);
        CHECK(test::words_other_than(c, written_here) == 0);
      }
    }
    CHECK(mark.given_back());
  }

  TEST_CASE("the device's preferred kind is file_descriptor where it can export descriptors") {
    CHECK(cuda::preferred_sharing(0) ==
          (cuda::supports_file_descriptors(0) ? cuda::sharing::file_descriptor : cuda::sharing::ipc_handle));
    CHECK(cuda::chunk::create(0, 1).kind() == cuda::preferred_sharing(0));
  }

  TEST_CASE("another process maps a chunk made here, reads what was written here, and what it writes is read here") {
    const test::memory_mark mark(0);
    for (auto kind : test::kinds_on(0)) {
      CAPTURE(static_cast<int>(kind));
      auto c = cuda::chunk::create(0, 5 << 20, kind);
      test::fill_words(c, written_here);
      CHECK(check_and_reply_elsewhere(test::ticket_for(c), written_here, written_there) == 0);
      CHECK(test::words_other_than(c, written_there) == 0);
    }
    CHECK(mark.given_back());
  }

  TEST_CASE("a file_descriptor chunk's memory outlives the chunk that made it while a descriptor for it is open") {
    if (!exports_descriptors()) return;
    const test::memory_mark mark(0);
    auto c = cuda::chunk::create(0, 1, cuda::sharing::file_descriptor);
    test::fill_words(c, written_here);
    const test::chunk_ticket ticket = test::ticket_for(c);
    c = cuda::chunk();  // this process's mapping and handle go; the descriptor stays
    CHECK_FALSE(c);
    CHECK(check_and_reply_elsewhere(ticket, written_here, written_there) == 0);
    CHECK(mark.given_back());  // the last descriptor closed: the memory went
  }

  TEST_CASE("a chunk imported twice in one process maps the same memory twice") {
    if (!exports_descriptors()) return;
    const test::memory_mark mark(0);
    {
      auto c = cuda::chunk::create(0, 1, cuda::sharing::file_descriptor);
      test::fill_words(c, written_here);
      const int fd = c.export_fd();
      auto a = cuda::chunk::import(0, fd, c.size());
      auto b = cuda::chunk::import(0, fd, c.size());
      ::close(fd);
      CHECK(a.data() != b.data());
      CHECK_FALSE(a.made_here());
      CHECK(test::words_other_than(a, written_here) == 0);
      test::fill_words(b, written_there);
      CHECK(test::words_other_than(a, written_there) == 0);
      CHECK(test::words_other_than(c, written_there) == 0);
    }
    CHECK(mark.given_back());
  }

  TEST_CASE("asking for more memory than the device has fails, naming the size and the memory free") {
    const test::memory_mark mark(0);
    const auto memory = cuda::device_memory(0);
    for (auto kind : test::kinds_on(0)) {
      CAPTURE(static_cast<int>(kind));
      const std::size_t step = cuda::granularity(0, kind);
      const std::size_t too_much = (memory.total / step + 1) * step;
      try {
        cuda::chunk::create(0, too_much, kind);
        FAIL("no exception");
      } catch (const cuda::error& e) {
        const std::string what = e.what();
        CAPTURE(what);
        if (kind == cuda::sharing::file_descriptor) {
          CHECK(e.call() == "cuMemCreate");
          CHECK(e.name() == "CUDA_ERROR_OUT_OF_MEMORY");
        } else {
          CHECK(e.call() == "cudaMalloc");
          CHECK(e.name() == "cudaErrorMemoryAllocation");
        }
        CHECK(what.starts_with("cohort::cuda::chunk::create: " + std::to_string(too_much) + " bytes ("));
        CHECK(what.find(" on device 0, which has ") != std::string::npos);
        CHECK(what.find(" free of " + std::to_string(memory.total) + " bytes (") != std::string::npos);
      }
      // Not a lasting failure: the next chunk is made.
      CHECK(cuda::chunk::create(0, 1, kind));
    }
    CHECK(mark.given_back());
  }

  TEST_CASE("a size that is no multiple of the granularity, or a negative descriptor, is refused before CUDA is asked") {
    const std::size_t step = cuda::granularity(0, cuda::sharing::file_descriptor);
    CHECK_THROWS_AS(cuda::chunk::import(0, 0, step + 1), std::invalid_argument);
    CHECK_THROWS_AS(cuda::chunk::import(0, 0, 0), std::invalid_argument);
    CHECK_THROWS_AS(cuda::chunk::import(0, -1, step), std::invalid_argument);
    CHECK_THROWS_AS(cuda::chunk::open(0, cuda::ipc_memory_handle{}, 1), std::invalid_argument);
    CHECK_THROWS_AS(cuda::chunk::create(0, 0), std::invalid_argument);
    CHECK_THROWS_AS(cuda::chunk::create(cuda::device_count(), 1), std::invalid_argument);
  }

  TEST_CASE("a chunk gives only the handle of its own kind") {
    if (cuda::supports_file_descriptors(0)) {
      auto c = cuda::chunk::create(0, 1, cuda::sharing::file_descriptor);
      CHECK_THROWS_AS(c.ipc_handle(), std::logic_error);
    }
    auto c = cuda::chunk::create(0, 1, cuda::sharing::ipc_handle);
    CHECK_THROWS_AS(c.export_fd(), std::logic_error);
  }

  TEST_CASE("a moved chunk leaves its source empty, and the memory goes once") {
    const test::memory_mark mark(0);
    for (auto kind : test::kinds_on(0)) {
      auto a = cuda::chunk::create(0, 1, kind);
      void* memory = a.data();
      const std::size_t size = a.size();
      cuda::chunk b(std::move(a));
      CHECK_FALSE(a);
      CHECK(a.data() == nullptr);
      CHECK(b.data() == memory);
      CHECK(b.size() == size);
      cuda::chunk c = cuda::chunk::create(0, 1, kind);
      c = std::move(b);  // c's own memory goes here
      CHECK_FALSE(b);
      CHECK(c.data() == memory);
      test::fill_words(c, written_here);
      CHECK(test::words_other_than(c, written_here) == 0);
    }
    CHECK(mark.given_back());
  }
}

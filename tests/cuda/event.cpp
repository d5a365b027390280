#include "cohort/cuda/event.hpp"

#include "cohort/cuda/chunk.hpp"
#include "cohort/cuda/device.hpp"
#include "cohort/cuda/error.hpp"
#include "cohort/spawn_and_join.hpp"

#include "support/cuda_memory.hpp"
#include "support/harness.hpp"

#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

using namespace cohort;
using namespace std::chrono_literals;

const test::needs_device needs{"CUDA device", [] { return cuda::unavailable_reason(); }};

namespace cuda_event_tests {

constexpr std::uint32_t old_words = 0x01010101;
constexpr unsigned char new_byte = 0x5a;
constexpr std::uint32_t new_words = 0x5a5a5a5a;

// A stream of this process's own, destroyed with the object.
class stream {
 public:
  explicit stream(int device) {
    test::cuda_check(cudaSetDevice(device), "cudaSetDevice");
    test::cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  }
  stream(const stream&) = delete;
  stream& operator=(const stream&) = delete;
  ~stream() { cudaStreamDestroy(stream_); }
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// A host function that holds up its stream until a byte arrives on the
// descriptor it points to (at most 60 s, so that a test that fails does
// not hang).
void CUDART_CB wait_for_byte(void* fd) {
  pollfd p{*static_cast<int*>(fd), POLLIN, 0};
  if (::poll(&p, 1, 60'000) == 1) {
    char byte;
    [[maybe_unused]] auto n = ::read(p.fd, &byte, 1);
  }
}

// In a rank: opens the event and maps the chunk this process was sent.
// Queues on a stream of its own a wait for the event, then a copy of the
// chunk into memory of its own; then says, on `gate`, that the other
// process may go on. Returns "<query before the gate opened> <words of the
// copy that are not new_words> <query at the end>".
std::string wait_then_copy(int, std::vector<std::byte> event_handle, int kind, std::uint64_t size, int fd,
                           std::vector<std::byte> chunk_handle, std::string id, int gate) {
  const int device = test::device_by_uuid(id);
  cuda::ipc_event_handle h;
  std::copy(event_handle.begin(), event_handle.end(), h.bytes.begin());
  cuda::event done = cuda::event::from_ipc_handle(device, h);
  cuda::chunk c = test::chunk_from(device, kind, size, fd, chunk_handle);
  if (fd >= 0) ::close(fd);
  const stream mine(device);
  void* copy = nullptr;
  test::cuda_check(cudaMalloc(&copy, size), "cudaMalloc");
  done.wait(mine.get());
  test::cuda_check(cudaMemcpyAsync(copy, c.data(), size, cudaMemcpyDeviceToDevice, mine.get()), "cudaMemcpyAsync");
  const bool done_before = done.query();  // the other process's stream waits for the gate
  if (::write(gate, "g", 1) != 1) throw std::runtime_error("write to the gate");
  ::close(gate);
  test::cuda_check(cudaStreamSynchronize(mine.get()), "cudaStreamSynchronize");
  const std::uint64_t wrong = test::words_other_than(device, copy, size, new_words);
  cudaFree(copy);
  done.synchronize();
  return std::to_string(done_before) + " " + std::to_string(wrong) + " " + std::to_string(done.query());
}
COHORT_ENTRYPOINT(wait_then_copy);

std::vector<std::byte> bytes_of(const cuda::ipc_event_handle& h) { return {h.bytes.begin(), h.bytes.end()}; }

}  // namespace cuda_event_tests

using namespace cuda_event_tests;

TEST_SUITE("cuda events") {
  TEST_CASE("an event is interprocess, its own device's, and complete before it is recorded") {
    cuda::event e(0);
    REQUIRE(e);
    CHECK(e.device() == 0);
    CHECK_FALSE(e.opened());
    CHECK(e.query());
    e.synchronize();  // returns at once
    // CUDA gives a handle only for an event made interprocess with timing disabled.
    CHECK_NOTHROW(e.ipc_handle());
  }

  TEST_CASE("an event recorded behind held-up work is not complete until the work is, and synchronize waits for it") {
    cuda::event e(0);
    const stream s(0);
    int gate[2];
    REQUIRE(::pipe2(gate, O_CLOEXEC) == 0);
    REQUIRE(cudaLaunchHostFunc(s.get(), wait_for_byte, &gate[0]) == cudaSuccess);
    e.record(s.get());
    CHECK_FALSE(e.query());
    std::atomic<bool> opened{false};
    std::thread opener([&] {
      std::this_thread::sleep_for(200ms);
      opened = true;
      [[maybe_unused]] auto n = ::write(gate[1], "g", 1);
    });
    e.synchronize();
    CHECK(opened);
    CHECK(e.query());
    opener.join();
    ::close(gate[0]);
    ::close(gate[1]);
  }

  TEST_CASE("another process's stream waits for an event recorded here after this process's writes") {
    const test::memory_mark mark(0);
    {
      cuda::event warm(0);  // what the first interprocess event sets up stays
    }
    {
      auto c = cuda::chunk::create(0, 4 << 20);
      test::fill_words(c, old_words);
      cuda::event done(0);
      const stream s(0);
      int gate[2];
      REQUIRE(::pipe2(gate, O_CLOEXEC) == 0);
      // Held up until the other process has queued its wait and its copy:
      // without the wait, its copy would read the old words.
      REQUIRE(cudaLaunchHostFunc(s.get(), wait_for_byte, &gate[0]) == cudaSuccess);
      REQUIRE(cudaMemsetAsync(c.data(), new_byte, c.size(), s.get()) == cudaSuccess);
      done.record(s.get());
      CHECK_FALSE(done.query());

      const test::chunk_ticket ticket = test::ticket_for(c);
      join_options options;
      options.spawn.keep_fds = {gate[1]};
      if (ticket.fd >= 0) options.spawn.keep_fds.push_back(ticket.fd);
      const std::string id = cuda::to_string(cuda::device_uuid(0));
      const auto said = spawn_and_join(wait_then_copy,
                                       std::tuple{bytes_of(done.ipc_handle()), ticket.kind, ticket.size, ticket.fd,
                                                  ticket.handle, id, gate[1]},
                                       1, options);
      if (ticket.fd >= 0) ::close(ticket.fd);
      REQUIRE(said.size() == 1);
      CHECK(said[0] == "0 0 1");
      done.synchronize();
      CHECK(done.query());
      CHECK(test::words_other_than(c, new_words) == 0);
      REQUIRE(cudaStreamSynchronize(s.get()) == cudaSuccess);
      ::close(gate[0]);
      ::close(gate[1]);
    }
    CHECK(mark.given_back());
  }

  TEST_CASE("a moved event leaves its source empty") {
    cuda::event a(0);
    CUevent_st* handle = a.native_handle();
    cuda::event b(std::move(a));
    CHECK_FALSE(a);
    CHECK(b.native_handle() == handle);
    cuda::event c(0);
    c = std::move(b);
    CHECK_FALSE(b);
    CHECK(c.native_handle() == handle);
    CHECK_THROWS_AS(a.record(nullptr), std::logic_error);
  }
}

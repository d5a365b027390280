// What a receiver refuses in a device tensor's record before it asks any
// device: a note that does not describe a block of its chunk, a record
// whose fields no sender writes. Runs on every machine, with
// CUDA_VISIBLE_DEVICES=-1 (tests/cuda/tensor.cpp refuses, on a device,
// records naming a chunk or a device that is not there).
#include "support/cuda_records.hpp"
#include "support/process_probe.hpp"

#include "cohort/cuda/error.hpp"
#include "cohort/cuda/event.hpp"
#include "cohort/queue.hpp"
#include "cohort/spawn_and_join.hpp"
#include "cuda/exchange.hpp"

#include <doctest/doctest.h>

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

using namespace cohort;
using test::made_up_memory;
using test::made_up_record;

namespace record_tests {

const std::array<unsigned char, 16> some_device{0xaa, 0xbb, 0xcc, 0xdd, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};

// Checks that receiving the record made by changing a good one with `change`
// is a decode_error whose text holds `says`.
void check_refused(const std::function<void(made_up_record&)>& change, const std::string& says) {
  auto r = made_up_record::block_of(7, some_device);
  change(r);
  CHECK_THROWS_WITH_AS((void)r.receive(), doctest::Contains(says.c_str()), decode_error);
}

// In a rank: serves a table of event slots as its event table, says its
// pid and port on `where`, and once `done` says so returns how many
// acknowledgements slots 3, 4 and 5 got.
std::vector<std::uint64_t> serve_table(int, queue<std::int64_t> where, queue<int> done) {
  const int fd = ::memfd_create("record-test", MFD_CLOEXEC);
  if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(cuda::detail::table_bytes)) != 0) throw std::runtime_error("memfd");
  void* at = ::mmap(nullptr, cuda::detail::table_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (at == MAP_FAILED) throw std::runtime_error("mmap");
  cuda::detail::serve_event_table(fd);
  ::close(fd);  // the socket's thread holds its own
  where.put(::getpid());
  where.put(cuda::detail::own_port());
  done.get();
  const auto* slots = static_cast<const cuda::detail::slot_counts*>(at);
  return {slots[3].acks.load(), slots[4].acks.load(), slots[5].acks.load()};
}
COHORT_ENTRYPOINT(serve_table);

// How many receipts a note's counter shows.
std::uint64_t receipts(const storage& note) {
  return std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(note.data() + cuda::detail::note_received_at))
      .load();
}

// A rank serving an event table (serve_table), run on a thread of its own.
struct table_server {
  queue<std::int64_t> where{2};
  queue<int> done{1};
  std::future<std::vector<std::vector<std::uint64_t>>> run;
  std::uint32_t pid = 0;
  std::uint32_t port = 0;

  table_server() {
    const auto args = std::tuple{where, done};
    run = std::async(std::launch::async, [args] { return spawn_and_join(serve_table, args, 1); });
    pid = static_cast<std::uint32_t>(*where.get());
    port = static_cast<std::uint32_t>(*where.get());
  }
  // Ends the rank; the acknowledgements of slots 3, 4 and 5.
  std::vector<std::uint64_t> acks() {
    done.put(1);
    return run.get().at(0);
  }
  // A record of chunk `chunk` that this rank sent, with event slot `slot`.
  made_up_record record(std::uint64_t chunk, std::uint32_t slot) const {
    auto r = made_up_record::block_of(chunk, some_device);
    r.sender = pid;
    r.port = port;
    r.slot = slot;
    return r;
  }
};

// A device storage whose handle is `r`'s record over `note`.
storage device_storage_of(const made_up_record& r, const storage& note) {
  return detail::make_device_storage(std::make_shared<made_up_memory>(r, note));
}

// `value` written, and each storage held, as a queue's message is; where
// each storage's handle starts in it.
std::vector<std::byte> message_of(const std::vector<storage>& value, std::vector<std::uint32_t>& handle_at) {
  std::vector<std::byte> record;
  detail::handle_context context{true, {}, {}, {}};
  {
    detail::handle_scope scope(context);
    detail::write(record, value);
  }
  detail::end_handle_record(record, context.handle_at);
  detail::hold_for_message(context);
  handle_at = context.handle_at;
  return record;
}

// Reads `value` back as a receiver reads it from a queue.
std::vector<storage> receive_as_message(const std::vector<storage>& value) {
  std::vector<std::uint32_t> handle_at;
  return detail::read_handle_record<std::vector<storage>>(message_of(value, handle_at), "bytes follow");
}

}  // namespace record_tests

using namespace record_tests;

TEST_SUITE("device tensor records") {
  TEST_CASE("a note that describes no block of its chunk is refused, naming the block and the chunk") {
    const std::string no_block = "not a block of that chunk";
    check_refused([](made_up_record& r) { r.note.magic ^= 1; }, no_block);
    check_refused([](made_up_record& r) { r.note.kind = 2; }, no_block);
    check_refused([](made_up_record& r) { r.note.single = 2; }, no_block);
    check_refused([](made_up_record& r) { r.note.maker = 0; }, no_block);
    check_refused([](made_up_record& r) { r.note.maker = 0x80000000u; }, no_block);
    check_refused([](made_up_record& r) { r.note.chunk_size = 0; }, no_block);
    // A block reaching past the chunk's end, larger than the chunk, or a
    // tensor larger than its block.
    check_refused([](made_up_record& r) { r.note.offset = r.note.chunk_size - 256; }, no_block);
    check_refused([](made_up_record& r) { r.note.offset = ~std::uint64_t{0} - 100; }, no_block);
    check_refused([](made_up_record& r) { r.note.capacity = r.note.chunk_size + 512; }, no_block);
    check_refused([](made_up_record& r) { r.nbytes = 513; }, "a device tensor of 513 bytes at 4096 of chunk 7");
  }

  TEST_CASE("a record whose own fields no sender writes is refused") {
    check_refused([](made_up_record& r) { r.note_bytes = 16; }, "a device tensor's note of 16 bytes");
    check_refused([](made_up_record& r) { r.zero = 1; }, "padding is not zero");
    check_refused([](made_up_record& r) { r.sender = 0; }, "a device tensor from pid 0");
    check_refused([](made_up_record& r) { r.sender = 0x80000000u; }, "a device tensor from pid 2147483648");
  }

  TEST_CASE("a record that holds together goes on to the device, which here says there is none") {
    const auto r = made_up_record::block_of(7, some_device);
    try {
      (void)r.receive();
      FAIL("received without a device");
    } catch (const cuda::no_device& e) {
      CHECK(std::string(e.what()).find("cohort::cuda::find_device") != std::string::npos);
    }
  }

  TEST_CASE("a queue's record refused, and one its value never reached, count as received and acknowledge the sender") {
    table_server server;
    const auto first = server.record(7, 3);
    const auto second = server.record(8, 4);
    const auto first_note = first.note_storage();
    const auto second_note = second.note_storage();
    const std::vector<storage> value{device_storage_of(first, first_note), device_storage_of(second, second_note),
                                     storage::allocate_shared(64)};
    // The first is refused here (no device), and the second never read.
    CHECK_THROWS_AS((void)receive_as_message(value), cuda::no_device);
    CHECK(receipts(first_note) == 1);
    CHECK(receipts(second_note) == 1);
    const auto acks = server.acks();
    CHECK(acks.at(0) == 1);
    CHECK(acks.at(1) == 1);
    CHECK(acks.at(2) == 0);
  }

  TEST_CASE("a queue's record whose note's handle is refused acknowledges the sender") {
    table_server server;
    const auto r = server.record(7, 4);
    const auto note = r.note_storage();
    const std::vector<storage> value{device_storage_of(r, note)};
    std::vector<std::uint32_t> handle_at;
    auto record = message_of(value, handle_at);
    REQUIRE(handle_at.size() == 1);
    // The padding byte of the note's handle (its fourth) is not zero.
    record.at((handle_at[0] & ~detail::device_record_place) + 3) = std::byte{1};
    CHECK_THROWS_WITH_AS((void)detail::read_handle_record<std::vector<storage>>(record, "bytes follow"),
                         doctest::Contains("padding is not zero"), decode_error);
    CHECK(server.acks().at(1) == 1);
  }

  TEST_CASE("a receiver keeps the event tables of, and connections to, live senders only") {
    // Each sender's record is refused here (no device), and acknowledged
    // through its table.
    const auto refuse_from_a_sender = [] {
      table_server server;
      const auto r = server.record(7, 5);
      const auto note = r.note_storage();
      const std::vector<storage> value{device_storage_of(r, note)};
      CHECK_THROWS_AS((void)receive_as_message(value), cuda::no_device);
      CHECK(server.acks().at(2) == 1);
    };
    refuse_from_a_sender();
    const int tables = test::mappings_naming("/memfd:record-test");
    const int sockets = test::descriptors_linking_to("socket:");
    CHECK(tables >= 1);
    // Those of each ended sender go with the next sender's first message.
    for (int i = 0; i < 3; ++i) refuse_from_a_sender();
    CHECK(test::mappings_naming("/memfd:record-test") == tables);
    CHECK(test::descriptors_linking_to("socket:") == sockets);
  }
}

TEST_CASE("an event received by a process with no device at all is refused with no_device") {
  // An event of process 1; its device and handle are never looked at here.
  std::vector<std::byte> bytes(cohort::detail::handle_codec<cuda::event>::handle_size);
  bytes[0] = std::byte{1};
  bytes[1] = std::byte{1};
  cohort::detail::reader in(bytes);
  CHECK_THROWS_AS((void)cohort::detail::handle_codec<cuda::event>::read(in), cuda::no_device);
}

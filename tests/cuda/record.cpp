// What a receiver refuses in a device tensor's record before it asks any
// device: a note that does not describe a block of its chunk, a record
// whose fields no sender writes. Runs on every machine, with
// CUDA_VISIBLE_DEVICES=-1 (tests/cuda/tensor.cpp refuses, on a device,
// records naming a chunk or a device that is not there).
#include "support/cuda_records.hpp"

#include "cohort/cuda/error.hpp"

#include <doctest/doctest.h>

#include <functional>
#include <string>

using namespace cohort;
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
}

#include "cohort/cuda/device.hpp"

#include "cohort/cuda/error.hpp"
#include "cohort/spawn_and_join.hpp"

#include "support/harness.hpp"

#include <doctest/doctest.h>

#include <set>
#include <stdexcept>
#include <string>

using namespace cohort;

const test::needs_device needs{"CUDA device", [] { return cuda::unavailable_reason(); }};

namespace cuda_device_tests {

// In a rank: how many devices it sees, and its index for the device whose
// UUID is `id`: "<count> <index>", index -1 when not found.
std::string find_by_uuid(int, std::string id) {
  const auto wanted = cuda::parse_uuid(id);
  if (!wanted) throw std::invalid_argument("not a UUID: " + id);
  const auto found = cuda::find_device(*wanted);
  return std::to_string(cuda::device_count()) + " " + std::to_string(found.value_or(-1));
}
COHORT_ENTRYPOINT(find_by_uuid);

}  // namespace cuda_device_tests

using namespace cuda_device_tests;

TEST_SUITE("cuda devices") {
  TEST_CASE("with a device, CUDA is available, gives no reason against, and counts it") {
    CHECK(cuda::available());
    CHECK(cuda::unavailable_reason().empty());
    CHECK(cuda::device_count() >= 1);
  }

  TEST_CASE("each device has a UUID of its own, written as nvidia-smi writes it, and is found by it") {
    std::set<std::string> seen;
    for (int device = 0; device < cuda::device_count(); ++device) {
      CAPTURE(device);
      const cuda::uuid id = cuda::device_uuid(device);
      const std::string text = cuda::to_string(id);
      CHECK(text.starts_with("GPU-"));
      CHECK(text.size() == 40);
      CHECK(cuda::parse_uuid(text) == id);
      CHECK(cuda::find_device(id) == device);
      CHECK(seen.insert(text).second);
    }
  }

  TEST_CASE("a UUID no device has is not found") {
    CHECK_FALSE(cuda::find_device(cuda::uuid{}).has_value());
  }

  TEST_CASE("an index with no device is refused, naming it") {
    for (int device : {-1, cuda::device_count()}) {
      CAPTURE(device);
      try {
        cuda::device_uuid(device);
        FAIL("no exception");
      } catch (const std::invalid_argument& e) {
        CHECK(std::string(e.what()).starts_with("cohort::cuda::device_uuid: no CUDA device " + std::to_string(device)));
      }
      CHECK_THROWS_AS(cuda::device_memory(device), std::invalid_argument);
    }
  }

  TEST_CASE("a process that sees only the last device numbers it 0 and finds it by its UUID") {
    const int last = cuda::device_count() - 1;
    const std::string id = cuda::to_string(cuda::device_uuid(last));
    join_options options;
    options.spawn.env.set("CUDA_VISIBLE_DEVICES", id);
    const auto said = spawn_and_join(find_by_uuid, std::tuple{id}, 1, options);
    REQUIRE(said.size() == 1);
    CHECK(said[0] == "1 0");
  }

  TEST_CASE("a device's free memory is no more than its total") {
    for (int device = 0; device < cuda::device_count(); ++device) {
      const auto memory = cuda::device_memory(device);
      CHECK(memory.total > 0);
      CHECK(memory.free <= memory.total);
    }
  }
}

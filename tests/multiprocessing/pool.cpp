#include "cohort/pool.hpp"

#include "support/harness.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <numeric>
#include <stdexcept>

using namespace cohort;

namespace pool_tests {

// As torch's test_multiprocessing fill: each call writes into a shared buffer.
void fill(int, storage buffer) { std::memset(buffer.data(), 7, buffer.nbytes()); }
COHORT_ENTRYPOINT(fill);

long square(int, long x) { return x * x; }
COHORT_ENTRYPOINT(square);

int which_worker(int worker, int) { return worker; }
COHORT_ENTRYPOINT(which_worker);

int fail_on_three(int, int x) {
  if (x == 3) throw std::domain_error("three");
  return x;
}
COHORT_ENTRYPOINT(fail_on_three);

void die_on_three(int, int x) {
  if (x == 3) ::_exit(9);
}
COHORT_ENTRYPOINT(die_on_three);

storage make_storage(int, int value) {
  storage s = storage::allocate_shared(16);
  std::memset(s.data(), value, 16);
  return s;
}
COHORT_ENTRYPOINT(make_storage);

const start_method methods[] = {start_method::spawn, start_method::fork, start_method::forkserver};

TEST_SUITE("pool") {
  TEST_CASE("a pool's workers fill shared buffers in place") {
    for (auto method : methods) {
      CAPTURE(to_string(method));
      pool p(2, {.method = method});
      std::vector<storage> buffers;
      for (int i = 0; i < 10; ++i) {
        buffers.push_back(storage::allocate(100));
        std::memset(buffers.back().data(), 0, 100);
      }
      p.map(fill, buffers);
      for (const auto& b : buffers) {
        CHECK(b.is_shared());
        CHECK(std::all_of(b.data(), b.data() + 100, [](std::byte x) { return x == std::byte{7}; }));
      }
    }
  }

  TEST_CASE("results come back in the items' order, from every worker") {
    pool p(3);
    std::vector<long> items(500);
    std::iota(items.begin(), items.end(), 0);
    const auto squares = p.map(square, items);
    REQUIRE(squares.size() == items.size());
    for (std::size_t i = 0; i < items.size(); ++i) CHECK(squares[i] == items[i] * items[i]);
    const auto workers = p.map(which_worker, std::vector<int>(300, 0));
    for (int w : workers) CHECK((w >= 0 && w < 3));
  }

  TEST_CASE("an exception in one item is thrown by map and the pool goes on") {
    pool p(2);
    try {
      p.map(fail_on_three, std::vector<int>{1, 2, 3, 4});
      FAIL("map returned");
    } catch (const std::runtime_error& e) {
      CHECK(std::string(e.what()).find("item 2") != std::string::npos);
      CHECK(std::string(e.what()).find("std::domain_error: three") != std::string::npos);
    }
    CHECK(p.map(square, std::vector<long>{5}) == std::vector<long>{25});
  }

  TEST_CASE("a worker that dies ends the pool with its exit") {
    pool p(2);
    CHECK_THROWS_AS(p.map(die_on_three, std::vector<int>{1, 2, 3, 4}), process_exited_error);
    CHECK_THROWS_AS(p.map(square, std::vector<long>{5}), std::logic_error);
  }

  TEST_CASE("storages a worker returns stay valid in the parent") {
    pool p(2);
    const auto made = p.map(make_storage, std::vector<int>{1, 2, 3});
    for (int i = 0; i < 3; ++i) CHECK(std::to_integer<int>(made[i].data()[15]) == i + 1);
  }
}

}  // namespace pool_tests

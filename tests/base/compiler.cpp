#include "cohort/compiler.hpp"

#include "support/harness.hpp"

#include <doctest/doctest.h>

#include <asio/awaitable.hpp>

namespace {

// Counts every object made and destroyed.
struct counted {
  static inline int made = 0;
  static inline int destroyed = 0;
  counted() { ++made; }
  counted(const counted&) { ++made; }
  counted(counted&&) noexcept { ++made; }
  counted& operator=(const counted&) = default;
  ~counted() { ++destroyed; }
  static void reset() { made = destroyed = 0; }
};

struct aggregate {
  int value = 0;
  counted tracked{};
};

struct constructed {
  explicit constructed(int v) : value(v) {}
  int value;
  counted tracked{};
};

asio::awaitable<int> value_of(const aggregate& a) { co_return a.value; }
asio::awaitable<int> value_of(const constructed& c) { co_return c.value; }

}  // namespace

TEST_SUITE("compiler") {
  TEST_CASE("COHORT_AWAIT_TEMPORARY_BUG is set exactly where an aggregate temporary in co_await is destroyed twice") {
    counted::reset();
    asio::io_context io;
    // Harmless here: destroying `counted` twice touches no memory it owns.
    int value = cohort::test::run(io, []() -> asio::awaitable<int> {
      co_return co_await value_of(aggregate{.value = 5});
    }());
    CHECK(value == 5);
    CHECK(counted::made == 1);
    CHECK(counted::destroyed - counted::made == COHORT_AWAIT_TEMPORARY_BUG);
  }

  TEST_CASE("a temporary built by a constructor in co_await is destroyed once") {
    counted::reset();
    asio::io_context io;
    int value = cohort::test::run(io, []() -> asio::awaitable<int> {
      co_return co_await value_of(constructed(6));
    }());
    CHECK(value == 6);
    CHECK(counted::made == 1);
    CHECK(counted::destroyed == 1);
  }
}

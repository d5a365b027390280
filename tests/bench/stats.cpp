#include "stats.hpp"

#include <doctest/doctest.h>

#include <vector>

TEST_SUITE("bench stats") {
  using cohort::bench::median;

  TEST_CASE("the median of an even count is the mean of its two middle values") {
    CHECK(median({2.0, 1.0}) == 1.5);
    CHECK(median({4.0, 1.0, 3.0, 2.0}) == 2.5);
    CHECK(median({5.0, 5.0, 1.0, 9.0}) == 5.0);
  }

  TEST_CASE("the median of an odd count is its middle value") {
    CHECK(median({7.0}) == 7.0);
    CHECK(median({3.0, 9.0, 1.0}) == 3.0);
  }

  TEST_CASE("the median of no samples is 0") { CHECK(median({}) == 0.0); }

  TEST_CASE("a spread's median is the rounds' median, its range their least and greatest") {
    const auto s = cohort::bench::spread_of({1.0, 4.0, 2.0, 8.0});
    CHECK(s.median == 3.0);
    CHECK(s.min == 1.0);
    CHECK(s.max == 8.0);
  }

  TEST_CASE("other percentiles stay nearest rank") {
    const std::vector<double> samples{1.0, 2.0, 3.0, 4.0};
    CHECK(cohort::bench::percentile(samples, 50) == 3.0);
    CHECK(cohort::bench::percentile(samples, 0) == 1.0);
    CHECK(cohort::bench::percentile(samples, 100) == 4.0);
  }
}

#include "stats.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <string>
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

  TEST_CASE("in turns, the first goes first in even rounds and the second in odd ones") {
    std::string order;
    for (int round = 0; round < 4; ++round) {
      cohort::bench::in_turns(round, [&] { order += 'a'; }, [&] { order += 'b'; });
    }
    CHECK(order == "abbaabba");
  }

  TEST_CASE("a round's order turns by one every two rounds and is reversed in odd ones") {
    std::string orders;
    for (int round = 0; round < 6; ++round) {
      for (auto i : cohort::bench::round_order(round, 3)) orders += static_cast<char>('a' + i);
      orders += ' ';
    }
    CHECK(orders == "abc cba bca acb cab bac ");
  }

  TEST_CASE("over a round's order's cycle, each goes first twice and follows more than one other") {
    for (std::size_t count = 3; count <= 6; ++count) {
      std::vector<int> first(count);
      std::vector<std::vector<bool>> followed(count, std::vector<bool>(count));
      for (int round = 0; round < 2 * static_cast<int>(count); ++round) {
        const auto order = cohort::bench::round_order(round, count);
        REQUIRE(order.size() == count);
        ++first[order[0]];
        for (std::size_t i = 1; i < count; ++i) followed[order[i]][order[i - 1]] = true;
      }
      for (std::size_t v = 0; v < count; ++v) {
        CAPTURE(count);
        CAPTURE(v);
        CHECK(first[v] == 2);
        CHECK(std::count(followed[v].begin(), followed[v].end(), true) == 2);
      }
    }
  }

  TEST_CASE("a peer's turns are as many as asked, spread evenly over the rounds") {
    const auto taken = [](int turns, int rounds) {
      std::vector<int> out;
      for (int r = 0; r < rounds; ++r) {
        if (cohort::bench::one_of_spread(r, turns, rounds)) out.push_back(r);
      }
      return out;
    };
    CHECK(taken(10, 50) == std::vector<int>{4, 9, 14, 19, 24, 29, 34, 39, 44, 49});
    CHECK(taken(3, 50) == std::vector<int>{16, 33, 49});
    CHECK(taken(5, 5) == std::vector<int>{0, 1, 2, 3, 4});
    CHECK(taken(0, 5).empty());
  }

  TEST_CASE("a comparison is worded by its ratio: faster, or taking as long") {
    using cohort::bench::faster_text;
    CHECK(faster_text({2.3, 1.9, 2.8}, "cohort fork", "torch/cohort") ==
          "cohort fork is 2.3x faster; torch/cohort 1.90-2.80x");
    CHECK(faster_text({0.4, 0.38, 0.52}, "cohort fork", "torch/cohort") ==
          "cohort fork takes 2.5x as long; torch/cohort 0.38-0.52x");
  }
}

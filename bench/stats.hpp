// Helpers shared by the benchmarks: a clock, CPU time, medians, percentiles and spreads, the
// order of contenders' turns, and a line-buffered stdout.
#pragma once

#include <fmt/format.h>

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

namespace cohort::bench {

using clock = std::chrono::steady_clock;

/// Makes stdout line-buffered: each line a benchmark prints is out as it is
/// printed, on a pipe too, and stays out when a later step fails. Called
/// first in main, before anything is printed.
inline void line_buffered_stdout() { std::setvbuf(stdout, nullptr, _IOLBF, 0); }

/// A benchmark's body, run so that what failed is said and what was measured
/// before it stays: stdout line-buffered, an exception printed on stderr as
/// "<name>: <what>" and returned as exit code 1; else what `body` returns.
template <class F>
int run_reporting(const char* name, F&& body) {
  line_buffered_stdout();
  try {
    return body();
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}: {}\n", name, e.what());
    return 1;
  }
}

inline double seconds_since(clock::time_point start) {
  return std::chrono::duration<double>(clock::now() - start).count();
}

/// The CPU seconds, user and system, that `usage` counts.
inline double cpu_seconds(const rusage& usage) {
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1e-6;
}

/// The p-th percentile (0..100) of `samples`, nearest rank.
inline double percentile(std::vector<double> samples, double p) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  auto rank = static_cast<std::size_t>(p / 100.0 * static_cast<double>(samples.size() - 1) + 0.5);
  return samples[std::min(rank, samples.size() - 1)];
}

/// The median of `samples`: the middle value, or of an even count the mean
/// of the two middle values (nearest rank would give the upper one: with
/// two rounds, their maximum).
inline double median(std::vector<double> samples) {
  if (samples.empty()) return 0;
  const std::size_t half = samples.size() / 2;
  std::nth_element(samples.begin(), samples.begin() + static_cast<std::ptrdiff_t>(half), samples.end());
  const double upper = samples[half];
  if (samples.size() % 2 != 0) return upper;
  return (*std::max_element(samples.begin(), samples.begin() + static_cast<std::ptrdiff_t>(half)) + upper) / 2;
}

/// a[i] / b[i]: two contenders' figures as ratios, round by round (as many
/// as the shorter has).
inline std::vector<double> per_round(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> r;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) r.push_back(a[i] / b[i]);
  return r;
}

/// The median of per-round figures and their range.
struct spread {
  double median, min, max;
};

inline spread spread_of(const std::vector<double>& rounds) {
  if (rounds.empty()) return {0, 0, 0};
  const auto [min, max] = std::minmax_element(rounds.begin(), rounds.end());
  return {median(rounds), *min, *max};
}

/// "median unit (spread min-max)" of per-round figures, each number written
/// with `format` (an fmt format such as "{:.2f}").
inline std::string spread_text(const std::vector<double>& rounds, const char* format, const char* unit) {
  const auto s = spread_of(rounds);
  const auto number = [format](double v) { return fmt::format(fmt::runtime(format), v); };
  return fmt::format("{} {} (spread {}-{})", number(s.median), unit, number(s.min), number(s.max));
}

/// How `who` compares with a baseline, from the rounds' ratios of the
/// baseline's time to its own: "cohort fork is 2.3x faster" where the median
/// ratio is 1 or more, "cohort fork takes 2.3x as long" where it is less;
/// then the ratios' range, named `ratio_name` ("torch/cohort 1.9-2.8x").
inline std::string faster_text(const spread& ratio, std::string_view who, std::string_view ratio_name) {
  const std::string verdict = ratio.median >= 1 ? fmt::format("{} is {:.1f}x faster", who, ratio.median)
                                                : fmt::format("{} takes {:.1f}x as long", who, 1 / ratio.median);
  return fmt::format("{}; {} {:.2f}-{:.2f}x", verdict, ratio_name, ratio.min, ratio.max);
}

/// `a` then `b` in even rounds, `b` then `a` in odd ones: neither always
/// goes first, nor always follows what the other leaves behind.
template <class A, class B>
void in_turns(int round, A&& a, B&& b) {
  if (round % 2 == 0) {
    a();
    b();
  } else {
    b();
    a();
  }
}

/// The order in which `count` contenders run in round `round` (from 0), as
/// their indices: 0 to count - 1 turned left by round / 2 places, then in
/// odd rounds reversed. Every 2 * count rounds each goes first twice, and
/// one of three or more follows one neighbour in even rounds and the other
/// in odd ones: none always runs right after the same other one. (Two
/// contenders alternate in pairs of rounds; in_turns alternates each round.)
inline std::vector<std::size_t> round_order(int round, std::size_t count) {
  std::vector<std::size_t> order(count);
  if (count == 0) return order;
  const std::size_t turn = static_cast<std::size_t>(round / 2) % count;
  for (std::size_t i = 0; i < count; ++i) order[i] = (turn + i) % count;
  if (round % 2 != 0) std::reverse(order.begin(), order.end());
  return order;
}

/// Whether round `round` (from 0) is one of `turns` rounds spread evenly
/// over `rounds` (the last of each stretch of rounds / turns): where a peer
/// too slow for every round takes its turns. Every round where turns >= rounds.
inline bool one_of_spread(int round, int turns, int rounds) {
  const auto at = [&](int r) { return static_cast<long long>(r) * turns / rounds; };
  return at(round + 1) != at(round);
}

}  // namespace cohort::bench

// Timing helpers shared by the benchmarks: a clock, medians and percentiles.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <vector>

namespace cohort::bench {

using clock = std::chrono::steady_clock;

inline double seconds_since(clock::time_point start) {
  return std::chrono::duration<double>(clock::now() - start).count();
}

/// The p-th percentile (0..100) of `samples`, nearest rank.
inline double percentile(std::vector<double> samples, double p) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  auto rank = static_cast<std::size_t>(p / 100.0 * static_cast<double>(samples.size() - 1) + 0.5);
  return samples[std::min(rank, samples.size() - 1)];
}

inline double median(std::vector<double> samples) { return percentile(std::move(samples), 50); }

/// The median of per-round figures and their range.
struct spread {
  double median, min, max;
};

inline spread spread_of(const std::vector<double>& rounds) {
  if (rounds.empty()) return {0, 0, 0};
  const auto [min, max] = std::minmax_element(rounds.begin(), rounds.end());
  return {median(rounds), *min, *max};
}

}  // namespace cohort::bench

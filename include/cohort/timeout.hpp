// How a caller's timeout, of any duration type, becomes the one unit a
// blocking call of cohort's counts in.
#pragma once

#include "cohort/export.hpp"

#include <chrono>

COHORT_API_BEGIN

namespace cohort::detail {

/// `d` in `To`'s unit, rounded toward zero, held to To's range. The plain
/// conversion of a coarse duration's max() (seconds::max() to nanoseconds,
/// the usual "no limit") overflows and wraps to a negative count: a wait
/// asked for without end would end at once as timed out.
template <class To, class Rep, class Period>
constexpr To saturating_cast(std::chrono::duration<Rep, Period> d) noexcept {
  using wide = std::chrono::duration<long double, typename To::period>;
  // long double holds every count below 2^64 exactly, so the comparisons
  // below are exact for every integer duration.
  const wide w = std::chrono::duration_cast<wide>(d);
  if (w >= wide(To::max())) return To::max();
  if (w <= wide(To::min())) return To::min();
  return std::chrono::duration_cast<To>(d);
}

}  // namespace cohort::detail

COHORT_API_END

// A deadline on the steady clock that saturates: a timeout too long for the
// clock to add (a caller's duration::max() for "no limit") gives the clock's
// last instant, where the plain sum would wrap into the past, and a
// negative one has passed already, where the sum of a large negative one
// would wrap into the far future.
#pragma once

#include <chrono>

namespace cohort::os {

template <class Rep, class Period>
std::chrono::steady_clock::time_point deadline_after(std::chrono::steady_clock::time_point now,
                                                     std::chrono::duration<Rep, Period> timeout) noexcept {
  using steady = std::chrono::steady_clock;
  if (timeout <= timeout.zero()) return now;
  // The room before the clock's end in the timeout's unit, rounded down: a
  // timeout below it converts to the clock's unit without overflow.
  const auto room = std::chrono::duration_cast<std::chrono::duration<Rep, Period>>(steady::time_point::max() - now);
  if (timeout >= room) return steady::time_point::max();
  return now + std::chrono::duration_cast<steady::duration>(timeout);
}

}  // namespace cohort::os

// How long the waits on one side of a queue spin before they sleep, learnt
// from the waits before.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>

namespace cohort::detail {

/// The spin of one side of a queue in this process. Each wait moves it
/// towards twice the time its value (or room) took to come, when that was
/// within `longest`, whether it spun or slept (a sleeper learns when from
/// the time the waker stamped); a longer one halves it. While the other
/// side answers within a spin (it runs on a CPU of its own) the waits spin
/// and never pay for a sleep; while it answers late (it waits for a CPU,
/// on a machine with more to run than CPUs, or is busy) they spin little
/// and sleep, and leave the CPU to it. A wait whose spin ran out while the
/// other side last went through on this thread's CPU halves it too, however
/// soon the answer came: the spin only held the other side off, and the
/// answer that came just after it would teach that spinning pays.
///
/// Never a sched_yield in its place: on a loaded machine that hands the CPU
/// to any other task for a whole slice, and the scheduler (EEVDF) counts it
/// against the yielder. Any thread may call any member: the budget is one
/// relaxed word, and a lesson lost to a race is one sample among many.
class spin_budget {
 public:
  /// At most about what a futex sleep and wake between processes costs on
  /// a busy machine (2-5 us on a quiet one in bench/machine_limits, 30-90 us
  /// at times on a shared one), so that a spin that runs out costs no more
  /// than the sleep it stands in for.
  static constexpr std::chrono::nanoseconds longest = std::chrono::microseconds(50);
  /// Long enough to catch a peer answering on a CPU of its own.
  static constexpr std::chrono::nanoseconds shortest = std::chrono::microseconds(2);

  /// How long a wait that begins now may spin: from `shortest` to `longest`.
  std::chrono::nanoseconds get() const noexcept {
    return std::chrono::nanoseconds(ns_.load(std::memory_order_relaxed));
  }

  /// A wait that went through within its spin, `waited` after it began
  /// (zero for one that went through at once).
  void spun(std::chrono::nanoseconds waited) noexcept {
    const auto now = ns_.load(std::memory_order_relaxed);
    const auto sample = std::clamp(2 * waited, shortest, longest).count();
    ns_.store(now + (sample - now) / 4, std::memory_order_relaxed);
  }

  /// A wait past its spin, whose value (or room) came `came_after` its
  /// start (negative where the waker's stamp predates it); with
  /// `beside_other_side` when the other side last went through on the CPU
  /// this wait spun on.
  void slept(std::chrono::nanoseconds came_after, bool beside_other_side) noexcept {
    if (!beside_other_side && came_after >= std::chrono::nanoseconds::zero() && came_after <= longest) {
      return spun(came_after);
    }
    ns_.store(std::max(ns_.load(std::memory_order_relaxed) / 2, shortest.count()), std::memory_order_relaxed);
  }

 private:
  std::atomic<std::int64_t> ns_{longest.count()};
};

}  // namespace cohort::detail

// Taking a shared_lock: a short spin, then futex sleeps that check, when
// they run out, whether the holder still lives.
#include "shm/shared_lock.hpp"

#include "os/process_identity.hpp"
#include "os/spin_mutex.hpp"

#include <sched.h>

#include <chrono>
#include <system_error>

namespace cohort::shm {
namespace {

// How long a waiter for a shared_lock sleeps before it looks whether the
// holder is still there.
constexpr std::chrono::milliseconds holder_check{10};

}  // namespace

void shared_lock::lock() noexcept {
  const auto self = static_cast<std::uint32_t>(os::this_process());
  const auto record = record_of(self, os::own_start_time());
  const auto take = [&](std::uint32_t& seen, std::uint32_t value) {
    if (!word.compare_exchange_strong(seen, value, std::memory_order_acq_rel, std::memory_order_relaxed)) return false;
    holder.store(record, std::memory_order_release);
    return true;
  };
  std::uint32_t seen = 0;
  if (take(seen, self)) return;
  // A short spin first: holders keep it for a few stores, and sleeping on
  // the kernel's side costs far more.
  for (int i = 0; i < 100; ++i) {
    os::cpu_relax();
    seen = 0;
    if (word.load(std::memory_order_relaxed) == 0 && take(seen, self)) return;
  }
  for (;;) {
    seen = word.load(std::memory_order_relaxed);
    if (seen == 0) {
      // Taken as one that may have company asleep: its unlock wakes one.
      if (take(seen, self | sleeping)) return;
      continue;
    }
    if ((seen & sleeping) == 0) {
      if (!word.compare_exchange_weak(seen, seen | sleeping, std::memory_order_relaxed)) continue;
      seen |= sleeping;
    }
    std::error_code ec;
    const auto woke = os::futex_wait(word, seen, holder_check, ec);
    if (ec) ::sched_yield();  // not a sleep: at least no busy loop
    if (woke != os::futex_result::timed_out && !ec) continue;
    const auto pid = seen & ~sleeping;
    // The word may have changed hands since it was read, and come back to
    // the same pid (held by it again, or by a process given that pid since)
    // before the take below: the start time counts only when the record
    // names that pid. Otherwise (another holder's record, or none yet) the
    // pid alone decides, which never takes a lock from a live holder.
    const auto recorded = holder.load(std::memory_order_acquire);
    const auto start = (recorded & ((std::uint64_t{1} << pid_bits) - 1)) == pid ? recorded >> pid_bits : 0;
    // Ended: gone, or a zombie not yet reaped (perhaps by this very process).
    const bool ended = os::has_ended(static_cast<pid_t>(pid), start);
    if (ended && take(seen, self | sleeping)) return;
  }
}


}  // namespace cohort::shm

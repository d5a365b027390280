// futex(2) and futex_waitv(2) on shared 32-bit words.
#include "shm/futex.hpp"

#include "config.hpp"
#include "shm/segment.hpp"
#include "shm/spin_mutex.hpp"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace cohort::shm {
namespace {

static_assert(sizeof(std::atomic<std::uint32_t>) == 4 && std::atomic<std::uint32_t>::is_always_lock_free,
              "a futex word is a lock-free 32-bit atomic, the same in every process");

// How long a waiter for a shared_lock sleeps before it looks whether the
// holder is still there.
constexpr std::chrono::milliseconds holder_check{10};

// How long futex_wait_either sleeps on the word alone without futex_waitv.
constexpr std::chrono::milliseconds stop_check{50};

long futex(std::atomic<std::uint32_t>& word, int op, std::uint32_t value, const timespec* timeout) {
  return ::syscall(SYS_futex, &word, op, value, timeout, nullptr, 0);
}

futex_result result_of(long rc, std::error_code& ec) {
  if (rc >= 0) return futex_result::woken;
  switch (errno) {
    case EAGAIN: return futex_result::value_changed;
    case ETIMEDOUT: return futex_result::timed_out;
    case EINTR: return futex_result::interrupted;
    default: ec.assign(errno, std::system_category()); return futex_result::woken;
  }
}

}  // namespace

futex_result futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t expected,
                        std::optional<std::chrono::nanoseconds> timeout, std::error_code& ec) {
  ec.clear();
  timespec ts{};
  if (timeout) {
    const auto ns = std::max(*timeout, std::chrono::nanoseconds::zero());
    ts.tv_sec = static_cast<time_t>(ns / std::chrono::seconds(1));
    ts.tv_nsec = static_cast<long>((ns % std::chrono::seconds(1)).count());
  }
  // FUTEX_WAIT's timeout is relative; FUTEX_WAIT_BITSET's would be absolute.
  return result_of(futex(word, FUTEX_WAIT, expected, timeout ? &ts : nullptr), ec);
}

futex_result futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t expected,
                        std::optional<std::chrono::nanoseconds> timeout) {
  std::error_code ec;
  const futex_result result = futex_wait(word, expected, timeout, ec);
  if (ec) throw std::system_error(ec, "futex wait");
  return result;
}

int futex_wake(std::atomic<std::uint32_t>& word, int count) {
  const long woken = futex(word, FUTEX_WAKE, static_cast<std::uint32_t>(count), nullptr);
  if (woken < 0) throw std::system_error(errno, std::system_category(), "futex wake");
  return static_cast<int>(woken);
}

futex_result futex_wait_either(std::atomic<std::uint32_t>& word, std::uint32_t expected,
                               std::atomic<std::uint32_t>& stop, std::error_code& ec) {
  ec.clear();
  futex_waitv waiters[2] = {
      {expected, reinterpret_cast<std::uintptr_t>(&word), config::futex2_size_u32, 0},
      {0, reinterpret_cast<std::uintptr_t>(&stop), config::futex2_size_u32, 0},
  };
  const long rc = ::syscall(SYS_futex_waitv, waiters, 2, 0, nullptr, CLOCK_MONOTONIC);
  if (rc < 0 && errno == ENOSYS) return futex_wait(word, expected, stop_check, ec);
  return result_of(rc, ec);
}

void shared_lock::lock() noexcept {
  const auto self = static_cast<std::uint32_t>(this_process());
  // Taken: acq_rel, so that a waiter that reads this pid in the word also
  // reads, in holder_start, 0 or this process's start time, never an
  // earlier holder's.
  const auto take = [&](std::uint32_t& seen, std::uint32_t value) {
    if (!word.compare_exchange_strong(seen, value, std::memory_order_acq_rel, std::memory_order_relaxed)) return false;
    holder_start.store(own_start_time(), std::memory_order_release);
    return true;
  };
  std::uint32_t seen = 0;
  if (take(seen, self)) return;
  // A short spin first: holders keep it for a few stores, and sleeping on
  // the kernel's side costs far more.
  for (int i = 0; i < 100; ++i) {
    cpu_relax();
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
    const auto woke = futex_wait(word, seen, holder_check, ec);
    if (ec) ::sched_yield();  // not a sleep: at least no busy loop
    if (woke != futex_result::timed_out && !ec) continue;
    const auto holder = static_cast<pid_t>(seen & ~sleeping);
    const auto start = holder_start.load(std::memory_order_acquire);
    // Ended (gone, or a zombie not yet reaped, perhaps by this very
    // process), or, when killed between its take and its record, gone now.
    const bool ended = has_ended(holder, start);
    if (ended && take(seen, self | sleeping)) return;
  }
}

}  // namespace cohort::shm

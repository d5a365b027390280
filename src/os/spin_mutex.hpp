// A lock between the threads of one process for the few stores that the
// shared-memory bookkeeping makes on every value sent or received.
#pragma once

#include <sched.h>

#include <atomic>
#include <cassert>

#if __has_include(<sys/single_threaded.h>)
#include <sys/single_threaded.h>
#define COHORT_HAVE_SINGLE_THREADED 1
#else
#define COHORT_HAVE_SINGLE_THREADED 0
#endif

namespace cohort::os {

/// Tells the CPU this thread spins on a value another one will change.
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

/// A lock for sections of a few loads and stores that never block, taken
/// several times for each tensor that crosses: its unlock is one plain
/// store where a pthread mutex's is a second atomic read-modify-write, and
/// while libc counts this process single-threaded (`__libc_single_threaded`,
/// as libstdc++'s shared_ptr reads it) its lock is one too: no other thread
/// can hold it then, and none starts inside a section. A waiter spins a
/// little, then yields its CPU, so a holder that lost its CPU gets it back.
/// Never hold it across a system call that may block, nor start a thread
/// inside it. Meets Lockable, for std::lock_guard and std::unique_lock.
class spin_mutex {
 public:
  void lock() noexcept {
#if COHORT_HAVE_SINGLE_THREADED
    if (__libc_single_threaded) {
      // Taken twice by one thread: a hang on the other path.
      assert(!held_.load(std::memory_order_relaxed) && "cohort::os::spin_mutex taken by its holder");
      held_.store(true, std::memory_order_relaxed);
      // Nor may the compiler move the section's accesses above the store,
      // where a signal handler's try_lock would find the lock free.
      std::atomic_signal_fence(std::memory_order_seq_cst);
      return;
    }
#endif
    if (!held_.exchange(true, std::memory_order_acquire)) return;
    contended();
  }
  bool try_lock() noexcept {
    return !held_.load(std::memory_order_relaxed) && !held_.exchange(true, std::memory_order_acquire);
  }
  void unlock() noexcept { held_.store(false, std::memory_order_release); }

 private:
  void contended() noexcept {
    int spins = 0;
    do {
      while (held_.load(std::memory_order_relaxed)) {
        if (spins < 64) {
          cpu_relax();
          ++spins;
        } else {
          ::sched_yield();
        }
      }
    } while (held_.exchange(true, std::memory_order_acquire));
  }

  std::atomic<bool> held_{false};
};

}  // namespace cohort::os

// A lock in shared memory between processes, that survives its holder's
// death.
#pragma once

#include "os/futex.hpp"

#include <atomic>
#include <cstdint>

namespace cohort::shm {


/// A lock in shared memory that processes take, with no kernel call while
/// nobody waits. Its word holds the holder's pid, and `sleeping` while a
/// waiter may sleep on it; `holder_start` the holder's start time, so that a
/// pid the system has handed to another process since is not taken for the
/// holder. A holder killed outright is found out by a waiter whose sleep ran
/// out: the waiter takes the lock over, so what it guards must be left
/// consistent at every store (as a queue's records are written before its
/// tail moves). Cheaper than a robust pthread mutex, which keeps every lock
/// on a list the kernel walks at thread exit.
struct shared_lock {
  std::atomic<std::uint32_t> word{0};
  std::atomic<std::uint64_t> holder_start{0};  ///< 0 between a take and its record
  static constexpr std::uint32_t sleeping = 1u << 31;  // above any pid (pid_max ≤ 2^22)

  void lock() noexcept;
  void unlock() noexcept {
    holder_start.store(0, std::memory_order_relaxed);
    if (word.exchange(0, std::memory_order_release) & sleeping) os::futex_wake(word, 1);
  }
};

}  // namespace cohort::shm

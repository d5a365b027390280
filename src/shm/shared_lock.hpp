// A lock in shared memory between processes, that survives its holder's
// death.
#pragma once

#include "os/futex.hpp"

#include <atomic>
#include <cstdint>

namespace cohort::shm {

/// A lock in shared memory that processes take, with no kernel call while
/// nobody waits. Its word holds the holder's pid, and `sleeping` while a
/// waiter may sleep on it; `holder` records that pid beside the holder's
/// start time, so that a pid the system has handed to another process since
/// is not taken for the holder. A holder killed outright is found out by a
/// waiter whose sleep ran out: the waiter takes the lock over, so what it
/// guards must be left consistent at every store (as a queue's records are
/// written before its tail moves). Cheaper than a robust pthread mutex,
/// which keeps every lock on a list the kernel walks at thread exit.
struct shared_lock {
  std::atomic<std::uint32_t> word{0};
  /// record_of(pid, start time) of the holder; 0 between a take and its
  /// record. The pid in it tells a waiter whether the start time it reads
  /// is the holder's it saw in the word, or another holder's since.
  std::atomic<std::uint64_t> holder{0};
  static constexpr std::uint32_t sleeping = 1u << 31;  // above any pid (pid_max ≤ 2^22)
  static constexpr int pid_bits = 22;

  /// A holder's record: its start time (clock ticks since boot, which take
  /// 42 bits only after a thousand years) above its pid.
  static constexpr std::uint64_t record_of(std::uint32_t pid, std::uint64_t start_time) noexcept {
    return start_time << pid_bits | pid;
  }

  void lock() noexcept;
  void unlock() noexcept {
    holder.store(0, std::memory_order_relaxed);
    if (word.exchange(0, std::memory_order_release) & sleeping) os::futex_wake(word, 1);
  }
};

}  // namespace cohort::shm

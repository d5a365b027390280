// Blocking futex waits and wakes on a 32-bit word that processes share.
//
// The word is a `std::atomic<std::uint32_t>` in a MAP_SHARED mapping (a
// memfd, a /dev/shm file, or an anonymous shared mapping inherited across
// fork). Waits and wakes are shared futexes, never FUTEX_PRIVATE: the kernel
// keys them by the mapping's backing object and offset, so processes that
// map the word at different addresses still meet.
//
// The word must be 4-byte aligned, as `std::atomic<std::uint32_t>` is when
// placed by the compiler but not when cast from an arbitrary byte offset of
// a mapping: the kernel refuses an unaligned futex with EINVAL, and an
// unaligned atomic may straddle two cache lines (or pages), where its loads
// and stores are no longer atomic for the other processes.
//
// A waker stores the new value first (release), then calls futex_wake; a
// waiter reads the word (acquire) after its wait returns. Every outcome but
// `value_changed` may come with the word unchanged (wake-ups can be
// spurious, and a wake need not follow a store): re-check the condition and
// wait again.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <system_error>

namespace cohort::os {

/// How a futex wait ended.
enum class futex_result {
  woken,          ///< a futex_wake, or a spurious wake-up
  value_changed,  ///< the word did not hold `expected` when the wait began (EAGAIN)
  timed_out,      ///< the timeout passed (ETIMEDOUT)
  interrupted,    ///< a signal handler ran on this thread (EINTR)
};

/// Sleeps while `word` holds `expected`, until a futex_wake from any
/// process, a signal handler, or `timeout` (relative, on CLOCK_MONOTONIC;
/// nullopt waits without limit; negative is zero). Other failures (EFAULT:
/// the word is not mapped; EINVAL: it is not 4-byte aligned) throw
/// std::system_error naming "futex wait". Any thread may call it.
futex_result futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t expected,
                        std::optional<std::chrono::nanoseconds> timeout = std::nullopt);
/// As above, reporting the other failures in `ec` (the result is then `woken`
/// and means nothing).
futex_result futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t expected,
                        std::optional<std::chrono::nanoseconds> timeout, std::error_code& ec);

/// Wakes up to `count` waiters on `word` (INT_MAX: all), in any process and
/// on the ring as well; returns how many woke. Throws std::system_error
/// naming "futex wake" for the failures futex_wait throws for.
int futex_wake(std::atomic<std::uint32_t>& word, int count);

/// Whether futex_waitv (Linux 5.16) may be called here: false where the
/// kernel lacks it or a seccomp filter refuses it (ENOSYS, EPERM or EACCES,
/// as container profiles answer calls they do not know). Asked once.
bool futex_waitv_supported();

/// Sleeps while `word` holds `expected` and `stop` holds 0, until either is
/// woken (futex_waitv, Linux 5.16): one thread's wait that another can end
/// by storing to `stop` and waking it, with no wake lost in between. Where
/// futex_waitv is not supported it sleeps on `word` alone for at most 50 ms
/// (then reports `timed_out`), so the caller sees `stop` change that late at
/// worst. Failures as for the `ec` form of futex_wait.
futex_result futex_wait_either(std::atomic<std::uint32_t>& word, std::uint32_t expected,
                               std::atomic<std::uint32_t>& stop, std::error_code& ec);

/// Sleeps while `word` holds `expected` and `other` holds `other_expected`,
/// until either is woken, for at most `timeout` (futex_waitv, Linux 5.16):
/// one wait on two conditions with no wake lost in between. Where
/// futex_waitv is not supported it sleeps on `word` alone for at most 10 ms (then
/// reports `timed_out`), so a change of `other` is seen that late at worst.
/// Failures as for the `ec` form of futex_wait.
futex_result futex_wait_two(std::atomic<std::uint32_t>& word, std::uint32_t expected,
                            std::atomic<std::uint32_t>& other, std::uint32_t other_expected,
                            std::chrono::nanoseconds timeout, std::error_code& ec);

}  // namespace cohort::os

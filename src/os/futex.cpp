// futex(2) and futex_waitv(2) on shared 32-bit words.
#include "os/futex.hpp"

#include "config.hpp"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace cohort::os {
namespace {

static_assert(sizeof(std::atomic<std::uint32_t>) == 4 && std::atomic<std::uint32_t>::is_always_lock_free,
              "a futex word is a lock-free 32-bit atomic, the same in every process");

// How long futex_wait_either sleeps on the word alone without futex_waitv.
constexpr std::chrono::milliseconds stop_check{50};
// How long futex_wait_two does.
constexpr std::chrono::nanoseconds two_check = std::chrono::milliseconds(10);

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

// Whether futex_waitv's failure says the call is not there: ENOSYS from a
// kernel before 5.16, or from a seccomp filter; EPERM or EACCES from a
// filter that answers calls it does not know so (Docker's default profile).
bool refused(int error) { return error == ENOSYS || error == EPERM || error == EACCES; }

// futex_waitv on two words, until `deadline` (CLOCK_MONOTONIC; null: none).
long wait_on_two(std::atomic<std::uint32_t>& word, std::uint32_t expected, std::atomic<std::uint32_t>& other,
                 std::uint32_t other_expected, const timespec* deadline) {
  futex_waitv waiters[2] = {
      {expected, reinterpret_cast<std::uintptr_t>(&word), config::futex2_size_u32, 0},
      {other_expected, reinterpret_cast<std::uintptr_t>(&other), config::futex2_size_u32, 0},
  };
  return ::syscall(SYS_futex_waitv, waiters, 2, 0, deadline, CLOCK_MONOTONIC);
}

}  // namespace

bool futex_waitv_supported() {
  static const bool supported = [] {
    // No words and no deadline: EINVAL where the call may be made.
    return !(::syscall(SYS_futex_waitv, nullptr, 0, 0, nullptr, CLOCK_MONOTONIC) < 0 && refused(errno));
  }();
  return supported;
}

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
  if (!futex_waitv_supported()) return futex_wait(word, expected, stop_check, ec);
  return result_of(wait_on_two(word, expected, stop, 0, nullptr), ec);
}

futex_result futex_wait_two(std::atomic<std::uint32_t>& word, std::uint32_t expected,
                            std::atomic<std::uint32_t>& other, std::uint32_t other_expected,
                            std::chrono::nanoseconds timeout, std::error_code& ec) {
  ec.clear();
  if (!futex_waitv_supported()) return futex_wait(word, expected, std::min(timeout, two_check), ec);
  // futex_waitv's timeout is absolute.
  timespec at{};
  ::clock_gettime(CLOCK_MONOTONIC, &at);
  const auto ns = std::max(timeout, std::chrono::nanoseconds::zero()).count() + at.tv_nsec;
  at.tv_sec += static_cast<time_t>(ns / 1'000'000'000);
  at.tv_nsec = static_cast<long>(ns % 1'000'000'000);
  return result_of(wait_on_two(word, expected, other, other_expected, &at), ec);
}

}  // namespace cohort::os

// clone3(2) with a function to run in the child, which libc does not wrap.
#pragma once

#include <cstdint>

namespace cohort::os {

/// The kernel's struct clone_args as of Linux 5.3 (CLONE_ARGS_SIZE_VER0),
/// the fields cohort uses.
struct clone3_args {
  std::uint64_t flags = 0;
  std::uint64_t pidfd = 0;        ///< with CLONE_PIDFD: where the pidfd goes (an int*)
  std::uint64_t child_tid = 0;
  std::uint64_t parent_tid = 0;
  std::uint64_t exit_signal = 0;
  std::uint64_t stack = 0;        ///< the lowest address of the child's stack
  std::uint64_t stack_size = 0;
  std::uint64_t tls = 0;
};

/// clone3's flag (Linux 5.5) that resets every handled signal to its
/// default in the child, as part of the clone; ignored signals stay ignored.
inline constexpr std::uint64_t clone_clear_sighand = std::uint64_t{1} << 32;

/// Whether clone3_run is wired here (x86-64); elsewhere it returns -ENOSYS.
constexpr bool clone3_run_supported() noexcept {
#if defined(__x86_64__)
  return true;
#else
  return false;
#endif
}

/// clone3(2) with `args`. The child calls `fn(arg)` on the stack `args`
/// names (it must be given one) and ends with _exit of the result; `fn`
/// must never return into anything else, nor unwind. In the parent: the
/// child's pid, or -errno (-ENOSYS where the kernel, a seccomp filter or
/// this build has no clone3; -EINVAL where the kernel lacks a flag).
long clone3_run(clone3_args& args, int (*fn)(void*), void* arg) noexcept;

}  // namespace cohort::os

// System calls that touch no memory of the calling thread but their
// arguments: no errno (thread-local), no lock, no libc state. For code that
// runs in a process sharing this one's memory (a clone with CLONE_VM), or on
// a thread libc does not know of (os/bare_thread.hpp), where a write to the
// errno of the thread that started it would land in that thread's storage
// while it runs, or in storage freed when it ended.
//
// Written out for x86-64 and AArch64 (`raw_syscall_is_private`); elsewhere
// they go through libc's syscall(), whose errno is only safe to write in a
// process with memory of its own.
#pragma once

#include <signal.h>
#include <sys/resource.h>
#include <sys/syscall.h>

#include <cerrno>
#include <cstddef>

#if !defined(__x86_64__) && !defined(__aarch64__)
#include <unistd.h>
#endif

// Code that runs on memory this process shares but with no per-thread
// state of libc's own (a clone sharing the memory, a thread libc does not
// know of): no stack protector, whose canary lives in the storage of the
// thread that started it (which may have ended), and no instrumentation,
// whose runtimes keep state per thread. GCC's attribute syntax, which
// clang also honours (it ignores some of the [[gnu::]] spellings). Only
// named functions: a lambda's attributes do not reach the function its
// conversion to a pointer makes. Arrays in it are to be
// COHORT_UNINITIALIZED: -ftrivial-auto-var-init would call memset.
#define COHORT_BARE_CODE \
  __attribute__((no_stack_protector, no_sanitize("address", "thread", "undefined"), no_instrument_function, \
                 no_profile_instrument_function))
#define COHORT_UNINITIALIZED __attribute__((uninitialized))

namespace cohort::os {

/// Whether raw_syscall leaves the thread's own storage alone on this
/// architecture.
#if defined(__x86_64__) || defined(__aarch64__)
inline constexpr bool raw_syscall_is_private = true;
#else
inline constexpr bool raw_syscall_is_private = false;
#endif

/// System call `number` with up to six arguments: the kernel's result,
/// -errno on failure.
[[gnu::always_inline]] inline long raw_syscall(long number, long a = 0, long b = 0, long c = 0, long d = 0, long e = 0,
                                               long f = 0) noexcept {
#if defined(__x86_64__)
  long result;
  register long r10 asm("r10") = d;
  register long r8 asm("r8") = e;
  register long r9 asm("r9") = f;
  asm volatile("syscall"
               : "=a"(result)
               : "a"(number), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
               : "rcx", "r11", "memory");
  return result;
#elif defined(__aarch64__)
  register long x8 asm("x8") = number;
  register long x0 asm("x0") = a;
  register long x1 asm("x1") = b;
  register long x2 asm("x2") = c;
  register long x3 asm("x3") = d;
  register long x4 asm("x4") = e;
  register long x5 asm("x5") = f;
  asm volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4), "r"(x5) : "memory");
  return x0;
#else
  const long result = ::syscall(number, a, b, c, d, e, f);
  return result == -1 ? -errno : result;
#endif
}

/// Sets this thread's signal mask with rt_sigprocmask itself, which, unlike
/// pthread_sigmask, also blocks glibc's SIGCANCEL and SIGSETXID; returns the
/// mask before.
[[gnu::always_inline]] inline unsigned long long set_signal_mask(unsigned long long mask) noexcept {
  unsigned long long before = 0;
  raw_syscall(SYS_rt_sigprocmask, SIG_SETMASK, reinterpret_cast<long>(&mask), reinterpret_cast<long>(&before), sizeof mask);
  return before;
}

/// Closes every descriptor from 3 up but those in `keep` (increasing;
/// negative ones are none), with close_range and no libc code; where
/// close_range is refused (before Linux 5.9, or by a seccomp filter), one
/// by one below RLIMIT_NOFILE, unless `one_by_one` is false. Returns 0, or
/// the errno of the first call that failed (it goes on past it).
[[gnu::always_inline]] inline int close_all_but(const int* keep, std::size_t count, bool one_by_one = true) noexcept {
  long from = 3;
  long failed = 0;
  long limit = -1;  // RLIMIT_NOFILE, once close_range was refused
  for (std::size_t i = 0; i <= count; ++i) {
    const long next = i < count ? keep[i] : long{~0U} + 1;  // past the last: up to ~0U
    if (next < from) continue;
    if (next > from) {
      long r = limit < 0 ? raw_syscall(SYS_close_range, from, next - 1, 0) : -ENOSYS;
      if (one_by_one && (r == -ENOSYS || r == -EPERM)) {
        if (limit < 0) {
          rlimit files{};
          const bool known = raw_syscall(SYS_prlimit64, 0, RLIMIT_NOFILE, 0, reinterpret_cast<long>(&files)) == 0;
          limit = known && files.rlim_cur < (rlim_t{1} << 20) ? static_cast<long>(files.rlim_cur) : long{1} << 20;
        }
        for (long fd = from; fd < next && fd < limit; ++fd) raw_syscall(SYS_close, fd);
        r = 0;
      }
      if (r != 0 && failed == 0) failed = -r;
    }
    from = next + 1;
  }
  return static_cast<int>(failed);
}

}  // namespace cohort::os

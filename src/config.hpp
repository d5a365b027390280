// Platform switches for the whole tree: kernel feature numbers that Debian's
// headers (glibc 2.36, liburing 2.3) do not carry yet, and the io_uring switch.
// No other file tests kernel or library versions.
#pragma once

#include <linux/io_uring.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

/// Marks the code a forked rank runs between its fork and its exit. fork
/// copies no page-table entries of a program's code: a child faults each
/// page of it in again, 64 KiB around the address at a time. Marked
/// functions are placed together (GCC's .text.hot, which the linker
/// gathers), so a child faults in a few pages of this library, not one for
/// each function it passes through.
#define COHORT_FORKED_CHILD_PATH [[gnu::hot]]

namespace cohort::config {

/// IORING_OP_WAITID (Linux 6.7). liburing 2.3 has no prep helper; fields are
/// filled by hand: fd = id, len = idtype, file_index = options, addr2 = siginfo.
inline constexpr int op_waitid = 50;
/// IORING_OP_FUTEX_WAIT / IORING_OP_FUTEX_WAKE (Linux 6.7, futex2 flags in fd).
inline constexpr int op_futex_wait = 51;
inline constexpr int op_futex_wake = 52;
/// futex2 flag for a 32-bit word (FUTEX2_SIZE_U32 since Linux 6.7, FUTEX_32 in
/// the headers here): the `fd` of a ring futex op, the flags of futex_waitv.
/// cohort never adds FUTEX2_PRIVATE (128): other processes' waits and wakes must meet.
inline constexpr unsigned futex2_size_u32 = 2;

/// waitid's idtype for a pidfd (Linux 5.4).
#ifdef P_PIDFD
inline constexpr int p_pidfd = P_PIDFD;
#else
inline constexpr int p_pidfd = 3;
#endif

/// close_range(2) flag (Linux 5.11): mark instead of close.
inline constexpr unsigned close_range_cloexec = 1U << 2;

/// Environment variable that forces the reactor fallback when set to "0".
inline constexpr const char* io_uring_env = "COHORT_IO_URING";

/// glibc 2.36 declares the pidfd calls without C linkage for C++
/// (<sys/pidfd.h> lacks __BEGIN_DECLS), so they are reached by number.
inline int pidfd_open(pid_t pid) { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)); }
inline int pidfd_send_signal(int pidfd, int signal, unsigned flags = 0) {
  return static_cast<int>(::syscall(SYS_pidfd_send_signal, pidfd, signal, nullptr, flags));
}
/// pidfd_send_signal flag (PIDFD_SIGNAL_PROCESS_GROUP, Linux 6.9): to the
/// process group whose id is the pidfd's process's pid. The group is the
/// one that process led, never a later one given its number. Older
/// kernels refuse the flag with EINVAL.
inline constexpr unsigned pidfd_signal_process_group = 1U << 2;

}  // namespace cohort::config

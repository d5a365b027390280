// A thread of this process that libc does not know of.
#pragma once

#include <cstddef>

namespace cohort::os {

/// Whether start_bare_thread can start one here: where raw_syscall is
/// private (x86-64, AArch64), the only calls such a thread can make.
bool bare_threads_supported() noexcept;

/// Starts `run(arg)` on a new thread of this process, made with clone(2)
/// rather than pthread_create, on a stack of `stack_size` bytes (and a guard
/// page) that stays mapped for the process's life. libc does not count it:
/// `__libc_single_threaded` stays as it was, so malloc, shared_ptr and
/// cohort's own locks keep their single-threaded paths (a plain store where
/// a thread libc knows of makes each an atomic read-modify-write).
///
/// The price is what such a thread may do. It has every signal blocked,
/// and no thread storage of its own (errno, the stack protector's canary
/// and libc's locks are those of the thread that started it): `run` must be
/// COHORT_BARE_CODE, make only raw_syscall calls, allocate nothing, and
/// touch only memory that outlives it. libc's setuid and the like change
/// only the threads libc knows of, so a thread that kept the process's
/// privileges would keep them past any drop: where the process holds any
/// (a root id, ids that differ, a capability), the thread first takes
/// nobody's ids and gives up every capability, for itself alone, and when
/// it cannot, it ends without running `run`. A fork copies only the forking
/// thread, as always; the stack is not copied into the child. When `run`
/// returns the thread ends.
///
/// Returns 0 once the thread runs; else the errno of the mmap or clone that
/// failed, or EPERM when it could not give up the privileges.
int start_bare_thread(void (*run)(void*), void* arg, std::size_t stack_size) noexcept;

}  // namespace cohort::os

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
/// touch only memory that outlives it. libc's setuid, capset and the like
/// change only the threads libc knows of, so such a thread keeps the
/// credentials it starts with: it starts only where the process's user and
/// group ids are each the same (real, effective, saved), and gives up
/// every capability, for itself alone, before `run` (a root process's
/// thread stays uid 0 without capabilities; its ids are not changed, which
/// would make the whole process non-dumpable). Where it cannot give them
/// up it ends without running `run`. A process that drops root by setuid
/// after starting one leaves that thread at uid 0. A fork copies only the
/// forking thread, as always; the stack is not copied into the child. When
/// `run` returns the thread ends.
///
/// Returns 0 once the thread runs; else the errno of the mmap or clone that
/// failed, or EPERM when the ids differ or the capabilities could not be
/// given up.
int start_bare_thread(void (*run)(void*), void* arg, std::size_t stack_size) noexcept;

}  // namespace cohort::os

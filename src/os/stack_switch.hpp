// Running a function on a stack of the caller's choosing, on the calling
// thread.
#pragma once

#include <cstddef>

namespace cohort::os {

/// Calls `fn(arg)` on the calling thread with its stack pointer at the top
/// of [bottom, bottom + size), and returns when it does. The unwinder finds
/// no frame below fn's (as below a thread's start): an exception escaping
/// fn meets no handler, so std::terminate is called at its throw. On
/// x86-64 the switch is a few instructions; elsewhere (and under
/// AddressSanitizer) it is libc's makecontext and swapcontext, and throws
/// std::system_error where they fail.
void run_on_stack(void* bottom, std::size_t size, void (*fn)(void*), void* arg);

}  // namespace cohort::os

// A full fence right after an atomic read-modify-write, where the hardware
// already gives one.
#pragma once

#include <atomic>

namespace cohort::os {

/// Orders every access before the caller's last atomic read-modify-write
/// against every access after this call, as a seq_cst fence would: the
/// store-then-load pairing of a waker and a sleeper. On x86 a locked
/// instruction (every read-modify-write, `xchg` included) is a full fence
/// already, so only the compiler is held back; elsewhere it is a real fence.
/// The caller's read-modify-write must come after every store it orders,
/// and before every load.
inline void fence_after_rmw() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  std::atomic_signal_fence(std::memory_order_seq_cst);
#else
  std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
}

}  // namespace cohort::os

// Sending descriptors over a Unix socket (SCM_RIGHTS).
#pragma once

#include <cstddef>

namespace cohort::os {

/// The most descriptors one message may carry (the kernel's SCM_MAX_FD).
inline constexpr std::size_t max_passed = 253;

/// Sends `size` bytes with `count` (at most max_passed) descriptors on a
/// connected socket, again on EINTR; whether all the bytes were sent.
bool send_with_fds(int socket, const void* data, std::size_t size, const int* fds, std::size_t count) noexcept;

}  // namespace cohort::os

// Sending and receiving descriptors over a Unix socket (SCM_RIGHTS). Inline,
// so that libcohort-cuda, which sees none of libcohort's internal symbols,
// uses the same code.
#pragma once

#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>

namespace cohort::os {

/// The most descriptors one message may carry (the kernel's SCM_MAX_FD).
inline constexpr std::size_t max_passed = 253;

/// Sends `size` bytes with `count` (at most max_passed) descriptors on a
/// connected socket, again on EINTR; whether all the bytes were sent.
inline bool send_with_fds(int socket, const void* data, std::size_t size, const int* fds, std::size_t count) noexcept {
  iovec iov{const_cast<void*>(data), size};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * max_passed)]{};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (count > 0) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * count);
    cmsghdr* cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int) * count);
    std::memcpy(CMSG_DATA(cm), fds, sizeof(int) * count);
  }
  ssize_t n;
  do {
    n = ::sendmsg(socket, &msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  return n == static_cast<ssize_t>(size);
}

/// Receives one message of at most `size` bytes, again on EINTR, with up to
/// `capacity` (at most max_passed) descriptors, close-on-exec, into `fds`;
/// `count` says how many came. Returns its size (0 at EOF, -1 on error).
/// `truncated` is set when the kernel could not pass them all (more were
/// sent than `capacity`, or the receiver's open file limit): those that
/// came are closed then, and count is 0.
inline ssize_t receive_with_fds(int socket, void* data, std::size_t size, int* fds, std::size_t capacity,
                                std::size_t& count, bool& truncated) noexcept {
  iovec iov{data, size};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * max_passed)]{};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = CMSG_SPACE(sizeof(int) * capacity);
  ssize_t n;
  do {
    n = ::recvmsg(socket, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  count = 0;
  truncated = n > 0 && (msg.msg_flags & MSG_CTRUNC) != 0;
  for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm != nullptr; cm = CMSG_NXTHDR(&msg, cm)) {
    if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
    // CMSG_SPACE rounds the room up: one more than `capacity` can come
    // without MSG_CTRUNC. Those are more than were asked for all the same.
    const std::size_t came = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    if (came > capacity) truncated = true;
    if (!truncated) {
      std::memcpy(fds, CMSG_DATA(cm), sizeof(int) * came);
      count = came;
      continue;
    }
    for (std::size_t i = 0; i < came; ++i) {
      int fd = -1;
      std::memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof fd);
      ::close(fd);
    }
  }
  return n;
}

}  // namespace cohort::os

// A write to a blocking pipe or terminal that waits for no reader: for a
// descriptor that cannot be made non-blocking without changing the flags
// that every process sharing it sees (O_NONBLOCK belongs to the open file
// description), and cannot be opened again non-blocking through /proc
// either (a pipe or terminal of another user: EACCES).
#pragma once

#include <limits.h>
#include <poll.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>

namespace cohort::os {

/// Writes to `fd` what it takes without waiting, as write() on a
/// non-blocking descriptor answers: -1 with EAGAIN when poll does not find
/// it writable, else write()'s answer for at most PIPE_BUF bytes of
/// `data`. A pipe that polls writable has a free page and takes PIPE_BUF
/// bytes at once, so the write does not wait, unless another writer fills
/// that page between the poll and the write. A terminal that polls
/// writable is not stopped (^S) and has room; a write longer than its room
/// waits for the rest, which the terminal's reader frees as it shows them.
/// A file, a socket or an error (a reader gone, EPIPE) answers at once.
inline ssize_t write_if_room(int fd, const void* data, std::size_t size) noexcept {
  pollfd p{fd, POLLOUT, 0};
  const int ready = ::poll(&p, 1, 0);
  if (ready < 0) return -1;  // EINTR, or out of memory: errno says which
  if (ready == 0) {
    errno = EAGAIN;
    return -1;
  }
  return ::write(fd, data, std::min<std::size_t>(size, PIPE_BUF));
}

}  // namespace cohort::os

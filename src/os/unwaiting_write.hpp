// Writes to a descriptor that never wait on its reader, without changing
// the flags that every process sharing it sees (O_NONBLOCK belongs to the
// open file description): a console that its reader stopped reading (a
// paused terminal, `| less`) must not stop the writer.
#pragma once

#include "os/owned_fd.hpp"

#include <limits.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>

namespace cohort::os {

/// Writes to `fd` what it takes without waiting, as write() on a
/// non-blocking descriptor answers: -1 with EAGAIN when poll does not find
/// it writable, else write()'s answer for at most PIPE_BUF bytes of
/// `data`. For a blocking pipe or terminal that cannot be opened again
/// non-blocking (another user's: EACCES). A pipe that polls writable has a
/// free page and takes PIPE_BUF bytes at once, so the write does not wait,
/// unless another writer fills that page between the poll and the write. A
/// terminal that polls writable is not stopped (^S) and has room; a write
/// longer than its room waits for the rest, which the terminal's reader
/// frees as it shows them. A file, a socket or an error (a reader gone,
/// EPIPE) answers at once.
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

/// How a descriptor is written so that no write waits on its reader.
enum class write_way {
  plain,    // write(): non-blocking already, or a file (its writes wait on the disk, never on a reader)
  send,     // a socket: send() with MSG_DONTWAIT | MSG_NOSIGNAL
  if_room,  // a pipe or terminal that could not be opened again: write_if_room
};

/// A descriptor made ready for writes that do not wait: `way`, and the
/// descriptor opened again where that is how (else `reopened` is empty).
struct unwaiting_output {
  write_way way = write_way::plain;
  owned_fd reopened;
};

/// Makes `fd`, whose fstat is `st`, ready for writes that do not wait. A
/// pipe or terminal is opened again through /proc/self/fd with O_NONBLOCK
/// (its own flags, so the caller's descriptor stays as it is), and written
/// plainly through that; where it cannot be, or what opens is not the same
/// file (a name in /proc that now leads elsewhere), it is written
/// `if_room`. A socket is written with `send`.
unwaiting_output make_unwaiting(int fd, const struct stat& st) noexcept;

/// Writes to `fd` the way `way` says, answering as write() on a
/// non-blocking descriptor does (-1 with EAGAIN where it would wait).
inline ssize_t write_unwaiting(int fd, write_way way, const void* data, std::size_t size) noexcept {
  switch (way) {
    case write_way::send:
      return ::send(fd, data, size, MSG_DONTWAIT | MSG_NOSIGNAL);
    case write_way::if_room:
      return write_if_room(fd, data, size);
    case write_way::plain:
      break;
  }
  return ::write(fd, data, size);
}

}  // namespace cohort::os

// Opening a path that may name a FIFO without waiting for its other end.
#pragma once

#include <fcntl.h>
#include <sys/types.h>

#include <cerrno>

namespace cohort::os {

/// open(path, flags, mode) that never waits for a FIFO's other end: opened
/// with O_NONBLOCK, a FIFO for writing that no process reads fails (ENXIO)
/// and one for reading opens at once. A file under another process's
/// lease (a file server's), which a non-blocking open refuses
/// (EWOULDBLOCK), is opened again as a plain open would: waiting until the
/// lease is given up. The descriptor comes back blocking unless `flags`
/// asked for O_NONBLOCK, as its reader or writer expects.
inline int open_without_waiting(const char* path, int flags, mode_t mode) noexcept {
  const int fd = ::open(path, flags | O_NONBLOCK, mode);
  if (fd < 0) return errno == EWOULDBLOCK ? ::open(path, flags, mode) : fd;
  if ((flags & O_NONBLOCK) == 0) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

}  // namespace cohort::os

// One read(2) from a descriptor: IORING_OP_READ, or readiness on asio's
// reactor followed by a non-blocking read.
#pragma once

#include "uring/async.hpp"

#include <asio/buffer.hpp>

#include <poll.h>
#include <sys/stat.h>
#include <sys/uio.h>

namespace cohort::uring {

/// The ring part. Completion: res is the byte count (0 at end of file), or
/// -errno; -ECANCELED when cancelled. Reads at the file position (offset -1),
/// as read(2) does, so it suits pipes and sockets.
struct read_ring {
  int fd;
  asio::mutable_buffer buffer;

  void prepare(io_uring_sqe& sqe) {
    io_uring_prep_read(&sqe, fd, buffer.data(), static_cast<unsigned>(buffer.size()),
                       static_cast<__u64>(-1));
  }
  std::pair<std::error_code, std::size_t> result(int res) {
    return {error_from_res(res), static_cast<std::size_t>(res < 0 ? 0 : res)};
  }
};

/// The reactor part: RWF_NOWAIT keeps the read from blocking even on a
/// descriptor in blocking mode, so the caller's flags are left alone.
/// Regular files (always "ready", and RWF_NOWAIT would refuse uncached
/// pages for ever) and descriptors without RWF_NOWAIT get a plain read.
struct read_attempt {
  int fd;
  asio::mutable_buffer buffer;

  std::optional<std::pair<std::error_code, std::size_t>> operator()() const {
    iovec iov{buffer.data(), buffer.size()};
    ssize_t n = ::preadv2(fd, &iov, 1, -1, RWF_NOWAIT);
    if (n < 0 && (errno == EOPNOTSUPP || (errno == EAGAIN && is_regular_file()))) {
      n = ::read(fd, buffer.data(), buffer.size());
    }
    if (n >= 0) return std::pair{std::error_code{}, static_cast<std::size_t>(n)};
    if (errno == EAGAIN || errno == EINTR) return std::nullopt;
    return std::pair{std::error_code(errno, std::system_category()), std::size_t{0}};
  }

 private:
  bool is_regular_file() const {
    struct stat st {};
    return ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  }
};

/// Reads what is there, up to `buffer.size()` bytes; completes with
/// `void(std::error_code, std::size_t)`, 0 bytes meaning end of file. The
/// buffer and `fd` must stay valid until completion.
template <class Token>
auto async_read_some(const asio::any_io_executor& executor, int fd, asio::mutable_buffer buffer,
                     Token&& token) {
  return async_start<std::size_t>(executor, service_of(executor).caps().read, read_ring{fd, buffer}, fd,
                                  POLLIN, read_attempt{fd, buffer}, std::forward<Token>(token));
}

}  // namespace cohort::uring

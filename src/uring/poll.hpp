// One-shot poll of a descriptor: IORING_OP_POLL_ADD, or asio's reactor.
#pragma once

#include "uring/async.hpp"

#include <poll.h>

namespace cohort::uring {

/// The ring part. Completion: res is the ready event mask (POLLIN, POLLOUT,
/// POLLERR, POLLHUP...); -ECANCELED when cancelled.
struct poll_ring {
  int fd;
  short events;

  void prepare(io_uring_sqe& sqe) { io_uring_prep_poll_add(&sqe, fd, static_cast<unsigned>(events)); }
  std::pair<std::error_code, short> result(int res) {
    return {error_from_res(res), static_cast<short>(res < 0 ? 0 : res)};
  }
};

/// The reactor part: after readiness, poll(2) with no timeout says which.
/// A descriptor that is not open fails with EBADF, as on the ring (poll(2)
/// itself reports it as POLLNVAL).
struct poll_attempt {
  static constexpr bool never_blocks = true;  // tried once first (async_start)
  int fd;
  short events;

  std::optional<std::pair<std::error_code, short>> operator()() const {
    pollfd p{fd, events, 0};
    int n = ::poll(&p, 1, 0);
    if (n < 0) return std::pair{std::error_code(errno, std::system_category()), short{0}};
    if (n == 0) return std::nullopt;
    if ((p.revents & POLLNVAL) != 0) return std::pair{std::error_code(EBADF, std::system_category()), short{0}};
    return std::pair{std::error_code{}, p.revents};
  }
};

/// Waits until `fd` has one of `events` (POLLIN, POLLOUT, POLLPRI, in any
/// combination; error and hang-up are always reported); completes with
/// `void(std::error_code, short revents)`. `fd` must stay open until
/// completion.
template <class Token>
auto async_poll(const asio::any_io_executor& executor, int fd, short events, Token&& token) {
  return async_start<short>(executor, service_of(executor).caps().poll, poll_ring{fd, events}, fd, events,
                            poll_attempt{fd, events}, std::forward<Token>(token));
}

}  // namespace cohort::uring

// What the io_uring of an io_context can do on the running kernel, and an
// io_context that does without one.
#pragma once

#include "cohort/export.hpp"

#include <asio/io_context.hpp>

#include <string>

COHORT_API_BEGIN

namespace cohort {

/// Probed once per io_context, when cohort first uses it.
struct io_uring_info {
  bool ring = false;    ///< cohort drives a ring; false: asio's reactor, and helper threads for awaited futex waits
  bool waitid = false;  ///< IORING_OP_WAITID (Linux 6.7): exits arrive on the ring
  bool poll = false;    ///< IORING_OP_POLL_ADD
  bool read = false;    ///< IORING_OP_READ
  bool futex = false;   ///< IORING_OP_FUTEX_WAIT/WAKE (Linux 6.7)
  bool cancel = false;  ///< IORING_OP_ASYNC_CANCEL
  std::string why_not;  ///< why there is no ring, when there is none
};

/// What `io`'s ring can do, probed as cohort first uses `io`. Throws
/// std::system_error when asio's reactor cannot be brought up for it (no
/// descriptor left: the message names the open file limit).
io_uring_info io_uring_support(asio::io_context& io);

/// Gives `io` no ring: every cohort operation on it runs on asio's reactor,
/// and io_uring_support(io).ring is false. For an io_context that lives
/// for a few waits, where a ring's set-up and teardown (about 70 us of CPU
/// on a 2-CPU virtual machine) cost more than it saves. Call before cohort
/// first uses `io`; throws asio::service_already_exists after. Throws
/// std::system_error when asio's reactor cannot be brought up for it (no
/// descriptor left: the message names the open file limit).
void use_reactor_only(asio::io_context& io);

}  // namespace cohort

COHORT_API_END

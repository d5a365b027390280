// The io_uring service: one ring per asio execution context, bridged into
// asio through an eventfd that the ring signals on every completion.
#pragma once

#include <asio/any_io_executor.hpp>
#include <asio/execution_context.hpp>
#include <asio/io_context.hpp>
#include <asio/posix/stream_descriptor.hpp>

#include <liburing.h>

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace cohort::uring {

class service;

/// One request on the ring. The service owns it from `service::start` until
/// it calls `complete`, exactly once, from a thread running the execution
/// context; `complete` may delete the object.
class operation {
 public:
  operation(const operation&) = delete;
  operation& operator=(const operation&) = delete;

  /// Fills the submission entry. Pointers put into it must stay valid until
  /// `complete` runs: the kernel writes through them.
  virtual void prepare(io_uring_sqe& sqe) = 0;
  /// The completion's `res`: >= 0 success, -errno failure (-ECANCELED when cancelled).
  virtual void complete(int res) = 0;
  /// The service is shutting down: release resources, invoke nothing.
  virtual void destroy() = 0;

 protected:
  operation() = default;
  ~operation() = default;

 private:
  friend class service;
  operation* prev_ = nullptr;
  operation* next_ = nullptr;
  bool in_flight_ = false;
};

/// What the running kernel supports, probed once when the service starts.
struct capabilities {
  bool ring = false;      ///< a ring could be created and is in use
  bool waitid = false;    ///< IORING_OP_WAITID (Linux 6.7)
  bool poll = false;      ///< IORING_OP_POLL_ADD
  bool read = false;      ///< IORING_OP_READ
  bool futex = false;     ///< IORING_OP_FUTEX_WAIT/WAKE (Linux 6.7)
  bool cancel = false;    ///< IORING_OP_ASYNC_CANCEL
  std::string why_not;    ///< why the ring is off, when it is ("COHORT_IO_URING=0", "io_uring_queue_init: ...")
};

/// The ring of one execution context. Thread-safe: operations may be started
/// and cancelled from any thread; completions run on the context's threads.
/// Where io_uring is missing, refused, or switched off with COHORT_IO_URING=0,
/// `caps().ring` is false and callers use asio's reactor instead.
class service final : public asio::execution_context::service {
 public:
  using key_type = service;
  static inline asio::execution_context::id id;

  explicit service(asio::io_context& io);
  ~service() override;

  const capabilities& caps() const noexcept { return caps_; }

  /// Queues `op` on the ring and submits it. Where the ring has no room even
  /// after a flush, `op` completes with -EBUSY through the context (never
  /// inline). After shutdown `op` is destroyed. Requires `caps().ring`.
  void start(operation& op);

  /// Asks the kernel to cancel `op` if it is still in flight; a no-op
  /// otherwise. `op` completes, with -ECANCELED or its real result.
  void cancel(operation& op);

 private:
  void shutdown() override;
  void flush_locked();
  void arm_locked();
  void on_ready(const std::error_code& ec);
  void link_locked(operation& op);
  void unlink_locked(operation& op);

  asio::io_context& io_;
  capabilities caps_;
  io_uring ring_{};
  int eventfd_ = -1;
  std::optional<asio::posix::stream_descriptor> watch_;

  std::mutex mutex_;          // guards the submission queue, the in-flight list and armed_
  operation* head_ = nullptr;  // in-flight operations, for cancel and shutdown
  std::size_t in_flight_ = 0;
  bool armed_ = false;
  bool shut_down_ = false;
};

/// The io_context behind `executor` (an io_context's executor, or a strand
/// of one). Throws std::invalid_argument for any other executor: cohort's
/// operations need an io_context's reactor.
asio::io_context& io_context_of(const asio::any_io_executor& executor);

/// The service of the io_context behind `executor`.
inline service& service_of(const asio::any_io_executor& executor) {
  return asio::use_service<service>(io_context_of(executor));
}

}  // namespace cohort::uring

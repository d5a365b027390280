// The io_uring service: one ring per asio execution context, bridged into
// asio through a descriptor of the ring, which reads ready while completions wait.
#pragma once

#include "os/fork_safe_mutex.hpp"

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
/// it calls `complete`, exactly once, from a thread running the io_context;
/// `complete` takes the object over (and eventually deletes it).
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
  /// Whether `res` (other than -ECANCELED) can mean "the thread that
  /// submitted this exited" for this operation, so that it is to be
  /// submitted again rather than completed.
  virtual bool orphaned([[maybe_unused]] int res) const { return false; }

 protected:
  operation() = default;
  ~operation() = default;

 private:
  friend class service;
  operation* prev_ = nullptr;
  operation* next_ = nullptr;
  bool in_flight_ = false;
  bool cancel_requested_ = false;  // a -ECANCELED is then ours, not an orphaning
  bool cancel_unsent_ = false;     // no submission entry was free for the cancel yet
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

/// The ring of one io_context. Thread-safe: operations may be started and
/// cancelled from any thread; completions run on the context's threads.
/// Where io_uring is missing, refused, or switched off with COHORT_IO_URING=0,
/// `caps().ring` is false and callers use asio's reactor instead.
///
/// The kernel ties each request to the thread that submitted it and cancels
/// it when that thread exits. Such orphaned requests are submitted again from
/// the thread that sees their completion, so operations survive the exit of
/// the thread that started them.
class service final : public asio::execution_context::service {
 public:
  using key_type = service;
  static inline asio::execution_context::id id;

  /// The ring is made unless `with_ring` is false (use_reactor_only).
  explicit service(asio::io_context& io, bool with_ring = true);
  ~service() override;

  /// What the ring offers. In a forked child of the process that made the
  /// ring, which shares the ring with it, nothing: operations started there
  /// use the reactor, and the child's copy of the io_context (run, notified
  /// of the fork, or ended) leaves the ring, and the parent's requests and
  /// completions on it, alone.
  const capabilities& caps() const noexcept;

  /// Queues `op` on the ring and submits it. Where the ring has no room even
  /// after a flush, `op` completes with -EBUSY through the context (never
  /// inline). After shutdown `op` is destroyed. Requires `caps().ring`.
  void start(operation& op);

  /// Asks the kernel to cancel `op` if it is still in flight; a no-op
  /// otherwise (and in a forked child: the request is the parent's). `op`
  /// completes, with -ECANCELED or its real result.
  void cancel(operation& op);

 private:
  void shutdown() override;
  void notify_fork(asio::execution_context::fork_event event) override;
  void leave_ring_in_child(bool own_epoll);
  std::vector<operation*> take_copies_in_child();
  void flush_locked();
  io_uring_sqe* sqe_locked();
  bool queue_cancel_locked(operation& op);
  void arm_locked();
  void on_ready(const std::error_code& ec);
  void link_locked(operation& op);
  void unlink_locked(operation& op);
  unsigned reap_completions_locked(std::vector<operation*>& into);

  asio::io_context& io_;
  capabilities caps_;
  pid_t owner_ = 0;  // the process that made the ring
  io_uring ring_{};
  std::optional<asio::posix::stream_descriptor> watch_;

  // Guards the submission queue, the in-flight list and armed_; never held
  // in a forked child, nor the list half changed.
  os::fork_safe_mutex mutex_;
  operation* head_ = nullptr;  // in-flight operations, for cancel and shutdown
  std::size_t in_flight_ = 0;
  std::size_t unsent_cancels_ = 0;
  bool armed_ = false;
  bool shut_down_ = false;
};

/// The io_context behind `executor` (an io_context's executor, a strand of
/// one, or a strand of that). Throws std::invalid_argument, naming `what`,
/// for any other executor: cohort's operations need an io_context's
/// reactor.
asio::io_context& io_context_of(const asio::any_io_executor& executor, const char* what = "cohort");
/// The same, or null for any other executor.
asio::io_context* find_io_context(const asio::any_io_executor& executor);

/// The service of the io_context behind `executor` (io_context_of names
/// `what` where there is none).
inline service& service_of(const asio::any_io_executor& executor, const char* what = "cohort") {
  return asio::use_service<service>(io_context_of(executor, what));
}

/// The same, for an operation about to wait on the io_context: where the
/// service, and with it asio's reactor, cannot be brought up (no descriptor
/// left), a std::system_error naming `what` and the open file limit, not
/// asio's bare "eventfd_select_interrupter: Too many open files".
service& service_for(const asio::any_io_executor& executor, const char* what);

/// Gives `io` a service without a ring, so that every operation on it runs
/// on asio's reactor: for an io_context that lives for a few waits, where
/// a ring's set-up and teardown cost more than it saves (a blocking
/// spawn_and_join's). Call before anything uses the service of `io`;
/// throws asio::service_already_exists after. Throws std::system_error
/// naming the open file limit, as service_for does, when asio's reactor
/// cannot be brought up.
void use_reactor_only(asio::io_context& io);

}  // namespace cohort::uring

// An asynchronous futex wait: IORING_OP_FUTEX_WAIT (opcode 51, Linux 6.7),
// or, where the ring lacks it, the blocking wait on a helper thread: a
// futex has no descriptor for asio's reactor to watch.
#pragma once

#include "config.hpp"
#include "os/fork_safe_mutex.hpp"
#include "os/futex.hpp"
#include "os/process_identity.hpp"
#include "uring/async.hpp"

#include <asio/associator.hpp>

#include <linux/futex.h>
#include <signal.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <variant>
#include <vector>

namespace cohort::uring {

/// The ring part. Completion: res 0 when woken; -EAGAIN when the word did
/// not hold `expected`, which completes as success too; -ECANCELED when
/// cancelled.
struct futex_wait_ring {
  std::atomic<std::uint32_t>* word;
  std::uint32_t expected;

  void prepare(io_uring_sqe& sqe) {
    io_uring_prep_rw(config::op_futex_wait, &sqe, static_cast<int>(config::futex2_size_u32), word, 0, expected);
    sqe.addr3 = FUTEX_BITSET_MATCH_ANY;
  }
  std::pair<std::error_code, std::monostate> result(int res) {
    return {res == -EAGAIN ? std::error_code{} : error_from_res(res), {}};
  }
};

namespace detail {

/// Hands ring_operation's `(ec, value)` to a `void(std::error_code)` handler;
/// the handler's executor, cancellation slot and allocator show through.
template <class Handler>
struct drop_value {
  Handler handler;
  void operator()(std::error_code ec, std::monostate) { std::move(handler)(ec); }
};

}  // namespace detail
}  // namespace cohort::uring

template <template <class, class> class Associator, class Handler, class DefaultCandidate>
struct asio::associator<Associator, cohort::uring::detail::drop_value<Handler>, DefaultCandidate>
    : Associator<Handler, DefaultCandidate> {
  static typename Associator<Handler, DefaultCandidate>::type get(
      const cohort::uring::detail::drop_value<Handler>& h, const DefaultCandidate& c = DefaultCandidate()) noexcept {
    return Associator<Handler, DefaultCandidate>::get(h.handler, c);
  }
};

namespace cohort::uring {

class futex_threads;
struct futex_helper;

/// A wait held by one of the helper threads below.
class futex_thread_wait {
 public:
  futex_thread_wait(const futex_thread_wait&) = delete;
  futex_thread_wait& operator=(const futex_thread_wait&) = delete;

  /// Ends the wait as cancelled, unless it has ended already. Any thread.
  void request_stop();

 protected:
  futex_thread_wait(futex_threads& owner, std::atomic<std::uint32_t>& word, std::uint32_t expected)
      : owner_(owner), word_(word), expected_(expected) {}
  ~futex_thread_wait() = default;

  /// Hands the wait to the service (futex_threads::start).
  void begin();

  /// The wait ended: queue the completion on the handler's executor, which
  /// owns the wait from then on. Called once, by the service under its
  /// lock, never after shutdown.
  virtual void post(std::error_code ec) = 0;
  /// The io_context shuts down before `post`: free, call nothing.
  virtual void destroy() = 0;

 private:
  friend class futex_threads;
  futex_threads& owner_;
  std::atomic<std::uint32_t>& word_;
  const std::uint32_t expected_;
  // Under the service's lock:
  struct futex_helper* helper_ = nullptr;  // the thread that holds the wait
  bool cancelled_ = false;           // ends as operation_aborted, by its helper
};

/// The helper threads of one io_context's futex waits. Each sleeps in one
/// futex_waitv (Linux 5.16) on its own control word and up to 127 waits'
/// words at once, so a thousand pending waits take 8 threads, not a
/// thousand; where futex_waitv is not supported (see
/// os::futex_waitv_supported) each holds one wait and
/// looks at its control word every 50 ms. Threads are made as the pending
/// waits need them and kept for later waits. In a forked child of the
/// process that made them, they do not run: the child's waits get helpers
/// of its own, and its copies of the parent's waits end as cancelled when
/// the io_context is told of the fork (destroyed at its end otherwise).
/// None outlives the io_context:
/// on shutdown every helper is stopped and joined, and each wait still
/// pending is destroyed uncalled. A wait whose completion is queued already
/// is no longer the service's: the io_context destroys that completion
/// uncalled, as any queued handler.
class futex_threads final : public asio::execution_context::service {
 public:
  using key_type = futex_threads;
  static inline asio::execution_context::id id;

  explicit futex_threads(asio::execution_context& context);
  ~futex_threads() override;

  /// Gives `w` to a helper; posts at once, without one, when the word no
  /// longer holds the expected value or no thread can be made.
  void start(futex_thread_wait& w);
  /// Ends `w` as cancelled: its helper posts it, once out of its sleep on
  /// the word. Nothing when it has ended already.
  void cancel(futex_thread_wait& w);
  /// The helper threads made so far, each kept for later waits.
  std::size_t threads() const;
  /// The most waits a helper holds: 127, or 1 where futex_waitv is not
  /// supported.
  static std::size_t waits_per_thread();

 private:
  void shutdown() override;

  mutable os::fork_safe_mutex mutex_;  // never held in a forked child, nor the waits half changed
  void run(futex_helper& h);
  void leave_inherited_helpers_locked();
  void notify_fork(asio::execution_context::fork_event event) override;

  std::vector<std::unique_ptr<futex_helper>> helpers_;  // under mutex_
  // Waits held by the helpers of the process this one was forked from.
  std::vector<futex_thread_wait*> inherited_waits_;  // under mutex_
  pid_t owner_;                                       // the process the helpers run in; under mutex_
  bool shut_down_ = false;                            // under mutex_
};

inline void futex_thread_wait::request_stop() { owner_.cancel(*this); }
inline void futex_thread_wait::begin() { owner_.start(*this); }

/// A wait on a helper thread that ends by calling an asio handler, on the
/// handler's executor.
template <class Handler>
class futex_thread_operation final : public futex_thread_wait {
 public:
  futex_thread_operation(futex_threads& owner, std::atomic<std::uint32_t>& word, std::uint32_t expected,
                         Handler handler, const asio::any_io_executor& fallback)
      : futex_thread_wait(owner, word, expected),
        handler_(std::move(handler)),
        work_(asio::get_associated_executor(handler_, fallback)) {}

  /// Starts, with the handler's cancellation slot (if any) mapped to
  /// request_stop. As for ring_operation, cancellation must be emitted from
  /// the handler's executor, where the slot is cleared.
  void start() {
    auto slot = asio::get_associated_cancellation_slot(handler_);
    if (slot.is_connected()) slot.assign([this](asio::cancellation_type) { request_stop(); });
    begin();
  }

 private:
  // Runs on the handler's executor: clears the slot, frees the operation,
  // then calls the handler. Destroyed uncalled, it frees the operation
  // without calling anything.
  struct finisher {
    futex_thread_operation* op;
    std::error_code ec;

    finisher(futex_thread_operation* o, std::error_code e) : op(o), ec(e) {}
    finisher(finisher&& other) noexcept : op(std::exchange(other.op, nullptr)), ec(other.ec) {}
    finisher& operator=(finisher&&) = delete;
    ~finisher() {
      if (op != nullptr) op->destroy();
    }
    void operator()() {
      futex_thread_operation* self = std::exchange(op, nullptr);
      self->clear_slot();
      auto handler = std::move(self->handler_);
      auto work = std::move(self->work_);
      delete self;
      std::move(handler)(ec);
    }
  };

  void post(std::error_code ec) override { asio::post(work_.get_executor(), finisher{this, ec}); }

  void destroy() override {
    clear_slot();
    delete this;
  }

  void clear_slot() {
    auto slot = asio::get_associated_cancellation_slot(handler_);
    if (slot.is_connected()) slot.clear();
  }

  Handler handler_;
  asio::executor_work_guard<asio::associated_executor_t<Handler, asio::any_io_executor>> work_;
};

/// Waits until `word` is woken by a futex wake (os::futex_wake, from any
/// process) or is found not to hold `expected`; completes with
/// `void(std::error_code)`: success for both (re-check the word: wake-ups
/// can be spurious), asio::error::operation_aborted when cancelled through
/// the handler's cancellation slot. `word` is a 4-byte aligned word in
/// shared memory (see os/futex.hpp) and must stay mapped until completion.
///
/// On the ring the kernel holds the wait. Without the ring's futex op a
/// helper thread sleeps on it, with up to 126 other waits (futex_threads).
/// Destroying the io_context with a wait pending ends it without calling
/// the handler: the ring request is cancelled, or its helper stopped.
template <class Token>
auto async_futex_wait(const asio::any_io_executor& executor, std::atomic<std::uint32_t>& word,
                      std::uint32_t expected, Token&& token) {
  // The services are made here, not in the initiation: the first use of
  // an io_context may fail (no descriptor left for its reactor), and a
  // throw out of an awaiting coroutine's initiation ends the program.
  service& ring = service_of(executor);
  futex_threads* threads = ring.caps().futex ? nullptr : &asio::use_service<futex_threads>(io_context_of(executor));
  return asio::async_initiate<Token, void(std::error_code)>(
      [executor, ring = &ring, threads, word = &word, expected](auto handler) {
        using handler_type = decltype(handler);
        if (threads == nullptr) {
          auto* op = new ring_operation<futex_wait_ring, detail::drop_value<handler_type>>(
              *ring, futex_wait_ring{word, expected}, detail::drop_value<handler_type>{std::move(handler)}, executor);
          op->start();
        } else {
          auto* op = new futex_thread_operation<handler_type>(*threads, *word, expected, std::move(handler), executor);
          op->start();
        }
      },
      token);
}

}  // namespace cohort::uring

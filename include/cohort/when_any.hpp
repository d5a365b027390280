// Waiting for the first of a number of awaitables known only at run time
// (Asio 1.22's make_parallel_group takes a fixed set).
#pragma once

#include "cohort/compiler.hpp"
#include "cohort/export.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/associated_cancellation_slot.hpp>
#include <asio/associated_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/awaitable.hpp>
#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/cancellation_type.hpp>
#include <asio/co_spawn.hpp>
#include <asio/error.hpp>
#include <asio/post.hpp>
#include <asio/strand.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <cstddef>
#include <exception>
#include <initializer_list>
#include <memory>
#include <optional>
#include <stdexcept>
#include <system_error>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

COHORT_API_BEGIN

namespace cohort {

namespace detail {

/// What one op completes with; std::monostate stands for void.
template <class T>
using when_any_value = std::conditional_t<std::is_void_v<T>, std::monostate, T>;

/// How the ops ended: the winner's index with its value or its exception, or
/// `aborted` when the awaiting coroutine was cancelled before any op completed.
template <class T>
struct when_any_outcome {
  std::size_t index = 0;
  std::optional<when_any_value<T>> value;
  std::exception_ptr error;
  bool aborted = false;
};

/// Awaits one op. The optional gives co_spawn the default-constructible
/// result it needs whatever T is.
/// Runs `op` and sets `ended` once it has returned or thrown, while its
/// when_any still runs it: start() reads the flag to tell an op that ended
/// as it started (a pop of a queue that held a value) from one that waits.
template <class T>
asio::awaitable<std::optional<when_any_value<T>>> settle(asio::awaitable<T> op, bool* ended) {
  try {
    if constexpr (std::is_void_v<T>) {
      co_await std::move(op);
      *ended = true;
      co_return std::monostate{};
    } else {
      auto value = co_await std::move(op);
      *ended = true;
      co_return value;
    }
  } catch (...) {
    *ended = true;
    throw;
  }
}

/// The bookkeeping of one when_any. Everything but construction and
/// forward_cancellation() runs on the strand, which is also where the ops run.
/// The ops' completion handlers own it; the awaiting coroutine's cancellation
/// slot holds it weakly, so destroying an io_context with ops still pending
/// frees it (and the awaiting coroutine it holds through `Handler`).
template <class T, class Handler>
class when_any_state : public std::enable_shared_from_this<when_any_state<T, Handler>> {
 public:
  using strand_type = asio::strand<asio::any_io_executor>;

  when_any_state(strand_type strand, Handler handler, std::size_t size)
      : strand_(std::move(strand)),
        handler_(std::move(handler)),
        signals_(std::make_unique<asio::cancellation_signal[]>(size)),
        finished_(size, false) {}

  /// In the awaiting coroutine's context, before start(): a cancellation of
  /// that coroutine from now on reaches the ops.
  void forward_cancellation() {
    auto slot = asio::get_associated_cancellation_slot(*handler_);
    if (slot.is_connected()) slot.template emplace<cancel_request>(this->weak_from_this());
  }

  /// Starts the ops in order, each as its own co_spawn on the strand, each
  /// running inline up to its first suspension. An op that ends there,
  /// without suspending, wins unless a completion queued on the strand
  /// before its own comes first: the ops after it are destroyed without
  /// running, so that they take nothing (a later pop of a queue that holds
  /// a value would take the value, to be discarded). co_spawn reports such
  /// an op later, from the strand's queue; one reported inline (it hopped
  /// to another executor and back) decides the race at once too.
  void start(std::vector<asio::awaitable<T>> ops) {
    for (std::size_t i = 0; i < ops.size() && !decided_ && !op_ended_; ++i) {
      started_ = i + 1;
      ++running_;
      asio::co_spawn(strand_, settle(std::move(ops[i]), &op_ended_),
                     asio::bind_cancellation_slot(signals_[i].slot(), op_done{this->shared_from_this(), i}));
    }
    starting_ = false;
    ops.clear();
    complete_if_done();
  }

 private:
  /// The completion of op `index`, on the strand, after its frame is gone.
  struct op_done {
    std::shared_ptr<when_any_state> state;
    std::size_t index;
    void operator()(std::exception_ptr error, std::optional<when_any_value<T>> value) const {
      state->finish(index, std::move(error), std::move(value));
    }
  };

  /// Installed in the awaiting coroutine's cancellation slot; called where
  /// that slot is emitted, so it only hands the request to the strand.
  struct cancel_request {
    explicit cancel_request(std::weak_ptr<when_any_state> s) : state(std::move(s)) {}
    void operator()(asio::cancellation_type_t) const {
      if (auto s = state.lock()) asio::post(s->strand_, [s] { s->cancel(); });
    }
    std::weak_ptr<when_any_state> state;
  };

  void finish(std::size_t index, std::exception_ptr error, std::optional<when_any_value<T>> value) {
    finished_[index] = true;
    --running_;
    if (!decided_) {
      decided_ = true;
      outcome_->index = index;
      outcome_->error = std::move(error);
      if (value) outcome_->value.emplace(std::move(*value));
      cancel_running();
    }
    complete_if_done();
  }

  void cancel() {
    if (decided_) return;
    decided_ = true;
    outcome_->aborted = true;
    cancel_running();
    complete_if_done();
  }

  // An op may finish inline from its signal; finish() then only counts it.
  void cancel_running() {
    for (std::size_t i = 0; i < started_; ++i) {
      if (!finished_[i]) signals_[i].emit(asio::cancellation_type::terminal);
    }
  }

  // Resumes the awaiting coroutine through its own executor, never inline
  // from an op, once the race is decided and no op is left.
  void complete_if_done() {
    if (!decided_ || starting_ || running_ != 0 || !handler_) return;
    auto executor = asio::get_associated_executor(*handler_, strand_.get_inner_executor());
    asio::post(executor, [handler = std::move(*handler_), outcome = std::move(outcome_)]() mutable {
      asio::get_associated_cancellation_slot(handler).clear();
      std::move(handler)(std::move(outcome));
    });
    handler_.reset();
  }

  strand_type strand_;
  std::optional<Handler> handler_;  // empty once completed
  std::unique_ptr<asio::cancellation_signal[]> signals_;
  std::vector<bool> finished_;
  std::size_t started_ = 0;
  std::size_t running_ = 0;
  bool starting_ = true;
  bool decided_ = false;
  bool op_ended_ = false;  // set by settle() on the strand, as each op ends
  std::unique_ptr<when_any_outcome<T>> outcome_ = std::make_unique<when_any_outcome<T>>();
};

template <class T>
struct initiate_when_any {
  asio::strand<asio::any_io_executor> strand;

  template <class Handler>
  void operator()(Handler&& handler, std::vector<asio::awaitable<T>> ops) const {
    using state_type = when_any_state<T, std::decay_t<Handler>>;
    auto state = std::make_shared<state_type>(strand, std::forward<Handler>(handler), ops.size());
    state->forward_cancellation();
    asio::post(strand, [state, ops = std::move(ops)]() mutable { state->start(std::move(ops)); });
  }
};

/// The winner's outcome; throws what when_any documents.
template <class T>
asio::awaitable<std::unique_ptr<when_any_outcome<T>>> first_of(std::vector<asio::awaitable<T>> ops) {
  auto executor = co_await asio::this_coro::executor;
  const initiate_when_any<T> initiation{asio::make_strand(executor)};
  auto outcome = co_await asio::async_initiate<decltype(asio::use_awaitable), void(std::unique_ptr<when_any_outcome<T>>)>(
      initiation, asio::use_awaitable, std::move(ops));
  if (outcome->aborted) throw std::system_error(asio::error::operation_aborted, "cohort::when_any");
  if (outcome->error) std::rethrow_exception(outcome->error);
  co_return outcome;
}

template <class T>
asio::awaitable<std::pair<std::size_t, T>> value_of_first(std::vector<asio::awaitable<T>> ops) {
  auto outcome = co_await first_of(std::move(ops));
  co_return std::pair<std::size_t, T>(outcome->index, std::move(*outcome->value));
}

inline asio::awaitable<std::size_t> index_of_first(std::vector<asio::awaitable<void>> ops) {
  auto outcome = co_await first_of(std::move(ops));
  co_return outcome->index;
}

}  // namespace detail

/// Runs every awaitable of `ops` concurrently and completes when the first of
/// them completes, with its index in `ops` and its result. The others are then
/// cancelled (asio per-operation cancellation, terminal) and waited for: when
/// when_any returns, none of them is still running and every op's frame is
/// destroyed. Starts lazily, when awaited; `ops` is owned by when_any from the
/// call on.
///
/// The first to complete wins whether it returned or threw: a thrown exception
/// is rethrown, after the others have finished. What the others complete with
/// after their cancellation (values, operation_aborted, any exception) is
/// discarded. Of ops that complete as they start, without suspending, the one
/// earlier in `ops` wins, and the ops after it are not started: over the
/// pops of several queues that hold values, only the winner's pop takes
/// one. Otherwise the first completion to reach when_any
/// wins, whatever its place in `ops`: of two that become ready together (two
/// timers that expired while the loop was busy), the one asio runs first.
/// An op that ignores cancellation delays when_any until it ends. What the
/// cancellation does is each op's own: a child's wait() cancelled leaves the
/// child running, whereas a group's wait() cancelled shuts the group down,
/// so when_any over several groups' waits stops every group but the winner's.
///
/// Cancelling the awaiting coroutine (its cancellation slot, which by default
/// lets terminal cancellation through) cancels every op, waits for all of them,
/// then throws std::system_error(asio::error::operation_aborted) — unless an op
/// had already completed by the time the request reached when_any, in which case
/// that op wins as above. Emit that cancellation as for any asio operation: on
/// the coroutine's executor (on a multi-threaded io_context, on the strand the
/// coroutine runs on). An awaiting coroutine already cancelled throws
/// operation_aborted at the co_await, before any op starts (asio's default).
///
/// Threads: the ops run on one new strand of the awaiting coroutine's executor,
/// so they never run at the same time as each other (they may run alongside
/// code outside when_any); `co_await asio::this_coro::executor` in an op gives
/// that strand. The awaiting coroutine resumes on its own executor, posted,
/// never inline from an op. Safe on a multi-threaded io_context.
///
/// Throws std::invalid_argument at the call, before anything runs, when `ops`
/// is empty. T must be move-constructible; it need not be default-constructible.
/// The work is O(ops.size()) and the stack depth does not grow with it.
template <class T>
  requires(!std::is_void_v<T>)
[[nodiscard]] asio::awaitable<std::pair<std::size_t, T>> when_any(std::vector<asio::awaitable<T>> ops) {
  if (ops.empty()) throw std::invalid_argument("cohort::when_any: no operations to wait for");
  return detail::value_of_first(std::move(ops));
}

/// when_any for awaitables without a result: completes with the winner's index.
/// Everything else is as above.
[[nodiscard]] inline asio::awaitable<std::size_t> when_any(std::vector<asio::awaitable<void>> ops) {
  if (ops.empty()) throw std::invalid_argument("cohort::when_any: no operations to wait for");
  return detail::index_of_first(std::move(ops));
}

/// A braced list of awaitables is refused at compile time, with the reason:
/// a std::initializer_list holds its elements const, and awaitables can only
/// be moved. (g++ 12 would otherwise fail at the awaiting function's end, on
/// a braced list inside co_await.) The return type is deduced so that the
/// reason is given at the call.
template <class E>
auto when_any(std::initializer_list<E> ops) {
  static_assert(detail::refused<E>,
                "cohort::when_any: a braced list of awaitables cannot be moved from: push them into a "
                "std::vector in a variable first, then `co_await cohort::when_any(std::move(ops));`");
  return ops.size();
}

}  // namespace cohort

COHORT_API_END

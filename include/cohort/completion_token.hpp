// How cohort's asynchronous operations meet asio's completion tokens: each
// is a coroutine inside, started through asio::async_initiate, so that it
// takes any token (asio::use_awaitable, the default; a callback;
// asio::use_future; asio::deferred; asio::experimental::as_tuple ...) and
// completes as void(std::exception_ptr[, T]). It runs on the executor it
// was given, or on the handler's associated executor, an io_context's; a
// handler that names none (a plain callback, asio::use_future, an operation
// inside make_parallel_group), for an operation given no executor, is
// refused: the initiating call throws std::invalid_argument, and an
// operation that another launches later (a deferred one) completes with it
// at once, on the launching thread. Nothing runs on asio's system thread
// pool, which cohort never starts.
#pragma once

#include "cohort/export.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/associated_cancellation_slot.hpp>
#include <asio/associated_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/awaitable.hpp>
#include <asio/bind_cancellation_slot.hpp>
#include <asio/bind_executor.hpp>
#include <asio/cancellation_state.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/dispatch.hpp>
#include <asio/error.hpp>
#include <asio/execution/blocking.hpp>
#include <asio/require.hpp>
#include <asio/strand.hpp>
#include <asio/system_executor.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>

#include <atomic>
#include <exception>
#include <memory>
#include <optional>
#include <stdexcept>
#include <system_error>
#include <tuple>
#include <type_traits>
#include <utility>

COHORT_API_BEGIN

namespace cohort {

namespace detail {

template <class T>
struct signature_of {
  using type = void(std::exception_ptr, T);
};
template <>
struct signature_of<void> {
  using type = void(std::exception_ptr);
};

}  // namespace detail

/// The completion signature of a cohort operation that yields T:
/// void(std::exception_ptr, T), or void(std::exception_ptr) for void. The
/// exception is what the awaitable form throws; cancellation is
/// std::system_error(asio::error::operation_aborted).
template <class T>
using completion_signature = typename detail::signature_of<T>::type;

/// A completion token for an operation that yields T.
template <class Token, class T>
concept completion_token_of = asio::completion_token_for<Token, completion_signature<T>>;

/// The default token: the operation is an asio::awaitable<T>.
using default_token = asio::use_awaitable_t<>;

namespace detail {

/// Whether `Executor` hands what it runs to asio's system thread pool: the
/// system executor (a handler's when it names none), and asio::use_future's.
template <class Executor>
struct on_system_pool : std::false_type {};
template <class Blocking, class Relationship, class Allocator>
struct on_system_pool<asio::basic_system_executor<Blocking, Relationship, Allocator>> : std::true_type {};
template <class T, class Blocking>
struct on_system_pool<asio::detail::promise_executor<T, Blocking>> : std::true_type {};

/// Whether the handler's associated executor is one a cohort operation can
/// run on. Not for a handler that names none (a plain callback,
/// asio::use_future, an operation inside asio 1.22's make_parallel_group):
/// run there, the operation would start asio's system thread pool for the
/// program's life and complete on one of its threads, racing with whatever
/// started it on the caller's thread.
template <class Handler>
inline constexpr bool has_io_executor =
    std::is_convertible_v<asio::associated_executor_t<Handler>, asio::any_io_executor> &&
    !on_system_pool<asio::associated_executor_t<Handler>>::value;

/// What an operation with no executor of its own, given such a handler,
/// fails with.
inline constexpr const char* no_io_executor =
    "cohort: the completion handler has no associated io_context executor (a plain callback, "
    "asio::use_future, an operation inside make_parallel_group): bind one with asio::bind_executor";

/// True while async_awaitable's token starts the operation, and read (and
/// cleared) by the initiation as it begins: an initiation that runs inside
/// the initiating call (a callback, asio::use_future) may throw to the
/// caller; one run later, by an awaiting coroutine or by another operation
/// that launches a deferred one, may not, as asio 1.22 starts it inside a
/// noexcept function, where a throw ends the program. Per thread, as the
/// call and the initiation it makes run on one.
inline bool& initiating_call() noexcept {
  thread_local bool inside = false;
  return inside;
}

/// `operation`, run as the coroutine that co_spawn starts, so that every
/// type of cancellation reaches it, as a terminal one: such a coroutine
/// takes terminal ones alone by default, and so do those its awaits start
/// (asio's `||`). For operations that a cancellation leaves without a side
/// effect (a wait, a pop that takes no value), as total and partial
/// cancellation ask.
template <class T>
asio::awaitable<T> taking_any_cancellation(asio::awaitable<T> operation) {
  co_await asio::this_coro::reset_cancellation_state(
      [](asio::cancellation_type type) {
        return type != asio::cancellation_type::none ? asio::cancellation_type::terminal : type;
      },
      [](asio::cancellation_type type) { return type; });
  co_return co_await std::move(operation);
}

/// An operation that throws `error` once it runs.
template <class Operation>
Operation rethrown(std::exception_ptr error) {
  co_await asio::this_coro::executor;  // a coroutine, which throws where it runs
  std::rethrow_exception(error);
}

/// Runs `make(executor)`, an asio::awaitable<T>, by co_spawn on `executor`, or, when
/// there is none, on the handler's associated executor (the awaiting
/// coroutine's for use_awaitable), and completes the handler on its own
/// associated executor. With neither (has_io_executor), nothing runs: the
/// initiating call throws std::invalid_argument (no_io_executor), or, for
/// an operation launched later by another (a deferred one inside
/// make_parallel_group), the handler is completed with it at once. `where` is the executor (an optional one, or
/// std::nullopt), or a callable that gives it as the operation starts. The
/// handler's cancellation slot reaches the coroutine (co_spawn forwards
/// it); the slot is cleared before the handler runs, so a signal emitted
/// after completion reaches nothing.
///
/// With `stoppable_until_started` (the operation's name), a cancellation
/// of any type counts only until the coroutine starts: it then does not
/// run, and the operation completes with operation_aborted; once it runs,
/// nothing reaches it. For an operation that does all it does as it
/// starts, and that cannot be stopped then (a spawn). A cancellation
/// emitted before the coroutine first runs, of a type other than terminal,
/// would be gone (co_spawn's coroutine lets terminal ones alone in) before
/// it could let it in; on another executor (run_apart) even a terminal one
/// would come after the start.
struct initiate_awaitable {
  const char* stoppable_until_started = nullptr;

  template <class Handler, class Where, class Make>
  void operator()(Handler&& handler, Where where_given, Make make) const {
    const bool at_call = std::exchange(initiating_call(), false);
    std::optional<asio::any_io_executor> executor;
    // What a callable `where` throws completes the operation, where the
    // handler runs: thrown out of an awaiting coroutine's initiation, it
    // would end the program (std::terminate).
    std::exception_ptr refused;
    if constexpr (std::is_invocable_v<Where&>) {
      try {
        executor = where_given();
      } catch (...) {
        refused = std::current_exception();
      }
    } else {
      executor = std::move(where_given);
    }
    using operation = decltype(make(std::declval<const asio::any_io_executor&>()));
    asio::any_io_executor where;
    if constexpr (has_io_executor<Handler>) {
      where = executor && !refused ? *executor : asio::any_io_executor(asio::get_associated_executor(handler));
    } else {
      // Nowhere to run: refused before anything starts. Launched by another
      // operation, the handler is that operation's, which takes a
      // completion made inside its launch (make_parallel_group does).
      if (!executor || refused) {
        if (!refused) refused = std::make_exception_ptr(std::invalid_argument(no_io_executor));
        if (at_call) std::rethrow_exception(refused);
        return complete_now<typename operation::value_type>(std::move(handler), refused);
      }
      where = *executor;
    }
    auto slot = asio::get_associated_cancellation_slot(handler);
    auto completion = asio::get_associated_executor(handler, where);
    auto body = refused ? rethrown<operation>(refused) : make(where);
    if (slot.is_connected() && stoppable_until_started != nullptr) {
      return run_unless_cancelled(where, slot, completion, std::move(body), std::move(handler),
                                  stoppable_until_started);
    }
    if (slot.is_connected() && !same_executor(where, completion)) {
      return run_apart(where, slot, completion, std::move(body), std::move(handler));
    }
    asio::co_spawn(where, std::move(body),
                   asio::bind_cancellation_slot(
                       slot, asio::bind_executor(completion, [h = std::move(handler), slot](auto&&... results) mutable {
                         if (slot.is_connected()) slot.clear();
                         std::move(h)(std::forward<decltype(results)>(results)...);
                       })));
  }

 private:
  template <class T, class Handler>
  static void complete_now(Handler handler, std::exception_ptr error) {
    if constexpr (std::is_void_v<T>) {
      std::move(handler)(std::move(error));
    } else {
      std::move(handler)(std::move(error), T());
    }
  }

  template <class Executor>
  static bool same_executor(const asio::any_io_executor& where, const Executor& completion) {
    if constexpr (std::is_convertible_v<Executor, asio::any_io_executor>) {
      return where == asio::any_io_executor(completion);
    } else {
      return false;
    }
  }

  /// A cancellation that the handler's executor emits, bound for an
  /// operation that runs elsewhere (a child's wait on the child's
  /// io_context, awaited from a strand): asio 1.22's co_spawn hands it on
  /// inline, on the emitting thread, while the operation may be completing
  /// on another, and the two would touch one operation at once (freed
  /// memory). The operation runs on a strand of `where` instead, and the
  /// cancellation is handed to it on that strand.
  struct forwarded_cancellation {
    explicit forwarded_cancellation(const asio::any_io_executor& where) : strand(asio::make_strand(where)) {}
    asio::strand<asio::any_io_executor> strand;
    asio::cancellation_signal signal;  // emitted and cleared on the strand alone
  };

  template <class Body, class Handler>
  static void run_apart(const asio::any_io_executor& where, asio::cancellation_slot slot,
                        asio::associated_executor_t<Handler, asio::any_io_executor> completion, Body body,
                        Handler handler) {
    auto link = std::make_shared<forwarded_cancellation>(where);
    // The operation holds the link, and the caller's slot only watches it:
    // should `where`'s io_context be destroyed with the operation in
    // flight, the link, and the strand of that io_context in it, go with
    // the operation, while this stays in the caller's slot, on another
    // io_context, to be destroyed with it, long after.
    slot.assign([watched = std::weak_ptr<forwarded_cancellation>(link)](asio::cancellation_type type) {
      if (auto link = watched.lock()) asio::dispatch(link->strand, [link, type] { link->signal.emit(type); });
    });
    auto finish = [link, completion, slot, h = std::move(handler)](auto&&... results) mutable {
      link->signal.slot().clear();  // a cancellation still on its way to the strand reaches nothing
      auto done = std::make_tuple(std::forward<decltype(results)>(results)...);
      asio::dispatch(completion, [h = std::move(h), slot, done = std::move(done)]() mutable {
        if (slot.is_connected()) slot.clear();
        std::apply(std::move(h), std::move(done));
      });
    };
    asio::co_spawn(link->strand, std::move(body),
                   asio::bind_cancellation_slot(link->signal.slot(),
                                                asio::bind_executor(link->strand, std::move(finish))));
  }

  /// `operation`, unless `cancelled` holds as it starts.
  template <class T>
  static asio::awaitable<T> unless_cancelled(std::shared_ptr<const std::atomic<bool>> cancelled,
                                             asio::awaitable<T> operation, const char* what) {
    if (cancelled->load(std::memory_order_acquire)) throw std::system_error(asio::error::operation_aborted, what);
    co_return co_await std::move(operation);
  }

  /// The run of a stoppable_until_started operation: the handler's slot
  /// only notes a cancellation, for the coroutine to see as it starts. The
  /// note is made on the handler's executor and read on the operation's,
  /// maybe another thread's: the release store makes it seen by the
  /// acquire load of a coroutine that starts after it.
  template <class Body, class Handler>
  static void run_unless_cancelled(const asio::any_io_executor& where, asio::cancellation_slot slot,
                                   asio::associated_executor_t<Handler, asio::any_io_executor> completion, Body body,
                                   Handler handler, const char* what) {
    auto cancelled = std::make_shared<std::atomic<bool>>(false);
    slot.assign([cancelled](asio::cancellation_type type) {
      if (type != asio::cancellation_type::none) cancelled->store(true, std::memory_order_release);
    });
    asio::co_spawn(where, unless_cancelled(cancelled, std::move(body), what),
                   asio::bind_executor(completion, [h = std::move(handler), slot](auto&&... results) mutable {
                     if (slot.is_connected()) slot.clear();
                     std::move(h)(std::forward<decltype(results)>(results)...);
                   }));
  }
};

/// Marks, for its life, the initiating call that may start the operation
/// (initiating_call).
struct initiating {
  initiating() noexcept : outer(std::exchange(initiating_call(), true)) {}
  ~initiating() { initiating_call() = outer; }
  initiating(const initiating&) = delete;
  initiating& operator=(const initiating&) = delete;
  bool outer;
};

/// Starts the operation `make` (a callable taking the executor it runs on
/// and returning asio::awaitable<T>) for `token`, on `where`
/// (initiate_awaitable). `make` and a callable `where` hold copies of
/// whatever they read, since a lazy token (use_awaitable, deferred) may
/// start the operation long after the call. A callable `where` is asked at
/// the call too, so that what it refuses then throws at once; it is asked
/// again as the operation starts, when what it reads may have gone.
template <class T, class Token, class Where, class Make>
auto async_awaitable(Where where, Make make, Token&& token) {
  if constexpr (std::is_invocable_v<Where&>) (void)where();
  const initiating guard;
  return asio::async_initiate<Token, completion_signature<T>>(initiate_awaitable{}, token, std::move(where),
                                                             std::move(make));
}

/// async_awaitable for an operation that a cancellation of any type before
/// it starts leaves undone, and that nothing stops once started (a spawn):
/// see initiate_awaitable's stoppable_until_started. `what` names it in
/// the operation_aborted error.
template <class T, class Token, class Where, class Make>
auto async_awaitable_stoppable_until_started(const char* what, Where where, Make make, Token&& token) {
  if constexpr (std::is_invocable_v<Where&>) (void)where();
  const initiating guard;
  return asio::async_initiate<Token, completion_signature<T>>(initiate_awaitable{.stoppable_until_started = what},
                                                             token, std::move(where), std::move(make));
}

}  // namespace detail

}  // namespace cohort

COHORT_API_END

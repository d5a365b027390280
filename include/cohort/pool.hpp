// A pool of worker processes mapping a registered function over items
// (torch.multiprocessing's Pool.map): tensors and storages in the items
// are shared with the workers, not copied.
#pragma once

#include "cohort/export.hpp"

#include "cohort/compiler.hpp"
#include "cohort/completion_token.hpp"
#include "cohort/entry_point.hpp"
#include "cohort/group.hpp"
#include "cohort/process_error.hpp"
#include "cohort/queue.hpp"

#include <asio/associated_cancellation_slot.hpp>
#include <asio/associated_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/cancellation_type.hpp>
#include <asio/dispatch.hpp>
#include <asio/execution/context.hpp>
#include <asio/execution/executor.hpp>
#include <asio/execution/outstanding_work.hpp>
#include <asio/execution_context.hpp>
#include <asio/prefer.hpp>
#include <asio/query.hpp>
#include <asio/system_context.hpp>

#include <atomic>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

COHORT_API_BEGIN

namespace cohort {

struct pool_options {
  start_method method = start_method::spawn;
  /// How each worker starts (environment, directory, standard streams...).
  spawn_options spawn{};
  shutdown_policy shutdown{};
};

namespace detail {
class pool_state;
/// A map's place in the pool's line of maps, and its cancellation. Maps
/// take their turns in the order they are made.
struct map_ticket;
/// A ticket for an asynchronous map, made before its cancellation slot is
/// connected.
std::shared_ptr<map_ticket> pool_ticket(pool_state& pool);
/// Cancels the map: one waiting its turn leaves the line and completes at
/// once (on a thread of the pool) as aborted; one running stops as
/// map() documents. Thread-safe; the pool may be gone. The ticket is taken
/// by value: the caller is a slot's handler, and nothing here reads that
/// handler's own copy, which may go as the map completes.
void pool_cancel(std::shared_ptr<map_ticket> ticket) noexcept;
/// Blocks until the asynchronous maps that had their turns before this
/// one's have handed their handlers over: handlers reach their executors
/// in the order the maps ran. Not for a map that ran without a turn
/// (cancelled while waiting, refused by the pool's end).
void pool_await_hand_off(map_ticket& ticket);
/// This map's handler is handed over (or runs): the next may go.
/// Idempotent.
void pool_handed_off(map_ticket& ticket) noexcept;
/// Runs `tasks` (encoded arguments) through the function registered as
/// `name`; returns the encoded results in order. Throws as pool::map.
/// Without a ticket (a blocking map) it waits its turn first; with one, it
/// is the job pool_run_detached started.
std::vector<std::optional<encoded>> pool_run(pool_state& pool, const std::string& name,
                                             const std::vector<encoded>& tasks, map_ticket* ticket = nullptr);
/// Puts `job` in the line: it runs on a thread the pool owns once its turn
/// comes (or once cancelled, or as the pool ends), and the pool joins that
/// thread before its workers end. A waiting job holds no thread.
void pool_run_detached(pool_state& pool, const std::shared_ptr<map_ticket>& ticket, std::function<void()> job);
/// The values of a map's results.
template <class R>
std::vector<R> pool_values(const std::vector<std::optional<encoded>>& results) {
  std::vector<R> values;
  values.reserve(results.size());
  for (const auto& r : results) values.push_back(r.value().template as<R>());
  return values;
}

/// A handler waiting on a thread of the pool for its map to end, reachable
/// from the end of the execution context its executor belongs to: that
/// context's shutdown (~io_context, before its scheduler goes) settles it
/// by abandon(), the map's end by dispatching the handler; whichever comes
/// first, under `mutex`, and the other then leaves it alone.
class pending_completion {
 public:
  virtual ~pending_completion() = default;
  /// From the context's shutdown: lets go of the handler unless the map's
  /// end has handed it over already.
  void orphan() noexcept {
    std::unique_lock lock(mutex);
    if (settled) return;
    settled = true;
    lock.unlock();
    // Ours alone now. Destroyed outside the lock: the handler may hold the
    // pool's last reference, whose end joins the thread about to take it.
    abandon();
  }

 protected:
  /// Destroys the handler without calling it and drops its work, with the
  /// context still there.
  virtual void abandon() noexcept = 0;
  std::mutex mutex;
  bool settled = false;  // handed to the executor, or abandoned; under mutex
};
/// Has the shutdown of `context` orphan `completion` (if it is still
/// there).
void watch_completion(asio::execution_context& context, const std::weak_ptr<pending_completion>& completion);

/// The execution context an executor belongs to, where it can end before
/// the map: null for one that names none (asio::use_future's runs the
/// handler where it is called) and for the system executor (a plain
/// callback's), whose context lasts as long as the process and would start
/// its threads when asked for.
template <class Executor>
asio::execution_context* context_of(const Executor& executor) {
  if constexpr (asio::can_query<const Executor&, asio::execution::context_t>::value) {
    using context_type = std::decay_t<typename asio::query_result<const Executor&, asio::execution::context_t>::type>;
    if constexpr (std::is_same_v<context_type, asio::system_context>) {
      return nullptr;
    } else {
      return &asio::query(executor, asio::execution::context);
    }
  } else if constexpr (requires { executor.context(); }) {
    return &executor.context();
  } else {
    return nullptr;
  }
}

/// An asynchronous map's handler, with its executor (counting the map as
/// its work) and its cancellation slot, until the map ends. The slot is
/// that of a handler whose executor has an execution context, the one its
/// signal is emitted from; empty for one with none, whose slot the map
/// leaves alone.
template <class Handler, class Executor>
class map_completion final : public pending_completion {
 public:
  map_completion(Handler handler, Executor executor, asio::cancellation_slot slot, std::shared_ptr<map_ticket> ticket)
      : handler_(std::move(handler)), executor_(std::move(executor)), slot_(slot), ticket_(std::move(ticket)) {}

  /// Hands `args` to the handler on its executor, after the maps that ran
  /// before have handed theirs over, unless the context has ended. The
  /// executor's work ends here, under the lock, where the context's
  /// shutdown cannot pass. The slot is cleared on the thread that would
  /// emit it (a thread of the handler's context), just before the handler
  /// runs. A handler run at once, on this
  /// thread, lets the next map's go as it starts: it may wait for that map.
  template <class... Args>
  void complete(Args&&... args) {
    pool_await_hand_off(*ticket_);
    struct handing {
      map_ticket& ticket;
      ~handing() { pool_handed_off(ticket); }
    } handed{*ticket_};
    std::lock_guard lock(mutex);
    if (settled) return;
    settled = true;
    asio::dispatch(*executor_, [h = std::move(*handler_), slot = slot_, ticket = ticket_,
                                ... args = std::forward<Args>(args)]() mutable {
      pool_handed_off(*ticket);
      if (slot.is_connected()) slot.clear();
      std::move(h)(std::move(args)...);
    });
    handler_.reset();
    executor_.reset();
  }

 private:
  void abandon() noexcept override {
    // Nobody can take the results: the items not taken yet do not run.
    pool_cancel(ticket_);
    if (slot_.is_connected()) slot_.clear();
    handler_.reset();
    executor_.reset();
  }

  std::optional<Handler> handler_;
  std::optional<Executor> executor_;
  asio::cancellation_slot slot_;
  std::shared_ptr<map_ticket> ticket_;
};
}  // namespace detail

/// `workers` processes, started at construction, ended at destruction
/// (they finish the item in hand first) or by terminate() (at once). A function mapped over items is
/// registered with COHORT_ENTRYPOINT and called as fn(worker, item), where
/// `worker` is the index of the process running it. One map at a time, in
/// the order the maps were made (blocking and asynchronous alike, first
/// made first run, as Python's Pool queues them); map() may be called from
/// any thread. The workers are started by the
/// constructing thread and hold its parent-death signal
/// (spawn_options::parent_death_signal, SIGKILL by default), as a group's
/// ranks do: construct the pool on a thread that outlives it, or set
/// pool_options::spawn.parent_death_signal to 0. (Workers started by
/// `forkserver` hold that of a thread that lives as long as the process.)
/// Without that signal, a worker ends on its own, saying nothing, once it
/// finds the pool's process gone: waiting for an item, the first one
/// included, or starting after that process has exited.
class pool {
 public:
  /// Starts the workers. Throws what start_processes throws.
  explicit pool(int workers, const pool_options& options);
  /// With default options. (Not a default argument: g++ 12 destroys a
  /// defaulted `{}` twice in `co_await pool(n).map(...)`.)
  explicit pool(int workers) : pool(workers, static_cast<const pool_options&>(pool_options())) {}
#if COHORT_AWAIT_TEMPORARY_BUG
  /// Refused at compile time on g++ 12 and older, which destroy a
  /// pool_options temporary twice when the pool is made inside a co_await
  /// expression (`co_await pool(2, {...}).map(...)`). A named pool_options
  /// is taken by the constructor above.
  template <class Refused = void>
  explicit pool(int workers, pool_options&& options) : pool(workers, static_cast<const pool_options&>(options)) {
    static_assert(detail::refused<Refused>,
                  "g++ 12 destroys a pool_options temporary twice inside co_await (std::move of a named one is "
                  "refused too): name the options "
                  "first, `pool_options options{...}; pool p(n, options);`");
  }
#endif
  pool(pool&&) noexcept;
  pool& operator=(pool&&) noexcept;
  /// Lets the workers finish their item in hand, then ends them. A worker
  /// that died (killed outright, SIGKILL) gave back none of its holds on
  /// the queues' shared memory: what it held stays allocated in this
  /// process after the pool has gone, until trim_shared_memory() lets go
  /// of it (see storage.hpp). Call that after a pool whose worker died
  /// where pools are made again and again. In a child of the program's own
  /// fork(), the copy of a pool its parent made is left alone: its workers
  /// and its thread are the parent's, and the child neither ends them nor
  /// may map on them (std::logic_error); it makes a pool of its own. After
  /// terminate() it returns at once: nothing is left to wait for.
  ~pool();

  /// Ends the workers now, items in hand and all (Python's
  /// Pool.terminate()): the group's shutdown ends them (SIGTERM to each
  /// worker's process group after pool_options::shutdown's grace, SIGKILL
  /// after its term_grace), and they are reaped before it returns. Every
  /// map running or waiting its turn, blocking or asynchronous, ends with
  /// std::logic_error ("cohort::pool: the pool was terminated: ..."), and
  /// so does every later map. The asynchronous ones have completed when it
  /// returns (their handlers handed to their executors); a blocking map on
  /// another thread throws as soon as it sees the workers gone. As for a worker
  /// that died, what the workers held of the queues' shared memory stays
  /// allocated until trim_shared_memory(). Thread-safe, against maps and
  /// against itself: a later call waits for the first to end the pool,
  /// except one from a handler running on the pool's thread, which returns
  /// at once. Nothing for a pool moved from, or a forked child's copy.
  void terminate() noexcept;

  /// fn(worker, item) for every item, spread over the workers; returns the
  /// results in the items' order (nothing for a void fn). An exception
  /// escaping fn is thrown here as process_raised_error-like std::runtime_error
  /// naming the item and the exception; the pool stays usable. A worker that
  /// dies ends the pool: its failure (process_exited_error; one that exits
  /// with code 0 inside an item too) is thrown, and every later map throws
  /// std::logic_error. A map that throws before its
  /// last result (a result that cannot be received) takes back its items
  /// no worker has taken: they do not run. Returned handles (tensors,
  /// storages) hold their memory in the parent alone: the worker lets go of
  /// what it returned once sent, and the memory goes with the parent's last
  /// copy, before or after the pool ends.
  template <class R, class A>
  auto map(R (*fn)(int, A), const std::vector<std::decay_t<A>>& items) {
    const auto [name, tasks] = prepare(fn, items);
    auto results = detail::pool_run(state(), name, tasks);
    if constexpr (!std::is_void_v<R>) return detail::pool_values<std::decay_t<R>>(results);
  }

  /// map() as an asio asynchronous operation, completing as
  /// void(std::exception_ptr, std::vector<R>) (void(std::exception_ptr) for a
  /// void fn) with what map() returns or throws: `co_await p.map(fn, items,
  /// asio::use_awaitable)`, a callback, asio::use_future, a deferred
  /// operation. The items are encoded at the call, and the map takes its
  /// place in line then (a lazy token's call is its initiation: the
  /// co_await). Its turn come, it runs on a thread the pool owns, never
  /// blocking the caller's io_context; a map waiting its turn holds no
  /// thread. The handler runs on its associated executor (on that thread
  /// for a handler with none), and the map counts as work on it until then;
  /// handlers are handed to their executors in the order their maps ran
  /// (one run at once on the pool's thread lets the next go as it starts).
  /// Cancellation (the handler's cancellation slot, any type) ends the wait
  /// with std::system_error(operation_aborted), at once for a map waiting
  /// its turn: items a worker has taken still run, and their results are
  /// dropped; the rest do not run. An item a worker has taken holds the
  /// storages it names until that worker has answered. The signal of a handler whose executor
  /// has an execution context (an io_context, a strand, a coroutine's) is
  /// emitted from that context, and the map clears the slot as the handler
  /// runs; that of one with none (a callback, asio::use_future) may be
  /// emitted from any thread, and the map leaves its slot alone: the
  /// handler it put there stays until the slot takes another or the signal
  /// goes, and cancels nothing once the map has ended. A map whose turn
  /// comes while no thread can be started (a full pids cgroup) completes at
  /// once with std::system_error ("cohort::pool::map: starting the thread
  /// that runs the map"), the maps after it unaffected. Destroying the execution
  /// context of the handler's executor (an io_context, a thread_pool)
  /// before the map ends destroys the handler there, without calling it, as
  /// asio destroys the handlers of its own pending operations (a coroutine
  /// awaiting the map is destroyed), and cancels the map; nothing reaches
  /// that context afterwards. The pool must outlive the operation;
  /// destroying it waits for the map to end: its items not yet taken are
  /// taken back, and it completes with std::logic_error ("the pool was
  /// destroyed before ..."); terminate() waits for no item, and the map
  /// completes with std::logic_error ("the pool was terminated ..."). A handler that runs on the pool's thread must
  /// not throw (nothing there could catch it: std::terminate); it may drop
  /// the pool's last reference, and a map it starts while the pool is
  /// ending completes at once with std::logic_error.
  template <class R, class A, class Token>
    requires completion_token_of<Token, std::conditional_t<std::is_void_v<R>, void, std::vector<std::decay_t<R>>>>
  auto map(R (*fn)(int, A), const std::vector<std::decay_t<A>>& items, Token&& token) {
    using result = std::conditional_t<std::is_void_v<R>, void, std::vector<std::decay_t<R>>>;
    auto [name, tasks] = prepare(fn, items);
    return asio::async_initiate<Token, completion_signature<result>>(
        [state = &this->state()](auto handler, std::string name, std::vector<encoded> tasks) {
          auto ticket = detail::pool_ticket(*state);
          auto slot = asio::get_associated_cancellation_slot(handler);
          if (slot.is_connected()) {
            slot.assign([ticket](asio::cancellation_type) { detail::pool_cancel(ticket); });
          }
          // Counted as work on the handler's executor until the handler
          // is handed to it: an io_context's run() returns only once it
          // has run.
          auto executor = asio::prefer(asio::get_associated_executor(handler),
                                       asio::execution::outstanding_work.tracked);
          auto* context = detail::context_of(executor);
          // The slot is cleared as the handler runs only where that is
          // where its signal is emitted: on the handler's context. A future's
          // or a callback's handler runs on the map's thread, while its
          // signal may be emitted from any other: clearing the slot there
          // could destroy its handler under a running emit. That handler
          // stays until the slot takes another or the signal goes; a cancel
          // of a map that has ended does nothing.
          auto completion = std::make_shared<detail::map_completion<decltype(handler), decltype(executor)>>(
              std::move(handler), std::move(executor), context != nullptr ? slot : asio::cancellation_slot(), ticket);
          if (context != nullptr) detail::watch_completion(*context, completion);
          auto job = [state, name = std::move(name), tasks = std::move(tasks), ticket, completion] {
            std::exception_ptr error;
            std::vector<std::optional<encoded>> results;
            try {
              results = detail::pool_run(*state, name, tasks, ticket.get());
            } catch (...) {
              error = std::current_exception();
            }
            if constexpr (std::is_void_v<R>) {
              completion->complete(error);
            } else {
              result values;
              if (!error) {
                try {
                  values = detail::pool_values<std::decay_t<R>>(results);
                } catch (...) {
                  error = std::current_exception();
                }
              }
              completion->complete(error, std::move(values));
            }
          };
          // std::function copies its target: held once, and shared.
          auto held = std::make_shared<decltype(job)>(std::move(job));
          try {
            detail::pool_run_detached(*state, ticket, [held] { (*held)(); });
          } catch (...) {
            // No thread for its turn: the map fails as it is made, through
            // its handler (thrown from here, under use_awaitable nothing
            // could catch it, and the work counted on the executor would go).
            if constexpr (std::is_void_v<R>) {
              completion->complete(std::current_exception());
            } else {
              completion->complete(std::current_exception(), result{});
            }
          }
        },
        token, std::move(name), std::move(tasks));
  }

#if COHORT_AWAIT_TEMPORARY_BUG
  /// Refused at compile time on g++ 12 and older, which cannot compile a
  /// std::initializer_list inside a co_await expression (cohort/compiler.hpp).
  /// Every braced list of items comes here, whatever its elements (nested,
  /// of mixed types, empty): its element type is the item's, not deduced,
  /// and a braced list converts to an initializer_list before a vector.
  template <class R, class A, class Token>
  auto map(R (*fn)(int, A), std::initializer_list<std::type_identity_t<std::decay_t<A>>> items, Token&& token) {
    static_assert(detail::refused<Token>,
                  "g++ 12 cannot compile a braced list inside co_await: build the items' vector in a "
                  "variable first, then `co_await p.map(fn, items, token);`");
    return map(fn, std::vector<std::decay_t<A>>(items.begin(), items.end()), std::forward<Token>(token));
  }
  /// The same without a token: refused everywhere, since the map cannot
  /// tell whether its result is part of a co_await expression
  /// (`co_await sum(p.map(fn, {1, 2}))`).
  template <class R, class A>
  auto map(R (*fn)(int, A), std::initializer_list<std::type_identity_t<std::decay_t<A>>> items) {
    static_assert(detail::refused<R>,
                  "g++ 12 cannot compile a braced list inside co_await, and map cannot tell whether it is "
                  "inside one: build the items' vector in a variable first, then `p.map(fn, items);`");
    return map(fn, std::vector<std::decay_t<A>>(items.begin(), items.end()));
  }
#endif

  /// The workers started; 0 for a pool moved from, whose map() throws
  /// std::logic_error.
  int workers() const noexcept;

 private:
  template <class R, class A>
  static std::pair<std::string, std::vector<encoded>> prepare(R (*fn)(int, A), const std::vector<std::decay_t<A>>& items) {
    detail::check_signature<R, A>();
    std::string name = detail::registered_name(reinterpret_cast<detail::erased_function>(fn));
    std::vector<encoded> tasks;
    tasks.reserve(items.size());
    for (const auto& item : items) tasks.push_back(encode(std::tuple<std::decay_t<A>>(item)));
    return {std::move(name), std::move(tasks)};
  }

  // The state; std::logic_error for a pool moved from, or made by the
  // process this one was forked from.
  detail::pool_state& state() const;
  std::unique_ptr<detail::pool_state> state_;
};

}  // namespace cohort

COHORT_API_END

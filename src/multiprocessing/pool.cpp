// cohort::pool: a group of workers of cohort's own entry point, fed items
// through one queue and answering through another.
#include "cohort/pool.hpp"

#include "cohort/process_error.hpp"
#include "cohort/storage.hpp"
#include "launch/entry.hpp"
#include "process/launch.hpp"
#include "launch/uncaught.hpp"
#include "os/process_identity.hpp"
#include "shm/segment.hpp"

#include <asio/detail/strand_executor_service.hpp>
#include <asio/error.hpp>
#include <asio/execution_context.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

namespace cohort {

namespace detail {

// item, function, arguments, and the storages the arguments' handles name:
// the queue holds them while in flight and the worker that takes the item
// takes them over, so they outlive a map that is cancelled (or taken back
// by the pool's end) while that worker has still to decode its item.
using pool_task = std::tuple<std::uint64_t, std::string, std::vector<std::byte>, std::vector<storage>>;
// item, returned, result or error, and the storages the result's handles name
using pool_outcome = std::tuple<std::uint64_t, bool, std::vector<std::byte>, std::vector<storage>>;

// How long a worker waits for an item before it gives back the shared
// memory it keeps for reuse.
constexpr std::chrono::milliseconds idle_trim_after{100};

// Runs items until the task queue is closed. A result goes with the
// storages its handles name, which the queue holds while in flight and the
// parent takes over: the worker keeps nothing of it. It returns a value
// only so that a worker ending early with code 0 (an item that
// called exit) is a failure of its rank, which ends the pool: a void
// function's rank that exits 0 has simply finished, and the map would wait
// for its item for good. A worker whose parent has died (a pool whose
// workers do not die with it: parent_death_signal 0) ends, returning 1 and
// saying nothing: nobody is left to report to, and its end is no failure
// of its own.
int cohort_pool_worker(int worker, queue<pool_task> tasks, queue<pool_outcome> results) try {
  for (;;) {
    std::optional<pool_task> task;
    try {
      task = tasks.get(idle_trim_after);
      if (!task) {
        // Idle: the memory of results the parent has dropped goes back now,
        // not at this worker's next allocation.
        try {
          trim_shared_memory();
        } catch (const std::bad_alloc&) {
          // Left for the next trim, or allocation.
        }
        task = tasks.get();
      }
    } catch (const queue_closed&) {
      return 0;
    }
    // `holds` keeps the item's storages until its result is sent.
    auto& [item, name, bytes, holds] = *task;
    try {
      auto result = call_entry(name, worker, encoded::from_bytes(std::move(bytes)));
      std::vector<std::byte> out;
      std::vector<storage> holds;
      if (result) {
        out.assign(result->bytes().begin(), result->bytes().end());
        holds = held_storages(*result);
      }
      results.put({item, true, std::move(out), std::move(holds)});
    } catch (...) {
      // Any exception, std:: or not, fails the item and leaves the worker.
      const auto text = current_exception_message();
      const auto* first = reinterpret_cast<const std::byte*>(text.data());
      results.put({item, false, std::vector<std::byte>(first, first + text.size()), {}});
    }
  }
} catch (const peer_lost&) {
  // The parent, the one producer of items and consumer of results, has
  // gone (an item's own peer_lost fails only that item, above).
  return 1;
}
using pool_queues = std::tuple<queue<pool_task>, queue<pool_outcome>>;

// The worker's thunk: it decodes the queues apart from the worker's run. A
// worker that starts after its parent has died finds their shared memory
// gone with it, and ends as one whose parent dies while it waits for an
// item does (above), where the entry point's own thunk would report the
// loss as the rank's failure, on its stderr.
std::optional<encoded> pool_worker_thunk(erased_function /*cohort_pool_worker*/, int worker, const encoded& args) {
  std::optional<pool_queues> queues;
  try {
    queues.emplace(decode<pool_queues>(args));
  } catch (const shm::segment_gone& e) {
    if (!os::has_ended_or_is_ending(e.source(), 0)) throw;
    return encode(1);
  }
  auto& [tasks, results] = *queues;
  return encode(cohort_pool_worker(worker, std::move(tasks), std::move(results)));
}

[[maybe_unused]] const bool pool_worker_registered = register_entry(
    "cohort_pool_worker", reinterpret_cast<erased_function>(&cohort_pool_worker), &pool_worker_thunk);

// Set while a map is run here only to fail at once, run() throwing it:
// one made as the pool was ending, run by run_detached on the caller's
// thread (a map made before, whose thread reaches run() once the end has
// begun, was cut short by it), or one whose turn came while no thread could
// be started, run by pass_turn.
thread_local std::exception_ptr refusal;

// How the pool's end came: its destruction lets the workers finish the item
// in hand; terminate() ends them at once.
enum class end_kind { none, destroyed, terminated };

constexpr const char* terminated_message =
    "cohort::pool: the pool was terminated: its workers were ended, and no map runs on it";

// The pool whose map (or whose end's refused maps) this thread runs: an end
// called from there must not wait for another end, which joins this thread.
thread_local const pool_state* map_thread_of = nullptr;

// Runs `job` with `why` as its refusal.
void run_refused(const std::function<void()>& job, std::exception_ptr why) {
  struct refusing {
    explicit refusing(std::exception_ptr why) noexcept { refusal = std::move(why); }
    ~refusing() { refusal = nullptr; }
  } scope(std::move(why));
  job();
}

// The maps waiting their turn, first made first. Shared with the tickets,
// so that a cancel coming after the pool has gone finds it.
struct map_line {
  explicit map_line(pool_state* owner) : pool(owner) {}
  std::mutex mutex;
  pool_state* pool;      // null once the pool's end has begun
  bool taken = false;    // a map has the turn
  std::deque<std::shared_ptr<map_ticket>> waiting;
  std::condition_variable turn_given;  // to blocking maps waiting
  // Asynchronous maps' places in the order they had their turns, and how
  // many have handed their handlers over: each hands its own over once
  // `handed` reaches its place. The pool's end lets the rest go as they come.
  std::uint64_t placed = 0;
  std::uint64_t handed = 0;
  std::condition_variable hand_off;
};

}  // namespace detail

struct detail::map_ticket {
  // Set by pool_cancel, from any thread; read by the map as it runs, which
  // only polls it (relaxed: it carries no data).
  std::atomic<bool> cancelled{false};
  std::weak_ptr<map_line> line;
  // Under the line's mutex. The job (which holds the ticket) goes as the
  // map leaves the line.
  std::function<void()> job;  // an asynchronous map's, while in line; empty for a blocking one
  bool turn = false;          // given the turn: it runs, then passes it on
  std::uint64_t place = 0;    // with the turn: its place among the hand-overs
  bool handed = false;        // its handler has been handed over
};

namespace detail {

class pool_state {
 public:
  pool_state(int workers, const pool_options& options)
      : maker_(os::this_process()), workers_(workers), tasks_(1024), results_(1024), work_(io_.get_executor()) {
    if (workers < 1) throw std::invalid_argument("cohort::pool: at least one worker");
    refuse_piped_streams(options.spawn, "cohort::pool: pool_options::spawn");
    // The one producer of items from the start: a worker waiting for its
    // first item ends once this process has gone.
    queue_join_as_producer(queue_access::core(tasks_));
    group_spec spec;
    spec.name = "pool";
    spec.entry = call(options.method, cohort_pool_worker, tasks_, results_);
    spec.nprocs = workers;
    spec.options = options.spawn;
    spec.shutdown = options.shutdown;
    group_ = start_processes(io_.get_executor(), spec);
    runner_ = std::thread([this] { io_.run(); });
  }

  ~pool_state() { end(end_kind::destroyed); }

  // Ends the pool, once: the maps in line and in flight fail as `how` says,
  // and the workers leave. Destroyed, they finish the item in hand first;
  // terminated, the group's shutdown ends them at once. A later call waits
  // for the first to finish, unless it comes from a thread of the pool's
  // maps (a handler), which the first one may be joining.
  void end(end_kind how) noexcept {
    {
      std::unique_lock lock(end_mutex_);
      if (end_begun_) {
        if (map_thread_of != this) end_done_.wait(lock, [&] { return ended_; });
        return;
      }
      end_begun_ = true;
    }
    std::vector<detached_map> in_flight;
    std::deque<std::shared_ptr<map_ticket>> waiting;
    {
      // From here, a map that a handler starts fails at once (run_detached):
      // it could not run, and must not wait for this end, which waits for it.
      std::lock_guard lock(line_->mutex);
      ending_.store(how, std::memory_order_relaxed);
      line_->pool = nullptr;
      in_flight.swap(detached_);
      waiting.swap(line_->waiting);
      for (auto& ticket : waiting) {
        if (!ticket->job) ticket->turn = true;  // a blocking map: it sees the end
      }
      line_->turn_given.notify_all();
      line_->hand_off.notify_all();
    }
    // Closed before the take-back: a map still running pushes its next item
    // before the close, where the take-back finds it, or not at all; one
    // pushed between the two would run during the end.
    tasks_.close();
    take_back_tasks();
    // Workers in the middle of an item are ended by the group's shutdown
    // (SIGTERM, then SIGKILL, as pool_options::shutdown says), and the maps
    // waiting for them see the group end. The memory of stop()'s dispatch
    // failing leaves no way to end them: std::terminate, as noexcept says.
    if (how == end_kind::terminated) group_.stop();
    // Asynchronous maps still in line fail as the end cut the one ahead
    // short, in their order, on one thread.
    std::vector<std::function<void()>> refused;
    for (auto& ticket : waiting) {
      if (ticket->job) refused.push_back(std::exchange(ticket->job, nullptr));
    }
    if (!refused.empty()) {
      in_flight.push_back({std::thread([this, refused = std::move(refused)] {
        map_thread_of = this;
        for (const auto& job : refused) job();
      }), nullptr});
    }
    // Maps in flight end: their workers finish and leave, or have died.
    // A handler of one of them may be what destroys the pool (its last
    // reference): that thread is not joined by itself; nothing it runs
    // after the handler touches the pool.
    for (auto& map : in_flight) {
      if (map.thread.get_id() == std::this_thread::get_id()) {
        map.thread.detach();
      } else {
        map.thread.join();
      }
    }
    // Results nobody will read (a cancelled map's, taken before the
    // cancel) are drained meanwhile: a worker blocked putting one into a
    // full queue would never return.
    while (!group_.join(std::chrono::milliseconds(10))) drain_results();
    work_.reset();
    runner_.join();  // the group ends when every worker has returned
    {
      std::lock_guard lock(end_mutex_);
      ended_ = true;
    }
    end_done_.notify_all();
  }

  void drain_results() noexcept {
    try {
      while (results_.try_pop()) {
      }
    } catch (...) {
      // Its memory is gone, or a value could not be read: nothing left to drain.
    }
  }

  // Items no worker has taken yet do not run: a cancelled map's are not
  // worked through before the next map's, and a pool going away lets each
  // worker finish only the item in hand (which could otherwise block on
  // results nobody reads any more).
  void take_back_tasks() noexcept {
    try {
      while (tasks_.try_pop()) {
      }
    } catch (...) {
      // Closed and empty, or its memory is gone: nothing left to take back.
    }
  }

  std::vector<std::optional<encoded>> run(const std::string& name, const std::vector<encoded>& args,
                                          map_ticket* ticket) {
    // Taken once: a handler the refused map's completion runs here must not
    // find it.
    if (refusal) std::rethrow_exception(std::exchange(refusal, nullptr));
    const std::atomic<bool>* cancelled = nullptr;
    if (ticket == nullptr) {
      wait_turn();
    } else {
      cancelled = &ticket->cancelled;
      // Started without the turn: it left the line cancelled, or the
      // pool's end took it out.
      if (!ticket->turn) {
        if (cancelled->load(std::memory_order_relaxed)) {
          throw std::system_error(asio::error::operation_aborted, "cohort::pool::map");
        }
        throw_ended();
      }
    }
    struct passing {
      pool_state& pool;
      ~passing() { pool.pass_turn(); }
    } pass{*this};
    // A map made before the pool's end began, which had not begun.
    if (ending()) throw_ended();
    if (broken_) throw std::logic_error("cohort::pool: a worker has died; the pool is over");
    std::vector<std::optional<encoded>> out(args.size());
    std::optional<std::string> error;
    // Items are numbered across maps: results of a cancelled map that
    // arrive later belong to no item of this one and are dropped.
    const std::uint64_t first = next_item_;
    next_item_ += args.size();
    try {
      receive_all(name, args, cancelled, first, out, error);
    } catch (...) {
      // A map that ends early (cancelled, a result that cannot be received,
      // an item that cannot be sent) leaves none of its items to run before
      // the next map's.
      take_back_tasks();
      throw;
    }
    if (error) throw std::runtime_error(*error);
    return out;
  }

  int workers() const noexcept { return workers_; }
  pid_t maker() const noexcept { return maker_; }

 private:
  // Whether a worker has ended or begun to exit: the group has ended, or a
  // worker's pid names no process, a zombie or one exiting. Judged by the
  // pid alone: one the supervisor has reaped may, rarely, name a process
  // started since, and the failure is then thrown as it is.
  bool a_worker_has_ended() const {
    if (group_.result()) return true;
    const auto pids = group_.pids();
    return std::any_of(pids.begin(), pids.end(), [](pid_t pid) { return os::has_ended_or_is_ending(pid, 0); });
  }

  // Sends the items numbered from `first` and receives their results into
  // `out`, the first item's error into `error`.
  void receive_all(const std::string& name, const std::vector<encoded>& args, const std::atomic<bool>* cancelled,
                   std::uint64_t first, std::vector<std::optional<encoded>>& out, std::optional<std::string>& error) {
    std::size_t sent = 0, received = 0;
    while (received < args.size()) {
      if (cancelled != nullptr && cancelled->load(std::memory_order_relaxed)) {
        throw std::system_error(asio::error::operation_aborted, "cohort::pool::map");
      }
      if (sent < args.size()) {
        const auto bytes = args[sent].bytes();
        bool pushed = false;
        try {
          pushed = tasks_.try_push(
              {first + sent, name, std::vector<std::byte>(bytes.begin(), bytes.end()), held_storages(args[sent])});
        } catch (const queue_closed&) {
          throw_ended();  // closed by the pool's end
        }
        if (pushed) {
          ++sent;
          continue;
        }
      }
      std::optional<pool_outcome> outcome;
      try {
        outcome = results_.get(std::chrono::milliseconds(50));
      } catch (const peer_lost&) {
        // A worker died with its result unread: the group's end tells how.
      } catch (...) {
        // A result that could not be received otherwise while a worker has
        // ended (its memory went with the worker, say) is that death too,
        // and the pool ends with the worker's failure, not with this one.
        if (!a_worker_has_ended()) throw;
      }
      if (!outcome) {
        if (!group_.join(std::chrono::milliseconds(0))) continue;
        broken_ = true;
        // The workers' deaths are terminate()'s doing, not failures.
        if (terminated()) throw_ended();
        auto result = group_.result().value();
        throw_first_failure(result);
        if (ending()) throw_ended();
        throw std::logic_error("cohort::pool: the workers ended");
      }
      auto& [number, returned, bytes, holds] = *outcome;
      if (number < first) continue;  // from a cancelled map
      const std::uint64_t item = number - first;
      if (item >= out.size()) throw std::logic_error("cohort::pool: a result for no item");
      ++received;
      if (!returned) {
        if (!error) error = fmt::format("cohort::pool: item {} raised {}", item, std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
      } else if (!bytes.empty()) {
        out[item] = encoded::from_bytes(std::move(bytes));
        if (!holds.empty()) {
          encoded_holds::set(*out[item], std::make_shared<const std::vector<storage>>(std::move(holds)));
        }
      }
    }
  }

 public:
  // A map the pool's end cut short (its items not yet taken were taken
  // back, and the workers have left), or, after terminate(), any map.
  [[noreturn]] void throw_ended() const {
    throw ended_error("cohort::pool: the pool was destroyed before the map's items were all worked through");
  }

  // After terminate() every map fails with the same words; while the
  // pool is being destroyed, `why` says what the map met.
  std::logic_error ended_error(const char* why) const {
    if (terminated()) return std::logic_error(terminated_message);
    return std::logic_error(why);
  }

  std::shared_ptr<map_ticket> ticket() const {
    auto made = std::make_shared<map_ticket>();
    made->line = line_;
    return made;
  }

  void run_detached(const std::shared_ptr<map_ticket>& ticket, std::function<void()> job) {
    std::unique_lock lock(line_->mutex);
    if (ending()) {
      auto error = std::make_exception_ptr(ended_error("cohort::pool: map while the pool is ending"));
      lock.unlock();
      // It fails at once, in run(), and completes its handler with that.
      run_refused(job, error);
      return;
    }
    if (ticket->cancelled.load(std::memory_order_relaxed)) {
      start(job);  // it fails at once as aborted
    } else if (!line_->taken && line_->waiting.empty()) {
      line_->taken = true;
      give_turn(*ticket);
      try {
        start(job);
      } catch (...) {
        // No thread for it: the map fails as it is made, and the line is as
        // it was, for the maps made next.
        ticket->turn = false;
        --line_->placed;
        line_->taken = false;
        throw;
      }
    } else {
      line_->waiting.push_back(ticket);
      ticket->job = std::move(job);
    }
  }

  // A map waiting its turn leaves the line, and runs at once to fail as
  // aborted. Under the line's mutex, the pool's end not begun.
  void cancel_waiting(const std::shared_ptr<map_ticket>& ticket) {
    const auto it = std::find(line_->waiting.begin(), line_->waiting.end(), ticket);
    if (it == line_->waiting.end()) return;  // running, or over
    start(ticket->job);
    ticket->job = nullptr;
    line_->waiting.erase(it);
  }

 private:
  // Blocks until a blocking map has the turn.
  void wait_turn() {
    std::unique_lock lock(line_->mutex);
    if (!line_->taken && line_->waiting.empty()) {
      line_->taken = true;
      return;
    }
    auto ticket = std::make_shared<map_ticket>();
    line_->waiting.push_back(ticket);
    line_->turn_given.wait(lock, [&] { return ticket->turn; });
  }

  // The turn goes to the map made next, if any. One whose thread cannot be
  // started fails with why, once the turn has gone on past it: here, at
  // once, outside the lock (its handler, if it runs here, may make a map).
  void pass_turn() noexcept {
    std::vector<std::pair<std::function<void()>, std::exception_ptr>> refused;
    {
      std::lock_guard lock(line_->mutex);
      for (;;) {
        if (line_->waiting.empty()) {
          line_->taken = false;
          break;
        }
        auto next = line_->waiting.front();
        if (next->job) {
          give_turn(*next);  // before its thread reads it
          try {
            start(next->job);
          } catch (...) {
            next->turn = false;
            --line_->placed;
            try {
              refused.emplace_back(std::move(next->job), std::current_exception());
            } catch (...) {
              break;  // no memory to fail it: left in line, for a cancel or the pool's end
            }
            next->job = nullptr;
            line_->waiting.pop_front();
            continue;
          }
          next->job = nullptr;
        } else {
          next->turn = true;
          line_->turn_given.notify_all();
        }
        line_->waiting.pop_front();
        break;
      }
    }
    for (auto& [job, why] : refused) run_refused(job, why);
  }

  // An asynchronous map's turn, and its place among the hand-overs. Under
  // the line's mutex.
  void give_turn(map_ticket& ticket) {
    ticket.turn = true;
    ticket.place = line_->placed++;
  }

  // Runs `job` on a thread of the pool. Under the line's mutex.
  void start(const std::function<void()>& job) {
    // Threads of maps that have ended are joined here, so they do not pile up.
    std::erase_if(detached_, [](detached_map& d) {
      if (!d.done->load(std::memory_order_acquire)) return false;
      d.thread.join();
      return true;
    });
    detached_.reserve(detached_.size() + 1);
    auto done = std::make_shared<std::atomic<bool>>(false);
    std::thread thread;
    try {
      thread = std::thread([this, job, done] {
        map_thread_of = this;
        job();
        done->store(true, std::memory_order_release);
      });
    } catch (const std::system_error& e) {
      throw std::system_error(e.code(), "cohort::pool::map: starting the thread that runs the map");
    }
    detached_.push_back({std::move(thread), done});
  }

 private:
  const pid_t maker_;  // the process whose workers these are
  int workers_;
  queue<pool_task> tasks_;
  queue<pool_outcome> results_;
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  group group_;
  std::thread runner_;
  // One map at a time: the one with the turn.
  std::shared_ptr<map_line> line_ = std::make_shared<map_line>(this);
  bool broken_ = false;          // with the turn
  std::uint64_t next_item_ = 0;  // with the turn
  struct detached_map {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;  // set as its job returns
  };
  std::vector<detached_map> detached_;  // under the line's mutex
  // Set, under the line's mutex, as the pool's end begins. Read relaxed by
  // maps that have the turn: a map seeing the group ended by terminate()
  // sees it set, ordered by the group's own lock between the two.
  std::atomic<end_kind> ending_{end_kind::none};
  bool ending() const noexcept { return ending_.load(std::memory_order_relaxed) != end_kind::none; }
  bool terminated() const noexcept { return ending_.load(std::memory_order_relaxed) == end_kind::terminated; }
  // The pool's end runs once (end()).
  std::mutex end_mutex_;
  std::condition_variable end_done_;
  bool end_begun_ = false;  // under end_mutex_
  bool ended_ = false;      // under end_mutex_
};

std::shared_ptr<map_ticket> pool_ticket(pool_state& pool) { return pool.ticket(); }

void pool_cancel(std::shared_ptr<map_ticket> ticket) noexcept {
  ticket->cancelled.store(true, std::memory_order_relaxed);
  const auto line = ticket->line.lock();
  if (!line) return;
  std::lock_guard lock(line->mutex);
  if (line->pool == nullptr) return;  // the pool's end fails the maps in line
  try {
    line->pool->cancel_waiting(ticket);
  } catch (...) {
    // No thread for it: it fails as aborted when its turn comes.
  }
}

void pool_await_hand_off(map_ticket& ticket) {
  if (!ticket.turn) return;
  const auto line = ticket.line.lock();
  if (!line) return;
  std::unique_lock lock(line->mutex);
  line->hand_off.wait(lock, [&] { return line->handed >= ticket.place || line->pool == nullptr; });
}

void pool_handed_off(map_ticket& ticket) noexcept {
  if (!ticket.turn) return;
  const auto line = ticket.line.lock();
  if (!line) return;
  {
    std::lock_guard lock(line->mutex);
    if (ticket.handed) return;
    ticket.handed = true;
    // Past the pool's end a later map may have gone first.
    line->handed = std::max(line->handed, ticket.place + 1);
  }
  line->hand_off.notify_all();
}

std::vector<std::optional<encoded>> pool_run(pool_state& pool, const std::string& name,
                                             const std::vector<encoded>& tasks, map_ticket* ticket) {
  return pool.run(name, tasks, ticket);
}

void pool_run_detached(pool_state& pool, const std::shared_ptr<map_ticket>& ticket, std::function<void()> job) {
  pool.run_detached(ticket, std::move(job));
}

namespace {

// Orphans, as its execution context shuts down, the completions of maps
// that would hand their handlers to it: an io_context destroyed with a map
// in flight destroys the map's handler then, as it destroys those of its
// own operations, and the map's end leaves it alone.
class completion_service final : public asio::execution_context::service {
 public:
  static asio::execution_context::id id;
  explicit completion_service(asio::execution_context& context) : service(context) {}

  void watch(const std::weak_ptr<pending_completion>& completion) {
    std::lock_guard lock(mutex_);
    if (watched_.size() >= prune_at_) {  // let go of the settled ones, as often as the list doubles
      std::erase_if(watched_, [](const std::weak_ptr<pending_completion>& w) { return w.expired(); });
      prune_at_ = std::max<std::size_t>(64, watched_.size() * 2);
    }
    watched_.push_back(completion);
  }

 private:
  void shutdown() override {
    // Orphaned outside the list's lock: a handler destroyed there may start
    // a map, whose completion comes to watch().
    for (;;) {
      std::vector<std::weak_ptr<pending_completion>> watched;
      {
        std::lock_guard lock(mutex_);
        watched.swap(watched_);
      }
      if (watched.empty()) return;
      for (const auto& weak : watched) {
        if (const auto completion = weak.lock()) completion->orphan();
      }
    }
  }

  std::mutex mutex_;
  std::vector<std::weak_ptr<pending_completion>> watched_;  // under mutex_
  std::size_t prune_at_ = 64;
};

asio::execution_context::id completion_service::id;

}  // namespace

void watch_completion(asio::execution_context& context, const std::weak_ptr<pending_completion>& completion) {
  if (!asio::has_service<completion_service>(context)) {
    // A context shuts its services down last made first. A strand's service
    // made after the watch would shut down before it, and a map ending in
    // between would have its handler destroyed on the map's thread, beside
    // the strand's own: it is made first, so that the watch goes before it.
    (void)asio::use_service<asio::detail::strand_executor_service>(context);
  }
  asio::use_service<completion_service>(context).watch(completion);
}

}  // namespace detail

pool::pool(int workers, const pool_options& options)
    : state_(std::make_unique<detail::pool_state>(workers, options)) {}
pool::pool(pool&&) noexcept = default;

namespace {

// A forked child's copy of its parent's pool is never destroyed: its end
// would close the parent's queues, take back the parent's items and wait
// for workers and a thread that are the parent's alone.
void let_go(std::unique_ptr<detail::pool_state>& state) noexcept {
  if (state && state->maker() != os::this_process()) (void)state.release();
}

}  // namespace

pool& pool::operator=(pool&& other) noexcept {
  if (this != &other) {
    let_go(state_);
    state_ = std::move(other.state_);
  }
  return *this;
}

pool::~pool() { let_go(state_); }

void pool::terminate() noexcept {
  if (state_ && state_->maker() == os::this_process()) state_->end(detail::end_kind::terminated);
}

int pool::workers() const noexcept { return state_ ? state_->workers() : 0; }

detail::pool_state& pool::state() const {
  if (!state_) throw std::logic_error("cohort::pool: used after it was moved from");
  if (state_->maker() != os::this_process()) {
    throw std::logic_error(fmt::format(
        "cohort::pool: this pool's workers are process {}'s, which this process was forked from; a forked child "
        "makes a pool of its own",
        state_->maker()));
  }
  return *state_;
}

}  // namespace cohort

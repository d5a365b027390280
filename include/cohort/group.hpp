// Supervised groups of processes: N ranks of one program or function, and
// the first failure shutting the rest down.
#pragma once

#include "cohort/export.hpp"

#include "cohort/child.hpp"
#include "cohort/command.hpp"
#include "cohort/compiler.hpp"
#include "cohort/completion_token.hpp"
#include "cohort/encoding.hpp"
#include "cohort/entry_point.hpp"
#include "cohort/exit_status.hpp"
#include "cohort/logs.hpp"
#include "cohort/spawn.hpp"
#include "cohort/timeout.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <csignal>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

COHORT_API_BEGIN

namespace cohort {

/// How a group is shut down once a rank fails (or stop() is called):
/// `grace` for the others to finish on their own, SIGTERM to every live
/// rank's process group, `term_grace` for them to exit, SIGKILL to them and
/// to every process started under the group, then at most `kill_wait` more.
/// A shutdown started by a signal X that group::forward_signals() caught
/// (or group::interrupt(X)) has no `grace`: X itself goes to every live rank's process group at once,
/// then `term_grace`; SIGTERM to the ranks still running and another
/// `term_grace` (both skipped when X is SIGTERM); then SIGKILL and
/// `kill_wait` as above. What survives even that (a process stuck in the
/// kernel, D state) is reported in the result and reaped in the background,
/// never waited for. A negative wait is refused as the group starts
/// (std::invalid_argument), and so is a `kill_wait` of 0: SIGKILL takes a
/// moment to end a process, and with no wait every rank it ended would be
/// reported unreaped, as one stuck in the kernel.
struct shutdown_policy {
  std::chrono::milliseconds grace{0};
  std::chrono::milliseconds term_grace{std::chrono::seconds(30)};
  std::chrono::milliseconds kill_wait{std::chrono::seconds(5)};
};

/// What the ranks of a group run: a program, or a registered function
/// (cohort::call), which rank r runs as fn(r, args...).
using entry_point = std::variant<command, function_call>;

/// N ranks of one program or function.
struct group_spec {
  std::string name = "default";  ///< the role, used in messages
  entry_point entry;             ///< what every rank runs
  int nprocs = 1;
  /// Extra program arguments per rank, after the command's own. Empty, or
  /// keys exactly 0..nprocs-1. Only for a command: a function's arguments
  /// are in its call.
  std::map<int, std::vector<std::string>> args{};
  /// Environment variables per rank, set on top of options.env. Empty, or
  /// keys exactly 0..nprocs-1.
  std::map<int, std::map<std::string, std::string>> envs{};
  /// Everything else about how each rank starts (working directory, stdio,
  /// base environment...); shared by all ranks.
  spawn_options options{};
  shutdown_policy shutdown{};
  /// Threads that start ranks by re-execution (programs, and functions by
  /// spawn) at the same time: 0 for one per CPU (at most 8), 1 for one
  /// rank after another. fork and forkserver ranks are prepared first and
  /// made back to back by the calling thread whatever this says.
  unsigned start_threads = 0;
  /// Where the ranks' error files go: <error_dir>/<rank>/error.json (the
  /// folders are made at start, a stale error.json is removed), named to each
  /// rank in COHORT_ERROR_FILE and TORCHELASTIC_ERROR_FILE as absolute
  /// paths (a relative error_dir is read from this process's working
  /// directory at start, whatever options.cwd says). Empty: files in
  /// the user's directory, $TMPDIR/cohort-errors-<uid> (mode 0700, kept;
  /// $TMPDIR unset, empty, missing or not writable: the next of $TEMP,
  /// $TMP, /tmp, /var/tmp, /usr/tmp and the working directory that is, as
  /// Python's tempfile takes them), named for this process, the group and
  /// the rank, removed once the run has ended and its state is gone: the
  /// group object destroyed and every wait() on it done (for a group
  /// destroyed before its run ended, also the shutdown that its
  /// destruction starts run by the io_context; rank_failure::error_file
  /// can be read until then); those of a process killed outright go at
  /// the first start of a group in a later process. A group of this
  /// process whose state lives on (see above) holds its error_dir: a start
  /// given the same one (the same folder by any path, or the same logs'
  /// attempt folder, whatever the error_dirs) throws std::invalid_argument
  /// before it makes or truncates any file, as its reports and logs would
  /// overwrite and be read as the other's. Groups of other processes are
  /// not told apart: give each its own.
  std::filesystem::path error_dir{};
  /// Per-rank log files, tee to the console, line prefixes (see
  /// logs_spec). When logs.dir is set and error_dir is not, the error files
  /// go into the logs' attempt folder: <attempt_dir>/<rank>/error.json.
  logs_spec logs{};
};

/// A rank that failed on its own (not by the group's shutdown).
struct rank_failure {
  int rank = 0;
  pid_t pid = 0;
  exit_status status;
  /// From the rank's error file, when it wrote one (cohort::record_error,
  /// or torch's @record): "<type>: <what>", and the stack trace.
  std::string message;
  std::string trace;
  /// The error file the rank was given (COHORT_ERROR_FILE), whether or not
  /// it wrote one; in the user's error directory it is removed once the
  /// run has ended and the group object is destroyed.
  std::filesystem::path error_file;
  /// When the error happened (the error file's timestamp), else when the
  /// supervisor saw the exit. A timestamp in whole seconds (torch's error
  /// files) counts as the end of its second, or the exit if that came
  /// first, so that failures order as they happened.
  std::chrono::system_clock::time_point timestamp;
  /// What kept the supervisor from seeing how the rank ended; empty as a
  /// rule. "cohort: waiting for the rank's exit: ..." when its wait failed
  /// (the rank reaped elsewhere, as by another thread's waitpid(-1)), and
  /// "cohort: reading the rank's result: ..." when the value its function
  /// returned could not be read. The rank counts as failed, its `status`
  /// 255 (not its own), and `message` and `trace` stay what the rank itself
  /// reported (empty unless it wrote an error file): nothing was raised.
  std::string supervisor_error;
};

/// How a group's run ended.
struct run_result {
  /// Per rank, in rank order; nullopt for a rank never reaped (see unreaped).
  std::vector<std::optional<exit_status>> statuses;
  /// Ranks that failed on their own, in the order they were seen. A rank
  /// the shutdown's signals ended is not among them; one reaped after the
  /// shutdown's first signal is, when the report it wrote (its error
  /// file's timestamp, whole seconds taken at their latest) is dated
  /// before that signal: it failed before the shutdown reached it.
  std::vector<rank_failure> failures;
  /// Per rank, in rank order: what the rank's function returned (decode it
  /// with as<T>()); nullopt for programs, void functions and ranks that failed.
  /// A rank whose function returns a value and that exited with code 0
  /// without returning (exit() inside it) failed: never a silent nullopt.
  std::vector<std::optional<encoded>> return_values;
  /// Ranks still alive after SIGKILL and kill_wait (in D state, or dead
  /// with a tracer holding their exit): reported, not waited for. A thread
  /// reaps each whenever it ends; the io_context's run() does not wait.
  std::vector<int> unreaped;
  /// The run was shut down by stop(), by cancelling wait() or by a
  /// forwarded signal (or interrupt()), not by a failure. A request that
  /// came once every rank had ended stopped nothing: false then.
  bool stopped = false;
  /// The signal that ended the run, when forward_signals() or interrupt()
  /// turned one into the shutdown; also one that came once every rank had
  /// ended but before the run's end (while it still waited for the
  /// console), which only ended that wait (`stopped` false), and one that
  /// came after stop(), which it hurried. One that comes after the run has
  /// ended (join() or wait() has returned) is not recorded.
  std::optional<int> signal;
  /// Log files that could not be written to the end (a full disk), and a
  /// console that refused its lines (a pipe whose reader has gone).
  std::vector<std::string> log_errors;
  /// Why the run's end could not look for, or hold, each of the run's other
  /// processes (the ranks' children, `setsid` ones included) to kill them:
  /// this process had no descriptor left (RLIMIT_NOFILE) for the whole of
  /// the end's sweep. Those it could not find may live on. Empty when it
  /// could. (Those handed to this process as their parents die are ended
  /// even then, through a descriptor the supervisor keeps aside.)
  std::string sweep_error;

  /// No failure: every rank exited with code 0 (a function rank after its
  /// function returned), none was left unreaped, and the run was not
  /// stopped.
  bool ok() const noexcept { return failures.empty() && unreaped.empty() && !stopped; }
  /// The earliest failure by timestamp (the first seen among equals);
  /// nullptr when none.
  const rank_failure* first_failure() const noexcept {
    const rank_failure* first = nullptr;
    for (const auto& f : failures) {
      if (first == nullptr || f.timestamp < first->timestamp) first = &f;
    }
    return first;
  }
};

namespace detail {
struct group_state;
}

/// A running group. Supervision starts with the group and goes on whether or
/// not anyone waits: a rank's failure shuts the others down by itself.
/// Destroying the group object stops the group (as stop()) and leaves the
/// shutdown to finish on the io_context. Once the run has ended there is
/// nothing to stop: the run's state goes with the group object, or with
/// the last wait() on it, whether or not the io_context runs again.
class group {
 public:
  group() noexcept;
  group(group&&) noexcept;
  group& operator=(group&&) noexcept;
  ~group();

  /// Waits until every rank has ended and returns how the run went; an
  /// asio asynchronous operation completing as void(std::exception_ptr,
  /// run_result), by default an asio::awaitable<run_result> that starts
  /// lazily, when awaited. It runs on the group's executor; the handler runs
  /// on its own associated executor. Cancelling the wait (through the
  /// token's cancellation slot) shuts the group down as a failure would; the
  /// wait then ends, after the shutdown, with
  /// std::system_error(operation_aborted). Only terminal cancellation
  /// reaches it, as a child's wait not awaited on the child's executor:
  /// partial and total cancellation are ignored, and the wait goes on. Any
  /// number of waits may be in flight at once. Once the io_context the group runs on has been
  /// destroyed, the wait of an ended run gives its result on the handler's
  /// executor, and that of a run not ended throws std::logic_error. A wait
  /// in flight as that io_context is destroyed runs there, and goes with it:
  /// its handler is destroyed without being called (an awaiting coroutine
  /// never resumes), as asio's own pending operations are. In a process
  /// that fork() made during the run, the copy's wait of a run not ended,
  /// like its join(), stop(), send_signal(), interrupt() and
  /// forward_signals(), throws std::logic_error: the run is the starting
  /// process's.
  template <completion_token_of<run_result> Token = default_token>
  [[nodiscard]] auto wait(Token&& token = {}) {
    // Asked as the wait starts, which a lazy token does later: the
    // io_context may be gone by then.
    return detail::async_awaitable<run_result>(
        [state = state_] { return executor_of(state); },
        [state = state_](const asio::any_io_executor&) { return wait_for(state); }, std::forward<Token>(token));
  }
  /// Blocks the calling thread for at most `timeout`; true once every rank
  /// has ended (the result is then in result()). The io_context must run on
  /// another thread meanwhile.
  bool join(std::chrono::milliseconds timeout);
  /// The same with a timeout of any duration type: one too long to count in
  /// milliseconds (hours::max()) waits without end.
  template <class Rep, class Period>
  bool join(std::chrono::duration<Rep, Period> timeout) {
    return join(detail::saturating_cast<std::chrono::milliseconds>(timeout));
  }
  /// The result, once the run has ended.
  std::optional<run_result> result() const;
  /// The ranks' pids, in rank order.
  std::vector<pid_t> pids() const;
  /// Starts the shutdown now. Thread-safe. Once the io_context the group
  /// runs on has been destroyed, stop(), send_signal(), interrupt(),
  /// forward_signals() and join() (of a run not ended) throw
  /// std::logic_error: nothing is left to run them; destroying the group
  /// ends its ranks.
  void stop();
  /// Sends `sig` to every live rank's process group (to the rank alone when
  /// it leads none), the run going on, as forward_signals() does with the
  /// signals it passes on. Thread-safe; nothing once every rank has ended.
  void send_signal(int sig);
  /// Starts the shutdown as a shutdown signal `sig` caught by
  /// forward_signals() does (see there): for a program that takes its
  /// signals itself (sigwaitinfo, signalfd, its own asio::signal_set) and
  /// hands them on. A later call, or one after stop(), hurries the shutdown
  /// to SIGKILL. Thread-safe; std::invalid_argument for SIGKILL and SIGSTOP.
  void interrupt(int sig);
  /// Until the run ends, signals in `passed_on` that reach this process are
  /// sent on to every live rank's process group, and a signal X in
  /// `shutdown_signals` starts the shutdown (the result's `signal` records
  /// X): X itself goes at once to every live rank's process group (a Python
  /// rank gets KeyboardInterrupt for SIGINT, and its `finally` blocks run),
  /// then `term_grace` for the ranks to exit; those still running get
  /// SIGTERM and another `term_grace` (unless X is SIGTERM, already sent),
  /// then SIGKILL as in shutdown_policy. A second shutdown signal skips what
  /// is left of the waits: SIGKILL at once. The first one caught again
  /// within 100 ms is the same one passed on, not a second (a terminal's
  /// Ctrl-C reaching `timeout N program`, which sends it on to the program
  /// and its process group), as cohort-run counts it. A shutdown started by a failure
  /// keeps its own sequence (a shutdown signal then is only recorded); after
  /// stop(), one counts as the second. Replaces the handlers of those
  /// signals in this process while the run lasts (asio::signal_set), and
  /// puts back after it what the process had before (a handler, SIG_IGN),
  /// unless another asio::signal_set still holds the signal. Call once per
  /// group. std::invalid_argument for SIGKILL and SIGSTOP, and for SIGCHLD,
  /// which each rank's exit sends this process.
  void forward_signals(std::vector<int> shutdown_signals, std::vector<int> passed_on = {});
  /// The same with SIGINT, SIGTERM, SIGHUP and SIGQUIT as the shutdown
  /// signals (an overload rather than a braced default argument, which g++
  /// 12 refuses inside a co_await expression).
  void forward_signals();

  explicit group(std::shared_ptr<detail::group_state> state) noexcept;

 private:
  static asio::awaitable<run_result> wait_for(std::shared_ptr<detail::group_state> state);
  /// Where a wait runs: the group's strand; none without a group, or for
  /// an ended run whose io_context is gone. Throws std::logic_error for a
  /// run not ended whose io_context is gone.
  static std::optional<asio::any_io_executor> executor_of(const std::shared_ptr<detail::group_state>& state);
  std::shared_ptr<detail::group_state> state_;
};

#if COHORT_AWAIT_TEMPORARY_BUG
/// Refused at compile time on g++ 12 and older, which destroy a group_spec
/// temporary inside a co_await expression twice (cohort/compiler.hpp): its
/// maps would be freed twice. A named group_spec is taken by the overloads
/// above.
template <class Token = default_token>
auto start_processes(group_spec&& spec, Token&& token = {}) {
  static_assert(detail::refused<Token>,
                "g++ 12 destroys a group_spec temporary twice inside co_await (std::move of a named one is "
                "refused too): name the group_spec "
                "first, `group_spec spec{...}; co_await start_processes(spec);`");
  return start_processes(static_cast<const group_spec&>(spec), std::forward<Token>(token));
}
#endif

/// Starts the ranks now; supervision runs on `executor` (an io_context's).
group start_processes(const asio::any_io_executor& executor, const group_spec& spec);
#if COHORT_AWAIT_TEMPORARY_BUG
/// Refused at compile time on g++ 12 and older, which destroy a group_spec
/// temporary twice when the call is part of a co_await expression
/// (`co_await start_processes(executor, group_spec{...}).wait()`). Refused
/// everywhere, since the call cannot tell whether it is inside one; a named
/// group_spec is taken by the overload above.
template <class Refused = void>
group start_processes(const asio::any_io_executor& executor, group_spec&& spec) {
  static_assert(detail::refused<Refused>,
                "g++ 12 destroys a group_spec temporary twice inside co_await (std::move of a named one is "
                "refused too): name the group_spec first, `group_spec spec{...}; "
                "start_processes(executor, spec);`");
  return start_processes(executor, static_cast<const group_spec&>(spec));
}
#endif

namespace detail {
asio::awaitable<group> start_processes_on(asio::any_io_executor executor, group_spec spec);
}

/// Starts the ranks of `spec`; an asio asynchronous operation completing as
/// void(std::exception_ptr, group) once every rank runs, by default an
/// asio::awaitable<group> that starts lazily, when awaited. Supervision runs
/// on the handler's associated executor, which must be an io_context's (the
/// awaiting coroutine's for use_awaitable; bind one with asio::bind_executor
/// for a callback or asio::use_future, or pass the executor first); given
/// a handler that names none, and no executor, the call throws
/// std::invalid_argument (see cohort/completion_token.hpp). Bad rank
/// maps (missing or extra keys), nprocs < 1, and launch failures fail it
/// before anything keeps running: ranks already started are killed and
/// reaped. This process becomes a child subreaper (PR_SET_CHILD_SUBREAPER),
/// so descendants that leave their rank's process group (setsid) are still
/// found and ended with the run. Not all of them when the ranks share this
/// process's process group (options.new_process_group and new_session
/// false; a program, `spawn` or `fork` rank: a `forkserver` rank is in the
/// server's group then): this process's own children are in that group
/// too, and a child a rank left behind at its end is this process's child
/// like them, so an orphan handed over inside that group is left alone.
/// What a rank leaves there is ended only when its initial environment
/// (/proc/<pid>/environ) carries the group's marker: a fork of a program
/// or `spawn` rank, and a program executed with the environment it
/// inherited from a rank; not a program given an environment of its own,
/// nor a fork of a `fork` rank that executes nothing. Or when a shutdown
/// starts while its rank still runs: it is found by parent links then.
/// `spec` is copied
/// when the operation is made. A cancellation of any type (terminal,
/// partial or total) emitted before the operation runs starts no rank, and
/// it completes with asio::error::operation_aborted. The launch blocks the
/// thread it runs on; once it runs, cancellation has nothing to stop.
template <completion_token_of<group> Token = default_token>
[[nodiscard]] auto start_processes(const group_spec& spec, Token&& token = {}) {
  return detail::async_awaitable_stoppable_until_started<group>(
      "cohort::start_processes", std::nullopt,
      // Made once per operation: its copy of the spec moves on into the start.
      [spec](asio::any_io_executor executor) mutable {
        return detail::start_processes_on(std::move(executor), std::move(spec));
      },
      std::forward<Token>(token));
}
/// As above, supervision on `executor` (an io_context's).
template <completion_token_of<group> Token>
[[nodiscard]] auto start_processes(const asio::any_io_executor& executor, const group_spec& spec, Token&& token) {
  return detail::async_awaitable_stoppable_until_started<group>(
      "cohort::start_processes", executor,
      [spec](asio::any_io_executor where) mutable {
        return detail::start_processes_on(std::move(where), std::move(spec));
      },
      std::forward<Token>(token));
}

#if COHORT_AWAIT_TEMPORARY_BUG
/// Refused at compile time on g++ 12 and older, as the form without an
/// executor is (above).
template <class Token>
auto start_processes(const asio::any_io_executor& executor, group_spec&& spec, Token&& token) {
  static_assert(detail::refused<Token>,
                "g++ 12 destroys a group_spec temporary twice inside co_await (std::move of a named one is "
                "refused too): name the group_spec "
                "first, `group_spec spec{...}; co_await start_processes(executor, spec, token);`");
  return start_processes(executor, static_cast<const group_spec&>(spec), std::forward<Token>(token));
}
#endif

}  // namespace cohort

COHORT_API_END

// Launching child processes.
#pragma once

#include "cohort/export.hpp"

#include "cohort/child.hpp"
#include "cohort/command.hpp"
#include "cohort/compiler.hpp"
#include "cohort/environment.hpp"
#include "cohort/exit_status.hpp"
#include "cohort/stdio.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>

#include <csignal>
#include <filesystem>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

COHORT_API_BEGIN

namespace cohort {

/// How to start a child. Every descriptor cohort opens is close-on-exec, so
/// concurrent spawns from other threads never leak them into other children.
struct spawn_options {
  environment env{};              ///< default: this process's environment
  /// Empty: this process's working directory. The child moves there before
  /// its exec, so a relative program path, and the program's search along
  /// the relative entries of PATH, start from it, as execvp there would.
  /// Unlike execvp, and as posix_spawnp, a file with no #! line that is not
  /// of an executable format is not run with /bin/sh: its spawn fails
  /// (ENOEXEC) saying so.
  std::filesystem::path cwd{};
  stdio in = stdio::inherit();
  stdio out = stdio::inherit();
  stdio err = stdio::inherit();
  /// The child leads a new process group (setpgid(0, 0)), so the group it
  /// starts can be signalled as one (child::signal_group). That group is
  /// not the terminal's foreground group: a child that reads the
  /// controlling terminal it inherited (stdin a terminal of this process's
  /// session), or writes to it where the terminal has `tostop` set, is
  /// stopped by SIGTTIN (SIGTTOU), and its wait, join() and run() then wait
  /// for good (they see exits only). For an interactive child set this to
  /// false; otherwise give it another stdin (stdio::null(), a file, a pipe).
  /// A group's rank started without it shares this process's group, and
  /// not everything it leaves behind is ended with the run (group.hpp,
  /// start_processes).
  bool new_process_group = true;
  /// The child leads a new session (setsid()), and with it a new process
  /// group, whatever new_process_group says. It then has no controlling
  /// terminal: it reads and writes a terminal it shares with this process
  /// as any other file, never stopped by job control (SIGTTIN, SIGTTOU;
  /// a debugger's prompt, input()), and the terminal's Ctrl-C and Ctrl-Z
  /// reach it only as this process passes them on. torchrun starts its
  /// workers so.
  bool new_session = false;
  /// Sent to the child when the *thread* that spawned it exits (Linux's
  /// PR_SET_PDEATHSIG follows the thread, not the process): spawn from
  /// threads that live as long as the children, such as the io_context's.
  /// 0 disables it.
  int parent_death_signal = SIGKILL;
  /// Close every descriptor but 0, 1, 2 and `keep_fds` in the child.
  bool close_other_fds = true;
  /// Descriptors (>= 3) the child inherits under the same numbers.
  std::vector<int> keep_fds{};
  /// The caller's own set-up of the child, for what these options do not
  /// cover (setrlimit, nice, namespaces, CPU affinity): called in the child
  /// as `before_exec(before_exec_context)` after the set-up above (process
  /// group, streams, working directory, descriptors) and just before exec,
  /// or before a function rank's function. The child is vfork-style: it
  /// shares the parent's memory and may run while the parent holds locks,
  /// so the hook must be noexcept, allocate nothing and make only
  /// async-signal-safe calls. Before a program's exec it runs on a small
  /// stack of its own: it may use 48 KiB of it, no more (a large buffer
  /// belongs in memory the caller provides through the context). It
  /// returns 0, or an errno value that fails the launch: the spawn throws
  /// std::system_error with that value, naming the hook, and no process is
  /// left behind. -1 fails it with errno's value, as C's calls fail (EINVAL
  /// where errno is 0), and another negative value -e with e. A child that
  /// dies before its exec (a hook that overruns its stack, killed by
  /// SIGSEGV) or ends there by itself (the hook's _exit) fails the launch
  /// too, with ESRCH and a message that says how
  /// it ended. `before_exec_context` is passed
  /// as is and must stay valid until the spawn returns. Refused
  /// (std::invalid_argument) by the forkserver start method, whose children
  /// are forked by another program.
  int (*before_exec)(void* context) noexcept = nullptr;
  void* before_exec_context = nullptr;
};

namespace detail {
asio::awaitable<child> spawn_on(asio::any_io_executor executor, command cmd, spawn_options options);
}

/// Starts `cmd`; an asio asynchronous operation completing as
/// void(std::exception_ptr, child) with the child running, by default an
/// asio::awaitable<child> that starts lazily, when awaited. The child's wait
/// and pipes run on the handler's associated executor, which must be an
/// io_context's (the awaiting coroutine's for use_awaitable; bind one with
/// asio::bind_executor for a callback or asio::use_future, or pass the
/// executor first); given a handler that names none, and no executor, the
/// call throws std::invalid_argument and starts nothing (see
/// cohort/completion_token.hpp). Fails with std::system_error naming the program and the
/// cause when it cannot start (not found, not executable, bad working
/// directory, a file that cannot be opened, a failing before_exec hook,
/// EMFILE with the descriptor limit, arguments past the kernel's limits);
/// no process is left behind then.
/// `options` is copied when the operation is made. A cancellation of any
/// type (terminal, partial or total) emitted before the operation runs
/// starts nothing, and it completes with asio::error::operation_aborted.
/// The launch itself blocks the thread it runs on until the child has
/// exec'd; once it runs, cancellation has nothing to stop.
template <completion_token_of<child> Token = default_token>
[[nodiscard]] auto spawn(command cmd, const spawn_options& options, Token&& token = {}) {
  return detail::async_awaitable_stoppable_until_started<child>(
      "cohort::spawn", std::nullopt, [cmd = std::move(cmd), options](asio::any_io_executor executor) {
        return detail::spawn_on(std::move(executor), cmd, options);
      }, std::forward<Token>(token));
}
template <completion_token_of<child> Token = default_token>
[[nodiscard]] auto spawn(command cmd, Token&& token = {}) {
  return detail::async_awaitable_stoppable_until_started<child>(
      "cohort::spawn", std::nullopt, [cmd = std::move(cmd)](asio::any_io_executor executor) {
        const spawn_options defaults;
        return detail::spawn_on(std::move(executor), cmd, defaults);
      }, std::forward<Token>(token));
}
/// As above, the child's wait and pipes on `executor` (an io_context's).
template <completion_token_of<child> Token>
[[nodiscard]] auto spawn(const asio::any_io_executor& executor, command cmd, const spawn_options& options,
                         Token&& token) {
  return detail::async_awaitable_stoppable_until_started<child>(
      "cohort::spawn", executor, [cmd = std::move(cmd), options](asio::any_io_executor where) {
        return detail::spawn_on(std::move(where), cmd, options);
      }, std::forward<Token>(token));
}

#if COHORT_AWAIT_TEMPORARY_BUG
/// Refused at compile time on g++ 12 and older, which destroy a
/// spawn_options temporary inside a co_await expression twice
/// (cohort/compiler.hpp). A named spawn_options is taken by the overload
/// above.
template <class Token = default_token>
auto spawn(command cmd, spawn_options&& options, Token&& token = {}) {
  static_assert(detail::refused<Token>,
                "g++ 12 destroys a spawn_options temporary twice inside co_await (std::move of a named one is "
                "refused too): name the options "
                "first, `spawn_options options{...}; co_await spawn(cmd, options);`");
  return spawn(std::move(cmd), static_cast<const spawn_options&>(options), std::forward<Token>(token));
}
/// The same for the form that takes an executor and a token. (The
/// error_code form is refused below.)
template <class Token>
  requires(!std::is_same_v<std::remove_cvref_t<Token>, std::error_code>)
auto spawn(const asio::any_io_executor& executor, command cmd, spawn_options&& options, Token&& token) {
  static_assert(detail::refused<Token>,
                "g++ 12 destroys a spawn_options temporary twice inside co_await (std::move of a named one is "
                "refused too): name the options "
                "first, `spawn_options options{...}; co_await spawn(executor, cmd, options, token);`");
  return spawn(executor, std::move(cmd), static_cast<const spawn_options&>(options), std::forward<Token>(token));
}
#endif

/// Starts `cmd` now; its wait and pipes run on `executor` (an io_context's).
child spawn(const asio::any_io_executor& executor, const command& cmd, const spawn_options& options);
child spawn(const asio::any_io_executor& executor, const command& cmd,
            const spawn_options& options, std::error_code& ec);
#if COHORT_AWAIT_TEMPORARY_BUG
/// Refused at compile time on g++ 12 and older, which destroy a
/// spawn_options temporary twice when the call is part of a co_await
/// expression (`co_await spawn(executor, cmd, {...}).wait()`). Refused
/// everywhere, since the call cannot tell whether it is inside one; a named
/// spawn_options is taken by the overloads above.
template <class Refused = void>
child spawn(const asio::any_io_executor& executor, const command& cmd, spawn_options&& options) {
  static_assert(detail::refused<Refused>,
                "g++ 12 destroys a spawn_options temporary twice inside co_await (std::move of a named one is "
                "refused too): name the options first, `spawn_options options{...}; "
                "spawn(executor, cmd, options);`");
  return spawn(executor, cmd, static_cast<const spawn_options&>(options));
}
template <class Refused = void>
child spawn(const asio::any_io_executor& executor, const command& cmd, spawn_options&& options,
            std::error_code& ec) {
  static_assert(detail::refused<Refused>,
                "g++ 12 destroys a spawn_options temporary twice inside co_await (std::move of a named one is "
                "refused too): name the options first, `spawn_options options{...}; "
                "spawn(executor, cmd, options, ec);`");
  return spawn(executor, cmd, static_cast<const spawn_options&>(options), ec);
}
#endif
/// With default options. (An overload, not a default argument: g++ 12
/// would destroy a defaulted `{}` twice in `co_await spawn(executor,
/// cmd).wait()`.)
inline child spawn(const asio::any_io_executor& executor, const command& cmd) {
  const spawn_options defaults;
  return spawn(executor, cmd, defaults);
}

/// Starts `cmd` and blocks until it exits. Pipes are refused
/// (std::invalid_argument): nothing would read them.
exit_status run(const command& cmd, const spawn_options& options);
exit_status run(const command& cmd, const spawn_options& options, std::error_code& ec);
#if COHORT_AWAIT_TEMPORARY_BUG
/// Refused at compile time on g++ 12 and older, as spawn's are (above):
/// `co_await f(run(cmd, {...}).code())` destroys the options twice.
template <class Refused = void>
exit_status run(const command& cmd, spawn_options&& options) {
  static_assert(detail::refused<Refused>,
                "g++ 12 destroys a spawn_options temporary twice inside co_await (std::move of a named one is "
                "refused too): name the options first, `spawn_options options{...}; run(cmd, options);`");
  return run(cmd, static_cast<const spawn_options&>(options));
}
template <class Refused = void>
exit_status run(const command& cmd, spawn_options&& options, std::error_code& ec) {
  static_assert(detail::refused<Refused>,
                "g++ 12 destroys a spawn_options temporary twice inside co_await (std::move of a named one is "
                "refused too): name the options first, `spawn_options options{...}; run(cmd, options, ec);`");
  return run(cmd, static_cast<const spawn_options&>(options), ec);
}
#endif
/// With default options (an overload, as spawn's above).
inline exit_status run(const command& cmd) {
  const spawn_options defaults;
  return run(cmd, defaults);
}

}  // namespace cohort

COHORT_API_END

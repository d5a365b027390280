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
#include <utility>
#include <vector>

COHORT_API_BEGIN

namespace cohort {

/// How to start a child. Every descriptor cohort opens is close-on-exec, so
/// concurrent spawns from other threads never leak them into other children.
struct spawn_options {
  environment env{};              ///< default: this process's environment
  std::filesystem::path cwd{};    ///< empty: this process's working directory
  stdio in = stdio::inherit();
  stdio out = stdio::inherit();
  stdio err = stdio::inherit();
  /// The child leads a new process group (setpgid(0, 0)), so the group it
  /// starts can be signalled as one (child::signal_group).
  bool new_process_group = true;
  /// Sent to the child when the *thread* that spawned it exits (Linux's
  /// PR_SET_PDEATHSIG follows the thread, not the process): spawn from
  /// threads that live as long as the children, such as the io_context's.
  /// 0 disables it.
  int parent_death_signal = SIGKILL;
  /// Close every descriptor but 0, 1, 2 and `keep_fds` in the child.
  bool close_other_fds = true;
  /// Descriptors (>= 3) the child inherits under the same numbers.
  std::vector<int> keep_fds{};
};

/// Starts `cmd` on the calling coroutine's executor. The child is running
/// when this returns. Throws std::system_error naming the program and the
/// cause when it cannot start (not found, not executable, bad working
/// directory, a file that cannot be opened, EMFILE with the descriptor
/// limit); no process is left behind then. Starts lazily, when awaited:
/// `options` is read then, so it must outlive that first await (it does when
/// the spawn is awaited in the statement that names it).
[[nodiscard]] asio::awaitable<child> spawn(command cmd, const spawn_options& options);
[[nodiscard]] asio::awaitable<child> spawn(command cmd);

#if COHORT_AWAIT_TEMPORARY_BUG
/// Refused at compile time on g++ 12 and older, which destroy a
/// spawn_options temporary inside a co_await expression twice
/// (cohort/compiler.hpp). A named spawn_options is taken by the overload
/// above.
template <class Refused = spawn_options>
asio::awaitable<child> spawn(command cmd, spawn_options&& options) {
  static_assert(detail::refused<Refused>,
                "g++ 12 destroys a spawn_options temporary twice inside co_await: name the options "
                "first, `spawn_options options{...}; co_await spawn(cmd, options);`, or call "
                "spawn(executor, cmd, options), which is not awaited");
  return spawn(std::move(cmd), static_cast<const spawn_options&>(options));
}
#endif

/// Starts `cmd` now; its wait and pipes run on `executor` (an io_context's).
child spawn(const asio::any_io_executor& executor, const command& cmd,
            const spawn_options& options = {});
child spawn(const asio::any_io_executor& executor, const command& cmd,
            const spawn_options& options, std::error_code& ec);

/// Starts `cmd` and blocks until it exits. Pipes are refused
/// (std::invalid_argument): nothing would read them.
exit_status run(const command& cmd, const spawn_options& options = {});
exit_status run(const command& cmd, const spawn_options& options, std::error_code& ec);

}  // namespace cohort

COHORT_API_END

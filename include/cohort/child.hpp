// A running child process, owned through its pidfd.
#pragma once

#include "cohort/export.hpp"

#include "cohort/completion_token.hpp"
#include "cohort/exit_status.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/readable_pipe.hpp>
#include <asio/writable_pipe.hpp>

#include <sys/types.h>

#include <memory>
#include <optional>
#include <system_error>

COHORT_API_BEGIN

namespace cohort {

namespace detail {
struct child_state;
struct child_access;
}  // namespace detail

/// One child process. The object owns the child through a pidfd, so it can
/// never signal or reap a recycled pid.
///
/// Destroying (or assigning over) a child that is still running kills it with
/// SIGKILL and reaps it, unless it was detach()ed; if a wait() is in flight,
/// that wait reaps it when it ends, however it ends. A child in
/// uninterruptible sleep (D state) delays that reap until the kernel lets it
/// die.
///
/// The child is the spawning process's alone. In a process that fork()
/// made from it, a copy of the object (or of a coroutine frame or an
/// io_context that holds one) kills nothing and reaps nothing as it goes,
/// detach() only lets go of it, and wait(), join(), try_wait(), signal()
/// and signal_group() fail with errc::no_child_process (ECHILD), saying
/// whose child it is.
///
/// Like asio's I/O objects, one child object must not be used from two
/// threads at once.
class child {
 public:
  child() noexcept;  ///< no process
  child(child&&) noexcept;
  child& operator=(child&&) noexcept;
  ~child();

  /// Whether this object holds a process (spawned, not moved from or detached).
  explicit operator bool() const noexcept { return state_ != nullptr; }
  pid_t pid() const noexcept;
  /// The pidfd; -1 without a process. Owned by this object.
  int native_handle() const noexcept;

  /// Waits for the child to exit and reaps it; an asio asynchronous
  /// operation completing as void(std::exception_ptr, exit_status), by
  /// default an asio::awaitable<exit_status> that starts lazily, when
  /// awaited. It runs on the executor the child was spawned on; the handler
  /// runs on its own associated executor. Once reaped, every later wait
  /// returns the same status at once. Cancellation (asio per-operation
  /// cancellation, through the token's cancellation slot) stops the wait and
  /// leaves the child running and waitable: it completes with
  /// std::system_error(operation_aborted). Awaited by a coroutine on the
  /// child's executor, the wait is that coroutine's own operation, so its
  /// cancellation filter decides which cancellation types reach it
  /// (terminal only, by default); otherwise only terminal cancellation
  /// does. Fails with std::logic_error while another wait() is in flight.
  /// Throws std::logic_error once the io_context the child was spawned on
  /// has been destroyed (join() and try_wait() still reap it). A wait in
  /// flight as that io_context is destroyed never completes: as asio does
  /// with every operation outstanding on an io_context it destroys, its
  /// handler is destroyed without being called, even one bound to another,
  /// live executor (a coroutine awaiting it there is never resumed, and its
  /// frame is destroyed), and the child is left unreaped for join(),
  /// try_wait() or the object's end. A child that
  /// died while another process traces it (ptrace) is this process's to
  /// reap only once the tracer has collected its exit or gone; until then
  /// the wait looks again at pauses growing to 100 ms.
  template <completion_token_of<exit_status> Token = default_token>
  [[nodiscard]] auto wait(Token&& token = {}) {
    if constexpr (std::is_same_v<std::decay_t<Token>, default_token>) {
      return wait_awaited(state_);
    } else {
      return wait_spawned(state_, std::forward<Token>(token));
    }
  }
  /// Blocks the calling thread until the child exits, and reaps it.
  exit_status join();
  exit_status join(std::error_code& ec);
  /// Reaps the child if it has exited; never blocks.
  std::optional<exit_status> try_wait();
  std::optional<exit_status> try_wait(std::error_code& ec);
  /// The status, once reaped.
  std::optional<exit_status> status() const noexcept;

  /// Sends `signal` through the pidfd (pidfd_send_signal). Does nothing once
  /// the child has exited. Throws std::system_error (EINVAL) for a bad
  /// signal number, exited or not.
  void signal(int signal);
  void signal(int signal, std::error_code& ec);
  /// To every process in the child's process group (killpg). Only for
  /// children started as group leaders (the default; otherwise
  /// errc::invalid_argument). Does nothing once reaped.
  void signal_group(int signal);
  void signal_group(int signal, std::error_code& ec);

  /// Lets the child run on its own: it is no longer killed when this object
  /// goes, and is reaped in the background once it exits. That background
  /// wait is work of the io_context it was spawned on: run() does not return
  /// before the child has exited; destroying the io_context first leaves the
  /// child unreaped. Its pipes are closed here. Afterwards this object holds
  /// no process. Throws std::logic_error, and keeps the process, once that
  /// io_context has been destroyed: nothing would reap the child.
  void detach();

  /// The parent ends of the pipes the spawn options asked for. Throw
  /// std::logic_error when that stream is not a pipe, or when the io_context
  /// the child was spawned on (theirs) has been destroyed: their
  /// descriptors were closed then, so that a child reading its stdin sees
  /// its end, and one writing to a full pipe gets EPIPE (or SIGPIPE) rather
  /// than waiting for good, and join() returns. A write to in() after
  /// the child has closed its stdin (or exited) is a write to a pipe with
  /// no reader: the kernel raises SIGPIPE in the writing thread, whose
  /// default action ends this process. A program that writes to children
  /// ignores SIGPIPE (`signal(SIGPIPE, SIG_IGN)`, as Python does), and the
  /// write then fails with asio::error::broken_pipe. The child starts with
  /// SIGPIPE at its default either way.
  asio::writable_pipe& in();
  asio::readable_pipe& out();
  asio::readable_pipe& err();

  /// Used by spawn(): adopts a launched process.
  explicit child(std::shared_ptr<detail::child_state> state) noexcept;

 private:
  static asio::awaitable<exit_status> wait_for(std::shared_ptr<detail::child_state> state);
  /// wait() for the default token: an awaiting coroutine that runs on the
  /// child's executor awaits wait_for directly, one coroutine and one
  /// dispatch fewer on the way from the exit to its resumption; any other
  /// goes through wait_spawned.
  static asio::awaitable<exit_status> wait_awaited(std::shared_ptr<detail::child_state> state);
  template <class Token>
  static auto wait_spawned(std::shared_ptr<detail::child_state> state, Token&& token) {
    // Asked as the wait starts, which a lazy token does later: the
    // io_context may be gone by then.
    return detail::async_awaitable<exit_status>(
        [state] { return executor_of(state); },
        [state](const asio::any_io_executor&) { return wait_for(state); }, std::forward<Token>(token));
  }
  /// The executor the child was spawned on; none without a process.
  static std::optional<asio::any_io_executor> executor_of(const std::shared_ptr<detail::child_state>& state);
  void release() noexcept;
  friend struct detail::child_access;
  std::shared_ptr<detail::child_state> state_;
};

}  // namespace cohort

COHORT_API_END

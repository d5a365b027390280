// What a child object and its in-flight operations share.
#pragma once

#include "cohort/child.hpp"
#include "cohort/exit_status.hpp"
#include "os/process_identity.hpp"
#include "process/owned_pids.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/readable_pipe.hpp>
#include <asio/writable_pipe.hpp>

#include <sys/types.h>

#include <memory>
#include <optional>
#include <system_error>

namespace cohort::detail {

/// Held by the child object and by each operation in flight on it, so an
/// operation outlives the object that started it. Closes the pidfd when the
/// last holder lets go. The pid is owned (own_pid) from here until reaped or
/// the last holder lets go. A copy of it that fork() made acts on the
/// process in no way: the process is the spawning process's child, not the
/// copy's (see here()).
struct child_state {
  child_state(asio::any_io_executor ex, pid_t p, int fd) : executor(std::move(ex)), pid(p), pidfd(fd) { own_pid(pid); }
  child_state(const child_state&) = delete;
  child_state& operator=(const child_state&) = delete;
  ~child_state();

  /// Reaps through the pidfd (waitid with rusage). Without `block`, returns
  /// nullopt while the child runs. Sets `status`. ECHILD when someone else
  /// reaped it (a waitpid(-1) elsewhere in the process), or when this is a
  /// forked process's copy (not here()).
  std::optional<exit_status> reap(bool block, std::error_code& ec);

  /// Whether the io_context of `executor` has been destroyed: nothing of
  /// it (the executor, the pipes' reactor) may be touched then.
  bool context_gone() const noexcept { return context.expired(); }

  /// Whether this is the process that spawned the child, not a copy of it
  /// that fork() made: the copy's pidfd still reaches the child, but the
  /// child is not its to kill or reap.
  bool here() const noexcept { return owner == os::this_process(); }

  asio::any_io_executor executor;
  std::weak_ptr<const void> context;  ///< context_lifetime(executor)
  pid_t owner = os::this_process();  ///< the process that spawned it
  pid_t pid;
  int pidfd;
  std::optional<exit_status> status;
  /// Who reaps the process once no child object holds it.
  enum class keeper {
    object,    ///< the child object (or a wait in flight on its behalf)
    killed,    ///< the object went while a wait was in flight: reap after the kill
    detached,  ///< detach()ed while a wait was in flight: reap in the background
  };

  bool group_leader = false;  ///< started with new_process_group
  bool waiting = false;       ///< a wait() is in flight; it reaps, or hands over to `kept_by`
  bool on_a_thread = false;   ///< reap_on_a_thread's thread reaps it, and lets go of the pid
  keeper kept_by = keeper::object;
  /// The parent's ends of the pipes, as asio objects of the io_context.
  /// Should it be destroyed first, their descriptors are closed as it shuts
  /// down (watch_pipes) and the objects left undestroyed: their destructors
  /// would reach its reactor.
  std::unique_ptr<asio::writable_pipe> in;
  std::unique_ptr<asio::readable_pipe> out;
  std::unique_ptr<asio::readable_pipe> err;
  /// Closes the pipes (see above).
  void close_pipes() noexcept;
};

/// Has the io_context of `state`'s executor close the descriptors of its
/// pipes as it shuts down: nothing can use them after (the child's in(),
/// out() and err() throw), and a child reading its stdin to the end, or
/// writing more than a pipe holds, would otherwise never exit while the
/// object lives. Call once the pipes are made.
void watch_pipes(const std::shared_ptr<child_state>& state);

/// Expires when the io_context behind `executor` is destroyed (as it shuts
/// its services down). Makes no ring: a service of its own holds it.
std::weak_ptr<const void> context_lifetime(const asio::any_io_executor& executor);

/// Waits for `state`'s process to exit and reaps it (`status` set); the
/// error where the wait or the reap failed (operation_aborted when
/// cancelled). A child that died while another process traces it is
/// looked at again at pauses growing to 100 ms, until the tracer lets go.
asio::awaitable<std::error_code> until_reaped(std::shared_ptr<child_state> state);

/// Reaps `state`'s process once it exits, with no child object left: a wait
/// on its executor keeps the state alive until then. Dropped, unreaped, if
/// the io_context is destroyed first.
void reap_in_background(const std::shared_ptr<child_state>& state);

/// Reaps `state`'s process whenever it exits, on a thread of its own that
/// waits in waitid: for a process that SIGKILL has not ended (in D state,
/// or dead with a tracer holding its exit), which nobody should wait for,
/// not even an io_context's run(). Closes its pipes. A wait in flight on
/// the state must be cancelled: it would go on looking. The pid stays
/// owned until that thread reaps it. Where no thread can be started, it is
/// reaped as reap_in_background does.
void reap_on_a_thread(const std::shared_ptr<child_state>& state);

/// Whether this process ignores SIGCHLD (SIG_IGN or SA_NOCLDWAIT): the
/// kernel then reaps its children as they exit, their statuses lost.
bool kernel_reaps_children() noexcept;

/// The state behind a child object, for the layers that hand a process on.
struct child_access {
  /// Takes it: the object is left holding no process, as after detach().
  static std::shared_ptr<child_state> take(child& c) noexcept { return std::move(c.state_); }
};

}  // namespace cohort::detail

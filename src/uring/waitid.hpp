// waitid on a pidfd: IORING_OP_WAITID (opcode 50, Linux 6.7), or readiness
// of the pidfd on the reactor followed by waitid(WNOHANG).
#pragma once

#include "config.hpp"
#include "uring/async.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>

#include <optional>
#include <system_error>
#include <utility>

namespace cohort::uring {

/// Whether the process behind `pidfd` is still this thread's to reap
/// (running, or exited and unreaped); asked with WNOWAIT, so it stays so.
inline bool unreaped(int pidfd) {
  siginfo_t info{};
  return ::waitid(static_cast<idtype_t>(config::p_pidfd), static_cast<id_t>(pidfd), &info,
                  WEXITED | WNOHANG | WNOWAIT) == 0;
}

/// One look at the child behind `pidfd`, with `options` and WNOHANG (a
/// reap, without WNOWAIT): its siginfo, or the error; nothing while it
/// has not exited.
inline std::optional<std::pair<std::error_code, siginfo_t>> look(int pidfd, int options) {
  siginfo_t info{};
  if (::waitid(static_cast<idtype_t>(config::p_pidfd), static_cast<id_t>(pidfd), &info, options | WNOHANG) != 0) {
    return std::pair{std::error_code(errno, std::system_category()), info};
  }
  if (info.si_pid == 0) return std::nullopt;
  return std::pair{std::error_code{}, info};
}

/// The ring part. The request carries no siginfo address and always
/// WNOWAIT: the kernel writes nothing into this process's memory, and the
/// child stays waitable until result() looks at it from this thread, with
/// the caller's own options (a reap, without WNOWAIT there). Completion:
/// res 0 once the child has exited; -ECHILD when the process is not our
/// child or was reaped elsewhere; -ECANCELED when cancelled.
///
/// Why no address: a process that ends with the request in flight has it
/// cancelled by a kernel worker, once its descriptors close. Linux (seen
/// on 6.18) then writes the zeroed siginfo through whatever address space
/// that worker last borrowed, which can be another process's: a forked
/// sibling, whose heap lies at the same addresses, had freed chunks zeroed
/// (si_signo, si_errno, si_code, then si_pid, si_uid, si_status).
struct waitid_ring {
  int pidfd;
  int options;

  void prepare(io_uring_sqe& sqe) const {
    io_uring_prep_rw(config::op_waitid, &sqe, pidfd, nullptr, config::p_pidfd, 0);
    sqe.file_index = static_cast<unsigned>(options | WNOWAIT);
  }
  std::pair<std::error_code, siginfo_t> result(int res) const {
    if (res < 0) return {error_from_res(res), siginfo_t{}};
    // Seen exited by the ring, yet not by the look: reported, not waited
    // on again.
    return look(pidfd, options)
        .value_or(std::pair{std::make_error_code(std::errc::resource_unavailable_try_again), siginfo_t{}});
  }
  /// When the submitting thread exits, a pending waitid fails with -ECHILD
  /// (looked at from a kernel worker, which has no children), not with
  /// -ECANCELED. It is told apart from a child really reaped elsewhere by
  /// asking again from this thread. Harmless to repeat: the request never
  /// reaps (WNOWAIT). (With a siginfo address, the worker's failed write
  /// made it -EFAULT; there is none now.)
  bool orphaned(int res) const { return res == -ECHILD && unreaped(pidfd); }
};

/// The reactor part: the pidfd reads ready once the process has exited.
struct waitid_attempt {
  static constexpr bool never_blocks = true;  // WNOHANG: tried once first (async_start)
  int pidfd;
  pid_t pid;
  int options;

  /// A second pidfd of the same process, for the reactor to watch and make
  /// non-blocking (a non-blocking pidfd fails a blocking waitid with
  /// EAGAIN, so the caller's own stays as it is); -1 when none can be had.
  /// Opened by pid, so it is checked against the caller's pidfd: while that
  /// one's process is still unreaped, the pid was not recycled, and the new
  /// pidfd is of the same process.
  int own_descriptor() const {
    const int own = config::pidfd_open(pid);
    if (own < 0) return -1;
    if (!unreaped(pidfd)) {
      ::close(own);  // reaped elsewhere: the attempt reports it
      return -1;
    }
    return own;
  }

  std::optional<std::pair<std::error_code, siginfo_t>> operator()() const { return look(pidfd, options); }
};

/// Waits for the process behind `pidfd` (process `pid`, a child of this
/// process) to exit; completes with `void(std::error_code, siginfo_t)`.
/// `options` is WEXITED plus WNOWAIT to leave the child waitable. The pidfd
/// must stay open until completion.
template <class Token>
auto async_waitid(const asio::any_io_executor& executor, int pidfd, pid_t pid, int options, Token&& token) {
  return async_start<siginfo_t>(executor, service_of(executor).caps().waitid, waitid_ring{pidfd, options},
                                pidfd, POLLIN, waitid_attempt{pidfd, pid, options}, std::forward<Token>(token));
}

/// The ring part of async_exited: the completion says it all, with no
/// look after it.
struct exit_ring : waitid_ring {
  std::pair<std::error_code, siginfo_t> result(int res) const { return {error_from_res(res), siginfo_t{}}; }
};

/// The reactor part of async_exited: waitid_attempt's, except that the
/// watch reading ready says it all. A pidfd reads ready once its process
/// has exited and stays so, so the exit needs no waitid to confirm it.
struct exit_attempt : waitid_attempt {
  std::pair<std::error_code, siginfo_t> once_ready() const { return {std::error_code{}, siginfo_t{}}; }
};

/// Waits for the process behind `pidfd` (process `pid`, a child of this
/// process) to exit, leaving it to be reaped; completes with
/// `void(std::error_code, siginfo_t)`. For a caller that reaps next: the
/// siginfo is the kernel's where a first look saw the exit, and empty
/// where the ring or the reactor's watch did. The pidfd must stay open
/// until completion.
template <class Token>
auto async_exited(const asio::any_io_executor& executor, int pidfd, pid_t pid, Token&& token) {
  constexpr int options = WEXITED | WNOWAIT;
  return async_start<siginfo_t>(executor, service_of(executor).caps().waitid, exit_ring{{pidfd, options}}, pidfd,
                                POLLIN, exit_attempt{{pidfd, pid, options}}, std::forward<Token>(token));
}

}  // namespace cohort::uring

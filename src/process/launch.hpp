// The launch of a child, split so that other ways of starting a process
// (fork, a forkserver) share what spawn prepares: the descriptors, the
// environment block, the set-up in the child and the adoption of the result.
#pragma once

#include "cohort/exit_status.hpp"
#include "cohort/spawn.hpp"
#include "os/raw_syscall.hpp"
#include "process/child_state.hpp"

#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/types.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace cohort::detail {

/// Where a launch failed; names the cause in the exception.
enum class stage {
  none, path_lookup, open_file, pipe, clone, signals, inherit, setpgid, setsid, pdeathsig, dup2, chdir, fds, hook, exec,
  start,
  reactor,  ///< asio's reactor for the io_context could not be brought up (see ready_to_wait)
  died  ///< a vfork-style child ended before its exec without saying why (a signal: the hook overran its stack)
};

/// What a child made by another process than the one that asks for it (a
/// forkserver's ranks) takes of the asker, where a fork or an exec by the
/// asker would have handed it on: the signals it ignores, its resource
/// limits, and the asking thread's umask, nice value and CPU affinity.
struct requester_state {
  std::uint64_t ignored = 0;  ///< bit sig - 1
  int umask = -1;             ///< -1: unknown, the maker's stays
  std::array<rlimit, RLIM_NLIMITS> limits{};
  int nice = 0;
  std::size_t affinity_words = 0;  ///< of `affinity` in use; 0: unknown, the maker's stays
  std::array<std::uint64_t, 16> affinity{};  ///< CPUs 0-1023, as sched_getaffinity gives them
};

/// The calling thread's (its umask, nice value and affinity; the process's
/// ignored signals and limits).
requester_state current_requester_state() noexcept;

/// A launch_plan's source for a standard stream the child has closed.
inline constexpr int closed_stream = -2;

/// What the new process does to set itself up, built in the parent. The new
/// process only reads it, except for `failed_at` / `error`.
struct launch_plan {
  const char* path = nullptr;         // exec only
  char* const* argv = nullptr;        // exec only
  char* const* envp = nullptr;        // the child's environment
  /// What goes to 0, 1, 2: a descriptor, -1 to leave it, closed_stream to
  /// close it.
  std::array<int, 3> source{-1, -1, -1};
  const char* cwd = nullptr;
  bool new_group = true;
  bool new_session = false;  // setsid, in place of new_group's setpgid
  int death_signal = 0;
  pid_t parent = 0;
  bool close_fds = true;
  /// Close the other descriptors now rather than at exec: for children that
  /// never exec. `keep` must then be sorted.
  bool close_now = false;
  const int* keep = nullptr;
  std::size_t keep_count = 0;
  /// For children forked in a batch: the signals whose handling the child
  /// must reset (bit sig - 1), as the parent found them just before the
  /// forks, so that each child does not ask for every signal again. Null:
  /// the child asks.
  const std::uint64_t* reset_signals = nullptr;
  /// Set by the launch when the clone itself reset every handled signal
  /// (clone3's CLONE_CLEAR_SIGHAND): the child then resets only an ignored
  /// SIGPIPE and SIGXFSZ, and asks after nothing.
  bool handlers_cleared = false;
  /// For a child made by another process than its requester: the
  /// requester's state, and the maker's, which the child starts with; the
  /// child sets what differs (stage::inherit) and ignores the signals the
  /// requester ignores (but SIGPIPE and SIGXFSZ), no others.
  const requester_state* requester = nullptr;
  const requester_state* maker = nullptr;
  /// spawn_options::before_exec and its context; called last.
  int (*hook)(void* context) noexcept = nullptr;
  void* hook_context = nullptr;
  /// A stream socket the child sends a start_note of itself on ('+', its
  /// pid) once its process group is made, before it runs anything of its
  /// caller's (the hook, the exec, a function), and then closes; -1: none.
  /// The socket is not the child's to keep: it is closed before the hook.
  int announce_fd = -1;

  stage failed_at = stage::none;
  int error = 0;
  /// Set by a vfork-style child just before its execve. Its parent resumes
  /// when the child has exec'd or ended: with neither this nor `failed_at`
  /// set, the child ended in its set-up without saying why (killed by a
  /// signal, or the hook's own _exit), and `died_as` is how, once reaped.
  bool exec_reached = false;
  exit_status died_as{};
  /// Set by a vfork-style child once it has sent its start_note: its
  /// launcher withdraws the note should the launch fail.
  bool announced = false;
};

/// What a child sends on launch_plan::announce_fd as it starts ('+'), and
/// what its launcher sends on the same socket to withdraw that ('-'): once
/// it has taken note of the child itself, or before it reaps a child whose
/// launch failed (the pid is then free for another process). One write of
/// 8 bytes each: the notes of many processes on one socket never interleave.
struct start_note {
  char what;
  char unused[3];
  std::int32_t pid;
};
static_assert(sizeof(start_note) == 8);

/// Sends `note` on the stream socket `fd`, waiting for room; never raises
/// SIGPIPE. False when it could not be sent (the reader is gone). Raw
/// system calls only: a new child calls it.
COHORT_BARE_CODE inline bool send_start_note(int fd, const start_note& note) noexcept {
  for (;;) {
    const long n = os::raw_syscall(SYS_sendto, fd, reinterpret_cast<long>(&note), sizeof note, MSG_NOSIGNAL, 0, 0);
    if (n != -EINTR) return n == static_cast<long>(sizeof note);
  }
}

/// Withdraws the start_note of `pid` on `fd` (nothing when -1): see start_note.
inline void withdraw_start_note(int fd, pid_t pid) noexcept {
  if (fd >= 0 && pid > 0) send_start_note(fd, start_note{'-', {}, static_cast<std::int32_t>(pid)});
}

/// For a launch that fails once children announced themselves on
/// `announce_fd` (nothing when -1): kills each of `pids` (this process's
/// children, unreaped) and, once it has died, so that it can announce
/// nothing more, withdraws its note. They are left for their owners to reap.
void end_and_withdraw(int announce_fd, std::span<const pid_t> pids) noexcept;

/// Marks closed_stream each stream a child would be left, or handed at
/// the same number, that an exec would close (a descriptor of this
/// process's own, marked close-on-exec, that took a closed stream's
/// number): a child that never execs sees it closed, as a spawned program
/// does, and stderr as stdout follows stdout. prepared_launch calls it.
void close_streams_an_exec_would(launch_plan& p) noexcept;

/// The signals whose handling a new child must reset, bit sig - 1 for each:
/// those with a handler of this process, and SIGPIPE and SIGXFSZ when
/// ignored. Read from /proc/self/status, or else asked signal by signal.
std::uint64_t signals_to_reset() noexcept;

/// Whether program launches clone with clone3 and CLONE_CLEAR_SIGHAND:
/// true until clone3 is first refused, on the architectures where it is
/// wired (os/clone3.hpp).
bool launches_use_clone3() noexcept;

/// Runs in the new process: resets signal handlers and the mask, then the
/// process group, parent-death signal, standard streams, working directory
/// and descriptors as `p` says, then calls the hook. Only system calls (and
/// the hook, which promises the same): safe in a vfork-style
/// child. Returns false with `failed_at` and `error` set.
bool set_up_child(launch_plan& p) noexcept;

/// Starts the process for a finished plan; runs with every signal blocked.
/// Returns its pidfd and sets `pid`, or returns -1 with `p.failed_at` and
/// `p.error` set and no process left.
using process_starter = std::function<int(launch_plan& p, pid_t& pid)>;

struct launch_failure {
  stage where = stage::none;
  int error = 0;
  std::string detail;  // the file or directory involved; for an exec, what is missing
};

/// The parent's side of one launch, prepared before the process is made:
/// the environment block, the standard streams (files opened, pipes made)
/// and the descriptors to keep, with the plan pointing into them. Made in a
/// batch, many launches can be prepared first and their processes made back
/// to back (a forking parent then copies few pages between forks).
class prepared_launch {
 public:
  /// `extra_keep` are descriptors the child keeps besides options.keep_fds.
  /// On failure, ok() is false and `f` says why; throws std::invalid_argument
  /// for bad options.
  prepared_launch(const spawn_options& options, const std::vector<int>& extra_keep, launch_failure& f);
  prepared_launch(const prepared_launch&) = delete;  // the plan points into it
  prepared_launch& operator=(const prepared_launch&) = delete;
  ~prepared_launch();

  bool ok() const noexcept;
  launch_plan& plan() noexcept;
  /// Where the plan failed, as a launch_failure.
  launch_failure failure() const;
  /// Takes over the process made from the plan, as a child of `executor`,
  /// whose context_lifetime() (taken before the process started) is
  /// `context`. Should that fail (no memory), the process is killed and
  /// reaped and the exception passes.
  std::shared_ptr<child_state> adopt(const asio::any_io_executor& executor, std::weak_ptr<const void> context,
                                     pid_t pid, int pidfd);

 private:
  struct parts;
  std::unique_ptr<parts> parts_;
};

/// Every signal blocked for a scope, glibc's own included, so that no
/// handler of this process runs in a new child before it resets them.
class signals_blocked {
 public:
  signals_blocked() noexcept;
  ~signals_blocked();
  signals_blocked(const signals_blocked&) = delete;
  signals_blocked& operator=(const signals_blocked&) = delete;

 private:
  sigset_t old_;
};

/// Prepares `options` into a plan, lets `start` make the process and adopts
/// it (see prepared_launch::adopt). `extra_keep` are descriptors the child
/// keeps besides options.keep_fds. On failure returns nullptr and fills `f`.
std::shared_ptr<child_state> launch(const asio::any_io_executor& executor, std::weak_ptr<const void> context,
                                    const spawn_options& options, const process_starter& start, launch_failure& f,
                                    const std::vector<int>& extra_keep = {});

/// Launches `cmd` as spawn() does (but for ready_to_wait, which spawn()
/// calls first): nullptr on failure, with `f` saying where and why, and no
/// process left. The child announces itself on `announce_fd`
/// (launch_plan::announce_fd), whose note a failed launch withdraws.
std::shared_ptr<child_state> launch_program(const asio::any_io_executor& executor, const command& cmd,
                                            const spawn_options& options, launch_failure& f, int announce_fd = -1);

/// spawn(), the child announcing itself on `announce_fd`
/// (launch_plan::announce_fd), whose note a failed launch withdraws.
child spawn_announced(const asio::any_io_executor& executor, const command& cmd, const spawn_options& options,
                      int announce_fd);

/// Brings up the cohort service of `executor`'s io_context, and with it
/// asio's reactor (an epoll descriptor, an eventfd and a timerfd) and the
/// service's io_uring ring where there is one, before a process starts
/// (spawn, start_processes): brought up later, inside the first wait for a
/// child, a failure for want of a descriptor could only fail that wait.
/// False, with `f` set (stage::reactor and the error), where it cannot be.
bool ready_to_wait(const asio::any_io_executor& executor, launch_failure& f, const char* what = "cohort::spawn");
/// The same, throwing std::system_error with describe_failure(what, f).
void ready_to_wait(const asio::any_io_executor& executor, const std::string& what);
/// The same for an io_context of one run, whose exits then wait on asio's
/// reactor only (uring::use_reactor_only: no ring is made).
void ready_to_wait_on_reactor_only(asio::io_context& io, const std::string& what);

/// How many descriptors this process holds for a child started with
/// `options` on `executor` while the child runs: its pidfd, the parent's
/// end of each piped stream, and a second pidfd while its exit is watched
/// on asio's reactor (where the io_context's ring has no waitid). Those
/// launching many children grow the descriptor table for them first
/// (os/descriptor_table.hpp).
std::size_t descriptors_per_child(const asio::any_io_executor& executor, const spawn_options& options);

/// The first of `options`' streams set to stdio::pipe(), as "in", "out" or
/// "err"; null when none is.
const char* piped_stream(const spawn_options& options) noexcept;
/// Throws std::invalid_argument naming `where` (as "cohort::pool:
/// pool_options::spawn") when one of `options`' streams is a pipe, which
/// the ranks of a run with no one to read or write it would fill for good.
void refuse_piped_streams(const spawn_options& options, std::string_view where);

/// Opens a stream's file as spawn does for stream `target` (0 for stdin):
/// with its flags, else read-only for stdin and, for output, created
/// (0644) and truncated; close-on-exec. The open never waits: a FIFO with
/// no reader fails for writing (ENXIO), and one with no writer opens for
/// reading. -1 with errno set on failure.
int open_stream_file(const stdio::file_t& file, int target) noexcept;

/// "cannot open '<path>'", saying why where errno's message would not: a
/// FIFO that no process reads, for ENXIO from open_stream_file.
std::string cannot_open(const std::string& path, int error);

/// "<what>: <cause>" for a failed launch, naming the descriptor limit on EMFILE.
std::string describe_failure(const std::string& what, const launch_failure& f);

/// A failed launch that was one step of a larger start (starting the
/// forkserver, re-executing this program for a rank) as that start's
/// failure: stage::start, its detail `step` and what describe_failure says
/// of `f`, so that the start's message keeps why the step failed.
launch_failure failure_of_step(const std::string& step, const launch_failure& f);

}  // namespace cohort::detail

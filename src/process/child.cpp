// Waiting for, reaping and signalling a child through its pidfd.
#include "cohort/child.hpp"

#include "config.hpp"
#include "process/child_state.hpp"
#include "os/descriptor_limit.hpp"
#include "os/fork_safe_mutex.hpp"
#include "uring/service.hpp"
#include "uring/waitid.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/execution_context.hpp>
#include <asio/redirect_error.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <fmt/format.h>

#include <signal.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <mutex>
#include <new>
#include <stdexcept>
#include <thread>
#include <vector>

namespace cohort {
namespace detail {
namespace {

std::chrono::microseconds to_duration(const timeval& tv) {
  return std::chrono::seconds(tv.tv_sec) + std::chrono::microseconds(tv.tv_usec);
}

exit_status to_status(const siginfo_t& info, const rusage& usage) {
  resource_usage used{to_duration(usage.ru_utime), to_duration(usage.ru_stime), usage.ru_maxrss};
  switch (info.si_code) {
    case CLD_EXITED: return exit_status::from_code(info.si_status, used);
    case CLD_DUMPED: return exit_status::from_signal(info.si_status, true, used);
    default: return exit_status::from_signal(info.si_status, false, used);
  }
}

}  // namespace

namespace {

// Orders the close of a child's pipe descriptors as an io_context shuts
// down before the release of their objects after it. Fork-safe: a thread
// of this process spawning with pipes may hold it as another forks, and
// the child's own first spawn with a pipe takes it. Never destroyed: an
// io_context may shut down as statics go.
os::fork_safe_mutex& left_mutex() {
  static auto& m = *new os::fork_safe_mutex;
  return m;
}

// A service of every io_context that children are spawned on, for the
// token that tells them it is gone. As it shuts down it closes the
// descriptors of the children's pipes, asked while the pipes' service is
// still there (after, the objects' native_handle() would reach a destroyed
// service).
class lifetime_service final : public asio::execution_context::service {
 public:
  using key_type = lifetime_service;
  static inline asio::execution_context::id id;
  explicit lifetime_service(asio::execution_context& context) : asio::execution_context::service(context) {}
  std::weak_ptr<const void> alive() const noexcept { return alive_; }

  void watch(const std::shared_ptr<child_state>& state) {
    std::lock_guard lock(left_mutex());
    if (watched_.size() >= prune_at_) {  // let go of the gone ones, as often as the list doubles
      std::erase_if(watched_, [](const std::weak_ptr<child_state>& w) { return w.expired(); });
      prune_at_ = std::max<std::size_t>(64, watched_.size() * 2);
    }
    watched_.push_back(state);
  }

 private:
  void shutdown() override {
    // The states are held until the lock is let go of: one whose last
    // holder lets go meanwhile ends here, after the context is gone, so
    // its end leaves the descriptors closed here alone (close_pipes), where
    // ending inside the loop it would close their numbers again.
    std::vector<std::shared_ptr<child_state>> held;
    std::lock_guard lock(left_mutex());
    try {
      held.reserve(watched_.size());
    } catch (const std::bad_alloc&) {
      // Without room, each ends where the loop lets go of it, as before.
    }
    for (const auto& weak : watched_) {
      auto state = weak.lock();
      if (!state) continue;
      if (state->in) ::close(state->in->native_handle());
      if (state->out) ::close(state->out->native_handle());
      if (state->err) ::close(state->err->native_handle());
      if (held.size() < held.capacity()) held.push_back(std::move(state));
    }
    watched_.clear();
    alive_.reset();
  }
  std::shared_ptr<const void> alive_ = std::make_shared<const bool>(true);
  std::vector<std::weak_ptr<child_state>> watched_;  // under left_mutex()
  std::size_t prune_at_ = 64;
};

}  // namespace

std::weak_ptr<const void> context_lifetime(const asio::any_io_executor& executor) {
  return asio::use_service<lifetime_service>(uring::io_context_of(executor)).alive();
}

namespace {

// The pause before looking again for an exit that a tracer holds (see
// wait_for): 1 ms after the first look, doubling to 100 ms.
std::chrono::milliseconds held_exit_pause(int looks) {
  return std::min(std::chrono::milliseconds(1 << std::min(looks, 7)), std::chrono::milliseconds(100));
}

}  // namespace

asio::awaitable<std::error_code> until_reaped(std::shared_ptr<child_state> state) {
  for (int looks = 0;; ++looks) {
    std::error_code ec;
    // Only that the child exited: the reap below collects its status
    // together with its resource usage.
    co_await uring::async_exited(state->executor, state->pidfd, state->pid,
                                 asio::redirect_error(asio::use_awaitable, ec));
    if (state->status) co_return std::error_code{};  // reaped meanwhile by try_wait()
    if (ec || state->reap(false, ec) || ec) co_return ec;
    // Exited, and not ours to reap yet: a tracer (ptrace) collects the exit
    // first. Its pidfd reads ready all along, so look again after a pause.
    asio::steady_timer pause(state->executor, held_exit_pause(looks));
    co_await pause.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    if (ec) co_return ec;
  }
}

namespace {

asio::awaitable<void> reap_when_exited(std::shared_ptr<child_state> state) { co_await until_reaped(std::move(state)); }

}  // namespace

void reap_in_background(const std::shared_ptr<child_state>& state) {
  if (state->context_gone()) return;  // as documented: left unreaped
  asio::co_spawn(state->executor, reap_when_exited(state), asio::detached);
}

void reap_on_a_thread(const std::shared_ptr<child_state>& state) {
  state->close_pipes();
  // By pid: still unreaped, the pid is this process's. A pidfd of the
  // thread's own, blocking whatever becomes of the state's.
  const int own = config::pidfd_open(state->pid);
  if (own >= 0) {
    try {
      std::thread([own, pid = state->pid] {
        siginfo_t info{};
        while (::waitid(static_cast<idtype_t>(config::p_pidfd), static_cast<id_t>(own), &info, WEXITED) != 0 &&
               errno == EINTR) {
        }
        disown_pid(pid);  // owned until here: nothing else takes it for an orphan to reap or sweep
        ::close(own);
      }).detach();
      state->on_a_thread = true;
      return;
    } catch (const std::system_error&) {
      ::close(own);
    }
  }
  reap_in_background(state);  // no thread to be had: the io_context's work, as detach() makes it
}

// A pid reaped here may be another process's by now: only one still
// unreaped is let go of.
child_state::~child_state() {
  close_pipes();
  if (!status && !on_a_thread) disown_pid(pid);
  if (pidfd >= 0) ::close(pidfd);
}

void watch_pipes(const std::shared_ptr<child_state>& state) {
  asio::use_service<lifetime_service>(uring::io_context_of(state->executor)).watch(state);
}

void child_state::close_pipes() noexcept {
  if (!context_gone()) {
    in.reset();
    out.reset();
    err.reset();
    return;
  }
  // Their descriptors were closed as the io_context shut down; the
  // objects are leaked (see the header).
  std::lock_guard lock(left_mutex());
  (void)in.release();
  (void)out.release();
  (void)err.release();
}

std::string not_here_note(const child_state& state) {
  return fmt::format(
      " (it is process {}'s child, not this process's: this object is a copy that fork() made of the one that "
      "spawned it, and only process {} can wait for it, signal it or kill it)",
      state.owner, state.owner);
}

bool kernel_reaps_children() noexcept {
  struct sigaction action {};
  ::sigaction(SIGCHLD, nullptr, &action);
  return action.sa_handler == SIG_IGN || (action.sa_flags & SA_NOCLDWAIT) != 0;
}

// What a waitid that found no child (ECHILD) means for `state`'s process:
// " (...)", or empty for any other error.
std::string reaped_elsewhere_note(const child_state& state, const std::error_code& ec) {
  if (ec != std::error_code(ECHILD, std::system_category())) return {};
  if (!state.here()) return not_here_note(state);
  if (kernel_reaps_children()) {
    return " (this process ignores SIGCHLD, by SIG_IGN or SA_NOCLDWAIT: the kernel reaps its children as they exit, "
           "and their exit status is lost; set SIGCHLD back to SIG_DFL before starting processes)";
  }
  return " (it was reaped elsewhere in this process: a waitpid(-1) or wait() of another part of the program)";
}

// glibc's waitid() has no rusage argument; the system call does. A copy
// made by fork reaps nothing: were this process to become the child's
// parent (a subreaper adopting it), its status is still its spawner's.
std::optional<exit_status> child_state::reap(bool block, std::error_code& ec) {
  ec.clear();
  if (status) return status;
  if (!here()) {
    ec.assign(ECHILD, std::system_category());
    return std::nullopt;
  }
  siginfo_t info{};
  rusage usage{};
  long rc;
  do {
    rc = ::syscall(SYS_waitid, config::p_pidfd, pidfd, &info, WEXITED | (block ? 0 : WNOHANG), &usage);
  } while (rc < 0 && errno == EINTR);
  if (rc < 0) {
    ec.assign(errno, std::system_category());
    return std::nullopt;
  }
  if (info.si_pid == 0) return std::nullopt;
  status = to_status(info, usage);
  disown_pid(pid);
  return status;
}

}  // namespace detail

child::child() noexcept = default;
child::child(std::shared_ptr<detail::child_state> state) noexcept : state_(std::move(state)) {}
child::child(child&& other) noexcept = default;

child& child::operator=(child&& other) noexcept {
  if (this != &other) {
    release();
    state_ = std::move(other.state_);
  }
  return *this;
}

child::~child() { release(); }

// Kills a child that still runs, and reaps it; a wait in flight reaps it
// instead, when it ends, whether it completes, is cancelled or is destroyed.
// A copy that fork() made (a forked process's, which it drops as it
// returns from main, say) only lets go of its descriptors: the child is its
// spawner's, which still waits for it.
void child::release() noexcept {
  auto state = std::move(state_);
  if (!state || state->status || !state->here()) return;
  if (config::pidfd_send_signal(state->pidfd, SIGKILL) != 0 && errno != ESRCH) {
    // Refused (a seccomp filter): its pid names it as surely while it is
    // unreaped, so kill() reaches it instead of the reap below waiting for
    // it without end.
    if (uring::unreaped(state->pidfd)) ::kill(state->pid, SIGKILL);
  }
  if (state->waiting) {
    state->kept_by = detail::child_state::keeper::killed;
  } else {
    std::error_code ignored;
    state->reap(true, ignored);
  }
}

namespace {

// What needs the io_context the child was spawned on fails once it has
// been destroyed, where it would reach freed memory; join() and try_wait()
// reap through the pidfd alone, and the object's end kills and reaps.
void refuse_gone_context(const detail::child_state& state, const char* what) {
  if (!state.context_gone()) return;
  throw std::logic_error(fmt::format("cohort::child::{}: the io_context the child was spawned on has been destroyed; "
                                     "join() or try_wait() reaps it",
                                     what));
}

}  // namespace

pid_t child::pid() const noexcept { return state_ ? state_->pid : -1; }
int child::native_handle() const noexcept { return state_ ? state_->pidfd : -1; }

std::optional<exit_status> child::status() const noexcept {
  return state_ ? state_->status : std::nullopt;
}

std::optional<asio::any_io_executor> child::executor_of(const std::shared_ptr<detail::child_state>& state) {
  if (!state) return std::nullopt;
  // A fork's copy: the wait fails where the waiter runs (wait_for), its
  // own io_context gone or not.
  if (!state->here()) return std::nullopt;
  refuse_gone_context(*state, "wait");
  return state->executor;
}

// A child whose io_context is gone is refused on the way through
// wait_spawned (executor_of): no coroutine runs on that context. An
// awaiting coroutine on the child's io_context (its executor, or a strand
// of it) awaits wait_for itself: the wait's completion then comes where
// the coroutine's cancellation is emitted, never on another thread at once.
asio::awaitable<exit_status> child::wait_awaited(std::shared_ptr<detail::child_state> state) {
  const asio::any_io_executor here = co_await asio::this_coro::executor;
  const bool on_its_executor =
      state && !state->context_gone() &&
      (state->executor == here || uring::find_io_context(state->executor) == uring::find_io_context(here));
  auto wait = on_its_executor ? wait_for(std::move(state)) : wait_spawned(std::move(state), asio::use_awaitable);
  co_return co_await std::move(wait);
}

// `state` keeps the process's state alive while the wait lasts.
asio::awaitable<exit_status> child::wait_for(std::shared_ptr<detail::child_state> state) {
  if (!state) throw std::logic_error("cohort::child::wait: no process");
  if (state->status) co_return *state->status;
  // Failed at once, not once the spawner's child has exited; before the
  // look at a wait in flight, which fork() copies with the rest.
  if (!state->here()) {
    throw std::system_error(ECHILD, std::system_category(),
                            fmt::format("cohort::child::wait: waitid for pid {}{}", state->pid,
                                        detail::not_here_note(*state)));
  }
  if (state->waiting) throw std::logic_error("cohort::child::wait: a wait is already in flight");
  state->waiting = true;
  // However the wait ends, a process whose object went meanwhile is reaped
  // (by its spawner: a copy of the wait that fork() made reaps nothing).
  struct end_of_wait {
    std::shared_ptr<detail::child_state> s;
    ~end_of_wait() {
      s->waiting = false;
      if (s->status || !s->here()) return;
      if (s->kept_by == detail::child_state::keeper::killed) {
        std::error_code ignored;
        s->reap(true, ignored);
      } else if (s->kept_by == detail::child_state::keeper::detached) {
        detail::reap_in_background(s);
      }
    }
  } guard{state};

  const std::error_code ec = co_await detail::until_reaped(state);
  if (state->status) co_return *state->status;
  if (ec == asio::error::operation_aborted) throw std::system_error(ec, "cohort::child::wait");
  const int error = ec.category() == std::system_category() ? ec.value() : 0;
  throw std::system_error(ec, fmt::format("cohort::child::wait: waitid for pid {}{}{}", state->pid,
                                          os::descriptor_limit_note(error), detail::reaped_elsewhere_note(*state, ec)));
}

exit_status child::join() {
  std::error_code ec;
  auto status = join(ec);
  if (ec) {
    throw std::system_error(ec, fmt::format("cohort::child::join: waitid for pid {}{}", pid(),
                                            detail::reaped_elsewhere_note(*state_, ec)));
  }
  return status;
}

exit_status child::join(std::error_code& ec) {
  if (!state_) throw std::logic_error("cohort::child::join: no process");
  // A fork's copy of a child with a wait in flight: reap() refuses it.
  if (state_->waiting && state_->here()) throw std::logic_error("cohort::child::join: a wait is already in flight");
  auto status = state_->reap(true, ec);
  return status ? *status : exit_status::from_code(-1);
}

std::optional<exit_status> child::try_wait() {
  std::error_code ec;
  auto status = try_wait(ec);
  if (ec) {
    throw std::system_error(ec, fmt::format("cohort::child::try_wait: waitid for pid {}{}", pid(),
                                            detail::reaped_elsewhere_note(*state_, ec)));
  }
  return status;
}

std::optional<exit_status> child::try_wait(std::error_code& ec) {
  if (!state_) throw std::logic_error("cohort::child::try_wait: no process");
  return state_->reap(false, ec);
}

namespace {

// What pidfd_send_signal takes (0 probes): the same refusal whether the
// child is running or reaped, so that a bad number never passes unseen
// because the child happened to have ended.
bool signal_number_valid(int sig) noexcept { return sig >= 0 && sig <= SIGRTMAX; }

// Sets EINVAL, as the kernel would, where the number is not a signal.
bool refused_signal_number(int sig, std::error_code& ec) noexcept {
  if (signal_number_valid(sig)) return false;
  ec.assign(EINVAL, std::system_category());
  return true;
}

}  // namespace

void child::signal(int sig) {
  std::error_code ec;
  signal(sig, ec);
  if (ec) {
    throw std::system_error(ec, fmt::format("cohort::child::signal: {} to pid {}{}", signal_name(sig), pid(),
                                            detail::reaped_elsewhere_note(*state_, ec)));
  }
}

void child::signal(int sig, std::error_code& ec) {
  ec.clear();
  if (!state_) throw std::logic_error("cohort::child::signal: no process");
  if (refused_signal_number(sig, ec)) return;
  if (state_->status) return;
  if (!state_->here()) {  // another process's child: see not_here_note
    ec.assign(ECHILD, std::system_category());
    return;
  }
  if (config::pidfd_send_signal(state_->pidfd, sig) != 0 && errno != ESRCH) {
    ec.assign(errno, std::system_category());
  }
}

void child::signal_group(int sig) {
  std::error_code ec;
  signal_group(sig, ec);
  if (ec && !state_->group_leader && signal_number_valid(sig)) {
    // No group carries the child's pid: naming one would send the reader
    // looking for it.
    throw std::system_error(ec, fmt::format("cohort::child::signal_group: {} to child {}: it does not lead a "
                                            "process group (spawn it with new_process_group = true)",
                                            signal_name(sig), pid()));
  }
  if (ec) {
    throw std::system_error(ec, fmt::format("cohort::child::signal_group: {} to group {}{}", signal_name(sig), pid(),
                                            detail::reaped_elsewhere_note(*state_, ec)));
  }
}

// The group id is the child's pid. A child reaped elsewhere (by the kernel,
// where this process ignores SIGCHLD, or by a waitpid(-1) of the program)
// has given that number up, and a new group may carry it: such a child is
// taken as reaped, as its pidfd's waitid tells (ECHILD). Past that, Linux
// 6.9's pidfd_send_signal reaches the group the child led and no other.
// Before 6.9, killpg by number: a child reaped elsewhere between the look
// and the killpg, its number taken by a new group in that moment, would
// have that group signalled.
void child::signal_group(int sig, std::error_code& ec) {
  ec.clear();
  if (!state_) throw std::logic_error("cohort::child::signal_group: no process");
  if (refused_signal_number(sig, ec)) return;
  if (state_->status) return;
  if (!state_->group_leader) {
    ec = std::make_error_code(std::errc::invalid_argument);  // its group is not its own
    return;
  }
  if (!state_->here()) {  // another process's child: see not_here_note
    ec.assign(ECHILD, std::system_category());
    return;
  }
  if (!uring::unreaped(state_->pidfd)) {
    if (errno != ECHILD) ec.assign(errno, std::system_category());
    return;
  }
  int rc = config::pidfd_send_signal(state_->pidfd, sig, config::pidfd_signal_process_group);
  if (rc != 0 && errno == EINVAL) rc = ::killpg(state_->pid, sig);  // before 6.9 (a bad signal is refused again)
  if (rc != 0 && errno != ESRCH) ec.assign(errno, std::system_category());
}

// A copy that fork() made lets go of its descriptors alone: its spawner
// reaps the child.
void child::detach() {
  if (state_ && !state_->status && state_->here()) refuse_gone_context(*state_, "detach");
  auto state = std::move(state_);
  if (!state || state->status || !state->here()) return;
  state->close_pipes();
  if (state->waiting) {
    state->kept_by = detail::child_state::keeper::detached;  // the wait in flight hands over
  } else {
    detail::reap_in_background(state);
  }
}

namespace {

template <class Pipe>
Pipe& pipe_or_throw(detail::child_state* state, std::unique_ptr<Pipe> detail::child_state::*member,
                    const char* name) {
  if (state == nullptr) throw std::logic_error(fmt::format("cohort::child::{}: no process", name));
  refuse_gone_context(*state, name);
  auto& pipe = state->*member;
  if (!pipe) throw std::logic_error(fmt::format("cohort::child::{}: that stream is not a pipe", name));
  return *pipe;
}

}  // namespace

asio::writable_pipe& child::in() { return pipe_or_throw(state_.get(), &detail::child_state::in, "in"); }
asio::readable_pipe& child::out() { return pipe_or_throw(state_.get(), &detail::child_state::out, "out"); }
asio::readable_pipe& child::err() { return pipe_or_throw(state_.get(), &detail::child_state::err, "err"); }

}  // namespace cohort

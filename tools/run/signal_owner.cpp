#include "run/signal_owner.hpp"

#include "os/descriptor_limit.hpp"
#include "run/say.hpp"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <system_error>

namespace cohort_run {

namespace {

// The mask before hold_signals_from_start() (called before main), and
// whether it changed it since.
sigset_t started_with;
bool held = false;

sigset_t held_from_start() noexcept {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2}) sigaddset(&set, sig);
  return set;
}

// A duplicate of `fd` (the signalfd), for an io_context to wait on.
cohort::os::owned_fd duplicate(int fd) {
  cohort::os::owned_fd copy(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
  if (copy.get() < 0) {
    const int error = errno;
    throw std::system_error(error, std::system_category(),
                            "dup of its signalfd" + cohort::os::descriptor_limit_note(error));
  }
  return copy;
}

}  // namespace

void hold_signals_from_start() noexcept {
  const sigset_t set = held_from_start();
  held = ::pthread_sigmask(SIG_BLOCK, &set, &started_with) == 0;
}

void release_signals_held_from_start() noexcept {
  if (held) ::pthread_sigmask(SIG_SETMASK, &started_with, nullptr);
  held = false;
}

signal_owner::signal_owner(std::vector<int> shutdown, std::vector<int> passed_on)
    : shutdown_(std::move(shutdown)), passed_on_(std::move(passed_on)) {
  sigset_t taken;
  sigemptyset(&taken);
  for (const auto* list : {&shutdown_, &passed_on_}) {
    for (int sig : *list) sigaddset(&taken, sig);
  }
  // Blocked before the signalfd exists: one that comes meanwhile waits,
  // pending, for it.
  if (const int e = ::pthread_sigmask(SIG_BLOCK, &taken, nullptr); e != 0) {
    throw std::system_error(e, std::system_category(), "blocking the signals it handles");
  }
  signals_fd_ = ::signalfd(-1, &taken, SFD_CLOEXEC | SFD_NONBLOCK);
  if (signals_fd_ < 0) throw std::system_error(errno, std::system_category(), "signalfd");
  if (held) {
    sigset_t others = held_from_start();
    for (int sig = 1; sig < NSIG; ++sig) {
      if (sigismember(&taken, sig) == 1 || sigismember(&started_with, sig) == 1) sigdelset(&others, sig);
    }
    ::pthread_sigmask(SIG_UNBLOCK, &others, nullptr);
    held = false;
  }
  // A line of cohort-run's own that waits for a console nobody reads keeps
  // the signalfd unread: one of these, pending, limits that wait.
  sigset_t ending;
  sigemptyset(&ending);
  for (int sig : shutdown_) sigaddset(&ending, sig);
  end_console_waits_on(ending);
  // A shutdown signal this process was started ignoring (a shell's `cmd &`
  // ignores SIGINT and SIGQUIT) gets its default action back, as torchrun's
  // handlers give it: the ranks inherit what is ignored here, and a Python
  // rank would then never see Ctrl-C as KeyboardInterrupt. Blocked, it
  // still only reaches the signalfd here. A forwarded one stays ignored, as
  // torchrun, which handles none of them, leaves it; blocked, it reaches
  // the signalfd all the same.
  for (int sig : shutdown_) {
    struct sigaction now {};
    if (::sigaction(sig, nullptr, &now) == 0 && now.sa_handler == SIG_IGN) ::signal(sig, SIG_DFL);
  }
}

signal_owner::~signal_owner() { ::close(signals_fd_); }

void signal_owner::take_waiting() {
  // The shutdown signals waiting together count as one: the signalfd gives
  // pending ones lowest number first, whatever order they came in, so
  // which came first cannot be known, nor whether the later one is a
  // second. The one taken is the first one again where it is among them
  // (an echo, or a second one), else the lowest numbered.
  std::optional<int> ending;
  signalfd_siginfo info[8];
  for (;;) {
    const ssize_t got = ::read(signals_fd_, info, sizeof info);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;  // EAGAIN: none left
    for (std::size_t i = 0; i < static_cast<std::size_t>(got) / sizeof info[0]; ++i) {
      const int sig = static_cast<int>(info[i].ssi_signo);
      if (std::find(shutdown_.begin(), shutdown_.end(), sig) == shutdown_.end()) {
        take(sig);
      } else if (!ending || sig == first_.signal() || (ending != first_.signal() && sig < *ending)) {
        ending = sig;
      }
    }
  }
  if (ending) take(*ending);
}

void signal_owner::take(int sig) {
  const bool ends_run = std::find(shutdown_.begin(), shutdown_.end(), sig) != shutdown_.end();
  if (ends_run) {
    // The first one again at once is the same one passed on (a terminal's
    // Ctrl-C reaching `timeout N cohort-run`, which sends it on to
    // cohort-run and its group): it does not skip the waits.
    const bool began = !first_.signal();
    if (first_.is_echo(sig)) return;
    if (began) shutdown_began();
  }
  if (group_ == nullptr) return;  // a passed-on signal with no rank to reach: nothing to do
  if (ends_run) {
    group_->interrupt(sig);
  } else {
    group_->send_signal(sig);
  }
}

void signal_owner::wait_next() {
  readable_->async_wait(asio::posix::descriptor_base::wait_read, [this](std::error_code ec) {
    if (ec) return;  // detached
    std::lock_guard lock(mutex_);
    if (!readable_) return;  // detached since the signal came: the next attempt reads it
    take_waiting();
    wait_next();
  });
}

void signal_owner::prepare_attach() {
  std::lock_guard lock(mutex_);
  if (prepared_.get() < 0) prepared_ = duplicate(signals_fd_);
}

void signal_owner::attach(cohort::group& g, const asio::any_io_executor& ex) {
  std::lock_guard lock(mutex_);
  if (prepared_.get() < 0) prepared_ = duplicate(signals_fd_);
  const int copy = prepared_.release();
  try {
    readable_ = std::make_unique<asio::posix::stream_descriptor>(ex, copy);
  } catch (...) {
    ::close(copy);
    throw;
  }
  group_ = &g;
  try {
    if (const auto first = first_.signal()) g.interrupt(*first);  // came while no group ran
    take_waiting();
    wait_next();
  } catch (...) {  // out of memory: attached to nothing, as before the call
    group_ = nullptr;
    readable_.reset();
    throw;
  }
}

void signal_owner::detach() {
  std::lock_guard lock(mutex_);
  group_ = nullptr;
  readable_.reset();  // its wait ends, operation_aborted
  prepared_.reset();
}

std::optional<int> signal_owner::interrupted() {
  std::lock_guard lock(mutex_);
  take_waiting();
  return first_.signal();
}

bool signal_owner::pause(std::chrono::milliseconds limit, int fd) {
  pollfd readable[2] = {{signals_fd_, POLLIN, 0}, {fd, POLLIN, 0}};  // poll leaves out a negative fd
  const auto end = std::chrono::steady_clock::now() + limit;
  for (;;) {
    if (interrupted()) return false;
    if (readable[1].revents != 0) return true;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
    if (left <= std::chrono::milliseconds(0)) return true;
    ::poll(readable, 2, static_cast<int>(std::min<long long>(left.count(), 1 << 30)));
  }
}

}  // namespace cohort_run

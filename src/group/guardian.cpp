// The guardian: a forked process that outlives its parent just long enough
// to kill what the parent's groups left behind.
#include "cohort/guardian.hpp"

#include "group/descendants.hpp"
#include "process/owned_pids.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>

namespace cohort {
namespace {

// Kills every marked process it finds; the number found.
int kill_marked(std::string_view prefix) {
  int found = 0;
  detail::for_each_process([&](pid_t pid) {
    if (detail::environment_holds(pid, prefix, true)) {
      ::kill(pid, SIGKILL);
      ++found;
    }
  });
  return found;
}

[[noreturn]] void guard(int line, pid_t parent) {
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE}) ::signal(sig, SIG_IGN);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::prctl(PR_SET_NAME, "cohort-guardian");
  ::syscall(SYS_close_range, 3U, static_cast<unsigned>(line) - 1, 0U);
  ::syscall(SYS_close_range, static_cast<unsigned>(line) + 1, ~0U, 0U);
  char byte;
  ssize_t n;
  while ((n = ::read(line, &byte, 1)) < 0 && errno == EINTR) {
  }
  if (n == 1) ::_exit(0);  // released: the parent's groups swept their own
  // The parent is gone (or lets go): its marked processes go too. Killed
  // ones stop showing once dead, so a pass that finds none ends the work;
  // at most 10 s, for a process stuck in the kernel.
  const std::string prefix = detail::group_marker_prefix(parent);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (kill_marked(prefix) > 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ::_exit(0);
}

}  // namespace

guardian::guardian() {
  // A socket pair, not a pipe: the word release() sends cannot raise
  // SIGPIPE here when the guardian is gone.
  int ends[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ends) != 0) {
    throw std::system_error(errno, std::system_category(), "cohort::guardian: socketpair");
  }
  const pid_t parent = ::getpid();
  pid_ = ::fork();
  if (pid_ == 0) {
    ::close(ends[1]);
    guard(ends[0], parent);
  }
  const int error = errno;
  ::close(ends[0]);
  if (pid_ < 0) {
    ::close(ends[1]);
    throw std::system_error(error, std::system_category(), "cohort::guardian: fork");
  }
  line_ = ends[1];
  detail::own_pid(pid_);
}

guardian::~guardian() { end(true); }

void guardian::release() noexcept { end(false); }

void guardian::end(bool look) noexcept {
  if (line_ < 0) return;
  if (!look) {
    const char byte = 'r';
    while (::send(line_, &byte, 1, MSG_NOSIGNAL) < 0 && errno == EINTR) {
    }
  }
  ::close(line_);
  line_ = -1;
  if (pid_ > 0) {
    while (::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
    }
    detail::disown_pid(pid_);
  }
}

}  // namespace cohort

// Writes of this library's own that must not end the process: a write to a
// pipe whose reader has gone raises SIGPIPE in the writing thread, and one
// past RLIMIT_FSIZE raises SIGXFSZ; the default action of either kills the
// whole process (a supervisor whose console was `| head`, a failing rank
// whose error file meets its limit). The library may not change the
// process's disposition, which belongs to the program, so it keeps the
// signal off its own writes: while a quiet_signal lives, its signal is
// blocked in this thread, and one raised by those writes is taken back
// before it is unblocked. The write itself still fails (EPIPE, EFBIG).
#pragma once

#include <pthread.h>
#include <signal.h>
#include <time.h>

#include <cerrno>

namespace cohort::os {

class quiet_signal {
 public:
  explicit quiet_signal(int sig) noexcept : sig_(sig) {
    sigemptyset(&set_);
    sigaddset(&set_, sig);
    // One already pending is the program's (from a write of its own, or
    // sent by kill): it stays pending, and a second one would merge with it.
    sigset_t pending;
    sigemptyset(&pending);
    if (::sigpending(&pending) == 0 && sigismember(&pending, sig) == 1) return;
    armed_ = ::pthread_sigmask(SIG_BLOCK, &set_, &before_) == 0;
  }
  quiet_signal(const quiet_signal&) = delete;
  quiet_signal& operator=(const quiet_signal&) = delete;

  ~quiet_signal() {
    if (!armed_) return;
    sigset_t pending;
    sigemptyset(&pending);
    if (::sigpending(&pending) == 0 && sigismember(&pending, sig_) == 1) {
      const timespec now{0, 0};
      while (::sigtimedwait(&set_, nullptr, &now) < 0 && errno == EINTR) {
      }
    }
    ::pthread_sigmask(SIG_SETMASK, &before_, nullptr);
  }

 private:
  int sig_;
  sigset_t set_;
  sigset_t before_;
  bool armed_ = false;
};

/// SIGPIPE kept off this thread's writes to pipes and sockets.
class quiet_sigpipe : public quiet_signal {
 public:
  quiet_sigpipe() noexcept : quiet_signal(SIGPIPE) {}
};

}  // namespace cohort::os

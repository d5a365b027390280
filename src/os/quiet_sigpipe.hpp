// Writes of this library's own that must not end the process: a write to a
// pipe whose reader has gone raises SIGPIPE in the writing thread, and its
// default action kills the whole process (a supervisor whose console was
// `| head`). The library may not change the process's disposition, which
// belongs to the program, so it keeps the signal off its own writes: while
// a quiet_sigpipe lives, SIGPIPE is blocked in this thread, and one raised
// by those writes is taken back before it is unblocked. The write itself
// still fails with EPIPE.
#pragma once

#include <pthread.h>
#include <signal.h>
#include <time.h>

#include <cerrno>

namespace cohort::os {

class quiet_sigpipe {
 public:
  quiet_sigpipe() noexcept {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    // One already pending is the program's (from a write of its own, or
    // sent by kill): it stays pending, and a second one would merge with it.
    sigset_t pending;
    sigemptyset(&pending);
    if (::sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1) return;
    armed_ = ::pthread_sigmask(SIG_BLOCK, &pipe_, &before_) == 0;
  }
  quiet_sigpipe(const quiet_sigpipe&) = delete;
  quiet_sigpipe& operator=(const quiet_sigpipe&) = delete;

  ~quiet_sigpipe() {
    if (!armed_) return;
    sigset_t pending;
    sigemptyset(&pending);
    if (::sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1) {
      const timespec now{0, 0};
      while (::sigtimedwait(&pipe_, nullptr, &now) < 0 && errno == EINTR) {
      }
    }
    ::pthread_sigmask(SIG_SETMASK, &before_, nullptr);
  }

 private:
  sigset_t pipe_;
  sigset_t before_;
  bool armed_ = false;
};

}  // namespace cohort::os

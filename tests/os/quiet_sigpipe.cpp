// A write to a pipe with no reader under os::quiet_sigpipe: EPIPE, no
// SIGPIPE left behind, the thread's mask as it was, and a SIGPIPE the
// program already had pending still pending.
#include "os/quiet_sigpipe.hpp"

#include <doctest/doctest.h>

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>

using namespace cohort;

namespace {

// A pipe whose read end is closed: every write raises SIGPIPE.
struct broken_pipe {
  int write_end = -1;
  broken_pipe() {
    int ends[2];
    REQUIRE(::pipe2(ends, O_CLOEXEC) == 0);
    ::close(ends[0]);
    write_end = ends[1];
  }
  ~broken_pipe() { ::close(write_end); }
};

bool pending_sigpipe() {
  sigset_t pending;
  sigemptyset(&pending);
  REQUIRE(::sigpending(&pending) == 0);
  return sigismember(&pending, SIGPIPE) == 1;
}

bool blocked_sigpipe() {
  sigset_t mask;
  REQUIRE(::pthread_sigmask(SIG_BLOCK, nullptr, &mask) == 0);
  return sigismember(&mask, SIGPIPE) == 1;
}

}  // namespace

TEST_SUITE("quiet sigpipe") {
  TEST_CASE("with SIGPIPE at its default, the write fails with EPIPE and the process lives on") {
    struct sigaction dfl {}, before {};
    dfl.sa_handler = SIG_DFL;
    REQUIRE(::sigaction(SIGPIPE, &dfl, &before) == 0);
    broken_pipe p;
    const char byte = 'x';
    ssize_t n = 0;
    int error = 0;
    {
      os::quiet_sigpipe quiet;
      n = ::write(p.write_end, &byte, 1);
      error = errno;
      CHECK(blocked_sigpipe());
    }
    CHECK(n == -1);
    CHECK(error == EPIPE);
    CHECK_FALSE(pending_sigpipe());  // taken back
    CHECK_FALSE(blocked_sigpipe());  // the mask as it was
    REQUIRE(::sigaction(SIGPIPE, &before, nullptr) == 0);
  }

  TEST_CASE("a SIGPIPE the program had pending stays pending; a mask that blocked it still does") {
    sigset_t pipe_only, before;
    sigemptyset(&pipe_only);
    sigaddset(&pipe_only, SIGPIPE);
    REQUIRE(::pthread_sigmask(SIG_BLOCK, &pipe_only, &before) == 0);
    REQUIRE(::raise(SIGPIPE) == 0);  // the program's own, blocked: pending
    REQUIRE(pending_sigpipe());
    broken_pipe p;
    const char byte = 'x';
    {
      os::quiet_sigpipe quiet;
      CHECK(::write(p.write_end, &byte, 1) == -1);
    }
    CHECK(pending_sigpipe());  // not taken
    CHECK(blocked_sigpipe());
    const timespec now{0, 0};
    CHECK(::sigtimedwait(&pipe_only, nullptr, &now) == SIGPIPE);
    CHECK_FALSE(pending_sigpipe());
    {
      os::quiet_sigpipe quiet;  // blocked before, nothing pending: its own is taken back
      CHECK(::write(p.write_end, &byte, 1) == -1);
    }
    CHECK_FALSE(pending_sigpipe());
    CHECK(blocked_sigpipe());
    REQUIRE(::pthread_sigmask(SIG_SETMASK, &before, nullptr) == 0);
  }
}

// Shared memory's fork handlers and the fork-safe locks' run in one order
// whatever the link order. This program is linked with shm/fork.cpp's
// object ahead of the rest of the library (tests/meson.build), so that its
// static initializer runs before those of os/.
#include "os/fork_safe_mutex.hpp"
#include "shm/fork.hpp"

#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

using namespace cohort;

namespace {

void reap(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
}

// A batch of forks, as a group's fork ranks are made, on one thread, and
// plain forks on another, `rounds` times each; returns in the process that
// ran them.
void batches_beside_plain_forks(int rounds) {
  std::thread plain([rounds] {
    for (int i = 0; i < rounds; ++i) {
      const pid_t pid = ::fork();
      if (pid == 0) ::_exit(0);
      if (pid > 0) reap(pid);
    }
  });
  for (int i = 0; i < rounds; ++i) {
    pid_t pid;
    {
      shm::fork_batch batch;
      const os::fork_safe_mutexes_held held;
      batch.before_fork();
      pid = ::fork();
      if (pid == 0) ::_exit(0);
      if (pid < 0) batch.fork_failed();
    }
    if (pid > 0) reap(pid);
  }
  plain.join();
}

}  // namespace

TEST_CASE("a batch of forks and a plain fork on another thread take the locks in the same order") {
  // In a child of its own, which the test kills when the two threads wait for
  // each other for good: a plain fork taking the fork-safe locks before
  // shared memory's, where a batch takes them the other way round.
  const pid_t runner = ::fork();
  REQUIRE(runner >= 0);
  if (runner == 0) {
    batches_beside_plain_forks(2000);
    ::_exit(0);
  }
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  pid_t done = 0;
  while ((done = ::waitpid(runner, &status, WNOHANG)) == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (done == 0) {
    ::kill(runner, SIGKILL);
    reap(runner);
  }
  CHECK_MESSAGE(done == runner, "the batch and the plain fork waited for each other's locks");
  if (done == runner) CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
}

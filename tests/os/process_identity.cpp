#include "os/process_identity.hpp"

#include <doctest/doctest.h>

#include <pthread.h>
#include <signal.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <chrono>
#include <thread>

using namespace cohort;
using namespace std::chrono_literals;

namespace {

// A forked child with a second thread, which sleeps until the child is
// killed: the child's pid, and the second thread's id, which the child
// writes into a pipe. With `leader_leaves`, the child's first thread then
// exits as pthread_exit would and the second one runs on alone.
struct two_threads {
  pid_t pid = -1;
  pid_t thread = -1;

  explicit two_threads(bool leader_leaves) {
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      pthread_t t;
      ::pthread_create(
          &t, nullptr,
          [](void* fd) -> void* {
            const pid_t tid = static_cast<pid_t>(::syscall(SYS_gettid));
            (void)!::write(static_cast<int>(reinterpret_cast<std::intptr_t>(fd)), &tid, sizeof tid);
            for (;;) ::pause();
          },
          reinterpret_cast<void*>(static_cast<std::intptr_t>(fds[1])));
      // Not pthread_exit, whose unwinding the test's frames would stop.
      if (leader_leaves) ::syscall(SYS_exit, 0);
      for (;;) ::pause();
    }
    ::close(fds[1]);
    REQUIRE(::read(fds[0], &thread, sizeof thread) == static_cast<ssize_t>(sizeof thread));
    ::close(fds[0]);
  }
  two_threads(const two_threads&) = delete;
  two_threads& operator=(const two_threads&) = delete;
  ~two_threads() {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
};

}  // namespace

TEST_SUITE("process identity") {
  TEST_CASE("a running process has not ended and is not ending") {
    const two_threads child(false);
    const auto start = os::start_time_of(child.pid);
    REQUIRE(start.value_or(0) != 0);
    CHECK_FALSE(os::has_ended(child.pid, *start));
    CHECK_FALSE(os::has_ended_or_is_ending(child.pid, *start));
  }

  TEST_CASE("a process whose first thread has exited while another runs is not ending") {
    const two_threads child(true);
    const auto start = os::start_time_of(child.pid);
    REQUIRE(start.value_or(0) != 0);
    // The first thread shows the process as a zombie, and is exiting, once
    // it has left.
    while (os::state_of(child.pid) != 'Z') std::this_thread::sleep_for(1ms);
    CHECK_FALSE(os::has_ended(child.pid, *start));
    CHECK_FALSE(os::has_ended_or_is_ending(child.pid, *start));
  }

  TEST_CASE("a killed process is ending before it shows as ended") {
    // A thread traced by this process stays a zombie until this process
    // waits for it, and the process is not reaped until then: it stays,
    // killed, with its descriptors closed and its first thread a zombie,
    // but with two threads, where has_ended() cannot tell it has ended.
    const two_threads child(false);
    const auto start = os::start_time_of(child.pid);
    REQUIRE(start.value_or(0) != 0);
    if (::ptrace(PTRACE_SEIZE, child.thread, nullptr, nullptr) != 0) {
      MESSAGE("skipped: this process may not trace its child (" << std::strerror(errno) << ")");
      return;
    }
    REQUIRE(::kill(child.pid, SIGKILL) == 0);
    siginfo_t info{};
    REQUIRE(::waitid(P_PID, static_cast<id_t>(child.thread), &info, WEXITED | WNOWAIT | __WALL) == 0);
    // The first thread ends on its own time: a zombie once it has.
    while (os::state_of(child.pid) != 'Z') std::this_thread::sleep_for(1ms);
    CHECK_FALSE(os::has_ended(child.pid, *start));
    CHECK(os::has_ended_or_is_ending(child.pid, *start));
    REQUIRE(::waitpid(child.thread, nullptr, __WALL) == child.thread);
    // Reaped, the traced thread leaves the process a zombie alone: ended.
    while (os::state_of(child.pid) != 'Z' || !os::has_ended(child.pid, *start)) std::this_thread::sleep_for(1ms);
    CHECK(os::has_ended_or_is_ending(child.pid, *start));
  }
}

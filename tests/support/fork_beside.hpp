// Plain forks made while other threads run library code: what a child
// finds of the locks those threads held at the fork.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <thread>
#include <vector>

namespace cohort::test {

struct fork_outcome {
  int hung = 0;    // children ended by their alarm: a lock found held for good
  int failed = 0;  // children that ended otherwise than with status 0
};

/// Forks up to `rounds` times while `threads` threads run `beside` over
/// and over; each child runs `in_child` under an alarm of `alarm_s`
/// seconds and exits with what it returns. Stops at the first child that
/// hung or failed. Between the forks the children are looked at every 5 ms, so that
/// the threads run on meanwhile.
inline fork_outcome fork_beside(int threads, const std::function<void()>& beside, int rounds,
                                const std::function<int()>& in_child, unsigned alarm_s = 10) {
  std::atomic<bool> stop{false};
  std::vector<std::thread> running;
  for (int t = 0; t < threads; ++t) {
    running.emplace_back([&stop, &beside] {
      while (!stop.load(std::memory_order_relaxed)) beside();
    });
  }
  fork_outcome outcome;
  for (int round = 0; round < rounds && outcome.hung == 0 && outcome.failed == 0; ++round) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::alarm(alarm_s);
      int code = 100;
      try {
        code = in_child();
      } catch (...) {
      }
      ::_exit(code);
    }
    if (pid < 0) {
      ++outcome.failed;
      break;
    }
    int status = 0;
    while (::waitpid(pid, &status, WNOHANG) == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM) {
      ++outcome.hung;
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      ++outcome.failed;
    }
  }
  stop = true;
  for (auto& t : running) t.join();
  return outcome;
}

}  // namespace cohort::test

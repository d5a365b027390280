// Load beside a measurement: processes that only spin, as other work on a
// shared machine does, started before it and ended (by pid) after it.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace cohort::bench {

class busy_loops {
 public:
  explicit busy_loops(int count) {
    for (int i = 0; i < count; ++i) {
      const pid_t pid = ::fork();
      if (pid < 0) {
        std::perror("fork");
        std::exit(1);
      }
      if (pid == 0) {
        for (;;) asm volatile("" ::: "memory");
      }
      pids_.push_back(pid);
    }
  }
  busy_loops(const busy_loops&) = delete;
  busy_loops& operator=(const busy_loops&) = delete;
  ~busy_loops() {
    for (pid_t pid : pids_) ::kill(pid, SIGKILL);
    for (pid_t pid : pids_) {
      while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
      }
    }
  }

 private:
  std::vector<pid_t> pids_;
};

}  // namespace cohort::bench

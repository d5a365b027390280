// A futex word that a forked child shares, and the child that wakes it.
#pragma once

#include <doctest/doctest.h>

#include <linux/futex.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdint>
#include <new>

namespace cohort::test {

// A futex word alone on a MAP_SHARED page, so a forked child shares it.
struct shared_word {
  void* page = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  shared_word() {
    REQUIRE(page != MAP_FAILED);
    new (page) std::atomic<std::uint32_t>(0);
  }
  shared_word(const shared_word&) = delete;
  shared_word& operator=(const shared_word&) = delete;
  ~shared_word() { ::munmap(page, 4096); }
  std::atomic<std::uint32_t>& operator*() { return *static_cast<std::atomic<std::uint32_t>*>(page); }
};

// Forks a child that sleeps `delay_ms`, stores `value` in the word, wakes
// every waiter with the raw syscall and exits with how many woke. The child
// makes only async-signal-safe calls: the parent may have threads.
inline pid_t fork_waker(std::atomic<std::uint32_t>& word, std::uint32_t value, int delay_ms) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::poll(nullptr, 0, delay_ms);
    word.store(value, std::memory_order_release);
    const long woken = ::syscall(SYS_futex, &word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
    ::_exit(woken < 0 ? 255 : static_cast<int>(woken));
  }
  return pid;
}

// Reaps `pid`; its exit code, or -1 when it did not exit normally.
inline int reap(pid_t pid) {
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace cohort::test

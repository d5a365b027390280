#include "os/fork_safe_mutex.hpp"
#include "os/per_process.hpp"
#include "os/process_identity.hpp"

#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

using namespace cohort;

namespace {

struct counter {
  int value = 0;
};

// What a forked child saw, sent back through a pipe.
struct seen_in_child {
  pid_t cached = 0;        // os::this_process()
  pid_t asked = 0;         // getpid()
  bool made_before = true;  // os::made_in_this_process<counter>() before any use
  int value = -1;          // os::of_this_process<counter>().value, fresh in the child
};

}  // namespace

TEST_SUITE("per-process state") {
  TEST_CASE("a child of fork knows its own pid and gets its own state, not its parent's") {
    // The parent's pid and state, cached before the fork.
    REQUIRE(os::this_process() == ::getpid());
    os::of_this_process<counter>().value = 41;
    REQUIRE(os::made_in_this_process<counter>() == &os::of_this_process<counter>());

    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      seen_in_child s;
      s.cached = os::this_process();
      s.asked = ::getpid();
      s.made_before = os::made_in_this_process<counter>() != nullptr;
      s.value = os::of_this_process<counter>().value;
      ::_exit(::write(fds[1], &s, sizeof s) == sizeof s ? 0 : 1);
    }
    ::close(fds[1]);
    seen_in_child s;
    const auto n = ::read(fds[0], &s, sizeof s);
    ::close(fds[0]);
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    REQUIRE(n == static_cast<ssize_t>(sizeof s));
    CHECK(WIFEXITED(status));
    CHECK(s.asked == pid);
    CHECK(s.cached == pid);
    CHECK_FALSE(s.made_before);
    CHECK(s.value == 0);
    // The parent's are untouched.
    CHECK(os::this_process() == ::getpid());
    CHECK(os::of_this_process<counter>().value == 41);
  }
}

TEST_SUITE("fork_safe_mutex") {
  // With a plain mutex, a child forked while another thread held it found
  // it held for good (that thread does not run there), and what it guards
  // half changed.
  TEST_CASE("a fork waits for the holder to let go: the child finds the lock free and what it guards whole") {
    os::fork_safe_mutex m;
    int first = 0, second = 0;  // changed together, under the lock
    std::atomic<bool> stop{false};
    std::thread changer([&] {
      for (int i = 1; !stop; ++i) {
        std::lock_guard lock(m);
        first = i;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        second = i;
      }
    });
    for (int round = 0; round < 20; ++round) {
      const pid_t child = ::fork();
      if (child == 0) {
        if (!m.try_lock()) ::_exit(1);
        const bool whole = first == second;
        m.unlock();
        ::_exit(whole ? 0 : 2);
      }
      REQUIRE(child > 0);
      int status = 0;
      REQUIRE(::waitpid(child, &status, 0) == child);
      CHECK(WIFEXITED(status));
      CHECK(WEXITSTATUS(status) == 0);
    }
    stop = true;
    changer.join();
  }

  // The forks of a batch leave the mutexes alone in this process (taking
  // them again there would hang this thread on its own lock); each child
  // finds them free; another thread waits for the batch's end.
  TEST_CASE("held across forks: each child finds the lock free, other threads wait for the end") {
    os::fork_safe_mutex m;
    std::atomic<bool> taken{false};
    std::thread other;
    pid_t children[3] = {};
    {
      const os::fork_safe_mutexes_held held;
      other = std::thread([&] {
        std::lock_guard lock(m);
        taken = true;
      });
      for (pid_t& child : children) {
        child = ::fork();
        if (child == 0) {
          if (!m.try_lock()) ::_exit(1);
          m.unlock();
          ::_exit(0);
        }
        REQUIRE(child > 0);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      CHECK_FALSE(taken.load());
    }
    other.join();
    CHECK(taken.load());
    for (const pid_t child : children) {
      int status = 0;
      REQUIRE(::waitpid(child, &status, 0) == child);
      CHECK(WIFEXITED(status));
      CHECK(WEXITSTATUS(status) == 0);
    }
    // Free again in this process, for a plain fork as for this thread.
    REQUIRE(m.try_lock());
    m.unlock();
    const pid_t child = ::fork();
    if (child == 0) ::_exit(m.try_lock() ? 0 : 1);
    REQUIRE(child > 0);
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    CHECK(WEXITSTATUS(status) == 0);
  }

  // They live side by side on pages of slots, a page's worth at a time:
  // those on later pages, and slots given back and taken again, are taken
  // around each fork as the first ones are.
  TEST_CASE("a page's worth and more: a fork waits for the holder of any of them") {
    std::vector<std::unique_ptr<os::fork_safe_mutex>> many;
    for (int i = 0; i < 300; ++i) many.push_back(std::make_unique<os::fork_safe_mutex>());
    for (int i = 0; i < 300; i += 3) many[static_cast<std::size_t>(i)].reset();  // slots given back
    for (int i = 0; i < 50; ++i) many.push_back(std::make_unique<os::fork_safe_mutex>());  // and taken again
    for (const std::size_t pick : {std::size_t{1}, std::size_t{250}, many.size() - 1}) {
      auto& m = *many[pick];
      std::atomic<bool> holding{false};
      std::thread holder([&] {
        std::lock_guard lock(m);
        holding = true;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      });
      while (!holding) std::this_thread::yield();
      const pid_t child = ::fork();  // waits for the holder to let go
      if (child == 0) {
        bool all_free = true;
        for (auto& each : many) {
          if (!each) continue;
          if (!each->try_lock()) all_free = false;
          else each->unlock();
        }
        ::_exit(all_free ? 0 : 1);
      }
      REQUIRE(child > 0);
      holder.join();
      int status = 0;
      REQUIRE(::waitpid(child, &status, 0) == child);
      CHECK(WIFEXITED(status));
      CHECK(WEXITSTATUS(status) == 0);
    }
  }
}

#include "shm/fork.hpp"

#include "cohort/storage.hpp"

#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

using namespace cohort;

TEST_SUITE("fork") {
  TEST_CASE("children forked under a batch use shared memory and fork on their own, and others wait for its end") {
    storage before = storage::allocate_shared(64);  // inherited: each child takes a reference of its own
    before.data()[0] = std::byte{42};
    std::atomic<bool> trying{false}, allocated{false};
    std::thread other;
    std::vector<pid_t> children;
    {
      const shm::fork_batch batch;
      other = std::thread([&] {
        trying = true;
        storage s = storage::allocate_shared(64);  // the arena's lock: held by the batch
        allocated = true;
      });
      while (!trying) std::this_thread::yield();
      for (int i = 0; i < 4; ++i) {
        const pid_t pid = ::fork();
        if (pid == 0) {
          ::alarm(5);  // a lock left held hangs the child: SIGALRM ends it
          storage s = storage::allocate_shared(64);
          s.data()[63] = std::byte{7};
          // A fork of its own, outside any batch: its child finds the locks free too.
          const pid_t grandchild = ::fork();
          if (grandchild == 0) {
            storage t = storage::allocate_shared(64);
            ::_exit(t.data() != s.data() && before.data()[0] == std::byte{42} ? 0 : 1);
          }
          int status = 0;
          const bool grandchild_ok = grandchild > 0 && ::waitpid(grandchild, &status, 0) == grandchild &&
                                     WIFEXITED(status) && WEXITSTATUS(status) == 0;
          ::_exit(grandchild_ok && s.data()[63] == std::byte{7} ? 0 : 1);
        }
        REQUIRE(pid > 0);
        children.push_back(pid);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      CHECK_FALSE(allocated.load());  // still waiting while the batch lasts
    }
    other.join();
    CHECK(allocated.load());
    for (pid_t pid : children) {
      int status = 0;
      REQUIRE(::waitpid(pid, &status, 0) == pid);
      INFO("child ", pid, ": status ", status);
      CHECK(WIFEXITED(status));
      CHECK(WEXITSTATUS(status) == 0);
    }
    storage after = storage::allocate_shared(64);  // the batch let the locks go here too
    CHECK(after.data() != before.data());
  }
}

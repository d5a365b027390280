#include "shm/fork.hpp"

#include "cohort/queue.hpp"
#include "cohort/storage.hpp"

#include "support/carve_probe.hpp"
#include "support/fork_beside.hpp"

#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <optional>
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
  // Before, each child took its references as it started, after fork()
  // had returned in this process, which could free and carve the block
  // again first.
  TEST_CASE("a batch child holds what it inherits from the fork on, and lets go of it as a rank ends") {
    storage s = storage::allocate_shared(64);
    std::memset(s.data(), 0x5a, 64);
    const std::byte* const at = s.data();
    const storage kept = storage::allocate_shared(64);
    int go[2];
    REQUIRE(::pipe(go) == 0);
    pid_t pid = -1;
    {
      shm::fork_batch batch;
      batch.before_fork();
      pid = ::fork();
      if (pid == 0) {
        ::close(go[1]);
        char c = 0;
        if (::read(go[0], &c, 1) != 1) ::_exit(120);
        for (int i = 0; i < 64; ++i) {
          if (at[i] != std::byte{0x5a}) ::_exit(3);
        }
        detail::release_shared_memory_holds();  // as a forked rank does at its end
        ::_exit(0);
      }
      if (pid < 0) batch.fork_failed();
    }
    REQUIRE(pid > 0);
    ::close(go[0]);
    CHECK(detail::shared_holders(s) == 2);
    CHECK(detail::shared_holders(kept) == 2);
    s = storage();
    auto more = test::carve_over(at);
    REQUIRE(::write(go[1], "x", 1) == 1);
    ::close(go[1]);
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    CHECK(detail::shared_holders(kept) == 1);
  }
  TEST_CASE("a fork rank started by a plain fork's child holds what it inherits with references of its own") {
    // Its own references, not the plain fork's pipe: a rank closes the
    // descriptors it does not keep, that pipe's write end among them.
    const storage s = storage::allocate_shared(64);
    int report[2];
    REQUIRE(::pipe(report) == 0);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      pid_t rank = -1;
      {
        shm::fork_batch batch;
        batch.before_fork();
        rank = ::fork();
        if (rank == 0) {
          std::uint32_t seen[2] = {detail::shared_holders(s), 0};
          detail::release_shared_memory_holds();  // as a forked rank does at its end
          seen[1] = detail::shared_holders(s);
          ::_exit(::write(report[1], seen, sizeof seen) == sizeof seen ? 0 : 1);
        }
        if (rank < 0) batch.fork_failed();
      }
      int status = 0;
      ::_exit(rank > 0 && ::waitpid(rank, &status, 0) == rank && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1);
    }
    ::close(report[1]);
    std::uint32_t seen[2] = {0, 0};
    CHECK(::read(report[0], seen, sizeof seen) == sizeof seen);
    ::close(report[0]);
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    CHECK(seen[0] == 3);  // this process's, the one it keeps for the plain child, the rank's
    CHECK(seen[1] == 2);
    trim_shared_memory();
    CHECK(detail::shared_holders(s) == 1);
  }

  TEST_CASE("a queue's last holder on another thread during a batch drains it, not counting the batch's list") {
    const storage kept = storage::allocate_shared(64);
    std::optional<queue<storage>> q(std::in_place, 4);
    REQUIRE(q->put(kept, std::chrono::seconds(1)));
    std::thread other;
    {
      const shm::fork_batch batch;  // lists the queue's shared state among this process's storages
      other = std::thread([&q] { q.reset(); });
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // its last hold goes meanwhile
    }
    other.join();
    CHECK(detail::shared_holders(kept) == 1);
  }
  TEST_CASE("batches on two threads while a third drops storages never wait for each other for good") {
    // In a child with an alarm: a deadlock ends it with SIGALRM.
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::alarm(20);
      std::atomic<bool> stop{false};
      const auto batches = [&stop] {
        while (!stop.load(std::memory_order_relaxed)) {
          const shm::fork_batch batch;
        }
      };
      std::thread first(batches), second(batches);
      std::thread dropper([&stop] {
        std::vector<storage> held;
        while (!stop.load(std::memory_order_relaxed)) {
          held.push_back(storage::allocate_shared(64));
          if (held.size() == 16) held.clear();  // perhaps during a batch, which lists them
        }
      });
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      stop = true;
      first.join();
      second.join();
      dropper.join();
      ::_exit(0);
    }
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    INFO("status ", status);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
  TEST_CASE("plain forks on one thread beside batches that fork on another never wait for each other for good") {
    // glibc lets go of its own fork lock around each handler, so a plain
    // fork's handler may wait for a batch whose next fork needs that lock.
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::alarm(20);
      const storage s = storage::allocate_shared(64);  // something for each fork to hold
      std::atomic<bool> stop{false};
      std::atomic<int> plain{0}, batched{0};
      std::thread forking([&] {
        while (!stop.load(std::memory_order_relaxed)) {
          const pid_t child = ::fork();
          if (child == 0) ::_exit(0);
          if (child < 0 || ::waitpid(child, nullptr, 0) != child) ::_exit(3);
          ++plain;
        }
      });
      std::thread batches([&] {
        while (!stop.load(std::memory_order_relaxed)) {
          std::vector<pid_t> children;
          {
            shm::fork_batch batch;
            for (int i = 0; i < 4; ++i) {
              batch.before_fork();
              const pid_t child = ::fork();
              if (child == 0) {
                detail::release_shared_memory_holds();
                ::_exit(0);
              }
              if (child < 0) {
                batch.fork_failed();
                ::_exit(4);
              }
              children.push_back(child);
            }
          }
          for (pid_t child : children) ::waitpid(child, nullptr, 0);
          ++batched;
        }
      });
      std::this_thread::sleep_for(std::chrono::milliseconds(1000));
      stop = true;
      forking.join();
      batches.join();
      trim_shared_memory();
      ::_exit(plain > 0 && batched > 0 && detail::shared_holders(s) == 1 ? 0 : 5);
    }
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    INFO("status ", status);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }

  // Before, the locks of moves into shared memory were not the fork
  // handlers': a child forked while another thread moved a storage found
  // that stripe held for good, and its own move of a storage on the same
  // stripe hung.
  TEST_CASE("a plain fork while another thread moves storages into shared memory: the child's moves run") {
    const auto outcome = test::fork_beside(
        1,
        [] {
          storage s = storage::allocate(1 << 20);  // a long copy, a lock held long
          s.share_memory();
        },
        50,
        [] {
          // Storages enough to fall on every stripe.
          std::vector<storage> moved;
          for (int i = 0; i < 256; ++i) {
            moved.push_back(storage::allocate(64));
            moved.back().share_memory();
          }
          return std::all_of(moved.begin(), moved.end(), [](const storage& s) { return s.is_shared(); }) ? 0 : 1;
        });
    CHECK(outcome.hung == 0);
    CHECK(outcome.failed == 0);
  }
}

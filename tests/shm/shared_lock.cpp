#include "shm/shared_lock.hpp"

#include "os/process_identity.hpp"

#include "support/shared_word.hpp"

#include <doctest/doctest.h>

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <new>
#include <string>
#include <system_error>
#include <thread>

using namespace cohort;
using namespace std::chrono_literals;
using test::fork_waker;
using test::reap;
using test::shared_word;

TEST_SUITE("shared_lock") {
  TEST_CASE("a shared_lock keeps the increments of two processes apart") {
    struct guarded {
      shm::shared_lock lock;
      std::uint64_t count = 0;
    };
    shared_word page;
    auto& g = *new (page.page) guarded{};
    constexpr int each = 200000;
    const auto add = [&] {
      for (int i = 0; i < each; ++i) {
        g.lock.lock();
        const auto n = g.count;  // a read and a write apart: a lost update shows
        g.count = n + 1;
        g.lock.unlock();
      }
    };
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      add();
      ::_exit(0);
    }
    add();
    CHECK(reap(child) == 0);
    CHECK(g.count == 2u * each);
    CHECK(g.lock.word.load() == 0);
  }

  TEST_CASE("a shared_lock whose holder was killed holding it, reaped or not, is taken over") {
    for (const bool reaped : {true, false}) {
      CAPTURE(reaped);
      shared_word page;
      auto& lock = *new (page.page) shm::shared_lock{};
      const pid_t child = ::fork();
      REQUIRE(child >= 0);
      if (child == 0) {
        lock.lock();
        ::raise(SIGKILL);
      }
      // Held by the child, then by nobody alive.
      while (lock.word.load() == 0) std::this_thread::yield();
      CHECK((lock.word.load() & ~shm::shared_lock::sleeping) == static_cast<std::uint32_t>(child));
      int status = 0;
      if (reaped) REQUIRE(::waitpid(child, &status, 0) == child);
      lock.lock();  // a zombie holds nothing either
      CHECK((lock.word.load() & ~shm::shared_lock::sleeping) == static_cast<std::uint32_t>(::getpid()));
      lock.unlock();
      if (!reaped) REQUIRE(::waitpid(child, &status, 0) == child);
      CHECK(WIFSIGNALED(status));
    }
  }

  TEST_CASE("a shared_lock held by a process whose main thread has exited is not taken over") {
    struct guarded {
      shm::shared_lock lock;
      std::atomic<int> released{0};
    };
    shared_word page;
    auto& g = *new (page.page) guarded{};
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      g.lock.lock();
      // The process goes on in another thread; /proc shows its leader as a
      // zombie meanwhile.
      static guarded* shared = &g;
      pthread_t t;
      ::pthread_create(&t, nullptr, [](void*) -> void* {
        ::poll(nullptr, 0, 300);
        shared->released.store(1);
        shared->lock.unlock();
        ::_exit(0);
      }, nullptr);
      ::syscall(SYS_exit, 0);  // this thread alone, without unwinding through the test's frames
    }
    while (g.lock.word.load() == 0) std::this_thread::yield();
    g.lock.lock();
    CHECK(g.released.load() == 1);
    g.lock.unlock();
    CHECK(reap(child) == 0);
  }
  TEST_CASE("a shared_lock is not taken from a live holder when the record read names another process") {
    // What a waiter sees when the lock changed hands between its read of
    // the word and its read of the record, and came back to the same pid:
    // the word names a live holder, the record another live process.
    shm::shared_lock lock;
    const pid_t holder = ::fork();
    REQUIRE(holder >= 0);
    if (holder == 0) {
      ::poll(nullptr, 0, 10000);
      ::_exit(0);
    }
    lock.word.store(static_cast<std::uint32_t>(holder) | shm::shared_lock::sleeping);
    lock.holder.store(shm::shared_lock::record_of(static_cast<std::uint32_t>(::getpid()), os::own_start_time()));
    std::atomic<bool> taken{false};
    std::thread waiter([&] {
      lock.lock();
      taken.store(true);
      lock.unlock();
    });
    // Twenty of the waiter's checks of the holder.
    std::this_thread::sleep_for(200ms);
    const bool taken_from_live_holder = taken.load();
    lock.unlock();  // as the holder would
    waiter.join();
    CHECK_FALSE(taken_from_live_holder);
    CHECK(taken.load());
    ::kill(holder, SIGKILL);
    CHECK(reap(holder) == -1);
  }
}

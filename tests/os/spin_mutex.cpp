#include "os/spin_mutex.hpp"

#include <doctest/doctest.h>

#include <sys/single_threaded.h>

#include <mutex>
#include <thread>
#include <vector>

using namespace cohort;

TEST_SUITE("spin mutex") {
  TEST_CASE("a lock taken while libc counts one thread, and then among threads, excludes and frees") {
    os::spin_mutex mutex;
    // No thread has started in this program yet: the single-threaded path.
    REQUIRE(__libc_single_threaded);
    {
      std::lock_guard lock(mutex);
      CHECK_FALSE(mutex.try_lock());
    }
    CHECK(mutex.try_lock());
    mutex.unlock();
    // Threads now: the atomic path, taken by each in turn.
    constexpr int threads = 4, rounds = 100'000;
    long counted = 0;  // not atomic: the lock alone keeps it whole
    std::vector<std::thread> running;
    for (int t = 0; t < threads; ++t) {
      running.emplace_back([&] {
        for (int i = 0; i < rounds; ++i) {
          std::lock_guard lock(mutex);
          ++counted;
        }
      });
    }
    for (auto& t : running) t.join();
    CHECK(counted == long{threads} * rounds);
    CHECK(mutex.try_lock());
    mutex.unlock();
  }
}

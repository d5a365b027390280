#include "os/futex.hpp"

#include "support/shared_word.hpp"

#include <doctest/doctest.h>

#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
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

namespace {

void ignore_signal(int) {}

}  // namespace

TEST_SUITE("blocking futex") {
  TEST_CASE("the blocking wait times out while the word keeps its value") {
    shared_word w;
    const auto start = std::chrono::steady_clock::now();
    CHECK(os::futex_wait(*w, 0, 30ms) == os::futex_result::timed_out);
    CHECK(std::chrono::steady_clock::now() - start >= 30ms);
  }

  TEST_CASE("the blocking wait reports value_changed when the word differs") {
    shared_word w;
    (*w).store(3);
    CHECK(os::futex_wait(*w, 0, 5s) == os::futex_result::value_changed);
    CHECK(os::futex_wait(*w, 0, std::nullopt) == os::futex_result::value_changed);
  }

  TEST_CASE("the blocking wait is woken by another process") {
    shared_word w;
    const pid_t child = fork_waker(*w, 1, 200);
    CHECK(os::futex_wait(*w, 0, 10s) == os::futex_result::woken);
    CHECK(reap(child) == 1);
    CHECK((*w).load(std::memory_order_acquire) == 1);
  }

  TEST_CASE("the blocking wait reports a signal handler as interrupted") {
    shared_word w;
    struct sigaction action {}, old {};
    action.sa_handler = ignore_signal;
    ::sigemptyset(&action.sa_mask);
    REQUIRE(::sigaction(SIGUSR1, &action, &old) == 0);
    std::atomic<bool> done{false};
    os::futex_result result{};
    std::thread waiter([&] {
      result = os::futex_wait(*w, 0, 10s);
      done = true;
    });
    while (!done) {  // again and again: one may land before the thread sleeps
      ::pthread_kill(waiter.native_handle(), SIGUSR1);
      std::this_thread::sleep_for(10ms);
    }
    waiter.join();
    ::sigaction(SIGUSR1, &old, nullptr);
    CHECK(result == os::futex_result::interrupted);
  }

  TEST_CASE("a wait or wake on an unmapped word throws naming the call") {
    void* page = ::mmap(nullptr, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(page != MAP_FAILED);
    auto& word = *static_cast<std::atomic<std::uint32_t>*>(page);  // never touched here
    ::munmap(page, 4096);
    try {
      os::futex_wait(word, 0, 1s);
      FAIL("futex_wait did not throw");
    } catch (const std::system_error& e) {
      CHECK(e.code() == std::error_code(EFAULT, std::system_category()));
      CHECK(std::string(e.what()).find("futex wait") != std::string::npos);
    }
    CHECK_THROWS_WITH_AS(os::futex_wake(word, 1), doctest::Contains("futex wake"), std::system_error);
    std::error_code ec;
    os::futex_wait(word, 0, 1s, ec);
    CHECK(ec == std::error_code(EFAULT, std::system_category()));
  }

  TEST_CASE("the two-word wait ends when either word is woken, and times out while neither changes") {
    shared_word a, b;
    std::error_code ec;
    const auto start = std::chrono::steady_clock::now();
    CHECK(os::futex_wait_two(*a, 0, *b, 0, 30ms, ec) == os::futex_result::timed_out);
    CHECK(std::chrono::steady_clock::now() - start >= 30ms);
    CHECK_FALSE(ec);
    (*b).store(5);
    CHECK(os::futex_wait_two(*a, 0, *b, 0, 5s, ec) == os::futex_result::value_changed);
    (*b).store(0);
    for (auto* woken : {&a, &b}) {
      std::thread waker([&] {
        std::this_thread::sleep_for(50ms);
        (**woken).store(1);
        os::futex_wake(**woken, INT_MAX);
      });
      const auto begun = std::chrono::steady_clock::now();
      const auto result = os::futex_wait_two(*a, 0, *b, 0, 10s, ec);
      CHECK((result == os::futex_result::woken || result == os::futex_result::value_changed));
      CHECK(std::chrono::steady_clock::now() - begun < 5s);
      waker.join();
      (**woken).store(0);
    }
  }
}

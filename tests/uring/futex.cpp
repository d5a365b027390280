#include "uring/futex.hpp"
#include "shm/futex.hpp"

#include "support/harness.hpp"

#include <doctest/doctest.h>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <thread>

using namespace cohort;
using namespace std::chrono_literals;
using namespace asio::experimental::awaitable_operators;

namespace {

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
pid_t fork_waker(std::atomic<std::uint32_t>& word, std::uint32_t value, int delay_ms) {
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
int reap(pid_t pid) {
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

void ignore_signal(int) {}

}  // namespace

TEST_SUITE("futex") {
  // The io_uring run exists to test the ring's futex wait: without it (before
  // Linux 6.7) that run would only repeat the reactor run, so it skips.
  TEST_CASE("the io_uring run has the ring's futex wait to test") {
    if (test::reactor_mode()) return;
    asio::io_context io;
    const auto info = io_uring_support(io);
    if (!info.futex) {
      std::printf("SKIP: io_uring futex wait unavailable (%s)\n",
                  info.why_not.empty() ? "IORING_OP_FUTEX_WAIT not probed" : info.why_not.c_str());
      std::fflush(stdout);
      std::_Exit(77);
    }
  }

  TEST_CASE("a wait on a word that no longer holds the expected value completes at once") {
    asio::io_context io;
    shared_word w;
    (*w).store(7);
    std::optional<std::error_code> result;
    uring::async_futex_wait(io.get_executor(), *w, 0, [&](std::error_code ec) { result = ec; });
    CHECK_FALSE(result);  // never inline
    io.run_for(5s);
    REQUIRE(result);
    CHECK(*result == std::error_code{});
  }

  TEST_CASE("a wait is woken by a futex_wake from another thread") {
    asio::io_context io;
    shared_word w;
    std::optional<std::error_code> result;
    uring::async_futex_wait(io.get_executor(), *w, 0, [&](std::error_code ec) { result = ec; });
    io.run_for(100ms);
    REQUIRE_FALSE(result);
    int woken = -1;
    std::thread waker([&] {
      (*w).store(1, std::memory_order_release);
      woken = shm::futex_wake(*w, INT_MAX);
    });
    io.run_for(5s);
    waker.join();
    REQUIRE(result);
    CHECK(*result == std::error_code{});
    CHECK(woken == 1);  // the waiter was asleep on the word itself
  }

  TEST_CASE("a wait is woken by a futex wake from another process") {
    asio::io_context io;
    shared_word w;
    const pid_t child = fork_waker(*w, 1, 200);
    std::optional<std::error_code> result;
    uring::async_futex_wait(io.get_executor(), *w, 0, [&](std::error_code ec) { result = ec; });
    io.run_for(50ms);
    CHECK_FALSE(result);
    io.run_for(5s);
    CHECK(reap(child) == 1);
    REQUIRE(result);
    CHECK(*result == std::error_code{});
    CHECK((*w).load() == 1);
  }

  TEST_CASE("a wait cancelled through its slot completes with operation_aborted and is no longer woken") {
    asio::io_context io;
    auto w = std::make_unique<shared_word>();
    asio::cancellation_signal cancel;
    int calls = 0;
    std::error_code result;
    uring::async_futex_wait(io.get_executor(), **w, 0, asio::bind_cancellation_slot(cancel.slot(), [&](std::error_code ec) {
                              ++calls;
                              result = ec;
                            }));
    io.run_for(50ms);
    REQUIRE(calls == 0);
    cancel.emit(asio::cancellation_type::terminal);
    io.run_for(5s);
    CHECK(calls == 1);
    CHECK(result == asio::error::operation_aborted);
    // Nobody sleeps on the word any more: the ring request or the thread is gone.
    CHECK(shm::futex_wake(**w, INT_MAX) == 0);
    (**w).store(1);
    w.reset();
    cancel.emit(asio::cancellation_type::terminal);  // the slot was cleared: nothing runs
    io.restart();
    io.run_for(50ms);
    CHECK(calls == 1);
  }

  TEST_CASE("a wait loses a race with a timer and is cancelled") {
    asio::io_context io;
    shared_word w;
    auto winner = test::run(io, [&]() -> asio::awaitable<std::size_t> {
      asio::steady_timer t(io, 20ms);
      auto r = co_await (uring::async_futex_wait(io.get_executor(), *w, 0, asio::use_awaitable) ||
                         t.async_wait(asio::use_awaitable));
      co_return r.index();
    }());
    CHECK(winner == 1);
    CHECK(shm::futex_wake(*w, INT_MAX) == 0);
  }

  TEST_CASE("a wait cancelled as it is woken completes exactly once") {
    shared_word w;
    for (int i = 0; i < 100; ++i) {
      asio::io_context io;
      (*w).store(0);
      asio::cancellation_signal cancel;
      int calls = 0;
      std::error_code result;
      uring::async_futex_wait(io.get_executor(), *w, 0, asio::bind_cancellation_slot(cancel.slot(), [&](std::error_code ec) {
                                ++calls;
                                result = ec;
                              }));
      io.poll();
      std::thread waker([&] {
        (*w).store(1, std::memory_order_release);
        shm::futex_wake(*w, INT_MAX);
      });
      cancel.emit(asio::cancellation_type::terminal);
      waker.join();
      io.run_for(5s);
      REQUIRE(calls == 1);
      CHECK((!result || result == asio::error::operation_aborted));
    }
  }

  TEST_CASE("destroying the io_context with a wait pending destroys the handler uncalled") {
    shared_word w;
    auto token = std::make_shared<int>(0);
    std::weak_ptr<int> alive = token;
    bool called = false;
    {
      asio::io_context io;
      uring::async_futex_wait(io.get_executor(), *w, 0, [&called, token = std::move(token)](std::error_code) { called = true; });
      io.run_for(50ms);
    }
    CHECK_FALSE(called);
    CHECK(alive.expired());
    CHECK(shm::futex_wake(*w, INT_MAX) == 0);
  }

  TEST_CASE("the blocking wait times out while the word keeps its value") {
    shared_word w;
    const auto start = std::chrono::steady_clock::now();
    CHECK(shm::futex_wait(*w, 0, 30ms) == shm::futex_result::timed_out);
    CHECK(std::chrono::steady_clock::now() - start >= 30ms);
  }

  TEST_CASE("the blocking wait reports value_changed when the word differs") {
    shared_word w;
    (*w).store(3);
    CHECK(shm::futex_wait(*w, 0, 5s) == shm::futex_result::value_changed);
    CHECK(shm::futex_wait(*w, 0, std::nullopt) == shm::futex_result::value_changed);
  }

  TEST_CASE("the blocking wait is woken by another process") {
    shared_word w;
    const pid_t child = fork_waker(*w, 1, 200);
    CHECK(shm::futex_wait(*w, 0, 10s) == shm::futex_result::woken);
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
    shm::futex_result result{};
    std::thread waiter([&] {
      result = shm::futex_wait(*w, 0, 10s);
      done = true;
    });
    while (!done) {  // again and again: one may land before the thread sleeps
      ::pthread_kill(waiter.native_handle(), SIGUSR1);
      std::this_thread::sleep_for(10ms);
    }
    waiter.join();
    ::sigaction(SIGUSR1, &old, nullptr);
    CHECK(result == shm::futex_result::interrupted);
  }

  TEST_CASE("a wait or wake on an unmapped word throws naming the call") {
    void* page = ::mmap(nullptr, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(page != MAP_FAILED);
    auto& word = *static_cast<std::atomic<std::uint32_t>*>(page);  // never touched here
    ::munmap(page, 4096);
    try {
      shm::futex_wait(word, 0, 1s);
      FAIL("futex_wait did not throw");
    } catch (const std::system_error& e) {
      CHECK(e.code() == std::error_code(EFAULT, std::system_category()));
      CHECK(std::string(e.what()).find("futex wait") != std::string::npos);
    }
    CHECK_THROWS_WITH_AS(shm::futex_wake(word, 1), doctest::Contains("futex wake"), std::system_error);
    std::error_code ec;
    shm::futex_wait(word, 0, 1s, ec);
    CHECK(ec == std::error_code(EFAULT, std::system_category()));
  }

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
}


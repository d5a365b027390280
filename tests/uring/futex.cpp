#include "uring/futex.hpp"

#include "cohort/io_uring_info.hpp"

#include "support/harness.hpp"
#include "support/shared_word.hpp"

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

#include <algorithm>
#include <climits>
#include <filesystem>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <thread>
#include <vector>

using namespace cohort;

// The io_uring run tests the ring's futex wait (Linux 6.7).
const test::needs_ring_operation needs{"IORING_OP_FUTEX_WAIT", &io_uring_info::futex};
using test::fork_waker;
using test::reap;
using test::shared_word;
using namespace std::chrono_literals;
using namespace asio::experimental::awaitable_operators;


TEST_SUITE("futex") {
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
      woken = os::futex_wake(*w, INT_MAX);
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
    CHECK(os::futex_wake(**w, INT_MAX) == 0);
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
    CHECK(os::futex_wake(*w, INT_MAX) == 0);
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
        os::futex_wake(*w, INT_MAX);
      });
      cancel.emit(asio::cancellation_type::terminal);
      waker.join();
      io.run_for(5s);
      REQUIRE(calls == 1);
      CHECK((!result || result == asio::error::operation_aborted));
    }
  }

  TEST_CASE("a thousand pending waits end by their own wakes or cancellations, on few threads without the ring") {
    constexpr std::size_t n = 1000;
    void* page = ::mmap(nullptr, n * 4, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    REQUIRE(page != MAP_FAILED);
    auto* words = static_cast<std::atomic<std::uint32_t>*>(page);
    for (std::size_t i = 0; i < n; ++i) new (&words[i]) std::atomic<std::uint32_t>(0);
    const auto tasks_before = std::distance(std::filesystem::directory_iterator("/proc/self/task"),
                                            std::filesystem::directory_iterator());
    {
      asio::io_context io;
      std::vector<std::optional<std::error_code>> results(n);
      std::vector<asio::cancellation_signal> cancels(n);
      for (std::size_t i = 0; i < n; ++i) {
        uring::async_futex_wait(io.get_executor(), words[i], 0,
                                asio::bind_cancellation_slot(cancels[i].slot(), [&results, i](std::error_code ec) {
                                  REQUIRE_FALSE(results[i]);
                                  results[i] = ec;
                                }));
      }
      io.run_for(50ms);
      CHECK(std::count(results.begin(), results.end(), std::nullopt) == static_cast<long>(n));
      if (!io_uring_support(io).futex) {
        const auto most = (n + uring::futex_threads::waits_per_thread() - 1) / uring::futex_threads::waits_per_thread();
        CHECK(asio::use_service<uring::futex_threads>(io).threads() == most);
        const auto tasks = std::distance(std::filesystem::directory_iterator("/proc/self/task"),
                                         std::filesystem::directory_iterator());
        CHECK(tasks - tasks_before == static_cast<long>(most));
      }
      // Even words are stored to and woken from another thread; odd waits are cancelled.
      std::thread waker([&] {
        for (std::size_t i = 0; i < n; i += 2) {
          words[i].store(1, std::memory_order_release);
          os::futex_wake(words[i], INT_MAX);
        }
      });
      for (std::size_t i = 1; i < n; i += 2) cancels[i].emit(asio::cancellation_type::terminal);
      waker.join();
      for (int round = 0; round < 500 && std::count(results.begin(), results.end(), std::nullopt) > 0; ++round) {
        io.run_for(10ms);
      }
      for (std::size_t i = 0; i < n; ++i) {
        CAPTURE(i);
        REQUIRE(results[i]);
        CHECK(*results[i] == (i % 2 == 0 ? std::error_code{} : std::error_code(asio::error::operation_aborted)));
        CHECK(os::futex_wake(words[i], INT_MAX) == 0);  // nobody sleeps on it any more
      }
    }
    ::munmap(page, n * 4);
  }

  // Before, a forked child gave its waits to the helpers listed, which were
  // the parent's: their threads do not run in the child, and the waits never
  // ended.
  TEST_CASE("a forked child's waits on helper threads get helpers of its own; its copies of the parent's end") {
    asio::io_context io;
    use_reactor_only(io);  // helper threads, with the ring's futex op or without
    shared_word w;
    std::optional<std::error_code> first;
    uring::async_futex_wait(io.get_executor(), *w, 0, [&](std::error_code ec) { first = ec; });
    io.run_for(20ms);
    REQUIRE_FALSE(first);  // held by a helper thread, which runs on
    REQUIRE(asio::use_service<uring::futex_threads>(io).threads() == 1);
    const pid_t pid = ::fork();
    if (pid == 0) {
      io.notify_fork(asio::execution_context::fork_child);
      shared_word mine;
      std::optional<std::error_code> result;
      uring::async_futex_wait(io.get_executor(), *mine, 0, [&](std::error_code ec) { result = ec; });
      io.run_for(20ms);
      std::thread waker([&] {
        (*mine).store(1, std::memory_order_release);
        os::futex_wake(*mine, INT_MAX);
      });
      waker.join();
      for (int round = 0; round < 500 && !result; ++round) io.run_for(10ms);
      // Its copy of the parent's wait ended as cancelled.
      ::_exit(result && !*result && first == std::error_code(asio::error::operation_aborted) ? 0 : 1);
    }
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
    (*w).store(1, std::memory_order_release);
    os::futex_wake(*w, INT_MAX);
    for (int round = 0; round < 500 && !first; ++round) io.run_for(10ms);
    REQUIRE(first);
    CHECK(*first == std::error_code{});
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
    CHECK(os::futex_wake(*w, INT_MAX) == 0);
  }


}


#include "cohort/when_any.hpp"

#include "support/harness.hpp"

#include <doctest/doctest.h>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/redirect_error.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

using namespace cohort;
using namespace std::chrono_literals;

namespace {

/// What the ops of one when_any did: how many of their frames are alive,
/// how many saw their timer cancelled.
struct op_log {
  std::atomic<int> alive{0};
  std::atomic<int> cancelled{0};
};

/// Counts an op's frame as alive for as long as the frame exists.
struct frame_guard {
  explicit frame_guard(op_log& l) : log(l) { ++log.alive; }
  frame_guard(const frame_guard&) = delete;
  frame_guard& operator=(const frame_guard&) = delete;
  ~frame_guard() { --log.alive; }
  op_log& log;
};

/// A result type that counts its live objects and has no default constructor.
struct counted {
  static inline std::atomic<int> live{0};
  int value;
  explicit counted(int v) : value(v) { ++live; }
  counted(const counted& other) : value(other.value) { ++live; }
  counted(counted&& other) noexcept : value(other.value) { ++live; }
  counted& operator=(const counted&) = default;
  ~counted() { --live; }
};

/// Waits `delay`; a cancelled wait is counted and thrown as operation_aborted.
asio::awaitable<void> wait_for(op_log& log, std::chrono::milliseconds delay) {
  asio::steady_timer timer(co_await asio::this_coro::executor, delay);
  std::error_code ec;
  co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  if (ec == asio::error::operation_aborted) ++log.cancelled;
  if (ec) throw std::system_error(ec, "timer");
}

asio::awaitable<int> after(op_log& log, std::chrono::milliseconds delay, int value) {
  frame_guard guard(log);
  co_await wait_for(log, delay);
  co_return value;
}

/// Completes at once when `delay` is zero.
asio::awaitable<counted> counted_after(op_log& log, std::chrono::milliseconds delay, int value) {
  frame_guard guard(log);
  if (delay > 0ms) co_await wait_for(log, delay);
  co_return counted(value);
}

asio::awaitable<void> void_after(op_log& log, std::chrono::milliseconds delay) {
  frame_guard guard(log);
  co_await wait_for(log, delay);
}

asio::awaitable<int> at_once(op_log& log, int value) {
  frame_guard guard(log);
  co_return value;
}

asio::awaitable<int> throw_after(op_log& log, std::chrono::milliseconds delay) {
  frame_guard guard(log);
  co_await wait_for(log, delay);
  throw std::runtime_error("op failed");
}

/// Throws std::logic_error once cancelled.
asio::awaitable<int> throw_when_cancelled(op_log& log) {
  frame_guard guard(log);
  std::error_code ec;
  asio::steady_timer timer(co_await asio::this_coro::executor, 10s);
  co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  if (ec == asio::error::operation_aborted) ++log.cancelled;
  throw std::logic_error("loser failed");
}

/// Once cancelled, takes `cleanup` more to end, then records that it did.
asio::awaitable<int> slow_to_cancel(op_log& log, std::chrono::milliseconds cleanup, std::atomic<bool>& cleaned_up) {
  frame_guard guard(log);
  asio::steady_timer timer(co_await asio::this_coro::executor, 10s);
  std::error_code ec;
  co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  if (ec == asio::error::operation_aborted) ++log.cancelled;
  co_await asio::this_coro::reset_cancellation_state();
  timer.expires_after(cleanup);
  co_await timer.async_wait(asio::use_awaitable);
  cleaned_up = true;
  co_return 0;
}

/// The winner of a when_any over counted results, and how many counted
/// objects were alive while it was held. (test::run needs a result with a
/// default constructor, which counted lacks.)
struct counted_winner {
  std::size_t index = 0;
  int value = -1;
  int live_while_held = -1;
};

asio::awaitable<counted_winner> first_counted(std::vector<asio::awaitable<counted>> ops) {
  auto [index, value] = co_await when_any(std::move(ops));
  co_return counted_winner{index, value.value, counted::live};
}

template <class T>
std::vector<asio::awaitable<T>> list_of(asio::awaitable<T> a, asio::awaitable<T> b, asio::awaitable<T> c) {
  std::vector<asio::awaitable<T>> ops;
  ops.push_back(std::move(a));
  ops.push_back(std::move(b));
  ops.push_back(std::move(c));
  return ops;
}

/// The awaiting side of a cancellation test: its exception and what was
/// still alive when it got it.
struct cancelled_run {
  std::exception_ptr error;
  int alive_at_end = -1;
  bool ended = false;
};

/// Runs when_any(ops) in a coroutine whose cancellation slot is `signal`'s;
/// `signal` is emitted after `delay`. Returns the winner's index or -1.
long run_cancelled(std::vector<asio::awaitable<int>> ops, op_log& log, std::chrono::milliseconds delay,
                   cancelled_run& result) {
  asio::io_context io;
  asio::cancellation_signal signal;
  long index = -1;
  auto body = [&]() -> asio::awaitable<void> {
    auto [i, value] = co_await when_any(std::move(ops));
    index = static_cast<long>(i);
    CHECK(value == static_cast<int>(i) * 10);
  };
  asio::co_spawn(io, body(), asio::bind_cancellation_slot(signal.slot(), [&](std::exception_ptr e) {
                   result.error = e;
                   result.alive_at_end = log.alive;
                   result.ended = true;
                 }));
  asio::steady_timer trigger(io, delay);
  trigger.async_wait([&](std::error_code) { signal.emit(asio::cancellation_type::terminal); });
  io.run();
  return index;
}

std::error_code code_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::system_error& error) {
    return error.code();
  } catch (...) {
  }
  return {};
}

}  // namespace

TEST_SUITE("when_any") {

TEST_CASE("the earliest timer wins with its index and its value") {
  asio::io_context io;
  op_log log;
  auto ops = list_of(after(log, 200ms, 10), after(log, 1ms, 11), after(log, 300ms, 12));
  auto [index, value] = test::run(io, when_any(std::move(ops)));
  CHECK(index == 1);
  CHECK(value == 11);
}

TEST_CASE("the losers are cancelled and have ended when when_any returns") {
  asio::io_context io;
  op_log log;
  std::atomic<bool> cleaned_up{false};
  bool cleaned_up_on_return = false;
  int alive_on_return = -1;
  int cancelled_on_return = -1;
  auto body = [&]() -> asio::awaitable<std::size_t> {
    auto ops = list_of(after(log, 10s, 0), slow_to_cancel(log, 20ms, cleaned_up), after(log, 1ms, 2));
    auto [index, value] = co_await when_any(std::move(ops));
    cleaned_up_on_return = cleaned_up;
    alive_on_return = log.alive;
    cancelled_on_return = log.cancelled;
    co_return index;
  };
  CHECK(test::run(io, body()) == 2);
  CHECK(cleaned_up_on_return);
  CHECK(alive_on_return == 0);
  CHECK(cancelled_on_return == 2);
}

TEST_CASE("a winner that throws is rethrown after the losers have ended") {
  asio::io_context io;
  op_log log;
  std::string what;
  int alive_on_throw = -1;
  auto body = [&]() -> asio::awaitable<void> {
    auto ops = list_of(after(log, 10s, 0), throw_after(log, 1ms), after(log, 10s, 2));
    try {
      auto result = co_await when_any(std::move(ops));
      (void)result;
    } catch (const std::runtime_error& e) {
      what = e.what();
      alive_on_throw = log.alive;
    }
  };
  test::run(io, body());
  CHECK(what == "op failed");
  CHECK(alive_on_throw == 0);
  CHECK(log.cancelled == 2);
}

TEST_CASE("a loser that throws after its cancellation is ignored") {
  asio::io_context io;
  op_log log;
  auto ops = list_of(throw_when_cancelled(log), after(log, 1ms, 7), throw_when_cancelled(log));
  auto [index, value] = test::run(io, when_any(std::move(ops)));
  CHECK(index == 1);
  CHECK(value == 7);
  CHECK(log.cancelled == 2);
  CHECK(log.alive == 0);
}

TEST_CASE("an op that completes at once wins over pending timers") {
  asio::io_context io;
  op_log log;
  auto ops = list_of(after(log, 200ms, 0), after(log, 300ms, 1), at_once(log, 42));
  auto [index, value] = test::run(io, when_any(std::move(ops)));
  CHECK(index == 2);
  CHECK(value == 42);
  CHECK(log.cancelled == 2);
}

TEST_CASE("of ops that all complete at once, the first in the vector wins") {
  asio::io_context io;
  op_log log;
  auto ops = list_of(at_once(log, 5), at_once(log, 6), at_once(log, 7));
  auto [index, value] = test::run(io, when_any(std::move(ops)));
  CHECK(index == 0);
  CHECK(value == 5);
  CHECK(log.alive == 0);
}

/// Takes one of `held` at once, as a pop of a queue that holds values does.
asio::awaitable<int> take_one(int& held, int value) {
  --held;
  co_return value;
}

TEST_CASE("of ops that complete at once, those after the first are never started") {
  asio::io_context io;
  int first = 1, second = 1, third = 1;
  std::vector<asio::awaitable<int>> ops;
  ops.push_back(take_one(first, 10));
  ops.push_back(take_one(second, 20));
  ops.push_back(take_one(third, 30));
  auto [index, value] = test::run(io, when_any(std::move(ops)));
  CHECK(index == 0);
  CHECK(value == 10);
  CHECK(first == 0);
  CHECK(second == 1);
  CHECK(third == 1);
}

TEST_CASE("an op that completes at once after pending ones: those after it are never started") {
  asio::io_context io;
  op_log log;
  int later = 1;
  std::vector<asio::awaitable<int>> ops;
  ops.push_back(after(log, 200ms, 0));
  ops.push_back(at_once(log, 42));
  ops.push_back(take_one(later, 7));
  auto [index, value] = test::run(io, when_any(std::move(ops)));
  CHECK(index == 1);
  CHECK(value == 42);
  CHECK(later == 1);
  CHECK(log.cancelled == 1);
  CHECK(log.alive == 0);
}

TEST_CASE("awaitables without a result complete with the winner's index") {
  asio::io_context io;
  op_log log;
  auto ops = list_of(void_after(log, 10s), void_after(log, 1ms), void_after(log, 10s));
  CHECK(test::run(io, when_any(std::move(ops))) == 1);
  CHECK(log.cancelled == 2);
  CHECK(log.alive == 0);
}

TEST_CASE("an empty vector throws invalid_argument at the call") {
  CHECK_THROWS_AS((void)when_any(std::vector<asio::awaitable<int>>{}), std::invalid_argument);
  CHECK_THROWS_AS((void)when_any(std::vector<asio::awaitable<void>>{}), std::invalid_argument);
}

TEST_CASE("cancelling the awaiting coroutine ends when_any with operation_aborted after every op has ended") {
  op_log log;
  std::atomic<bool> cleaned_up{false};
  std::vector<asio::awaitable<int>> ops;
  ops.push_back(after(log, 10s, 0));
  ops.push_back(slow_to_cancel(log, 50ms, cleaned_up));
  ops.push_back(after(log, 10s, 20));
  cancelled_run result;
  CHECK(run_cancelled(std::move(ops), log, 20ms, result) == -1);
  REQUIRE(result.ended);
  CHECK(code_of(result.error) == asio::error::operation_aborted);
  CHECK(result.alive_at_end == 0);
  CHECK(cleaned_up);
  CHECK(log.cancelled == 3);
}

TEST_CASE("an op that completed before the awaiting coroutine was cancelled still wins") {
  op_log log;
  std::atomic<bool> cleaned_up{false};
  std::vector<asio::awaitable<int>> ops;
  // Still ending (50 ms of cleanup) when the cancellation comes at 10 ms.
  ops.push_back(slow_to_cancel(log, 50ms, cleaned_up));
  ops.push_back(at_once(log, 10));
  cancelled_run result;
  CHECK(run_cancelled(std::move(ops), log, 10ms, result) == 1);
  REQUIRE(result.ended);
  CHECK(!result.error);
  CHECK(result.alive_at_end == 0);
  CHECK(cleaned_up);
}

TEST_CASE("10,000 ops: the one timer that fires first wins and the rest are cancelled") {
  asio::io_context io;
  op_log log;
  constexpr int n = 10'000;
  std::vector<asio::awaitable<int>> ops;
  for (int i = 0; i < n; ++i) ops.push_back(after(log, i == 6'789 ? 1ms : 10s, i));
  auto [index, value] = test::run(io, when_any(std::move(ops)));
  CHECK(index == 6'789);
  CHECK(value == 6'789);
  CHECK(log.cancelled == n - 1);
  CHECK(log.alive == 0);
}

TEST_CASE("10,000 ops that all complete at once: the first wins and every result is destroyed") {
  asio::io_context io;
  op_log log;
  {
    std::vector<asio::awaitable<counted>> ops;
    for (int i = 0; i < 10'000; ++i) ops.push_back(counted_after(log, 0ms, i));
    const auto winner = test::run(io, first_counted(std::move(ops)));
    CHECK(winner.index == 0);
    CHECK(winner.value == 0);
    CHECK(winner.live_while_held == 1);
  }
  CHECK(counted::live == 0);
  CHECK(log.alive == 0);
}

TEST_CASE("results of winners and losers are all destroyed, whichever way they end") {
  asio::io_context io;
  op_log log;
  {
    // Losers that complete with a value in the same turn as the winner.
    std::vector<asio::awaitable<counted>> ops;
    ops.push_back(counted_after(log, 1ms, 1));
    ops.push_back(counted_after(log, 1ms, 2));
    ops.push_back(counted_after(log, 10s, 3));
    const auto winner = test::run(io, first_counted(std::move(ops)));
    CHECK(winner.index < 2);
    CHECK(winner.value == static_cast<int>(winner.index) + 1);
    CHECK(winner.live_while_held == 1);
  }
  CHECK(counted::live == 0);
  {
    // A cancelled awaiting coroutine: no result at all.
    asio::cancellation_signal signal;
    std::vector<asio::awaitable<counted>> ops;
    ops.push_back(counted_after(log, 10s, 1));
    ops.push_back(counted_after(log, 10s, 2));
    std::exception_ptr error;
    auto body = [&]() -> asio::awaitable<void> { (void)co_await when_any(std::move(ops)); };
    asio::co_spawn(io, body(), asio::bind_cancellation_slot(signal.slot(), [&](std::exception_ptr e) { error = e; }));
    asio::post(io, [&] { signal.emit(asio::cancellation_type::terminal); });
    io.run();
    io.restart();
    CHECK(code_of(error) == asio::error::operation_aborted);
  }
  CHECK(counted::live == 0);
  CHECK(log.alive == 0);
}

TEST_CASE("on four threads, 200 concurrent when_anys each pick their earliest op and leave nothing running") {
  constexpr int reps = 200;
  constexpr int width = 8;
  struct rep_result {
    op_log log;
    std::size_t index = width;
    int value = -1;
    int alive_on_return = -1;
    int cancelled_on_return = -1;
  };
  std::vector<rep_result> results(reps);
  asio::io_context io(4);
  auto body = [&](int rep) -> asio::awaitable<void> {
    rep_result& r = results[static_cast<std::size_t>(rep)];
    const int winner = rep % width;
    std::vector<asio::awaitable<int>> ops;
    for (int i = 0; i < width; ++i) {
      if (i != winner) ops.push_back(after(r.log, 10s, i));
      else if (rep % 2 == 0) ops.push_back(at_once(r.log, i));
      else ops.push_back(after(r.log, 1ms, i));
    }
    auto [index, value] = co_await when_any(std::move(ops));
    r.alive_on_return = r.log.alive;
    r.cancelled_on_return = r.log.cancelled;
    r.index = index;
    r.value = value;
  };
  std::atomic<int> failures{0};
  for (int rep = 0; rep < reps; ++rep) {
    asio::co_spawn(io, body(rep), [&](std::exception_ptr e) {
      if (e) ++failures;
    });
  }
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back([&io] { io.run(); });
  for (auto& t : threads) t.join();

  CHECK(failures == 0);
  int wrong = 0;
  for (int rep = 0; rep < reps; ++rep) {
    const rep_result& r = results[static_cast<std::size_t>(rep)];
    const auto winner = static_cast<std::size_t>(rep % width);
    // A winner that completes at once leaves the ops after it unstarted.
    const int cancelled = rep % 2 == 0 ? rep % width : width - 1;
    if (r.index != winner || r.value != rep % width || r.alive_on_return != 0 || r.cancelled_on_return != cancelled) {
      ++wrong;
    }
  }
  CHECK(wrong == 0);
}

TEST_CASE("on four threads, cancelling the awaiting coroutine from its strand always ends every op") {
  constexpr int reps = 50;
  struct rep_result {
    op_log log;
    asio::cancellation_signal signal;
    std::error_code code;
    int alive_at_end = -1;
  };
  std::vector<rep_result> results(reps);
  asio::io_context io(4);
  for (auto& r : results) {
    auto strand = asio::make_strand(io);
    std::vector<asio::awaitable<int>> ops;
    for (int i = 0; i < 8; ++i) ops.push_back(after(r.log, 10s, i));
    asio::co_spawn(strand, when_any(std::move(ops)),
                   asio::bind_cancellation_slot(r.signal.slot(), [&r](std::exception_ptr e, std::pair<std::size_t, int>) {
                     r.code = code_of(e);
                     r.alive_at_end = r.log.alive;
                   }));
    asio::post(strand, [&r] { r.signal.emit(asio::cancellation_type::terminal); });
  }
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back([&io] { io.run(); });
  for (auto& t : threads) t.join();

  int wrong = 0;
  for (const auto& r : results) {
    if (r.code != asio::error::operation_aborted || r.alive_at_end != 0 || r.log.cancelled != 8) ++wrong;
  }
  CHECK(wrong == 0);
}

}  // TEST_SUITE

#include "uring/poll.hpp"

#include "support/harness.hpp"

#include <doctest/doctest.h>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

using namespace cohort;

// The io_uring run tests the ring's poll.
const test::needs_ring_operation needs{"IORING_OP_POLL_ADD", &io_uring_info::poll};
using namespace asio::experimental::awaitable_operators;

TEST_SUITE("poll") {
  TEST_CASE("a poll completes with POLLIN once the pipe has data") {
    asio::io_context io;
    int p[2];
    REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
    asio::steady_timer later(io, std::chrono::milliseconds(20));
    bool written = false;
    later.async_wait([&](std::error_code) { written = ::write(p[1], "x", 1) == 1; });
    short revents = test::run(io, uring::async_poll(io.get_executor(), p[0], POLLIN, asio::use_awaitable));
    CHECK(written);
    CHECK((revents & POLLIN) != 0);
    ::close(p[0]);
    ::close(p[1]);
  }

  TEST_CASE("a poll reports hang-up when the other end closes") {
    asio::io_context io;
    int p[2];
    REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
    // Closed once the poll is under way, which its first try then did not see.
    asio::steady_timer later(io, std::chrono::milliseconds(20));
    later.async_wait([&](std::error_code) { ::close(p[1]); });
    short revents = test::run(io, uring::async_poll(io.get_executor(), p[0], POLLIN, asio::use_awaitable));
    CHECK((revents & POLLHUP) != 0);
    ::close(p[0]);
  }

  TEST_CASE("a poll of a pipe whose other end is closed already reports hang-up at once") {
    asio::io_context io;
    int p[2];
    REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
    ::close(p[1]);
    short revents = test::run(io, uring::async_poll(io.get_executor(), p[0], POLLIN, asio::use_awaitable));
    CHECK((revents & POLLHUP) != 0);
    ::close(p[0]);
  }

  TEST_CASE("a poll on a descriptor that is not open fails with EBADF") {
    asio::io_context io;
    const int unused = 4000;  // far above anything this test opens
    REQUIRE(::fcntl(unused, F_GETFD) == -1);
    std::error_code ec;
    uring::async_poll(io.get_executor(), unused, POLLIN, [&](std::error_code e, short) { ec = e; });
    io.run();
    CHECK(ec == std::error_code(EBADF, std::system_category()));
  }

  TEST_CASE("a poll loses a race with a timer and is cancelled") {
    asio::io_context io;
    int p[2];
    REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
    auto winner = test::run(io, [&]() -> asio::awaitable<std::size_t> {
      asio::steady_timer t(io, std::chrono::milliseconds(10));
      auto r = co_await (uring::async_poll(io.get_executor(), p[0], POLLIN, asio::use_awaitable) ||
                         t.async_wait(asio::use_awaitable));
      co_return r.index();
    }());
    CHECK(winner == 1);
    ::close(p[0]);
    ::close(p[1]);
  }

  TEST_CASE("a poll for input or output completes with POLLOUT on a writable, unread socket") {
    asio::io_context io;
    int sv[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) == 0);
    // Full at the poll's start, drained once it is under way: writable
    // only then, so the first try finds nothing.
    char block[4096]{};
    while (::write(sv[0], block, sizeof block) > 0) {
    }
    REQUIRE(errno == EAGAIN);
    asio::steady_timer later(io, std::chrono::milliseconds(20));
    later.async_wait([&](std::error_code) {
      while (::read(sv[1], block, sizeof block) > 0) {
      }
    });
    short revents = test::run(io, uring::async_poll(io.get_executor(), sv[0], POLLIN | POLLOUT, asio::use_awaitable));
    CHECK((revents & POLLOUT) != 0);
    CHECK((revents & POLLIN) == 0);
    ::close(sv[0]);
    ::close(sv[1]);
  }

  TEST_CASE("polls leave the descriptor's blocking mode alone, also two at once with one cancelled") {
    asio::io_context io;
    int p[2];
    REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
    asio::cancellation_signal cancel;
    std::error_code first, second;
    uring::async_poll(io.get_executor(), p[0], POLLIN,
                      asio::bind_cancellation_slot(cancel.slot(), [&](std::error_code ec, short) { first = ec; }));
    uring::async_poll(io.get_executor(), p[0], POLLIN, [&](std::error_code ec, short) { second = ec; });
    io.poll();
    cancel.emit(asio::cancellation_type::terminal);
    io.poll();
    REQUIRE(::write(p[1], "x", 1) == 1);
    io.run();
    CHECK(first == asio::error::operation_aborted);
    CHECK_FALSE(second);
    CHECK((::fcntl(p[0], F_GETFL) & O_NONBLOCK) == 0);
    ::close(p[0]);
    ::close(p[1]);
  }
}

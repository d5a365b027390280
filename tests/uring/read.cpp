#include "uring/read.hpp"

#include "support/harness.hpp"

#include <doctest/doctest.h>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <fcntl.h>
#include <pty.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

using namespace cohort;

// The io_uring run tests the ring's read.
const test::needs_ring_operation needs{"IORING_OP_READ", &io_uring_info::read};

namespace {

struct pipe_pair {
  int r = -1, w = -1;
  pipe_pair() {
    int p[2];
    REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
    r = p[0];
    w = p[1];
  }
  ~pipe_pair() {
    if (r >= 0) ::close(r);
    if (w >= 0) ::close(w);
  }
  void close_write() {
    ::close(w);
    w = -1;
  }
};

}  // namespace

TEST_SUITE("read") {
  TEST_CASE("a read returns the bytes written, then 0 at end of file") {
    asio::io_context io;
    pipe_pair p;
    REQUIRE(::write(p.w, "hello", 5) == 5);
    p.close_write();
    char buf[64];
    auto first = test::run(io, uring::async_read_some(io.get_executor(), p.r, asio::buffer(buf), asio::use_awaitable));
    CHECK(std::string(buf, first) == "hello");
    auto second = test::run(io, uring::async_read_some(io.get_executor(), p.r, asio::buffer(buf), asio::use_awaitable));
    CHECK(second == 0);
  }

  TEST_CASE("a read waits for data that arrives later, on a descriptor in blocking mode") {
    asio::io_context io;
    pipe_pair p;
    CHECK((::fcntl(p.r, F_GETFL) & O_NONBLOCK) == 0);
    asio::steady_timer later(io, std::chrono::milliseconds(20));
    later.async_wait([&](std::error_code) { CHECK(::write(p.w, "late", 4) == 4); });
    char buf[64];
    auto n = test::run(io, uring::async_read_some(io.get_executor(), p.r, asio::buffer(buf), asio::use_awaitable));
    CHECK(std::string(buf, n) == "late");
    CHECK((::fcntl(p.r, F_GETFL) & O_NONBLOCK) == 0);  // the caller's flags are left alone
  }

  TEST_CASE("a read of an empty pty in blocking mode returns from its start, and waits for data") {
    // RWF_NOWAIT is refused on a pty, so the read's attempt is a plain
    // read(2), which must not run before the terminal is readable.
    int master = -1, slave = -1;
    REQUIRE(::openpty(&master, &slave, nullptr, nullptr, nullptr) == 0);
    asio::io_context io;
    std::atomic<bool> started{false}, rescued{false};
    // Were the start to block, a byte from here ends it, and says so.
    std::thread watchdog([&] {
      for (int i = 0; i < 200 && !started; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      if (!started) {
        rescued = true;
        [[maybe_unused]] auto n = ::write(slave, "x\n", 2);
      }
    });
    char buf[16];
    std::size_t got = 0;
    uring::async_read_some(io.get_executor(), master, asio::buffer(buf), [&](std::error_code ec, std::size_t n) {
      CHECK_FALSE(ec);
      got = n;
    });
    started = true;
    watchdog.join();
    CHECK_FALSE(rescued);
    if (!rescued) REQUIRE(::write(slave, "hi\n", 3) == 3);
    io.run();
    CHECK(got > 0);
    ::close(slave);
    ::close(master);
  }

  TEST_CASE("a cancelled read completes as operation_aborted and consumes nothing") {
    asio::io_context io;
    pipe_pair p;
    asio::cancellation_signal cancel;
    std::error_code result;
    char buf[8];
    uring::async_read_some(io.get_executor(), p.r, asio::buffer(buf),
                           asio::bind_cancellation_slot(cancel.slot(), [&](std::error_code ec, std::size_t) { result = ec; }));
    io.poll();
    cancel.emit(asio::cancellation_type::terminal);
    io.run();
    io.restart();
    CHECK(result == asio::error::operation_aborted);
    REQUIRE(::write(p.w, "ab", 2) == 2);
    auto n = test::run(io, uring::async_read_some(io.get_executor(), p.r, asio::buffer(buf), asio::use_awaitable));
    CHECK(std::string(buf, n) == "ab");
  }

  TEST_CASE("a read of a descriptor that is not open fails with EBADF") {
    asio::io_context io;
    const int unused = 4000;  // far above anything this test opens
    REQUIRE(::fcntl(unused, F_GETFD) == -1);
    std::error_code ec;
    char buf[8];
    uring::async_read_some(io.get_executor(), unused, asio::buffer(buf), [&](std::error_code e, std::size_t) { ec = e; });
    io.run();
    CHECK(ec == std::error_code(EBADF, std::system_category()));
  }

  TEST_CASE("a read of a regular file returns its bytes from the file position") {
    asio::io_context io;
    char path[] = "/tmp/cohort-read-XXXXXX";
    int fd = ::mkstemp(path);
    REQUIRE(fd >= 0);
    ::unlink(path);
    REQUIRE(::write(fd, "file contents", 13) == 13);
    REQUIRE(::lseek(fd, 5, SEEK_SET) == 5);
    char buf[64];
    auto n = test::run(io, uring::async_read_some(io.get_executor(), fd, asio::buffer(buf), asio::use_awaitable));
    CHECK(std::string(buf, n) == "contents");
    ::close(fd);
  }
}

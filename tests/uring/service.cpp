#include "uring/service.hpp"

#include "support/harness.hpp"
#include "uring/poll.hpp"

#include <doctest/doctest.h>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>

#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <thread>

using namespace cohort;

namespace {

// Counts how many handlers were destroyed without being called.
struct counted_handler {
  std::shared_ptr<int> called;
  std::shared_ptr<int> alive;
  counted_handler(std::shared_ptr<int> c, std::shared_ptr<int> a) : called(std::move(c)), alive(std::move(a)) { ++*alive; }
  counted_handler(const counted_handler& o) : called(o.called), alive(o.alive) { ++*alive; }
  counted_handler(counted_handler&& o) noexcept : called(o.called), alive(o.alive) { ++*alive; }
  ~counted_handler() { --*alive; }
  void operator()(std::error_code, short) { ++*called; }
};

struct fd_guard {
  int fd;
  ~fd_guard() { ::close(fd); }
};

}  // namespace

TEST_SUITE("uring service") {
  TEST_CASE("the ring is in use unless COHORT_IO_URING=0 switches it off") {
    asio::io_context io;
    auto info = io_uring_support(io);
    if (test::reactor_mode()) {
      CHECK_FALSE(info.ring);
      CHECK(info.why_not == "COHORT_IO_URING=0");
      CHECK_FALSE(info.waitid);
    } else {
      CHECK(info.ring);
      CHECK(info.why_not.empty());
      CHECK(info.cancel);
      CHECK(info.poll);
      CHECK(info.read);
    }
  }

  TEST_CASE("run() returns when nothing is in flight, and not before") {
    asio::io_context io;
    fd_guard efd{::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};
    short got = 0;
    uring::async_poll(io.get_executor(), efd.fd, POLLIN, [&](std::error_code ec, short revents) {
      CHECK_FALSE(ec);
      got = revents;
    });
    std::thread writer([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      std::uint64_t one = 1;
      CHECK(::write(efd.fd, &one, sizeof one) == sizeof one);
    });
    io.run();  // must wait for the poll, then return
    writer.join();
    CHECK((got & POLLIN) != 0);
  }

  TEST_CASE("destroying the io_context with operations in flight destroys their handlers uncalled") {
    auto called = std::make_shared<int>(0);
    auto alive = std::make_shared<int>(0);
    fd_guard efd{::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};
    {
      asio::io_context io;
      for (int i = 0; i < 10; ++i) {
        uring::async_poll(io.get_executor(), efd.fd, POLLIN, counted_handler(called, alive));
      }
      io.poll();
      CHECK(*alive >= 1);
    }
    CHECK(*called == 0);
    CHECK(*alive == 0);
  }

  TEST_CASE("cancelling an operation completes it as operation_aborted") {
    asio::io_context io;
    fd_guard efd{::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};
    asio::cancellation_signal cancel;
    std::error_code result;
    bool done = false;
    uring::async_poll(io.get_executor(), efd.fd, POLLIN,
                      asio::bind_cancellation_slot(cancel.slot(), [&](std::error_code ec, short) {
                        result = ec;
                        done = true;
                      }));
    io.poll();
    CHECK_FALSE(done);
    cancel.emit(asio::cancellation_type::terminal);
    io.run();
    CHECK(done);
    CHECK(result == asio::error::operation_aborted);
  }

  TEST_CASE("operations started from several threads all complete on a multi-threaded io_context") {
    asio::io_context io;
    constexpr int per_thread = 200;
    constexpr int threads = 4;
    std::vector<int> fds;
    for (int i = 0; i < threads * per_thread; ++i) fds.push_back(::eventfd(1, EFD_CLOEXEC | EFD_NONBLOCK));
    std::atomic<int> completed{0};
    auto guard = asio::make_work_guard(io);
    std::vector<std::thread> runners;
    for (int t = 0; t < threads; ++t) runners.emplace_back([&] { io.run(); });
    std::vector<std::thread> starters;
    for (int t = 0; t < threads; ++t) {
      starters.emplace_back([&, t] {
        for (int i = 0; i < per_thread; ++i) {
          uring::async_poll(io.get_executor(), fds[static_cast<std::size_t>(t * per_thread + i)], POLLIN,
                            [&](std::error_code ec, short revents) {
                              if (!ec && (revents & POLLIN) != 0) ++completed;
                            });
        }
      });
    }
    for (auto& t : starters) t.join();
    guard.reset();
    for (auto& t : runners) t.join();
    CHECK(completed == threads * per_thread);
    for (int fd : fds) ::close(fd);
  }
}

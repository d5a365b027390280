#include "uring/waitid.hpp"

#include "support/harness.hpp"
#include "support/process_probe.hpp"

#include <doctest/doctest.h>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>

using namespace cohort;

// The io_uring run tests the ring's waitid (Linux 6.7).
const test::needs_ring_operation needs{"IORING_OP_WAITID", &io_uring_info::waitid};

namespace {

// A forked child that exits with `code` after `delay_ms`, and its pidfd.
struct forked {
  pid_t pid;
  int pidfd;
  forked(int code, int delay_ms) {
    pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::usleep(static_cast<useconds_t>(delay_ms) * 1000);
      ::_exit(code);
    }
    pidfd = config::pidfd_open(pid);
    REQUIRE(pidfd >= 0);
  }
  ~forked() {
    config::pidfd_send_signal(pidfd, SIGKILL);
    siginfo_t info;
    ::waitid(P_PIDFD, static_cast<id_t>(pidfd), &info, WEXITED);
    ::close(pidfd);
  }
};

// Starts a wait for `child` with `options` on an io_context of its own,
// cancels it once it is under way, and returns what it completed with.
std::error_code cancelled_wait(const forked& child, int options) {
  asio::io_context io;
  asio::cancellation_signal cancel;
  std::error_code result;
  uring::async_waitid(io.get_executor(), child.pidfd, child.pid, options,
                      asio::bind_cancellation_slot(cancel.slot(), [&](std::error_code ec, siginfo_t) { result = ec; }));
  io.poll();
  cancel.emit(asio::cancellation_type::terminal);
  io.run();
  return result;
}

// waitid_attempt without its first try (no never_blocks): the wait goes to
// the ring, or to a watch on the reactor, even when its answer is there at
// its start.
struct submitted_waitid {
  uring::waitid_attempt attempt;
  int own_descriptor() const { return attempt.own_descriptor(); }
  auto operator()() const { return attempt(); }
};

template <class Token>
auto async_waitid_submitted(const asio::any_io_executor& executor, int pidfd, pid_t pid, int options, Token&& token) {
  return uring::async_start<siginfo_t>(executor, uring::service_of(executor).caps().waitid,
                                       uring::waitid_ring{pidfd, options}, pidfd, POLLIN,
                                       submitted_waitid{{pidfd, pid, options}}, std::forward<Token>(token));
}

// Whether no descriptor can be made now (one made to look is closed).
bool none_can_be_made() {
  const int probe = ::dup(0);
  if (probe >= 0) ::close(probe);
  return probe < 0 && errno == EMFILE;
}

}  // namespace

TEST_SUITE("waitid") {
  TEST_CASE("with no descriptor left, waitid still reports the exit, and a cancel still ends it") {
    asio::io_context io;
    (void)io_uring_support(io);  // the ring and the reactor up before the descriptors go
    forked child(7, 30);
    forked sleeper(0, 10'000);
    siginfo_t info{};
    std::error_code cancelled;
    {
      const test::nofile_limit none_left(static_cast<rlim_t>(test::lowest_free_descriptor()));
      REQUIRE(none_can_be_made());
      info = test::run(io, uring::async_waitid(io.get_executor(), child.pidfd, child.pid, WEXITED, asio::use_awaitable));
      asio::cancellation_signal cancel;
      uring::async_waitid(io.get_executor(), sleeper.pidfd, sleeper.pid, WEXITED,
                          asio::bind_cancellation_slot(cancel.slot(), [&](std::error_code ec, siginfo_t) { cancelled = ec; }));
      io.restart();
      io.poll();
      cancel.emit(asio::cancellation_type::terminal);
      io.run();
    }
    CHECK(info.si_pid == child.pid);
    CHECK(info.si_code == CLD_EXITED);
    CHECK(info.si_status == 7);
    CHECK(cancelled == asio::error::operation_aborted);
  }


  TEST_CASE("with no descriptor left, a cancel that comes between two looks still ends the wait") {
    asio::io_context io;
    (void)io_uring_support(io);
    asio::steady_timer warm(io);  // asio's timers up before the descriptors go
    forked sleeper(0, 10'000);
    asio::cancellation_signal cancel;
    bool completed = false;
    std::error_code result;
    {
      const test::nofile_limit none_left(static_cast<rlim_t>(test::lowest_free_descriptor()));
      REQUIRE(none_can_be_made());
      uring::async_waitid(io.get_executor(), sleeper.pidfd, sleeper.pid, WEXITED,
                          asio::bind_cancellation_slot(cancel.slot(), [&](std::error_code ec, siginfo_t) {
                            completed = true;
                            result = ec;
                          }));
      // The first look's timer (1 ms) runs out while this handler sleeps;
      // the cancel is emitted after it, before the timer's handler runs.
      asio::post(io, [&] {
        asio::post(io, [&] { cancel.emit(asio::cancellation_type::terminal); });
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      });
      io.run_for(std::chrono::seconds(2));
    }
    CHECK(completed);
    CHECK(result == asio::error::operation_aborted);
  }

  TEST_CASE("a wait for a child that has exited already completes at the first turn, with no descriptor") {
    asio::io_context io;
    (void)io_uring_support(io);
    asio::steady_timer warm(io);
    forked child(5, 0);
    pollfd exited{child.pidfd, POLLIN, 0};
    REQUIRE(::poll(&exited, 1, 10'000) == 1);  // exited, not reaped
    bool completed = false;
    siginfo_t info{};
    const auto submitted = test::ring_submissions();
    {
      const test::nofile_limit none_left(static_cast<rlim_t>(test::lowest_free_descriptor()));
      REQUIRE(none_can_be_made());
      uring::async_waitid(io.get_executor(), child.pidfd, child.pid, WEXITED | WNOWAIT, [&](std::error_code ec, siginfo_t i) {
        completed = !ec;
        info = i;
      });
      // On the reactor, a watch would need a descriptor, and the wait would
      // fall back to looking every millisecond; on the ring, the completion
      // would come back through the ring's descriptor: either way no handler
      // would be ready now.
      io.poll_one();
    }
    CHECK(completed);
    CHECK(test::ring_submissions() == submitted);  // nothing went through the ring
    CHECK(info.si_pid == child.pid);
    CHECK(info.si_status == 5);
  }

  TEST_CASE("waitid reports the exit code and reaps the child") {
    asio::io_context io;
    forked child(42, 20);
    siginfo_t info = test::run(io, uring::async_waitid(io.get_executor(), child.pidfd, child.pid, WEXITED, asio::use_awaitable));
    CHECK(info.si_pid == child.pid);
    CHECK(info.si_code == CLD_EXITED);
    CHECK(info.si_status == 42);
    siginfo_t again{};
    CHECK(::waitid(P_PIDFD, static_cast<id_t>(child.pidfd), &again, WEXITED | WNOHANG) == -1);
    CHECK(errno == ECHILD);
  }

  TEST_CASE("waitid with WNOWAIT leaves the child waitable") {
    asio::io_context io;
    forked child(3, 20);  // exits once the wait is under way
    siginfo_t info = test::run(io, uring::async_waitid(io.get_executor(), child.pidfd, child.pid, WEXITED | WNOWAIT, asio::use_awaitable));
    CHECK(info.si_status == 3);
    siginfo_t again{};
    REQUIRE(::waitid(P_PIDFD, static_cast<id_t>(child.pidfd), &again, WEXITED | WNOHANG) == 0);
    CHECK(again.si_pid == child.pid);
    CHECK(again.si_status == 3);
  }

  TEST_CASE("waitid reports a death by signal") {
    asio::io_context io;
    forked child(0, 10'000);
    // SIGUSR1: the forked child still has the test framework's handlers for
    // the usual fatal signals. Sent once the wait is under way.
    asio::steady_timer later(io, std::chrono::milliseconds(20));
    bool sent = false;
    later.async_wait([&](std::error_code) { sent = config::pidfd_send_signal(child.pidfd, SIGUSR1) == 0; });
    siginfo_t info = test::run(io, uring::async_waitid(io.get_executor(), child.pidfd, child.pid, WEXITED, asio::use_awaitable));
    CHECK(sent);
    CHECK(info.si_code == CLD_KILLED);
    CHECK(info.si_status == SIGUSR1);
  }

  TEST_CASE("the caller's pidfd keeps its flags, and a blocking waitid on it still blocks") {
    asio::io_context io;
    forked child(5, 20);
    const int flags = ::fcntl(child.pidfd, F_GETFL);
    REQUIRE(flags >= 0);
    REQUIRE((flags & O_NONBLOCK) == 0);
    test::run(io, uring::async_waitid(io.get_executor(), child.pidfd, child.pid, WEXITED | WNOWAIT, asio::use_awaitable));
    CHECK(::fcntl(child.pidfd, F_GETFL) == flags);
    // A second child, waited on blockingly through a pidfd that a wait
    // watched before it exited: no EAGAIN.
    forked later(6, 50);
    REQUIRE(cancelled_wait(later, WEXITED | WNOWAIT) == asio::error::operation_aborted);
    siginfo_t info{};
    REQUIRE(::waitid(P_PIDFD, static_cast<id_t>(later.pidfd), &info, WEXITED) == 0);
    CHECK(info.si_pid == later.pid);
    CHECK(info.si_status == 6);
  }

  TEST_CASE("a child reaped elsewhere fails with ECHILD") {
    asio::io_context io;
    forked child(7, 0);
    siginfo_t reaped{};
    REQUIRE(::waitid(P_PIDFD, static_cast<id_t>(child.pidfd), &reaped, WEXITED) == 0);
    std::error_code found, submitted;
    uring::async_waitid(io.get_executor(), child.pidfd, child.pid, WEXITED | WNOWAIT,
                        [&](std::error_code ec, siginfo_t) { found = ec; });
    async_waitid_submitted(io.get_executor(), child.pidfd, child.pid, WEXITED | WNOWAIT,
                           [&](std::error_code ec, siginfo_t) { submitted = ec; });
    io.run();
    CHECK(found == std::error_code(ECHILD, std::system_category()));  // by its first try
    CHECK(submitted == std::error_code(ECHILD, std::system_category()));  // by the ring, or after a watch
  }

  TEST_CASE("the reactor's own pidfd is refused when the caller's process is gone, as after a recycled pid") {
    // The caller's pidfd names a reaped child; the pid given is another,
    // live process's, as a recycled pid would be.
    forked gone(0, 0);
    siginfo_t reaped{};
    REQUIRE(::waitid(P_PIDFD, static_cast<id_t>(gone.pidfd), &reaped, WEXITED) == 0);
    forked live(0, 10'000);
    CHECK(uring::waitid_attempt{gone.pidfd, live.pid, WEXITED}.own_descriptor() == -1);
    // For the live child itself: a second pidfd of that same process.
    const int own = uring::waitid_attempt{live.pidfd, live.pid, WEXITED}.own_descriptor();
    REQUIRE(own >= 0);
    CHECK(own != live.pidfd);
    REQUIRE(config::pidfd_send_signal(own, SIGKILL) == 0);
    siginfo_t info{};
    REQUIRE(::waitid(P_PIDFD, static_cast<id_t>(live.pidfd), &info, WEXITED) == 0);
    CHECK(info.si_pid == live.pid);
    CHECK(info.si_code == CLD_KILLED);
    ::close(own);
  }

  TEST_CASE("a cancelled waitid completes as operation_aborted and leaves the child running") {
    forked child(0, 10'000);
    CHECK(cancelled_wait(child, WEXITED) == asio::error::operation_aborted);
    siginfo_t info{};
    REQUIRE(::waitid(P_PIDFD, static_cast<id_t>(child.pidfd), &info, WEXITED | WNOHANG) == 0);
    CHECK(info.si_pid == 0);  // still running
  }

  // A request still in flight when its process ends is cancelled by a
  // kernel worker, which wrote the siginfo through whatever address space
  // it had borrowed: a forked sibling's freed heap chunks were zeroed. The
  // request names no siginfo and never reaps; the look after it does both.
  TEST_CASE("a waitid request gives the kernel no address to write into, and never reaps") {
    for (const int options : {WEXITED, WEXITED | WNOWAIT}) {
      CAPTURE(options);
      io_uring_sqe sqe;
      std::memset(&sqe, 0xff, sizeof sqe);
      const uring::waitid_ring wait{7, options};
      wait.prepare(sqe);
      CHECK(sqe.fd == 7);
      CHECK(sqe.addr2 == 0);
      CHECK(sqe.file_index == static_cast<unsigned>(options | WNOWAIT));
      std::memset(&sqe, 0xff, sizeof sqe);
      const uring::exit_ring exited{{7, options}};
      exited.prepare(sqe);
      CHECK(sqe.addr2 == 0);
      CHECK(sqe.file_index == static_cast<unsigned>(options | WNOWAIT));
    }
  }

  TEST_CASE("async_exited tells of the exit and leaves the child to be reaped, or ends cancelled") {
    asio::io_context io;
    forked child(9, 20);  // exits once the wait is under way: the ring's, or the reactor's watch
    forked sleeper(0, 10'000);
    std::error_code exited, cancelled;
    bool completed = false;
    uring::async_exited(io.get_executor(), child.pidfd, child.pid, [&](std::error_code ec, siginfo_t) {
      completed = true;
      exited = ec;
    });
    asio::cancellation_signal cancel;
    const auto on_cancel = [&](std::error_code ec, siginfo_t) { cancelled = ec; };
    uring::async_exited(io.get_executor(), sleeper.pidfd, sleeper.pid,
                        asio::bind_cancellation_slot(cancel.slot(), on_cancel));
    io.poll();
    CHECK_FALSE(completed);  // not before the exit
    cancel.emit(asio::cancellation_type::terminal);
    io.run();
    CHECK(completed);
    CHECK_FALSE(exited);
    CHECK(cancelled == asio::error::operation_aborted);
    siginfo_t info{};
    REQUIRE(::waitid(P_PIDFD, static_cast<id_t>(child.pidfd), &info, WEXITED | WNOHANG) == 0);
    CHECK(info.si_pid == child.pid);  // exited, and still ours to reap
    CHECK(info.si_status == 9);
    REQUIRE(::waitid(P_PIDFD, static_cast<id_t>(sleeper.pidfd), &info, WEXITED | WNOHANG) == 0);
    CHECK(info.si_pid == 0);  // still running
  }
}

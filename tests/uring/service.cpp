#include "uring/service.hpp"

#include "support/harness.hpp"
#include "support/process_probe.hpp"
#include "uring/poll.hpp"

#include <doctest/doctest.h>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/bind_executor.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/dispatch.hpp>
#include <asio/strand.hpp>
#include <asio/steady_timer.hpp>
#include <asio/thread_pool.hpp>

#include <fmt/format.h>

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>

using namespace cohort;

// Every operation here is a poll on the ring.
const test::needs_ring_operation needs{"IORING_OP_POLL_ADD", &io_uring_info::poll};

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



// A poll of an empty pipe (so that it is not answered by its first look,
// with no submission) that is written to once the poll is started: its
// error and events, once io.run() has returned.
std::pair<std::error_code, short> poll_pipe(asio::io_context& io) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return {std::error_code(errno, std::system_category()), 0};
  const fd_guard read_end{p[0]}, write_end{p[1]};
  std::pair<std::error_code, short> result{asio::error::would_block, 0};
  uring::async_poll(io.get_executor(), p[0], POLLIN, [&](std::error_code ec, short events) { result = {ec, events}; });
  if (::write(p[1], "x", 1) != 1) return {std::error_code(errno, std::system_category()), 0};
  io.run();
  return result;
}

// In a forked child whose thread the kernel refuses io_uring_enter (a
// seccomp filter, as container profiles have): 0 when a ring made then
// was not used and a poll ran on the reactor; 2 when no filter could be
// installed; another code says which did not hold. A spin on the refused
// submissions ends by SIGALRM.
int ring_refused_from_start() {
  ::alarm(20);
  if (!test::refuse_system_call(__NR_io_uring_enter, EPERM)) return 2;
  asio::io_context io;
  const auto caps = io_uring_support(io);
  if (caps.ring || caps.why_not != "io_uring_enter: Operation not permitted") return 3;
  const auto [error, events] = poll_pipe(io);
  if (error || (events & POLLIN) == 0) return 4;
  return 0;
}

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

  TEST_CASE("use_reactor_only gives an io_context no ring, its operations still complete; too late, it throws") {
    asio::io_context io;
    uring::use_reactor_only(io);
    const auto info = io_uring_support(io);
    CHECK_FALSE(info.ring);
    CHECK_FALSE(info.poll);
    CHECK_FALSE(info.why_not.empty());
    int p[2];
    REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
    const fd_guard read_end{p[0]}, write_end{p[1]};
    REQUIRE(::write(p[1], "x", 1) == 1);
    short events = 0;
    uring::async_poll(io.get_executor(), p[0], POLLIN, [&](std::error_code ec, short e) {
      CHECK_FALSE(ec);
      events = e;
    });
    io.run();
    CHECK((events & POLLIN) != 0);
    CHECK_THROWS_AS(uring::use_reactor_only(io), asio::service_already_exists);
  }

  // Before, use_reactor_only let asio's bare "epoll: Too many open files"
  // through, naming neither the call nor the limit, as service_for did not.
  TEST_CASE("use_reactor_only with no descriptor left for the reactor names itself and the limit") {
    asio::io_context io;  // fresh: no reactor yet
    std::string error;
    {
      const test::descriptors_left none(0);
      try {
        uring::use_reactor_only(io);
      } catch (const std::system_error& e) {
        error = e.what();
      }
    }
    CHECK(error.starts_with("cohort::use_reactor_only: bringing up asio's reactor for the io_context "
                            "(open file limit RLIMIT_NOFILE is "));
    CHECK(error.ends_with(std::string("): ") + std::strerror(EMFILE)));
  }

  // Before, every refused submission posted a retry of itself: the
  // io_context spun at full CPU, and the operations never completed.
  TEST_CASE("a ring the kernel refuses io_uring_enter from its start is not used: the reactor runs its operations") {
    if (test::reactor_mode()) return;  // no ring is made
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) ::_exit(ring_refused_from_start());
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    const std::string how = WIFSIGNALED(status) ? fmt::format("killed by signal {}", WTERMSIG(status))
                                                : fmt::format("exited with {}", WEXITSTATUS(status));
    INFO("the child ", how);
    REQUIRE(WIFEXITED(status));
    if (WEXITSTATUS(status) == 2) {
      WARN_MESSAGE(false, "no seccomp filter could be installed here: a refused io_uring_enter is not tested");
      return;
    }
    CHECK(WEXITSTATUS(status) == 0);
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

  // Before, a cancel that found no free entry (refused submissions, while
  // completions waited in the kernel's backlog) ended the cancelling: the
  // rest waited out the 5 s deadline and were leaked.
  TEST_CASE("destroying the io_context with thousands of operations in flight destroys every handler") {
    auto called = std::make_shared<int>(0);
    auto alive = std::make_shared<int>(0);
    fd_guard efd{::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};
    constexpr int count = 5000;
    {
      asio::io_context io;
      if (!uring::service_of(io.get_executor()).caps().ring) return;  // the ring's shutdown
      for (int i = 0; i < count; ++i) {
        uring::async_poll(io.get_executor(), efd.fd, POLLIN, counted_handler(called, alive));
      }
      io.poll();
      CHECK(*alive == count);
    }
    CHECK(*called == 0);
    CHECK(*alive == 0);  // none left past the deadline, leaked
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
    const auto room = test::nofile_limit::at_least(4096);  // more descriptors than a soft limit of 256 allows
    std::vector<int> fds;
    // Not ready yet: each poll is submitted (or watched), none found at once.
    for (int i = 0; i < threads * per_thread; ++i) fds.push_back(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    const auto made = std::count_if(fds.begin(), fds.end(), [](int fd) { return fd >= 0; });
    if (made < threads * per_thread) {
      for (int fd : fds) {
        if (fd >= 0) ::close(fd);
      }
    }
    REQUIRE_MESSAGE(made == threads * per_thread, "only ", made, " eventfds could be made");
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
    for (int fd : fds) {
      const std::uint64_t one = 1;
      REQUIRE(::write(fd, &one, sizeof one) == sizeof one);
    }
    guard.reset();
    for (auto& t : runners) t.join();
    CHECK(completed == threads * per_thread);
    for (int fd : fds) ::close(fd);
  }

  TEST_CASE("completions beyond the completion queue's size all arrive") {
    // The ring's completion queue holds 1024. The reactor path has no such
    // queue, but the kernel lets at most 500 epoll sets watch one descriptor.
    const int count = test::reactor_mode() ? 400 : 5000;
    asio::io_context io;
    fd_guard efd{::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};
    int completed = 0;
    for (int i = 0; i < count; ++i) {
      uring::async_poll(io.get_executor(), efd.fd, POLLIN, [&](std::error_code ec, short) {
        if (!ec) ++completed;
      });
    }
    io.poll();
    std::uint64_t one = 1;
    REQUIRE(::write(efd.fd, &one, sizeof one) == sizeof one);
    io.run();
    CHECK(completed == count);
  }

  TEST_CASE("a forked child that lets its copy of the io_context go leaves the parent's operations running") {
    fd_guard efd{::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};
    std::error_code result = asio::error::would_block;
    short revents = 0;
    std::optional<asio::io_context> io(std::in_place);
    uring::async_poll(io->get_executor(), efd.fd, POLLIN, [&](std::error_code ec, short r) {
      result = ec;
      revents = r;
    });
    io->poll();
    const pid_t pid = ::fork();
    if (pid == 0) {
      // Its copy shares the ring and the epoll set with the parent. A poll
      // started here must not use the ring: its completion could reach the
      // parent.
      bool polled = false;
      uring::async_poll(io->get_executor(), efd.fd, POLLOUT, [&](std::error_code ec, short) { polled = !ec; });
      io->run_one_for(std::chrono::seconds(5));
      const bool reactor = !uring::service_of(io->get_executor()).caps().ring;
      io.reset();
      ::_exit(polled && reactor ? 0 : 1);
    }
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
    std::uint64_t one = 1;
    REQUIRE(::write(efd.fd, &one, sizeof one) == sizeof one);
    io->run_for(std::chrono::seconds(5));  // before: the child had cancelled it, or taken it from the epoll set
    CHECK_FALSE(result);
    CHECK((revents & POLLIN) != 0);
  }

  // Before, the child's copy of the watch on the ring reaped the parent's
  // completions and ran its copies of the parent's handlers: the parent's
  // operation never completed.
  TEST_CASE("a forked child told of the fork that runs its io_context leaves the parent's completions to the parent") {
    fd_guard efd{::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};
    std::error_code result = asio::error::would_block;
    int handled = 0;
    asio::io_context io;
    // On asio's reactor, the child's io_context runs its copies of what was
    // pending at the fork, as asio does for every descriptor.
    if (!uring::service_of(io.get_executor()).caps().ring) return;
    uring::async_poll(io.get_executor(), efd.fd, POLLIN, [&](std::error_code ec, short) {
      result = ec;
      ++handled;
    });
    io.poll();
    const pid_t pid = ::fork();
    if (pid == 0) {
      // Its copy of the parent's poll ends as cancelled, never with the
      // parent's completion; once its own timer is done, run() returns.
      io.notify_fork(asio::execution_context::fork_child);
      ::alarm(10);
      asio::steady_timer busy(io, std::chrono::milliseconds(1500));
      busy.async_wait([](std::error_code) {});
      io.run();
      ::_exit(handled == 1 && result == asio::error::operation_aborted ? 0 : 1);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    std::uint64_t one = 1;
    REQUIRE(::write(efd.fd, &one, sizeof one) == sizeof one);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the child's loop runs meanwhile
    io.run_for(std::chrono::seconds(5));
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
    CHECK(handled == 1);
    CHECK_FALSE(result);
  }

  TEST_CASE("an operation started from a thread that then exits still completes") {
    asio::io_context io;
    fd_guard efd{::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};
    std::error_code result = asio::error::would_block;
    short revents = 0;
    std::thread([&] {
      uring::async_poll(io.get_executor(), efd.fd, POLLIN, [&](std::error_code ec, short r) {
        result = ec;
        revents = r;
      });
    }).join();
    io.poll();  // sees the kernel cancel the request of the exited thread
    std::uint64_t one = 1;
    REQUIRE(::write(efd.fd, &one, sizeof one) == sizeof one);
    io.run();
    CHECK_FALSE(result);
    CHECK((revents & POLLIN) != 0);
  }

  TEST_CASE("cancellation racing completion on a strand completes each operation once, on the strand, as ready or aborted") {
    asio::io_context io;
    auto strand = asio::make_strand(io);
    constexpr int rounds = 500;
    std::vector<std::atomic<int>> calls(rounds);
    std::atomic<int> finished{0}, ready{0}, aborted{0}, other{0}, off_strand{0};
    auto guard = asio::make_work_guard(io);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) threads.emplace_back([&] { io.run(); });
    for (int i = 0; i < rounds; ++i) {
      auto signal = std::make_shared<asio::cancellation_signal>();
      // An eventfd of its own per round, written only once the poll is
      // under way: not ready at its start, so never found by its first try.
      // Closed with the handler's last copy, after the poll has completed.
      auto efd = std::make_shared<fd_guard>(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
      REQUIRE(efd->fd >= 0);
      asio::dispatch(strand, [&, signal, efd, i] {
        auto handler = [&, signal, efd, i](std::error_code ec, short revents) {
          ++calls[static_cast<std::size_t>(i)];
          if (!strand.running_in_this_thread()) ++off_strand;
          if (ec == asio::error::operation_aborted) {
            ++aborted;
          } else if (!ec && (revents & POLLIN) != 0) {
            ++ready;
          } else {
            ++other;
          }
          ++finished;
        };
        uring::async_poll(strand, efd->fd, POLLIN,
                          asio::bind_cancellation_slot(signal->slot(), asio::bind_executor(strand, std::move(handler))));
        std::uint64_t one = 1;
        [[maybe_unused]] auto n = ::write(efd->fd, &one, sizeof one);
        signal->emit(asio::cancellation_type::terminal);
      });
    }
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (finished < rounds && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    // A handler called twice would show here, so give it the time to be.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    guard.reset();
    io.stop();
    for (auto& t : threads) t.join();
    CHECK(finished == rounds);
    CHECK(std::all_of(calls.begin(), calls.end(), [](const std::atomic<int>& c) { return c == 1; }));
    CHECK(ready + aborted == rounds);
    CHECK(other == 0);
    CHECK(off_strand == 0);
  }

  TEST_CASE("executors of an io_context are accepted in every usual wrapping, others refused") {
    asio::io_context io;
    asio::any_io_executor plain = io.get_executor();
    asio::any_io_executor strand = asio::make_strand(io);
    asio::any_io_executor strand_of_any = asio::make_strand(plain);
    asio::any_io_executor tracked = asio::prefer(io.get_executor(), asio::execution::outstanding_work.tracked);
    for (const auto& ex : {plain, strand, strand_of_any, tracked}) CHECK(&uring::io_context_of(ex) == &io);
    asio::thread_pool pool(1);
    CHECK_THROWS_AS(uring::io_context_of(pool.get_executor()), std::invalid_argument);
  }
}

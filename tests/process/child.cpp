#include "cohort/child.hpp"

#include "cohort/spawn.hpp"
#include "support/harness.hpp"
#include "support/process_probe.hpp"

#include <doctest/doctest.h>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/bind_executor.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/experimental/deferred.hpp>
#include <asio/detached.hpp>
#include <asio/strand.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/read_until.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_future.hpp>

#include <fmt/format.h>

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

using namespace cohort;
using namespace std::chrono_literals;
using namespace asio::experimental::awaitable_operators;
namespace fs = std::filesystem;

namespace {

command target(std::vector<std::string> args) { return command{test::target, std::move(args)}; }

// Polls try_wait() until the child is reaped, for at most `limit`.
std::optional<exit_status> poll_until_exit(child& c, std::chrono::milliseconds limit = 10s) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (auto status = c.try_wait()) return status;
    std::this_thread::sleep_for(1ms);
  }
  return std::nullopt;
}

// Spawns `exit 2` on `io` and waits for it with no descriptor free: its
// exit code, or what the wait threw.
std::string exit_code_with_no_descriptor_free(asio::io_context& io) {
  child c = spawn(io.get_executor(), target({"exit", "2"}));
  test::nofile_limit limit(static_cast<rlim_t>(test::lowest_free_descriptor()));
  try {
    return std::to_string(test::run(io, c.wait()).code());
  } catch (const std::system_error& e) {
    return e.what();
  }
}

// Makes `pid` the next pid this process's pid namespace gives out, if it
// is free. False when the namespace's ns_last_pid cannot be written.
bool next_pid_is(pid_t pid) {
  const int file = ::open("/proc/sys/kernel/ns_last_pid", O_WRONLY | O_CLOEXEC);
  if (file < 0) return false;
  const std::string last = std::to_string(pid - 1);
  const bool written = ::write(file, last.data(), last.size()) == static_cast<ssize_t>(last.size());
  ::close(file);
  return written;
}

// A process that leads a process group of its own until a signal ends it
// (at its default disposition: doctest's handlers are copied with the fork).
pid_t start_group_leader() {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::signal(SIGTERM, SIG_DFL);
    ::setpgid(0, 0);
    ::pause();
    ::_exit(0);
  }
  if (pid > 0) ::setpgid(pid, pid);
  return pid;
}

// In a new pid namespace, whose first process it is (its few pids taken in
// order, ns_last_pid setting the next): spawns `exit 0`, lets it be reaped
// elsewhere (by the kernel, SIGCHLD ignored, or by a waitpid(-1)), starts
// a process that takes its pid and leads a process group of that number,
// and signals the spawned child's group with SIGTERM. 0 when that process
// was left alone, 1 when the signal killed it, 77 when the reuse could not
// be set up here.
int group_signal_after_pid_reuse(bool kernel_reaps) {
  return test::exit_code_in_child([kernel_reaps] {
    if (::unshare(CLONE_NEWPID) != 0) return 77;
    return test::exit_code_in_child([kernel_reaps] {
      if (kernel_reaps) ::signal(SIGCHLD, SIG_IGN);
      asio::io_context io;
      child c = spawn(io.get_executor(), target({"exit", "0"}));
      const pid_t pid = c.pid();
      pollfd exited{c.native_handle(), POLLIN, 0};
      if (::poll(&exited, 1, 10'000) != 1) return 5;
      if (!kernel_reaps && ::waitpid(-1, nullptr, 0) != pid) return 6;
      ::signal(SIGCHLD, SIG_DFL);  // the group leader's end is reported
      // The kernel frees a pid it reaped a moment after the exit shows:
      // taken again until the leader gets it.
      pid_t other = -1;
      for (int tries = 0; tries < 1000 && other != pid; ++tries) {
        if (other > 0) {
          ::kill(other, SIGKILL);
          ::waitpid(other, nullptr, 0);
          std::this_thread::sleep_for(1ms);
        }
        if (!next_pid_is(pid)) return 77;
        other = start_group_leader();
      }
      if (other != pid) {
        if (other > 0) ::kill(other, SIGKILL);
        return 77;
      }
      std::error_code ec;
      c.signal_group(SIGTERM, ec);
      const bool killed = test::within(200ms, [other] { return ::waitpid(other, nullptr, WNOHANG) == other; });
      if (!killed) ::kill(other, SIGKILL);
      return killed ? 1 : ec ? 8 : 0;
    });
  });
}

}  // namespace

TEST_SUITE("child") {
  TEST_CASE("wait() reaps once; later waits return the same status at once") {
    asio::io_context io;
    test::run(io, []() -> asio::awaitable<void> {
      command c_cmd = target({"exit", "4"});
      child c = co_await spawn(c_cmd);
      const auto proc = "/proc/" + std::to_string(c.pid());
      CHECK(fs::exists(proc));  // running, or a zombie until reaped
      CHECK_FALSE(c.status());
      auto first = co_await c.wait();
      CHECK(first.code() == 4);
      CHECK_FALSE(fs::exists(proc));  // reaped
      auto second = co_await c.wait();
      CHECK(second == first);
      CHECK(c.status() == first);
    }());
  }

  TEST_CASE("try_wait() never blocks, and reaps once the child has exited") {
    asio::io_context io;
    child c = spawn(io.get_executor(), target({"sleep", "30"}));
    auto start = std::chrono::steady_clock::now();
    CHECK_FALSE(c.try_wait());
    CHECK(std::chrono::steady_clock::now() - start < 5s);  // a wait would take 30 s
    c.signal(SIGKILL);
    auto status = poll_until_exit(c);
    REQUIRE(status);
    CHECK(status->signal() == SIGKILL);
    CHECK(c.try_wait() == status);
  }

  TEST_CASE("join() blocks until the child exits") {
    asio::io_context io;
    child c = spawn(io.get_executor(), target({"exit", "12"}));
    CHECK(c.join().code() == 12);
  }

  // Before, both said only "No child processes".
  TEST_CASE("a child whose status was lost says why: SIGCHLD ignored here, or reaped elsewhere") {
    asio::io_context io;
    {
      struct sigaction ignore {}, before {};
      ignore.sa_handler = SIG_IGN;
      REQUIRE(::sigaction(SIGCHLD, &ignore, &before) == 0);
      child c = spawn(io.get_executor(), target({"exit", "3"}));
      std::string what;
      try {
        (void)c.join();
      } catch (const std::system_error& e) {
        what = e.what();
      }
      ::sigaction(SIGCHLD, &before, nullptr);
      CHECK(what.find("ignores SIGCHLD") != std::string::npos);
    }
    child c = spawn(io.get_executor(), target({"exit", "3"}));
    int raw = 0;
    REQUIRE(::waitpid(c.pid(), &raw, 0) == c.pid());
    CHECK_THROWS_WITH_AS(c.join(), doctest::Contains("reaped elsewhere"), std::system_error);
  }

  // Before, the forked process's copy killed the child with SIGKILL as it
  // went, through the pidfd it had inherited.
  TEST_CASE("a copy that fork() made, dropped in the forked process, leaves the child running to its own exit") {
    asio::io_context io;
    spawn_options opts{.in = stdio::pipe()};
    child c = spawn(io.get_executor(), target({"cat"}), opts);
    // The forked process ends as a return from main would: its copy goes.
    CHECK(test::exit_code_in_child([&c] {
            child copy = std::move(c);
            return 0;
          }) == 0);
    c.in().close();  // cat's end of file
    const exit_status status = c.join();
    CHECK_FALSE(status.signaled());
    CHECK(status.code() == 0);
  }

  TEST_CASE("a forked process that destroys its copy of the io_context, a wait in flight on it, leaves the child be") {
    std::optional<asio::io_context> io(std::in_place);
    child c = spawn(io->get_executor(), target({"sleep", "30"}));
    const pid_t pid = c.pid();
    std::optional<exit_status> waited;
    // The child object lives in the awaiting coroutine's frame alone.
    asio::co_spawn(
        *io,
        [](child owned, std::optional<exit_status>& into) -> asio::awaitable<void> { into = co_await owned.wait(); }(
            std::move(c), waited),
        asio::detached);
    io->poll();  // the wait is in flight
    REQUIRE_FALSE(waited);
    CHECK(test::exit_code_in_child([&io] {
            io.reset();
            return 0;
          }) == 0);
    REQUIRE(::kill(pid, SIGTERM) == 0);
    io->run();
    REQUIRE(waited);
    CHECK(waited->signal() == SIGTERM);
  }

  // Before, join() said it had been reaped elsewhere in this process.
  TEST_CASE("a forked process's copy of a child neither waits for it nor signals it, and says whose child it is") {
    asio::io_context io;
    spawn_options opts{.in = stdio::pipe()};
    child c = spawn(io.get_executor(), target({"cat"}), opts);
    const int refused = test::exit_code_in_child([&] {
      const auto says_whose = [&c](auto&& call) {
        try {
          call();
        } catch (const std::system_error& e) {
          return e.code() == std::errc::no_child_process &&
                 std::string_view(e.what()).find(fmt::format("process {}'s child", ::getppid())) != std::string::npos;
        }
        return false;
      };
      int code = 0;
      if (!says_whose([&c] { (void)c.join(); })) code |= 1;
      if (!says_whose([&c] { (void)c.try_wait(); })) code |= 2;
      if (!says_whose([&c] { c.signal(SIGTERM); })) code |= 4;
      if (!says_whose([&c] { c.signal_group(SIGTERM); })) code |= 8;
      if (!says_whose([&c, &io] { (void)test::run(io, c.wait()); })) code |= 16;
      return code;
    });
    CHECK(refused == 0);
    c.in().close();
    const exit_status status = c.join();
    CHECK_FALSE(status.signaled());
    CHECK(status.code() == 0);
  }

  // Before, a copy whose object had a wait in flight as fork() came said a
  // wait was in flight (std::logic_error), and one whose io_context was
  // gone that join() would reap it.
  TEST_CASE("a forked process's copy of a child with a wait in flight says whose child it is, its io_context gone or "
            "not") {
    std::optional<asio::io_context> io(std::in_place);
    spawn_options opts{.in = stdio::pipe()};
    child c = spawn(io->get_executor(), target({"cat"}), opts);
    std::optional<exit_status> waited;
    c.wait([&waited](std::exception_ptr, exit_status s) { waited = s; });
    io->poll();  // the wait is in flight
    REQUIRE_FALSE(waited);
    const int refused = test::exit_code_in_child([&] {
      const auto says_whose = [](auto&& call) {
        try {
          call();
        } catch (const std::system_error& e) {
          return e.code() == std::errc::no_child_process &&
                 std::string_view(e.what()).find(fmt::format("process {}'s child", ::getppid())) != std::string::npos;
        } catch (...) {
        }
        return false;
      };
      int code = 0;
      if (!says_whose([&c] { (void)c.join(); })) code |= 1;
      asio::io_context elsewhere;
      if (!says_whose([&c, &elsewhere] { (void)test::run(elsewhere, c.wait()); })) code |= 2;
      io.reset();
      if (!says_whose([&c, &elsewhere] { (void)test::run(elsewhere, c.wait()); })) code |= 4;
      return code;
    });
    CHECK(refused == 0);
    c.in().close();
    io->run();
    REQUIRE(waited);
    CHECK_FALSE(waited->signaled());
    CHECK(waited->code() == 0);
  }

  TEST_CASE("resource usage reports CPU time and peak memory") {
    asio::io_context io;
    child burner = spawn(io.get_executor(), target({"burn-cpu", "200"}));
    auto burnt = burner.join();
    CHECK(burnt.usage().user_time + burnt.usage().system_time >= 150ms);
    child toucher = spawn(io.get_executor(), target({"touch-mib", "64"}));
    auto touched = toucher.join();
    CHECK(touched.usage().max_rss_kib >= 60 * 1024);
    child idle = spawn(io.get_executor(), target({"exit", "0"}));
    CHECK(idle.join().usage().max_rss_kib < 60 * 1024);
  }

  TEST_CASE("signal() reaches the child; after its exit it does nothing") {
    asio::io_context io;
    test::run(io, []() -> asio::awaitable<void> {
      command c_cmd = target({"sleep", "30"});
      child c = co_await spawn(c_cmd);
      c.signal(SIGTERM);
      auto status = co_await c.wait();
      CHECK(status.signal() == SIGTERM);
      c.signal(SIGKILL);  // reaped already: nothing to signal, no error
    }());
  }

  TEST_CASE("a bad signal number is an error naming the operation") {
    asio::io_context io;
    child c = spawn(io.get_executor(), target({"sleep", "30"}));
    std::error_code ec;
    c.signal(12345, ec);
    CHECK(ec == std::error_code(EINVAL, std::system_category()));
    CHECK_THROWS_WITH_AS(c.signal(12345), doctest::Contains("cohort::child::signal"), std::system_error);
    c.signal(SIGKILL);
    CHECK(c.join().signal() == SIGKILL);
    // Reaped, the same number is refused the same way: the check does not
    // depend on whether the child happened to have ended.
    c.signal(-1, ec);
    CHECK(ec == std::errc::invalid_argument);
    c.signal_group(12345, ec);
    CHECK(ec == std::errc::invalid_argument);
    CHECK_THROWS_AS(c.signal(12345), std::system_error);
  }

  TEST_CASE("signal_group() names a bad signal number as such, not as a child leading no group") {
    asio::io_context io;
    const spawn_options options{.new_process_group = false};
    child c = spawn(io.get_executor(), target({"sleep", "30"}), options);
    try {
      c.signal_group(12345);
      FAIL("signal_group() took signal 12345");
    } catch (const std::system_error& e) {
      CHECK(e.code() == std::errc::invalid_argument);
      CHECK(std::string(e.what()).find("does not lead a process group") == std::string::npos);
    }
  }

  TEST_CASE("signal_group() reaches the child's descendants in its process group") {
    asio::io_context io;
    test::run(io, []() -> asio::awaitable<void> {
      command c_cmd{"/bin/sh", {"-c", test::target + " sleep 30 & echo $!; wait"}};
      spawn_options c_opts{.out = stdio::pipe()};
      child c = co_await spawn(c_cmd, c_opts);
      std::string line;
      co_await asio::async_read_until(c.out(), asio::dynamic_buffer(line), '\n', asio::use_awaitable);
      const pid_t grandchild = std::stoi(line);
      CHECK(test::alive(grandchild));
      c.signal_group(SIGKILL);
      CHECK((co_await c.wait()).signal() == SIGKILL);
      auto deadline = std::chrono::steady_clock::now() + 5s;
      while (test::alive(grandchild) && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
      CHECK_FALSE(test::alive(grandchild));
    }());
  }

  // Before, it called killpg with the child's pid, which the child, reaped
  // by the kernel or by the program's own waitpid(-1), had given up: the
  // group now carrying that number was signalled.
  TEST_CASE("signal_group() does nothing for a child reaped elsewhere, whose pid a new process group has taken") {
    for (const bool kernel_reaps : {true, false}) {
      CAPTURE(kernel_reaps);
      const int code = group_signal_after_pid_reuse(kernel_reaps);
      if (code == 77) {
        MESSAGE("a pid namespace, or the choice of the next pid in it, is refused here: nothing checked");
        return;
      }
      CHECK(code == 0);
    }
  }

  TEST_CASE("signal_group() is refused for a child that does not lead a group") {
    asio::io_context io;
    const spawn_options options{.new_process_group = false};
    child c = spawn(io.get_executor(), target({"sleep", "30"}), options);
    std::error_code ec;
    c.signal_group(SIGTERM, ec);
    CHECK(ec == std::errc::invalid_argument);
  }

  // Before, the throwing form named a group that does not exist, and a
  // reaped child that never led a group was refused too.
  TEST_CASE("signal_group() on a child that leads no group says so, and does nothing once it is reaped") {
    asio::io_context io;
    const spawn_options options{.new_process_group = false};
    child c = spawn(io.get_executor(), target({"sleep", "30"}), options);
    try {
      c.signal_group(SIGTERM);
      FAIL("signal_group() took a child that leads no group");
    } catch (const std::system_error& e) {
      CHECK(e.code() == std::errc::invalid_argument);
      const std::string what = e.what();
      CHECK(what.find("does not lead a process group") != std::string::npos);
      CHECK(what.find("new_process_group = true") != std::string::npos);
      CHECK(what.find("to group") == std::string::npos);
    }
    c.signal(SIGKILL);
    CHECK(c.join().signal() == SIGKILL);
    std::error_code ec;
    c.signal_group(SIGTERM, ec);
    CHECK_FALSE(ec);
    CHECK_NOTHROW(c.signal_group(SIGTERM));
  }

  TEST_CASE("destroying a running child kills and reaps it") {
    asio::io_context io;
    pid_t pid;
    {
      child c = spawn(io.get_executor(), target({"sleep", "30"}));
      pid = c.pid();
      CHECK(test::alive(pid));
    }
    CHECK_FALSE(test::alive(pid));
    CHECK_FALSE(fs::exists("/proc/" + std::to_string(pid)));  // reaped, not a zombie
  }

  // Before, a refused pidfd_send_signal left the child running, and its
  // destruction waited for it to end by itself.
  TEST_CASE("destroying a running child kills and reaps it where pidfd_send_signal is refused") {
    const int code = test::exit_code_in_child([] {
      ::alarm(20);  // a destruction that waits for the child's own end
      if (!test::refuse_system_call(SYS_pidfd_send_signal, EPERM)) return 77;
      asio::io_context io;
      pid_t pid;
      {
        child c = spawn(io.get_executor(), target({"sleep", "30"}));
        pid = c.pid();
      }
      return fs::exists("/proc/" + std::to_string(pid)) ? 1 : 0;
    });
    if (code == 77) {
      MESSAGE("no seccomp filter could be installed here: a refused pidfd_send_signal is not tested");
      return;
    }
    CHECK(code == 0);  // -1: the alarm ended it, the child not killed
  }

  TEST_CASE("assigning over a running child kills the old one; a moved-from child holds nothing") {
    asio::io_context io;
    child a = spawn(io.get_executor(), target({"sleep", "30"}));
    const pid_t old_pid = a.pid();
    a = spawn(io.get_executor(), target({"exit", "0"}));
    CHECK_FALSE(fs::exists("/proc/" + std::to_string(old_pid)));
    child b = std::move(a);
    CHECK_FALSE(a);
    CHECK(a.pid() == -1);
    CHECK(b.join().success());
  }

  TEST_CASE("destroying a child while a wait is in flight makes that wait see the kill") {
    asio::io_context io;
    auto c = std::make_unique<child>(spawn(io.get_executor(), target({"sleep", "30"})));
    std::optional<exit_status> seen;
    asio::co_spawn(io, c->wait(), [&](std::exception_ptr e, exit_status s) {
      if (!e) seen = s;
    });
    io.poll();
    c.reset();
    io.run();
    REQUIRE(seen);
    CHECK(seen->signal() == SIGKILL);
  }

  TEST_CASE("a child that outlives its io_context: waits, detach and pipes refuse, join reaps, nothing is left open") {
    const int descriptors = test::open_fd_count();
    child c;
    {
      asio::io_context io;
      spawn_options c_opts;
      c_opts.in = stdio::pipe();
      c_opts.out = stdio::pipe();
      c = spawn(io.get_executor(), command{"/bin/sh", {"-c", "sleep 0.3; exit 3"}}, c_opts);
      CHECK_NOTHROW(c.out());
    }
    const auto gone = doctest::Contains("the io_context the child was spawned on has been destroyed");
    CHECK_THROWS_WITH_AS(c.out(), gone, std::logic_error);
    CHECK_THROWS_WITH_AS(c.in(), gone, std::logic_error);
    CHECK_THROWS_WITH_AS(c.detach(), gone, std::logic_error);
    REQUIRE(c);  // the refused detach kept the process
    asio::io_context other;
    std::string awaited, with_token;
    test::run(other, [&]() -> asio::awaitable<void> {
      try {
        co_await c.wait();
      } catch (const std::logic_error& e) {
        awaited = e.what();
      }
      try {
        c.wait([](std::exception_ptr, exit_status) {});
      } catch (const std::logic_error& e) {
        with_token = e.what();
      }
    }());
    CHECK(awaited.find("cohort::child::wait: the io_context") == 0);
    CHECK(with_token.find("cohort::child::wait: the io_context") == 0);
    CHECK(c.join().code() == 3);
    c = child();
    CHECK(test::open_fd_count() == descriptors);  // the pipes' ends closed, the pidfd too
    CHECK(test::children_of_self().empty());
  }

  // Before, the pipes' descriptors stayed open until the object ended: a
  // child reading its stdin to the end, or writing more than a pipe holds,
  // never exited, and join() waited for good.
  TEST_CASE("a child's pipes close with its io_context: a reader sees the end, a writer its broken pipe") {
    child reader, writer;
    {
      asio::io_context io;
      spawn_options reads;
      reads.in = stdio::pipe();
      reads.out = stdio::null();
      reader = spawn(io.get_executor(), command{"/bin/cat", {}}, reads);
      spawn_options writes;
      writes.out = stdio::pipe();
      writer = spawn(io.get_executor(), command{"/bin/sh", {"-c", "exec head -c 1000000 /dev/zero"}}, writes);
    }
    // Bounded, so that a child still waiting fails the test rather than hanging it.
    const auto until = std::chrono::steady_clock::now() + 20s;
    while ((!reader.try_wait() || !writer.try_wait()) && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(5ms);
    }
    REQUIRE(reader.status());
    REQUIRE(writer.status());
    CHECK(reader.join().code() == 0);
    CHECK(writer.join().signal() == SIGPIPE);
  }

  // A deferred wait starts when it is run: before, one made while the
  // io_context lived and run after it went ran on the gone io_context.
  TEST_CASE("a deferred wait made before the child's io_context went is refused when it runs") {
    child c;
    std::optional<decltype(c.wait(asio::experimental::deferred))> waiting;
    {
      asio::io_context io;
      c = spawn(io.get_executor(), target({"exit", "3"}));
      waiting.emplace(c.wait(asio::experimental::deferred));
    }
    asio::io_context other;
    auto waited = std::move(*waiting)(asio::bind_executor(other, asio::use_future));
    other.run();
    CHECK_THROWS_WITH_AS(waited.get(), doctest::Contains("the io_context"), std::logic_error);
    CHECK(c.join().code() == 3);
  }

  TEST_CASE("a detached child runs to its end and is reaped in the background") {
    auto marker = fs::temp_directory_path() / ("cohort-detach-" + std::to_string(::getpid()));
    fs::remove(marker);
    asio::io_context io;
    pid_t pid;
    {
      child c = spawn(io.get_executor(), command{"/bin/sh", {"-c", "sleep 0.2; echo done > " + marker.string()}});
      pid = c.pid();
      c.detach();
      CHECK_FALSE(c);
    }
    CHECK(test::alive(pid));  // not killed by the destructor
    io.run();                 // returns once the background reap is done
    CHECK_FALSE(fs::exists("/proc/" + std::to_string(pid)));
    std::ifstream in(marker);
    std::string text;
    in >> text;
    CHECK(text == "done");
    fs::remove(marker);
  }

  TEST_CASE("a cancelled wait leaves the child running and waitable") {
    asio::io_context io;
    test::run(io, []() -> asio::awaitable<void> {
      command c_cmd = target({"sleep", "30"});
      child c = co_await spawn(c_cmd);
      asio::steady_timer timer(co_await asio::this_coro::executor, 20ms);
      auto first = co_await (c.wait() || timer.async_wait(asio::use_awaitable));
      CHECK(first.index() == 1);
      CHECK(test::alive(c.pid()));
      CHECK_FALSE(c.try_wait());
      c.signal(SIGKILL);
      CHECK((co_await c.wait()).signal() == SIGKILL);
    }());
  }

  TEST_CASE("a wait for a child whose exit a tracer holds sleeps, and ends with the status once the tracer goes") {
    asio::io_context io;
    test::run(io, []() -> asio::awaitable<void> {
      command c_cmd = target({"traceable", "30"});
      child c = co_await spawn(c_cmd);
      test::exit_holder holder(c.pid());
      if (!holder.held()) {
        MESSAGE("ptrace is refused here: not checked");
        co_return;
      }
      c.signal(SIGKILL);
      // Dead, its pidfd reading ready, but not this process's to reap yet:
      // the wait looks again after pauses instead of at once, over and over.
      const auto used = test::process_cpu_time();
      asio::steady_timer timer(co_await asio::this_coro::executor, 500ms);
      auto first = co_await (c.wait() || timer.async_wait(asio::use_awaitable));
      CHECK(first.index() == 1);
      CHECK(test::process_cpu_time() - used < 150ms);  // looking at once, over and over, used about 500 ms
      holder.end();
      const auto ended = std::chrono::steady_clock::now();
      CHECK((co_await c.wait()).signal() == SIGKILL);
      CHECK(std::chrono::steady_clock::now() - ended < 5s);
    }());
    CHECK(test::children_of_self().empty());
  }

  TEST_CASE("two waits at once on one child are refused") {
    asio::io_context io;
    test::run(io, []() -> asio::awaitable<void> {
      command c_cmd = target({"sleep", "30"});
      child c = co_await spawn(c_cmd);
      auto ex = co_await asio::this_coro::executor;
      std::optional<exit_status> first;
      asio::co_spawn(ex, c.wait(), [&](std::exception_ptr, exit_status s) { first = s; });
      asio::steady_timer tick(ex, 5ms);
      co_await tick.async_wait(asio::use_awaitable);
      CHECK_THROWS_AS(co_await c.wait(), std::logic_error);
      c.signal(SIGKILL);
      while (!first) {
        tick.expires_after(1ms);
        co_await tick.async_wait(asio::use_awaitable);
      }
      CHECK(first->signal() == SIGKILL);
    }());
  }

  TEST_CASE("children spawned and awaited from four threads of one io_context all report") {
    asio::io_context io;
    constexpr int count = 200;
    std::atomic<int> matched{0};
    for (int i = 0; i < count; ++i) {
      asio::co_spawn(io, [&matched, i]() -> asio::awaitable<void> {
        command c_cmd = target({"exit", std::to_string(i % 100)});
        child c = co_await spawn(c_cmd);
        if ((co_await c.wait()).code() == i % 100) ++matched;
      }, asio::detached);
    }
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) threads.emplace_back([&] { io.run(); });
    for (auto& t : threads) t.join();
    CHECK(matched == count);
  }

  // Before, the wait ran on the child's io_context and took the
  // cancellation inline on the thread that emitted it, while its completion
  // could be freeing the operation on another: memory read after it was
  // freed (seen under AddressSanitizer), or another wait cancelled.
  TEST_CASE("waits raced against their child's kill, from strands of its io_context and of another, end once each") {
    asio::io_context children_io, awaiting_io;
    constexpr int racers = 8, rounds = 100;
    std::atomic<int> won_by_exit{0}, won_by_kill{0}, failed{0};
    const auto race = [&](asio::io_context& spawn_on) -> asio::awaitable<void> {
      for (int round = 0; round < rounds; ++round) {
        try {
          const command cmd = target({"sleep", "30"});
          const spawn_options options;
          child c = co_await spawn(spawn_on.get_executor(), cmd, options, asio::use_awaitable);
          const pid_t pid = c.pid();
          // Busy for 0-1,000 us after the kill: about when the exit reaches the wait.
          auto kill_it = [](pid_t victim, std::chrono::microseconds busy) -> asio::awaitable<void> {
            ::kill(victim, SIGKILL);
            const auto until = std::chrono::steady_clock::now() + busy;
            while (std::chrono::steady_clock::now() < until) {
            }
            co_return;
          };
          auto outcome = co_await (c.wait() || kill_it(pid, std::chrono::microseconds(round % 25 * 40)));
          if (outcome.index() == 0) {
            if (std::get<0>(outcome).signal() == SIGKILL) ++won_by_exit;
            else ++failed;
          } else {
            ++won_by_kill;
          }
        } catch (...) {
          ++failed;
        }
      }
    };
    for (int r = 0; r < racers; ++r) {
      // Half await from a strand of the children's io_context, half from one of another.
      asio::io_context& home = r % 2 == 0 ? children_io : awaiting_io;
      asio::co_spawn(asio::make_strand(home), race(children_io), asio::detached);
    }
    std::vector<std::thread> threads;
    auto children_work = asio::make_work_guard(children_io);
    for (int t = 0; t < 2; ++t) threads.emplace_back([&] { awaiting_io.run(); });
    for (int t = 0; t < 2; ++t) threads.emplace_back([&] { children_io.run(); });
    threads[0].join();
    threads[1].join();
    children_work.reset();
    for (auto& t : threads) {
      if (t.joinable()) t.join();
    }
    CHECK(failed == 0);
    CHECK(won_by_exit + won_by_kill == racers * rounds);
  }

  TEST_CASE("a child whose object goes while its wait is then cancelled is still reaped") {
    asio::io_context io;
    auto c = std::make_unique<child>(spawn(io.get_executor(), target({"sleep", "30"})));
    const auto proc = "/proc/" + std::to_string(c->pid());
    asio::cancellation_signal cancel;
    asio::co_spawn(io, c->wait(), asio::bind_cancellation_slot(cancel.slot(), [](std::exception_ptr, exit_status) {}));
    io.poll();
    c.reset();  // kills it; the wait in flight is now the one to reap it
    cancel.emit(asio::cancellation_type::terminal);
    io.run();
    CHECK_FALSE(fs::exists(proc));
  }

  TEST_CASE("a child whose object goes while its wait is in flight is reaped when the io_context is destroyed") {
    pid_t pid;
    {
      asio::io_context io;
      auto c = std::make_unique<child>(spawn(io.get_executor(), target({"sleep", "30"})));
      pid = c->pid();
      asio::co_spawn(io, c->wait(), [](std::exception_ptr, exit_status) {});
      io.poll();
      c.reset();
    }  // never run again: the wait is destroyed, not completed
    CHECK_FALSE(fs::exists("/proc/" + std::to_string(pid)));
  }

  TEST_CASE("a wait awaited from another io_context, in flight as the child's io_context goes, keeps nothing of it") {
    // What forwards the awaiting side's cancellation to the wait stays in
    // that side's slot after the child's io_context has destroyed the
    // wait; it must not keep a strand of the destroyed io_context, whose
    // end would then touch freed memory as the other io_context goes
    // (AddressSanitizer sees it).
    using namespace asio::experimental::awaitable_operators;
    std::optional<asio::io_context> own(std::in_place);
    std::optional<asio::io_context> other(std::in_place);
    child c = spawn(own->get_executor(), target({"sleep", "30"}));
    bool expired = false;
    bool resumed = false;
    auto expire = [](asio::steady_timer& timer, bool& fired) -> asio::awaitable<void> {
      co_await timer.async_wait(asio::use_awaitable);
      fired = true;
    };
    auto await_or_expire = [expire](child& awaited, bool& fired, bool& done) -> asio::awaitable<void> {
      asio::steady_timer timer(co_await asio::this_coro::executor, 100ms);
      (void)co_await (awaited.wait(asio::use_awaitable) || expire(timer, fired));
      done = true;
    };
    asio::co_spawn(*other, await_or_expire(c, expired, resumed), asio::detached);
    other->poll();  // the wait starts, on the child's io_context
    own->poll();
    own.reset();  // the wait goes with it, never completed
    other->restart();
    other->run_for(10s);  // the timer expires, and cancels a wait that is gone
    CHECK(expired);
    CHECK_FALSE(resumed);  // as a wait destroyed uncalled leaves its awaiter
    other.reset();
    c.signal(SIGKILL);
    CHECK(c.join().signal() == SIGKILL);
  }

  TEST_CASE("a child detached while its wait is cancelled is reaped in the background") {
    asio::io_context io;
    child c = spawn(io.get_executor(), target({"sleep", "0"}));
    const auto proc = "/proc/" + std::to_string(c.pid());
    asio::cancellation_signal cancel;
    asio::co_spawn(io, c.wait(), asio::bind_cancellation_slot(cancel.slot(), [](std::exception_ptr, exit_status) {}));
    io.poll();
    c.detach();
    cancel.emit(asio::cancellation_type::terminal);
    io.run();
    CHECK_FALSE(fs::exists(proc));
  }

  TEST_CASE("a child spawned and detached on a thread that then exits is reaped") {
    asio::io_context io;
    pid_t pid = 0;
    std::thread([&] {
      const spawn_options options{.parent_death_signal = 0};
      child c = spawn(io.get_executor(), target({"sleep", "0"}), options);
      pid = c.pid();
      c.detach();
    }).join();
    io.run();
    CHECK_FALSE(fs::exists("/proc/" + std::to_string(pid)));
  }

  TEST_CASE("children can be spawned and awaited on a strand") {
    asio::io_context io;
    auto strand = asio::make_strand(io);
    auto status = asio::co_spawn(strand, []() -> asio::awaitable<exit_status> {
      command cmd = target({"exit", "6"});
      child c = co_await spawn(cmd);
      co_return co_await c.wait();
    }(), asio::use_future);
    io.run();
    CHECK(status.get().code() == 6);
  }

  TEST_CASE("a coroutine on another executor awaits a child and resumes on its own executor") {
    asio::io_context io;
    child c = spawn(io.get_executor(), target({"exit", "9"}));
    auto strand = asio::make_strand(io);
    bool on_strand = false;
    // The coroutine takes what it uses as parameters: a lambda's captures
    // would go with the temporary closure before the coroutine runs.
    auto await_on = [](child& awaited, asio::strand<asio::io_context::executor_type> own,
                       bool& resumed_on_own) -> asio::awaitable<exit_status> {
      const exit_status s = co_await awaited.wait();
      resumed_on_own = own.running_in_this_thread();
      co_return s;
    };
    auto status = asio::co_spawn(strand, await_on(c, strand, on_strand), asio::use_future);
    io.run();
    CHECK(status.get().code() == 9);
    CHECK(on_strand);
    CHECK(c.status());
  }

  TEST_CASE("a wait that cannot get a descriptor still ends with the status: polled on the reactor; on the ring it needs none") {
    asio::io_context io;
    io_uring_support(io);  // the ring, if any, exists before the limit drops
    CHECK(exit_code_with_no_descriptor_free(io) == "2");
  }

  // Before, the reactor's wait took terminal cancellations alone and went on
  // to the child's exit; the ring's took every type.
  TEST_CASE("without a ring, a partial cancellation that the awaiting coroutine lets through ends the wait") {
    asio::io_context io;
    cohort::use_reactor_only(io);
    child c = spawn(io.get_executor(), target({"sleep", "30"}));
    asio::cancellation_signal cancel;
    std::exception_ptr error;
    bool done = false;
    auto await_letting_partial = [](child& awaited) -> asio::awaitable<void> {
      co_await asio::this_coro::reset_cancellation_state(asio::enable_partial_cancellation());
      co_await awaited.wait();
    };
    asio::co_spawn(io, await_letting_partial(c), asio::bind_cancellation_slot(cancel.slot(), [&](std::exception_ptr e) {
      error = e;
      done = true;
    }));
    asio::steady_timer timer(io, 20ms);
    timer.async_wait([&](std::error_code) { cancel.emit(asio::cancellation_type::partial); });
    asio::steady_timer limit(io, 5s);
    limit.async_wait([&](std::error_code) { c.signal(SIGKILL); });
    io.run_one_for(0ms);
    while (!done && io.run_one() > 0) {
    }
    limit.cancel();
    CHECK(done);
    CHECK(test::aborted(error));
    CHECK(test::alive(c.pid()));
  }

  TEST_CASE("on an io_context given no ring (the public use_reactor_only), a child's exit still reaches its wait") {
    asio::io_context io;
    cohort::use_reactor_only(io);
    child c = spawn(io.get_executor(), target({"exit", "5"}));
    CHECK_FALSE(io_uring_support(io).waitid);  // watched on the reactor
    CHECK(test::run(io, c.wait()).code() == 5);
    CHECK_THROWS_AS(cohort::use_reactor_only(io), asio::service_already_exists);  // too late once used
  }

  TEST_CASE("wait() with a callback completes with the status on the child's io_context") {
    asio::io_context io;
    child c = spawn(io.get_executor(), target({"exit", "4"}));
    std::optional<exit_status> status;
    std::exception_ptr error;
    c.wait([&](std::exception_ptr e, exit_status s) {
      error = e;
      status = s;
    });
    CHECK_FALSE(status);  // not before the io_context runs
    io.run();
    CHECK_FALSE(error);
    REQUIRE(status);
    CHECK(status->code() == 4);
    CHECK(c.status() == status);
  }

  TEST_CASE("wait() with use_future delivers the status through the future") {
    asio::io_context io;
    child c = spawn(io.get_executor(), target({"exit", "5"}));
    const test::io_thread runner(io);
    auto status = c.wait(asio::use_future);
    CHECK(status.get().code() == 5);
  }

  TEST_CASE("a deferred wait cancelled through its slot completes as aborted and leaves the child waitable") {
    asio::io_context io;
    child c = spawn(io.get_executor(), target({"sleep", "30"}));
    auto wait = c.wait(asio::experimental::deferred);
    asio::cancellation_signal cancel;
    std::exception_ptr error;
    bool done = false;
    std::move(wait)(asio::bind_cancellation_slot(cancel.slot(), [&](std::exception_ptr e, exit_status) {
      error = e;
      done = true;
    }));
    asio::steady_timer timer(io, 20ms);
    timer.async_wait([&](std::error_code) { cancel.emit(asio::cancellation_type::terminal); });
    io.run();
    CHECK(done);
    CHECK(test::aborted(error));
    CHECK(test::alive(c.pid()));
    c.signal(SIGKILL);
    io.restart();
    std::optional<exit_status> later;
    c.wait([&](std::exception_ptr, exit_status s) { later = s; });
    io.run();
    REQUIRE(later);
    CHECK(later->signal() == SIGKILL);
  }
}

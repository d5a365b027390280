#include "cohort/stdio.hpp"

#include "cohort/spawn.hpp"
#include "support/harness.hpp"

#include <doctest/doctest.h>

#include <asio/write.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <optional>
#include <sstream>
#include <string>

using namespace cohort;

namespace {
// The descriptor a lease holder of the test below holds its lease by.
int leased_fd = -1;
}  // namespace

namespace fs = std::filesystem;

TEST_SUITE("stdio") {
  TEST_CASE("a piped stdout delivers what the child wrote, then end of file") {
    asio::io_context io;
    auto text = test::run(io, []() -> asio::awaitable<std::string> {
      command c_cmd{test::target, {"write", "1", "to stdout"}};
      spawn_options c_opts{.out = stdio::pipe()};
      child c = co_await spawn(c_cmd, c_opts);
      std::string got = co_await test::read_all(c.out());
      CHECK((co_await c.wait()).success());
      co_return got;
    }());
    CHECK(text == "to stdout");
  }

  TEST_CASE("a piped stdin carries what the parent writes") {
    asio::io_context io;
    auto echoed = test::run(io, []() -> asio::awaitable<std::string> {
      command c_cmd{test::target, {"cat"}};
      spawn_options c_opts{.in = stdio::pipe(), .out = stdio::pipe()};
      child c = co_await spawn(c_cmd, c_opts);
      co_await asio::async_write(c.in(), asio::buffer(std::string("round trip")), asio::use_awaitable);
      c.in().close();
      std::string got = co_await test::read_all(c.out());
      CHECK((co_await c.wait()).success());
      co_return got;
    }());
    CHECK(echoed == "round trip");
  }

  TEST_CASE("stderr can be piped apart from stdout, or joined to it") {
    asio::io_context io;
    test::run(io, []() -> asio::awaitable<void> {
      command apart_cmd{test::target, {"write", "2", "oops"}};
      spawn_options apart_opts{.out = stdio::pipe(), .err = stdio::pipe()};
      child apart = co_await spawn(apart_cmd, apart_opts);
      CHECK(co_await test::read_all(apart.err()) == "oops");
      CHECK(co_await test::read_all(apart.out()) == "");
      co_await apart.wait();

      command joined_cmd{test::target, {"write", "2", "joined"}};
      spawn_options joined_opts{.out = stdio::pipe(), .err = stdio::same_as_stdout()};
      child joined = co_await spawn(joined_cmd, joined_opts);
      CHECK(co_await test::read_all(joined.out()) == "joined");
      co_await joined.wait();
    }());
  }

  TEST_CASE("a file receives output, truncated or appended") {
    test::temp_dir dir;
    auto log = dir.path / "out.log";
    const spawn_options truncating{.out = stdio::file(log)};
    CHECK(run(command{test::target, {"write", "1", "first"}}, truncating).success());
    CHECK(test::read_file(log) == "first");
    CHECK(run(command{test::target, {"write", "1", "second"}}, truncating).success());
    CHECK(test::read_file(log) == "second");
    const spawn_options appending{.out = stdio::append(log)};
    CHECK(run(command{test::target, {"write", "1", "+third"}}, appending).success());
    CHECK(test::read_file(log) == "second+third");
  }

  TEST_CASE("a file feeds stdin") {
    test::temp_dir dir;
    auto input = dir.path / "in.txt";
    std::ofstream(input) << "from a file";
    auto output = dir.path / "out.txt";
    const spawn_options options{.in = stdio::file(input), .out = stdio::file(output)};
    CHECK(run(command{test::target, {"cat"}}, options).success());
    CHECK(test::read_file(output) == "from a file");
  }

  TEST_CASE("null gives end of file on stdin and swallows output") {
    asio::io_context io;
    auto text = test::run(io, []() -> asio::awaitable<std::string> {
      command c_cmd{test::target, {"cat"}};
      spawn_options c_opts{.in = stdio::null(), .out = stdio::pipe()};
      child c = co_await spawn(c_cmd, c_opts);
      std::string got = co_await test::read_all(c.out());
      CHECK((co_await c.wait()).success());
      co_return got;
    }());
    CHECK(text.empty());
    const spawn_options swallowed{.out = stdio::null()};
    CHECK(run(command{test::target, {"write", "1", "gone"}}, swallowed).success());
  }

  TEST_CASE("a descriptor of the parent can be handed over") {
    int p[2];
    REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
    const spawn_options options{.out = stdio::fd(p[1])};
    CHECK(run(command{test::target, {"write", "1", "via fd"}}, options).success());
    ::close(p[1]);
    char buf[32];
    auto n = ::read(p[0], buf, sizeof buf);
    CHECK(std::string(buf, static_cast<std::size_t>(n)) == "via fd");
    ::close(p[0]);
  }

  TEST_CASE("handing over this process's fd 0 as stdout survives stdin being replaced first") {
    int p[2];
    REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
    int saved_stdin = ::dup(0);
    REQUIRE(::dup2(p[1], 0) == 0);
    const spawn_options options{.in = stdio::null(), .out = stdio::fd(0)};
    auto status = run(command{test::target, {"write", "1", "fd0"}}, options);
    ::dup2(saved_stdin, 0);
    ::close(saved_stdin);
    ::close(p[1]);
    CHECK(status.success());
    char buf[32];
    auto n = ::read(p[0], buf, sizeof buf);
    CHECK(std::string(buf, static_cast<std::size_t>(n > 0 ? n : 0)) == "fd0");
    ::close(p[0]);
  }

  TEST_CASE("a file that cannot be opened fails the spawn, naming the file") {
    asio::io_context io;
    const spawn_options options{.out = stdio::file("/nonexistent-dir/x.log")};
    try {
      spawn(io.get_executor(), command{test::target, {"exit", "0"}}, options);
      FAIL("spawn succeeded");
    } catch (const std::system_error& e) {
      CHECK(e.code() == std::error_code(ENOENT, std::system_category()));
      CHECK(std::string(e.what()).find("/nonexistent-dir/x.log") != std::string::npos);
    }
  }

  // Before, the open waited for the FIFO's other end, holding up the
  // spawning thread (an io_context's, under co_await) for good.
  TEST_CASE("stdout to a FIFO that no process reads fails the spawn at once, saying so") {
    test::temp_dir dir;
    const fs::path fifo = dir.path / "out.fifo";
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    const spawn_options to_fifo{.out = stdio::file(fifo)};
    auto started = std::async(std::launch::async, [&] { return run(command{test::target, {"exit", "0"}}, to_fifo); });
    const bool at_once = started.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
    // A spawn stuck opening the FIFO: a reader's open lets it go on.
    const int reader = at_once ? -1 : ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    CHECK(at_once);
    try {
      started.get();
      ::close(reader);
      FAIL("spawn succeeded");
    } catch (const std::system_error& e) {
      CHECK(e.code() == std::error_code(ENXIO, std::system_category()));
      const std::string what = e.what();
      CHECK(what.find(fifo.string()) != std::string::npos);
      CHECK(what.find("FIFO") != std::string::npos);
      CHECK(what.find("for reading") != std::string::npos);
    }
  }

  TEST_CASE("stdin from a FIFO that no process writes starts at once and reads end of file") {
    test::temp_dir dir;
    const fs::path fifo = dir.path / "in.fifo";
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    const fs::path output = dir.path / "out.txt";
    const spawn_options from_fifo{.in = stdio::file(fifo), .out = stdio::file(output)};
    auto ran = std::async(std::launch::async, [&] { return run(command{test::target, {"cat"}}, from_fifo); });
    const bool at_once = ran.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
    if (!at_once) {
      // A spawn stuck opening the FIFO: a writer's open lets it go on.
      const int writer = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
      if (writer >= 0) ::close(writer);
    }
    CHECK(at_once);
    CHECK(ran.get().success());
    CHECK(test::read_file(output).empty());
  }

  // Opened non-blocking, a file under another process's lease was refused
  // (EWOULDBLOCK) where a plain open waits for the lease to be given up.
  TEST_CASE("stdout to a file under another process's lease waits for the lease, as a plain open does") {
    test::temp_dir dir;
    const fs::path file = dir.path / "leased.txt";
    std::ofstream(file) << "before\n";
    int ready[2];
    REQUIRE(::pipe2(ready, O_CLOEXEC) == 0);
    // The holder gives its lease up when told the lease is being broken
    // (SIGIO), as a file server does.
    const pid_t holder = ::fork();
    REQUIRE(holder >= 0);
    if (holder == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      leased_fd = ::open(file.c_str(), O_RDONLY);
      struct sigaction give_up {};
      give_up.sa_handler = [](int) { ::fcntl(leased_fd, F_SETLEASE, F_UNLCK); };
      ::sigaction(SIGIO, &give_up, nullptr);
      const char held = leased_fd >= 0 && ::fcntl(leased_fd, F_SETLEASE, F_RDLCK) == 0 ? 'y' : 'n';
      if (::write(ready[1], &held, 1) != 1) ::_exit(1);
      for (;;) ::pause();
    }
    ::close(ready[1]);
    char held = 0;
    const bool told = ::read(ready[0], &held, 1) == 1;
    ::close(ready[0]);
    std::optional<exit_status> status;
    std::string failure;
    if (told && held == 'y') {
      const spawn_options to_file{.out = stdio::file(file)};
      try {
        status = run(command{test::target, {"write", "1", "after\n"}}, to_file);
      } catch (const std::system_error& e) {
        failure = e.what();
      }
    }
    ::kill(holder, SIGKILL);
    ::waitpid(holder, nullptr, 0);
    REQUIRE(told);
    if (held != 'y') {
      MESSAGE("no lease can be taken on this file system: nothing to check");
      return;
    }
    REQUIRE_MESSAGE(status, failure);
    CHECK(status->success());
    CHECK(test::read_file(file) == "after\n");
  }

  TEST_CASE("a FIFO opened for the child's stdin or stdout is blocking in the child") {
    test::temp_dir dir;
    const fs::path in = dir.path / "in.fifo";
    const fs::path out = dir.path / "out.fifo";
    REQUIRE(::mkfifo(in.c_str(), 0600) == 0);
    REQUIRE(::mkfifo(out.c_str(), 0600) == 0);
    // Each with its other end open here, so that no open would wait.
    const int reader = ::open(out.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    REQUIRE(reader >= 0);
    const int writer = ::open(in.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC);
    REQUIRE(writer >= 0);
    const fs::path report = dir.path / "fdinfo.txt";
    const spawn_options fifos{.in = stdio::file(in), .out = stdio::file(out), .err = stdio::file(report)};
    const auto status = run(command{"/bin/sh", {"-c", "cat /proc/self/fdinfo/0 /proc/self/fdinfo/1 >&2"}}, fifos);
    ::close(reader);
    ::close(writer);
    CHECK(status.success());
    std::istringstream lines(test::read_file(report));
    int streams = 0;
    for (std::string line; std::getline(lines, line);) {
      if (!line.starts_with("flags:")) continue;
      ++streams;
      const int flags = std::stoi(line.substr(line.find_first_of("01234567")), nullptr, 8);
      CHECK((flags & O_NONBLOCK) == 0);
    }
    CHECK(streams == 2);
  }

  TEST_CASE("same_as_stdout() is for stderr only, and pipes are refused by run()") {
    asio::io_context io;
    const spawn_options stdout_as_stdout{.out = stdio::same_as_stdout()};
    CHECK_THROWS_AS(spawn(io.get_executor(), command{test::target, {"exit", "0"}}, stdout_as_stdout),
                    std::invalid_argument);
    const spawn_options piped{.out = stdio::pipe()};
    CHECK_THROWS_AS(run(command{test::target, {"exit", "0"}}, piped), std::invalid_argument);
  }

  TEST_CASE("asking for a pipe that was not configured is a logic error") {
    asio::io_context io;
    child c = spawn(io.get_executor(), command{test::target, {"exit", "0"}});
    CHECK_THROWS_AS(c.out(), std::logic_error);
    CHECK_THROWS_AS(c.in(), std::logic_error);
    c.join();
  }
}

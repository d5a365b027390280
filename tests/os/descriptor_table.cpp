#include "os/descriptor_table.hpp"

#include "support/harness.hpp"
#include "support/process_probe.hpp"

#include <doctest/doctest.h>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>

using namespace cohort;

namespace {

enum outcome { holds = 0, broken = 1, threw = 2, cannot_tell = 3 };

// Runs `check` in a forked child, whose descriptor table is only as large
// as its open descriptors need (the test program's may have grown), and
// checks its outcome; where the machine leaves the test nothing to look at,
// says so instead.
void in_child(const std::function<outcome()>& check) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    int code = threw;
    try {
      code = check();
    } catch (...) {
    }
    ::_exit(code);
  }
  REQUIRE(pid > 0);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  if (WEXITSTATUS(status) == cannot_tell) {
    WARN("this process's descriptor table or limit leaves the test nothing to look at");
    return;
  }
  CHECK(WEXITSTATUS(status) == holds);
}

}  // namespace

TEST_CASE("reserve_descriptors grows the table past the lowest free descriptor, and leaves nothing open") {
  in_child([] {
    const long before = test::table_size(::getpid()), open = test::open_fd_count();
    if (before <= 0 || before >= 300) return cannot_tell;
    const auto room = test::nofile_limit::at_least(4096);  // room for 400 more under a low soft limit too
    if (room.current() < 512) return cannot_tell;
    os::reserve_descriptors(400);
    return test::table_size(::getpid()) >= 400 && test::open_fd_count() == open ? holds : broken;
  });
}

TEST_CASE("reserve_descriptors stays within RLIMIT_NOFILE") {
  in_child([] {
    rlimit limit{};
    if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_max < 100) return cannot_tell;
    limit.rlim_cur = 100;
    if (::setrlimit(RLIMIT_NOFILE, &limit) != 0 || test::table_size(::getpid()) > 64) return cannot_tell;
    os::reserve_descriptors(5000);
    const long size = test::table_size(::getpid());
    return size >= 100 && size < 1024 ? holds : broken;
  });
}

TEST_CASE("reserve_descriptors of nothing changes nothing") {
  in_child([] {
    const long before = test::table_size(::getpid());
    if (before <= 0) return cannot_tell;
    os::reserve_descriptors(0);
    return test::table_size(::getpid()) == before ? holds : broken;
  });
}

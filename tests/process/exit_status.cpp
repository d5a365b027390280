#include "cohort/exit_status.hpp"

#include <doctest/doctest.h>

#include <fmt/format.h>

#include <signal.h>

using cohort::exit_status;

TEST_SUITE("exit_status") {
  TEST_CASE("an exit formats with its code") {
    CHECK(fmt::format("{}", exit_status::from_code(3)) == "exited with code 3");
    CHECK(fmt::format("{}", exit_status::from_code(0)) == "exited with code 0");
  }

  TEST_CASE("a death by signal formats with the signal's name and number") {
    CHECK(fmt::format("{}", exit_status::from_signal(SIGKILL)) == "killed by signal SIGKILL (9)");
    CHECK(fmt::format("{}", exit_status::from_signal(SIGSEGV, true)) ==
          "killed by signal SIGSEGV (11) (core dumped)");
  }

  TEST_CASE("the format honours width and alignment") {
    CHECK(fmt::format("[{:>20}]", exit_status::from_code(1)) == "[  exited with code 1]");
  }

  TEST_CASE("accessors tell exits from signals") {
    auto exited = exit_status::from_code(255);
    CHECK(exited.exited());
    CHECK_FALSE(exited.signaled());
    CHECK(exited.code() == 255);
    CHECK(exited.signal() == 0);
    CHECK_FALSE(exited.success());
    CHECK(exited.shell_code() == 255);

    auto killed = exit_status::from_signal(SIGTERM);
    CHECK(killed.signaled());
    CHECK(killed.signal() == SIGTERM);
    CHECK(killed.code() == 0);
    CHECK_FALSE(killed.success());
    CHECK(killed.shell_code() == 128 + SIGTERM);

    CHECK(exit_status::from_code(0).success());
  }

  TEST_CASE("statuses compare by how they ended, not by resource usage") {
    cohort::resource_usage used{std::chrono::microseconds(5), std::chrono::microseconds(6), 7};
    CHECK(exit_status::from_code(1, used) == exit_status::from_code(1));
    CHECK(exit_status::from_code(1) != exit_status::from_code(2));
    CHECK(exit_status::from_signal(9) != exit_status::from_code(9));
    CHECK(exit_status::from_signal(11, true) != exit_status::from_signal(11, false));
  }

  TEST_CASE("signal names cover classic, real-time and unknown numbers") {
    CHECK(cohort::signal_name(SIGINT) == "SIGINT");
    CHECK(cohort::signal_name(SIGUSR2) == "SIGUSR2");
    CHECK(cohort::signal_name(SIGRTMIN) == "SIGRTMIN");
    CHECK(cohort::signal_name(SIGRTMIN + 2) == "SIGRTMIN+2");
    CHECK(cohort::signal_name(0) == "signal 0");
    CHECK(cohort::signal_name(200) == "signal 200");
  }
}

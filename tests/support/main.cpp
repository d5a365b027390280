// doctest's main for every test program; it hands control to a function
// entry point first, as every program that starts functions must. A program
// that declares the io_uring operation it tests (test::needs_ring_operation)
// skips with exit code 77 on the io_uring run where the kernel lacks it, and
// one that declares a device (test::needs_device) where there is none.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "harness.hpp"

#include <cohort/entry_point.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <optional>
#include <string>

namespace {

// Asks `need.why_not` in a forked child: the reason it answers (empty when
// the device is there), or nullopt when the child did not end normally.
std::optional<std::string> ask_in_child(const cohort::test::needs_device& need) {
  int ends[2];
  if (::pipe(ends) != 0) return std::nullopt;
  const pid_t pid = ::fork();
  if (pid < 0) return std::nullopt;
  if (pid == 0) {
    ::close(ends[0]);
    const std::string why = need.why_not();
    const bool written = ::write(ends[1], why.data(), why.size()) == static_cast<ssize_t>(why.size());
    ::_exit(written ? 0 : 1);
  }
  ::close(ends[1]);
  std::string why;
  char buf[256];
  for (ssize_t n; (n = ::read(ends[0], buf, sizeof buf)) > 0;) why.append(buf, static_cast<std::size_t>(n));
  ::close(ends[0]);
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return std::nullopt;
  return why;
}

}  // namespace

int main(int argc, char** argv) {
  // Function entry points started by re-execution run here.
  if (auto rc = cohort::child_main(argc, argv)) return *rc;
  const auto* need = cohort::test::needs_ring_operation::declared();
  if (need != nullptr && !cohort::test::reactor_mode()) {
    asio::io_context io;
    const auto info = cohort::io_uring_support(io);
    if (!info.ring || !(info.*need->available)) {
      std::printf("SKIP: io_uring without %s (%s)\n", need->name,
                  info.why_not.empty() ? "not offered by this kernel" : info.why_not.c_str());
      return 77;
    }
  }
  if (const auto* device = cohort::test::needs_device::declared()) {
    const auto why = ask_in_child(*device);
    if (!why) {
      std::printf("asking for %s failed: the child did not end normally\n", device->name);
      return 1;
    }
    if (!why->empty()) {
      std::printf("SKIP: no %s: %s\n", device->name, why->c_str());
      return 77;
    }
  }
  return doctest::Context(argc, argv).run();
}

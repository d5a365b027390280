// cohort-info: what cohort found on this machine (kernel, io_uring operations).
#include <cohort/io_uring_info.hpp>
#include <cohort/version.hpp>

#include <fmt/format.h>

#include <sys/utsname.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string_view>

namespace {

constexpr std::string_view usage =
    "usage: cohort-info [--help | --version]\n"
    "Prints the kernel and the io_uring operations cohort uses.\n"
    "COHORT_IO_URING=0 forces asio's reactor instead of the ring.\n";

// What stands in for each operation without the ring: exits, pipes and
// reads are watched on asio's reactor; an awaited futex wait sleeps on a
// helper thread (in futex_waitv, or one wait a thread before Linux 5.16).
void print_support(const cohort::io_uring_info& info) {
  constexpr const char* reactor = "no (asio's reactor)";
  constexpr const char* helper = "no (a helper thread)";
  auto yes = [](bool b, const char* instead) { return b ? "yes" : instead; };
  fmt::print("io_uring: on\n  waitid: {}\n  poll:   {}\n  read:   {}\n  futex:  {}\n  cancel: {}\n",
             yes(info.waitid, reactor), yes(info.poll, reactor), yes(info.read, reactor), yes(info.futex, helper),
             yes(info.cancel, reactor));
}

// `code`, once what was printed has reached stdout; 1 where it did not
// (stdout a full disk, a closed pipe), saying so, where the report would
// otherwise be lost with a status that says it was given.
int printed(int code) {
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
    fmt::print(stderr, "cohort-info: writing to stdout: {}\n", std::strerror(errno));
    return 1;
  }
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) {
    const std::string_view arg = argv[1];
    const bool known = arg == "--help" || arg == "-h" || arg == "--version";
    if (!known || argc > 2) {
      fmt::print(stderr, "cohort-info: unexpected argument '{}'\n{}", known ? argv[2] : argv[1], usage);
      return 2;
    }
    if (arg == "--version") fmt::print("cohort {}\n", COHORT_VERSION);
    else fmt::print("{}", usage);
    return printed(0);
  }
  try {
    utsname u{};
    ::uname(&u);
    asio::io_context io;
    const auto info = cohort::io_uring_support(io);
    fmt::print("cohort {}\nkernel: {} {}\n", COHORT_VERSION, u.sysname, u.release);
    if (!info.ring) {
      fmt::print("io_uring: off ({}): asio's reactor watches exits, pipes and reads, and an awaited futex wait "
                 "sleeps on a helper thread\n",
                 info.why_not);
      return printed(0);
    }
    print_support(info);
    return printed(0);
  } catch (const std::exception& e) {
    fmt::print(stderr, "cohort-info: {}\n", e.what());
    return 1;
  }
}

// cohort-info: what cohort found on this machine (kernel, io_uring operations).
#include <cohort/io_uring_info.hpp>
#include <cohort/version.hpp>

#include <fmt/format.h>

#include <sys/utsname.h>

#include <cstring>

int main(int argc, char** argv) {
  if (argc > 1 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0)) {
    fmt::print("usage: cohort-info\nPrints the kernel and the io_uring operations cohort uses.\n"
               "COHORT_IO_URING=0 forces asio's reactor instead of the ring.\n");
    return 0;
  }
  utsname u{};
  ::uname(&u);
  asio::io_context io;
  auto info = cohort::io_uring_support(io);
  auto yes = [](bool b) { return b ? "yes" : "no (reactor fallback)"; };
  fmt::print("cohort {}\nkernel: {} {}\n", COHORT_VERSION, u.sysname, u.release);
  if (!info.ring) {
    fmt::print("io_uring: off ({}); every operation uses asio's reactor\n", info.why_not);
    return 0;
  }
  fmt::print("io_uring: on\n  waitid: {}\n  poll:   {}\n  read:   {}\n  futex:  {}\n  cancel: {}\n",
             yes(info.waitid), yes(info.poll), yes(info.read), yes(info.futex), yes(info.cancel));
  return 0;
}

// doctest's main for every test program; it hands control to a function
// entry point first, as every program that starts functions must. A program
// that declares the io_uring operation it tests (test::needs_ring_operation)
// skips with exit code 77 on the io_uring run where the kernel lacks it.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "harness.hpp"

#include <cohort/entry_point.hpp>

#include <cstdio>

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
  return doctest::Context(argc, argv).run();
}

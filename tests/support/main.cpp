// doctest's main for every test program; it hands control to a function
// entry point first, as every program that starts functions must. A program built with
// COHORT_TEST_NEEDS_RING tests the ring itself: where the kernel offers no
// io_uring (and the reactor was not asked for) it skips with exit code 77.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "harness.hpp"

#include <cohort/entry_point.hpp>

#include <cstdio>

int main(int argc, char** argv) {
  // Function entry points started by re-execution run here.
  if (auto rc = cohort::child_main(argc, argv)) return *rc;
#ifdef COHORT_TEST_NEEDS_RING
  if (!cohort::test::reactor_mode()) {
    asio::io_context io;
    auto info = cohort::io_uring_support(io);
    if (!info.ring || !info.waitid) {
      std::printf("SKIP: io_uring with waitid unavailable (%s)\n", info.why_not.c_str());
      return 77;
    }
  }
#endif
  return doctest::Context(argc, argv).run();
}

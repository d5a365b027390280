// A library whose global constructor throws, as dlopen runs it with the
// dynamic loader's lock held: for the trace of an exception that escapes
// there (tests/launch/error_file.cpp, through `thrower constructor`).
#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <thread>

namespace throwing_constructor {

struct settings {
  settings() {
    // After COHORT_TEST_CONSTRUCTOR_SLEEP_MS, where set: time for another
    // thread to fail meanwhile.
    if (const char* ms = std::getenv("COHORT_TEST_CONSTRUCTOR_SLEEP_MS")) {
      std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(ms)));
    }
    throw std::runtime_error("thrown by a constructor as its library loads");
  }
};

const settings loaded;

}  // namespace throwing_constructor

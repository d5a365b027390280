#include "cohort/thread_name.hpp"

#include <doctest/doctest.h>

#include <sys/syscall.h>
#include <unistd.h>

#include <fstream>
#include <stdexcept>
#include <thread>

namespace {

// What the kernel shows for the calling thread.
std::string comm_of_this_thread() {
  std::ifstream comm("/proc/self/task/" + std::to_string(::syscall(SYS_gettid)) + "/comm");
  std::string name;
  std::getline(comm, name);
  return name;
}

}  // namespace

TEST_SUITE("thread_name") {
  TEST_CASE("a thread's name is what the kernel shows, and reads back") {
    std::thread([] {
      cohort::set_thread_name("worker-3");
      CHECK(comm_of_this_thread() == "worker-3");
      CHECK(cohort::thread_name() == "worker-3");
    }).join();
  }

  TEST_CASE("names past 15 bytes are cut at 15") {
    std::thread([] {
      cohort::set_thread_name("a-very-long-thread-name");
      CHECK(cohort::thread_name() == "a-very-long-thr");
      CHECK(comm_of_this_thread() == "a-very-long-thr");
    }).join();
  }

  TEST_CASE("naming one thread leaves the others alone") {
    const std::string before = cohort::thread_name();
    std::thread([] { cohort::set_thread_name("other"); }).join();
    CHECK(cohort::thread_name() == before);
  }

  TEST_CASE("a name holding NUL is refused") {
    CHECK_THROWS_AS(cohort::set_thread_name(std::string_view("a\0b", 3)), std::invalid_argument);
  }
}

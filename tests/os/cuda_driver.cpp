#include "os/cuda_driver.hpp"

#include "support/harness.hpp"

#include <doctest/doctest.h>

#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

using namespace cohort;

namespace {

using init_fn = int (*)(unsigned);
using device_get_fn = int (*)(int*, int);

// What a child that loads the stand-in driver sees, one bit per check that
// failed: the child's exit code.
enum failed_check {
  loaded = 1,
  counted_before_init = 2,
  probe_initialised = 4,
  not_counted_after_init = 8,
};

// In a child of its own, so that this process never holds the driver.
[[noreturn]] void load_and_initialise() {
  int failed = 0;
  void* driver = ::dlopen(test::fake_libcuda.c_str(), RTLD_NOW);
  if (driver == nullptr) ::_exit(loaded);
  auto init = reinterpret_cast<init_fn>(::dlsym(driver, "cuInit"));
  auto device_get = reinterpret_cast<device_get_fn>(::dlsym(driver, "cuDeviceGet"));
  if (init == nullptr || device_get == nullptr) ::_exit(loaded);
  if (os::cuda_initialised()) failed |= counted_before_init;
  int device = -1;
  if (device_get(&device, 0) != 3) failed |= probe_initialised;  // still CUDA_ERROR_NOT_INITIALIZED
  init(0);
  if (!os::cuda_initialised()) failed |= not_counted_after_init;
  ::_exit(failed);
}

}  // namespace

TEST_SUITE("cuda driver") {
  TEST_CASE("a process that never loaded the driver has not initialised CUDA") {
    CHECK_FALSE(os::cuda_initialised());
    CHECK(::dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD) == nullptr);  // the question loaded nothing
  }

  TEST_CASE("a loaded driver counts once cuInit has run, and asking initialises nothing") {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) load_and_initialise();
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    REQUIRE(WIFEXITED(status));
    const int failed = WEXITSTATUS(status);
    CHECK((failed & loaded) == 0);
    CHECK((failed & counted_before_init) == 0);
    CHECK((failed & probe_initialised) == 0);
    CHECK((failed & not_counted_after_init) == 0);
  }
}

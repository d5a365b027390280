#include "os/bare_thread.hpp"

#include "os/raw_syscall.hpp"

#include <doctest/doctest.h>

#include <linux/capability.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/single_threaded.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdint>
#include <filesystem>
#include <string>
#include <thread>

using namespace cohort;
using namespace std::chrono_literals;

namespace {

// What the bare thread reports: its thread id, its signal mask, its
// effective user id and whether it holds any capability, then `done` set
// and woken.
struct report {
  std::atomic<long> tid{0};
  std::atomic<unsigned long long> mask{0};
  std::atomic<long> euid{-1};
  std::atomic<long> capabilities{-1};
  std::atomic<std::uint32_t> done{0};
};

COHORT_BARE_CODE void tell(void* into) {
  auto& r = *static_cast<report*>(into);
  r.tid.store(os::raw_syscall(SYS_gettid), std::memory_order_relaxed);
  unsigned long long mask = 0;
  os::raw_syscall(SYS_rt_sigprocmask, SIG_BLOCK, 0, reinterpret_cast<long>(&mask), sizeof mask);
  r.mask.store(mask, std::memory_order_relaxed);
  r.euid.store(os::raw_syscall(SYS_geteuid), std::memory_order_relaxed);
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  COHORT_UNINITIALIZED __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3];
  if (os::raw_syscall(SYS_capget, reinterpret_cast<long>(&header), reinterpret_cast<long>(data)) == 0) {
    long any = 0;
    for (int i = 0; i < _LINUX_CAPABILITY_U32S_3; ++i) any |= static_cast<long>(data[i].effective | data[i].permitted);
    r.capabilities.store(any, std::memory_order_relaxed);
  }
  r.done.store(1, std::memory_order_release);
  os::raw_syscall(SYS_futex, reinterpret_cast<long>(&r.done), FUTEX_WAKE, INT_MAX);
}

constexpr unsigned long long bit(int signal) { return 1ULL << (signal - 1); }

// Waits up to 10 s for `done`.
bool wait_done(report& r) {
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (r.done.load(std::memory_order_acquire) == 0) {
    if (std::chrono::steady_clock::now() > until) return false;
    const timespec slice{0, 10'000'000};
    os::raw_syscall(SYS_futex, reinterpret_cast<long>(&r.done), FUTEX_WAIT, 0, reinterpret_cast<long>(&slice));
  }
  return true;
}

}  // namespace

TEST_SUITE("bare thread") {
  TEST_CASE("a bare thread runs with every signal blocked and no capability, libc still counts one thread, and it ends on return") {
    REQUIRE(os::bare_threads_supported());
    // This program starts no thread before: libc counts it single-threaded.
    REQUIRE(__libc_single_threaded);
    const int dumpable = ::prctl(PR_GET_DUMPABLE);
    report r;
    REQUIRE(os::start_bare_thread(tell, &r, 16 << 10) == 0);
    REQUIRE(wait_done(r));
    const long tid = r.tid.load();
    CHECK(tid > 0);
    CHECK(tid != ::getpid());
    // Every signal but the two the kernel never blocks, glibc's own
    // SIGCANCEL and SIGSETXID (32 and 33) included.
    CHECK((r.mask.load() | bit(SIGKILL) | bit(SIGSTOP)) == ~0ULL);
    CHECK(__libc_single_threaded);
    // It runs with the process's ids and no capability; this thread keeps
    // its own, and the process stays as dumpable as it was (an id changed
    // on any thread would make it non-dumpable, closing its /proc/<pid>/fd
    // to the ranks that open segments through it).
    CHECK(r.euid.load() == ::geteuid());
    CHECK(r.capabilities.load() == 0);
    CHECK(::prctl(PR_GET_DUMPABLE) == dumpable);
    // Returned from its function, the thread is gone from the process.
    const std::filesystem::path task = "/proc/self/task/" + std::to_string(tid);
    const auto until = std::chrono::steady_clock::now() + 10s;
    while (std::filesystem::exists(task) && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
    CHECK_FALSE(std::filesystem::exists(task));
  }

  TEST_CASE("a bare thread does not start where the process's ids differ, and its start says EPERM") {
    if (::geteuid() != 0) {
      MESSAGE("not root: the ids cannot be made to differ");
      return;
    }
    // In a child whose real user id is no longer its effective one: libc's
    // setuid back to either would not reach the thread.
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      if (::setresuid(65534, 0, 0) != 0) ::_exit(2);
      report r;
      const int error = os::start_bare_thread(tell, &r, 16 << 10);
      ::_exit(error == EPERM && r.done.load() == 0 ? 0 : 1);
    }
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
}

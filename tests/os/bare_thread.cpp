#include "os/bare_thread.hpp"

#include "os/raw_syscall.hpp"

#include <doctest/doctest.h>

#include <linux/capability.h>
#include <linux/futex.h>
#include <signal.h>
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
  TEST_CASE("a bare thread runs with every signal blocked and no privilege, libc still counts one thread, and it ends on return") {
    REQUIRE(os::bare_threads_supported());
    // This program starts no thread before: libc counts it single-threaded.
    REQUIRE(__libc_single_threaded);
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
    // A root process's bare thread runs as nobody, with no capability;
    // this thread keeps its own.
    if (::geteuid() == 0) {
      CHECK(r.euid.load() != 0);
      CHECK(r.capabilities.load() == 0);
      CHECK(::geteuid() == 0);
    }
    // Returned from its function, the thread is gone from the process.
    const std::filesystem::path task = "/proc/self/task/" + std::to_string(tid);
    const auto until = std::chrono::steady_clock::now() + 10s;
    while (std::filesystem::exists(task) && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
    CHECK_FALSE(std::filesystem::exists(task));
  }

  TEST_CASE("a bare thread that cannot give up the process's privileges does not run, and its start says EPERM") {
    if (::geteuid() != 0) {
      MESSAGE("not root: no privilege to keep");
      return;
    }
    // In a child that keeps root's ids but loses the capabilities to change
    // them: the thread can give up neither.
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
      __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {};
      if (::syscall(SYS_capget, &header, data) != 0) ::_exit(2);
      const auto drop = ~((1u << CAP_SETUID) | (1u << CAP_SETGID));
      data[0].effective &= drop;
      data[0].permitted &= drop;
      if (::syscall(SYS_capset, &header, data) != 0) ::_exit(3);
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

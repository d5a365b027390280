#include "os/clone3.hpp"

#include "os/raw_syscall.hpp"
#include "config.hpp"
#include "support/harness.hpp"

#include <doctest/doctest.h>

#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

using namespace cohort;

namespace {

// The kernel's struct sigaction, as rt_sigaction(2) takes it.
struct kernel_sigaction {
  void (*handler)(int);
  unsigned long flags;
  void (*restorer)();
  unsigned long mask;
};

// What the child reports, through the memory it shares with the parent.
struct report {
  long pid = 0;
  std::uintptr_t local = 0;     // the address of one of its locals
  std::uintptr_t aligned = 0;   // and of one aligned to 16 bytes
  void (*usr1)(int) = nullptr;  // its disposition of SIGUSR1
  void (*usr2)(int) = nullptr;  // and of SIGUSR2
};

void no_op(int) {}

// The child's function: raw system calls only, on the stack it was given.
int tell(void* into) {
  auto& r = *static_cast<report*>(into);
  alignas(16) volatile char aligned[16] = {};
  volatile int local = 0;
  r.local = reinterpret_cast<std::uintptr_t>(&local);
  r.aligned = reinterpret_cast<std::uintptr_t>(&aligned[0]);
  r.pid = os::raw_syscall(SYS_getpid);
  kernel_sigaction sa{};
  if (os::raw_syscall(SYS_rt_sigaction, SIGUSR1, 0, reinterpret_cast<long>(&sa), 8) == 0) r.usr1 = sa.handler;
  if (os::raw_syscall(SYS_rt_sigaction, SIGUSR2, 0, reinterpret_cast<long>(&sa), 8) == 0) r.usr2 = sa.handler;
  return 7;
}

// A stack for the child, unmapped at the end of the scope.
struct mapped_stack {
  static constexpr std::size_t size = 64 * 1024;
  void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  ~mapped_stack() {
    if (base != MAP_FAILED) ::munmap(base, size);
  }
};

}  // namespace

TEST_SUITE("clone3") {
  TEST_CASE("the child runs the function on its stack, with handled signals reset and ignored ones kept") {
    if (!os::clone3_run_supported()) {
      os::clone3_args none;
      CHECK(os::clone3_run(none, tell, nullptr) == -ENOSYS);
      return;
    }
    mapped_stack stack;
    REQUIRE(stack.base != MAP_FAILED);
    struct sigaction handled {}, ignored {}, saved_usr1 {}, saved_usr2 {};
    handled.sa_handler = no_op;
    ignored.sa_handler = SIG_IGN;
    REQUIRE(::sigaction(SIGUSR1, &handled, &saved_usr1) == 0);
    REQUIRE(::sigaction(SIGUSR2, &ignored, &saved_usr2) == 0);

    report r;
    int pidfd = -1;
    os::clone3_args args;
    args.flags = CLONE_VM | CLONE_VFORK | CLONE_PIDFD | os::clone_clear_sighand;
    args.pidfd = reinterpret_cast<std::uintptr_t>(&pidfd);
    args.exit_signal = SIGCHLD;
    args.stack = reinterpret_cast<std::uintptr_t>(stack.base);
    args.stack_size = mapped_stack::size;
    const long pid = os::clone3_run(args, tell, &r);
    ::sigaction(SIGUSR1, &saved_usr1, nullptr);
    ::sigaction(SIGUSR2, &saved_usr2, nullptr);
    if (pid == -ENOSYS || pid == -EPERM) {
      // A seccomp filter that refuses clone3 (container runtimes answer
      // ENOSYS): spawn then clones as before.
      WARN_MESSAGE(false, "clone3 is refused here: ", -pid);
      return;
    }
    if (test::kernel_at_least(5, 5)) REQUIRE(pid > 0);
    if (pid < 0) return;  // an older kernel without CLONE_CLEAR_SIGHAND
    REQUIRE(pidfd >= 0);
    // CLONE_VFORK: the child has run (and exited) before clone3 returned.
    CHECK(r.pid == pid);
    const auto base = reinterpret_cast<std::uintptr_t>(stack.base);
    CHECK(r.local >= base);  // on the stack it was given
    CHECK(r.local < base + mapped_stack::size);
    CHECK(r.aligned % 16 == 0);
    CHECK((r.usr1 == SIG_DFL));
    CHECK((r.usr2 == SIG_IGN));
    siginfo_t info{};
    REQUIRE(::waitid(static_cast<idtype_t>(config::p_pidfd), static_cast<id_t>(pidfd), &info, WEXITED) == 0);
    CHECK(info.si_pid == pid);
    CHECK(info.si_code == CLD_EXITED);
    CHECK(info.si_status == 7);
    ::close(pidfd);
  }

  TEST_CASE("a clone without a stack is refused and starts nothing") {
    os::clone3_args args;
    args.flags = CLONE_VM | CLONE_VFORK;
    args.exit_signal = SIGCHLD;
    report r;
    const long result = os::clone3_run(args, tell, &r);
    CHECK(result < 0);
    CHECK(r.pid == 0);
  }
}

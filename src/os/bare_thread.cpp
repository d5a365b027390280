// Starting a thread with clone(2), every signal blocked and every
// capability given up, on a stack of its own.
#include "os/bare_thread.hpp"

#include "os/raw_syscall.hpp"

#include <linux/capability.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <new>

namespace cohort::os {
namespace {

// What the new thread needs, at the top of its mapping, and what it says
// back before it runs: `verdict` 1 once it runs with no capability, 2 when
// it could not give them up (it ends then).
struct bare_start {
  void (*run)(void*);
  void* arg;
  std::atomic<std::uint32_t> verdict{0};
  // The thread's id while it lives: the kernel clears it and wakes it at
  // the thread's end (CLONE_CHILD_CLEARTID).
  std::atomic<pid_t> alive{-1};
};

// This thread's effective and permitted capabilities, or -1 when they
// cannot be read; raw system calls only.
COHORT_BARE_CODE long raw_capabilities() {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  COHORT_UNINITIALIZED __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3];
  if (raw_syscall(SYS_capget, reinterpret_cast<long>(&header), reinterpret_cast<long>(data)) != 0) return -1;
  long any = 0;
  for (const auto& d : data) any |= static_cast<long>(d.effective | d.permitted);
  return any;
}

// Gives up every capability of this thread (its own: the process's other
// threads keep theirs; a thread that holds none gives up nothing). Its ids stay the process's: a thread whose
// effective id changed would make the whole process non-dumpable (its
// /proc/<pid>/fd closed to other processes of the same user, which is how
// ranks open each other's segments) and open it to signals from that id.
// Whether it holds no capability now.
COHORT_BARE_CODE bool give_up_capabilities() {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct none[_LINUX_CAPABILITY_U32S_3] = {};
  raw_syscall(SYS_capset, reinterpret_cast<long>(&header), reinterpret_cast<long>(none));
  return raw_capabilities() == 0;
}

COHORT_BARE_CODE int bare_main(void* start) {
  auto* s = static_cast<bare_start*>(start);
  const bool ready = give_up_capabilities();
  const auto run = s->run;
  const auto arg = s->arg;
  // Nothing of `s` but `alive`, which the kernel clears, is touched after
  // this: the starter may go on at once.
  s->verdict.store(ready ? 1 : 2, std::memory_order_release);
  raw_syscall(SYS_futex, reinterpret_cast<long>(&s->verdict), FUTEX_WAKE, 1);
  if (ready) run(arg);
  raw_syscall(SYS_exit, 0);  // this thread alone, not exit_group
  __builtin_unreachable();
}

// The process's ids: whether they are all the same (no set-id program,
// nothing to switch back to). A bare thread keeps them, and libc's setuid
// would not reach it, so it starts only where they are.
bool ids_settled() noexcept {
  uid_t ru = 0, eu = 0, su = 0;
  gid_t rg = 0, eg = 0, sg = 0;
  if (::getresuid(&ru, &eu, &su) != 0 || ::getresgid(&rg, &eg, &sg) != 0) return false;
  return ru == eu && eu == su && rg == eg && eg == sg;
}

}  // namespace

bool bare_threads_supported() noexcept { return raw_syscall_is_private; }

int start_bare_thread(void (*run)(void*), void* arg, std::size_t stack_size) noexcept {
  if (!bare_threads_supported()) return ENOSYS;
  if (!ids_settled()) return EPERM;
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  // At least a page: clone writes the function's address below the top.
  const std::size_t stack = stack_size == 0 ? page : (stack_size + page - 1) / page * page;
  const std::size_t size = page + stack + page;  // guard, stack, what bare_main reads
  void* mapping = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  if (mapping == MAP_FAILED) return errno;
  const auto unmap = [&](int error) {
    ::munmap(mapping, size);
    return error;
  };
  if (::mprotect(mapping, page, PROT_NONE) != 0) return unmap(errno);
  // A fork copies the forking thread alone: its children need no copy of
  // this stack.
  ::madvise(mapping, size, MADV_DONTFORK);
  char* top = static_cast<char*>(mapping) + page + stack;
  auto* start = new (top) bare_start{run, arg};
  // Started with every signal blocked: a signal for the process then goes
  // to a thread libc knows of, whose handlers can run there.
  const auto before = set_signal_mask(~0ULL);
  constexpr int flags = CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD | CLONE_SYSVSEM |
                        CLONE_CHILD_SETTID | CLONE_CHILD_CLEARTID;
  const int tid = ::clone(bare_main, top, flags, start, nullptr, nullptr, reinterpret_cast<pid_t*>(&start->alive));
  const int error = errno;
  set_signal_mask(before);
  if (tid < 0) return unmap(error);
  // Its verdict, before anything runs: a thread that could not give up
  // the process's capabilities does not run, and libc's capset would never
  // reach it.
  std::uint32_t verdict = 0;
  while ((verdict = start->verdict.load(std::memory_order_acquire)) == 0) {
    raw_syscall(SYS_futex, reinterpret_cast<long>(&start->verdict), FUTEX_WAIT, 0, 0);
  }
  if (verdict == 1) return 0;  // its stack stays mapped for the process's life
  // Once it has ended, its stack goes.
  for (pid_t id; (id = start->alive.load(std::memory_order_acquire)) != 0;) {
    raw_syscall(SYS_futex, reinterpret_cast<long>(&start->alive), FUTEX_WAIT, id, 0);
  }
  return unmap(EPERM);
}

}  // namespace cohort::os

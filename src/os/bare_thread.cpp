// Starting a thread with clone(2), every signal blocked, on a stack of its
// own.
#include "os/bare_thread.hpp"

#include "os/raw_syscall.hpp"

#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <new>

namespace cohort::os {
namespace {

// What the new thread needs, at the top of its mapping.
struct bare_start {
  void (*run)(void*);
  void* arg;
};

COHORT_BARE_CODE int bare_main(void* start) {
  const auto* s = static_cast<const bare_start*>(start);
  s->run(s->arg);
  raw_syscall(SYS_exit, 0);  // this thread alone, not exit_group
  __builtin_unreachable();
}

}  // namespace

bool bare_threads_supported() noexcept { return raw_syscall_is_private; }

int start_bare_thread(void (*run)(void*), void* arg, std::size_t stack_size) noexcept {
  if (!bare_threads_supported()) return ENOSYS;
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const std::size_t stack = (stack_size + page - 1) / page * page;
  const std::size_t size = page + stack + page;  // guard, stack, what bare_main reads
  void* mapping = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  if (mapping == MAP_FAILED) return errno;
  ::mprotect(mapping, page, PROT_NONE);
  // A fork copies the forking thread alone: its children need no copy of
  // this stack.
  ::madvise(mapping, size, MADV_DONTFORK);
  char* top = static_cast<char*>(mapping) + page + stack;
  auto* start = new (top) bare_start{run, arg};
  // Started with every signal blocked: a signal for the process then goes
  // to a thread libc knows of, whose handlers can run there.
  const auto before = set_signal_mask(~0ULL);
  constexpr int flags = CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD | CLONE_SYSVSEM;
  const int tid = ::clone(bare_main, top, flags, start);
  const int error = errno;
  set_signal_mask(before);
  if (tid < 0) {
    ::munmap(mapping, size);
    return error;
  }
  return 0;
}

}  // namespace cohort::os

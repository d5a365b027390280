// The fork handlers of shared memory, registered once, so that their locks
// are always taken in one order; and batches of forks.
#include "shm/fork.hpp"

#include "config.hpp"

#include <pthread.h>

namespace cohort::shm {

namespace {

// Set while this thread holds a fork_batch. A child's copy is cleared by
// its handler: a child that forks in turn locks around each of its forks.
[[gnu::tls_model("initial-exec")]] thread_local bool in_batch = false;

// The table of storages first, then the arena (the order allocate() takes
// its own locks in is kept inside lock_arena_for_fork): a batch takes them
// in the same order, so a fork on another thread meanwhile waits rather
// than holding one the batch needs.
void lock_all() {
  lock_storages_for_fork();
  lock_arena_for_fork();
}

void unlock_all() noexcept {
  unlock_arena_after_fork();
  unlock_storages_after_fork();
}

COHORT_FORKED_CHILD_PATH void in_child() {
  in_batch = false;
  arena_after_fork_in_child();
  storages_after_fork_in_child();
}

[[maybe_unused]] const bool handlers = [] {
  ::pthread_atfork(
      [] {
        if (!in_batch) lock_all();
      },
      [] {
        if (!in_batch) unlock_all();
      },
      in_child);
  return true;
}();

}  // namespace

fork_batch::fork_batch() {
  lock_all();
  in_batch = true;
}

fork_batch::~fork_batch() {
  in_batch = false;
  unlock_all();
}

}  // namespace cohort::shm

// Every fork_safe_mutex, taken around each fork.
#include "os/fork_safe_mutex.hpp"

#include <pthread.h>

namespace cohort::os {

namespace {

// Whether this thread holds them all across its forks (fork_safe_mutexes_held).
thread_local bool held_across_forks = false;

}  // namespace

// The live mutexes, in a list of their own; the list's lock is held from a
// fork's start to its end in both processes.
struct fork_safe_mutexes {
  std::mutex mutex;
  fork_safe_mutex* head = nullptr;

  static fork_safe_mutexes& all() {
    static fork_safe_mutexes& list = *new fork_safe_mutexes;  // never destroyed: a fork may come at exit
    return list;
  }
  static void lock_all() {
    auto& l = all();
    l.mutex.lock();
    for (auto* m = l.head; m != nullptr; m = m->next_) m->mutex_.lock();
  }
  // The thread that locked them, in the process that forked or in its child.
  static void unlock_all() {
    auto& l = all();
    for (auto* m = l.head; m != nullptr; m = m->next_) m->mutex_.unlock();
    l.mutex.unlock();
  }
  static void before_fork() {
    if (!held_across_forks) lock_all();
  }
  static void after_fork_in_parent() {
    if (!held_across_forks) unlock_all();
  }
  static void after_fork_in_child() {
    held_across_forks = false;
    unlock_all();
  }
};

namespace {

[[maybe_unused]] const bool handlers = [] {
  ::pthread_atfork(fork_safe_mutexes::before_fork, fork_safe_mutexes::after_fork_in_parent,
                   fork_safe_mutexes::after_fork_in_child);
  return true;
}();

}  // namespace

fork_safe_mutexes_held::fork_safe_mutexes_held() {
  fork_safe_mutexes::lock_all();
  held_across_forks = true;
}

fork_safe_mutexes_held::~fork_safe_mutexes_held() {
  held_across_forks = false;
  fork_safe_mutexes::unlock_all();
}

fork_safe_mutex::fork_safe_mutex() {
  auto& l = fork_safe_mutexes::all();
  std::lock_guard lock(l.mutex);
  next_ = l.head;
  if (next_ != nullptr) next_->prev_ = this;
  l.head = this;
}

fork_safe_mutex::~fork_safe_mutex() {
  auto& l = fork_safe_mutexes::all();
  std::lock_guard lock(l.mutex);
  if (prev_ != nullptr) {
    prev_->next_ = next_;
  } else {
    l.head = next_;
  }
  if (next_ != nullptr) next_->prev_ = prev_;
}

}  // namespace cohort::os

// A mutex that fork never copies held.
#pragma once

#include <mutex>

namespace cohort::os {

/// A mutex that every fork of this process takes first (pthread_atfork),
/// and that the parent and the child release after it: a child never finds
/// it held by a thread of the parent that does not run there, nor what it
/// guards half changed. For a lock that threads the library runs (helpers,
/// an io_context's threads) take at any moment. A thread must not fork
/// while it holds one, nor take another while it holds one.
class fork_safe_mutex {
 public:
  fork_safe_mutex();
  fork_safe_mutex(const fork_safe_mutex&) = delete;
  fork_safe_mutex& operator=(const fork_safe_mutex&) = delete;
  ~fork_safe_mutex();

  void lock() { mutex_->lock(); }
  bool try_lock() { return mutex_->try_lock(); }
  void unlock() { mutex_->unlock(); }

 private:
  // A slot on the pages that hold every fork_safe_mutex side by side: each
  // fork writes each of their pages twice in the forking process (taking
  // them while the last child still shares the page, releasing them while
  // the new one does), a page copied each time, so they share as few
  // pages as they can.
  std::mutex* mutex_;
};

/// Registers, once, the fork handlers that take every fork_safe_mutex
/// around each fork, after the one that makes a child forget its parent's
/// pid. A layer whose own handlers must take their locks before these, and
/// run in the child after these are released, calls it before registering
/// them: the order of a program's static initializers is its link order,
/// which a static link of the library may change. Called by this file's own
/// initializer too.
void take_fork_safe_mutexes_around_forks() noexcept;

/// Every fork_safe_mutex, held by this thread while it forks several
/// children back to back: the forks leave them alone in this process, where
/// releasing them after each fork would write their pages, each a page
/// copied per fork while a child still shares it. Each child releases its
/// copies as after any fork. This thread must not take one meanwhile.
class fork_safe_mutexes_held {
 public:
  fork_safe_mutexes_held();
  fork_safe_mutexes_held(const fork_safe_mutexes_held&) = delete;
  fork_safe_mutexes_held& operator=(const fork_safe_mutexes_held&) = delete;
  ~fork_safe_mutexes_held();
};

}  // namespace cohort::os

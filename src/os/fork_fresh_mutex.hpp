// A mutex that a forked child never finds held.
#pragma once

#include "os/process_identity.hpp"

#include <atomic>
#include <mutex>

namespace cohort::os {

/// A mutex whose first use in a forked child takes a fresh one: the copy,
/// which a thread of the parent may have held at the fork (a thread that
/// does not run in the child, and would never release it), is let go
/// untouched, as of_this_process does with its state. For a lock that
/// threads of the parent take at any moment and that a child may need
/// after the fork. A thread must not fork while it holds it.
class fork_fresh_mutex {
 public:
  fork_fresh_mutex() = default;
  fork_fresh_mutex(const fork_fresh_mutex&) = delete;
  fork_fresh_mutex& operator=(const fork_fresh_mutex&) = delete;
  ~fork_fresh_mutex() { delete current_.load(std::memory_order_relaxed); }

  void lock() { current().lock(); }
  bool try_lock() { return current().try_lock(); }
  void unlock() { current().unlock(); }

 private:
  struct holder {
    pid_t owner;
    std::mutex mutex;
  };
  std::mutex& current() {
    const pid_t self = this_process();
    holder* h = current_.load(std::memory_order_acquire);
    while (h == nullptr || h->owner != self) {
      auto* fresh = new holder{self, {}};
      if (current_.compare_exchange_strong(h, fresh, std::memory_order_acq_rel)) return fresh->mutex;
      delete fresh;  // another thread of this process came first: h is now its
    }
    return h->mutex;
  }
  std::atomic<holder*> current_{nullptr};
};

}  // namespace cohort::os

// State that belongs to one process, not to the copies fork makes.
#pragma once

#include <unistd.h>

#include <atomic>

namespace cohort::detail {

/// This process's T, made on first use in each process. A child forked
/// while another thread of its parent held a lock of T's finds a fresh T,
/// not the copy, whose lock no thread of the child would ever release; the
/// copy is let go untouched. No lock is taken on the way, so none can be
/// held across a fork.
template <class T>
T& of_this_process() {
  struct holder {
    pid_t owner;
    T value;
  };
  static std::atomic<holder*> current{nullptr};
  const pid_t self = ::getpid();
  holder* h = current.load(std::memory_order_acquire);
  while (h == nullptr || h->owner != self) {
    auto* fresh = new holder{self, {}};
    if (current.compare_exchange_strong(h, fresh, std::memory_order_acq_rel)) return fresh->value;
    delete fresh;  // another thread of this process came first: h is now its
  }
  return h->value;
}

}  // namespace cohort::detail

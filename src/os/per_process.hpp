// State that belongs to one process, not to the copies fork makes.
#pragma once

#include "os/process_identity.hpp"

#include <atomic>

namespace cohort::os {

template <class T>
struct per_process_holder {
  pid_t owner;
  T value;
};

/// The latest T made by of_this_process, in whichever process made it.
template <class T>
std::atomic<per_process_holder<T>*>& latest_of_process() {
  static std::atomic<per_process_holder<T>*> current{nullptr};
  return current;
}

/// This process's T, made on first use in each process. A child forked
/// while another thread of its parent held a lock of T's finds a fresh T,
/// not the copy, whose lock no thread of the child would ever release; the
/// copy is let go untouched. No lock is taken on the way, so none can be
/// held across a fork.
template <class T>
T& of_this_process() {
  auto& current = latest_of_process<T>();
  const pid_t self = this_process();
  auto* h = current.load(std::memory_order_acquire);
  while (h == nullptr || h->owner != self) {
    auto* fresh = new per_process_holder<T>{self, {}};
    if (current.compare_exchange_strong(h, fresh, std::memory_order_acq_rel)) return fresh->value;
    delete fresh;  // another thread of this process came first: h is now its
  }
  return h->value;
}

/// This process's T if of_this_process has made it, else nullptr: makes
/// none.
template <class T>
T* made_in_this_process() noexcept {
  auto* h = latest_of_process<T>().load(std::memory_order_acquire);
  return h != nullptr && h->owner == this_process() ? &h->value : nullptr;
}

}  // namespace cohort::os

// Every fork_safe_mutex, taken around each fork.
#include "os/fork_safe_mutex.hpp"

#include "os/process_identity.hpp"

#include <pthread.h>

#include <array>
#include <bitset>
#include <cstddef>
#include <vector>

namespace cohort::os {

namespace {

// Whether this thread holds them all across its forks (fork_safe_mutexes_held).
thread_local bool held_across_forks = false;

}  // namespace

// The live mutexes, in slots on pages of their own; the first slot of the
// first page is the pages' own lock, held from a fork's start to its end in
// both processes. The pages are never given back: a fork may come at exit.
struct fork_safe_mutexes {
  static constexpr std::size_t per_page = 4096 / sizeof(std::mutex);
  struct alignas(4096) page {
    std::array<std::mutex, per_page> slots;
  };
  page* const first = new page;  // apart from `pages`, which grows under its lock
  std::vector<page*> pages{first};
  // Beside the pages: only a slot's taking and return write it. The first
  // page's first slot is the pages' lock.
  std::vector<std::bitset<per_page>> used{std::bitset<per_page>().set(0)};

  static fork_safe_mutexes& all() {
    static fork_safe_mutexes& list = *new fork_safe_mutexes;  // never destroyed, as the pages
    return list;
  }
  std::mutex& lock_of_pages() { return first->slots[0]; }

  std::mutex* take_slot() {
    std::lock_guard lock(lock_of_pages());
    for (std::size_t p = 0; p < pages.size(); ++p) {
      if (used[p].all()) continue;
      std::size_t s = 0;
      while (used[p][s]) ++s;
      used[p].set(s);
      return &pages[p]->slots[s];
    }
    pages.reserve(pages.size() + 1);
    used.reserve(used.size() + 1);
    auto* fresh = new page;
    pages.push_back(fresh);
    used.emplace_back().set(0);
    return &fresh->slots[0];
  }
  void give_back(std::mutex* slot) {
    std::lock_guard lock(lock_of_pages());
    for (std::size_t p = 0; p < pages.size(); ++p) {
      const auto* begin = pages[p]->slots.data();
      if (slot >= begin && slot < begin + per_page) used[p].reset(static_cast<std::size_t>(slot - begin));
    }
  }
  template <class Fn>
  void for_each_slot(Fn fn) {
    for (std::size_t p = 0; p < pages.size(); ++p) {
      for (std::size_t s = p == 0 ? 1 : 0; s < per_page; ++s) {
        if (used[p][s]) fn(pages[p]->slots[s]);
      }
    }
  }

  static void lock_all() {
    auto& l = all();
    l.lock_of_pages().lock();
    l.for_each_slot([](std::mutex& m) { m.lock(); });
  }
  // The thread that locked them, in the process that forked or in its child.
  static void unlock_all() {
    auto& l = all();
    l.for_each_slot([](std::mutex& m) { m.unlock(); });
    l.lock_of_pages().unlock();
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

void take_fork_safe_mutexes_around_forks() noexcept {
  static const bool registered = [] {
    forget_process_id_in_forked_children();
    ::pthread_atfork(fork_safe_mutexes::before_fork, fork_safe_mutexes::after_fork_in_parent,
                     fork_safe_mutexes::after_fork_in_child);
    return true;
  }();
  (void)registered;
}

namespace {

[[maybe_unused]] const bool handlers = [] {
  take_fork_safe_mutexes_around_forks();
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

fork_safe_mutex::fork_safe_mutex() : mutex_(fork_safe_mutexes::all().take_slot()) {}

fork_safe_mutex::~fork_safe_mutex() { fork_safe_mutexes::all().give_back(mutex_); }

}  // namespace cohort::os

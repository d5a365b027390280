// The fork handlers of shared memory, registered once, so that their locks
// are always taken in one order; batches of forks; and the blocks held for
// the children of plain forks until they exec or end.
#include "shm/fork.hpp"

#include "config.hpp"
#include "os/fork_safe_mutex.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <functional>
#include <mutex>
#include <new>
#include <utility>

namespace cohort::shm {

namespace {

// Set while this thread holds a fork_batch. A child's copy is cleared by
// its handler: a child that forks in turn locks around each of its forks.
[[gnu::tls_model("initial-exec")]] thread_local bool in_batch = false;

// The blocks held for one plain fork's child, and the read end of a pipe
// whose write end only that child (and what it forks) has, close-on-exec:
// its end of file says that each of them has exec'd or ended.
struct child_holds {
  int child_gone = -1;
  std::vector<block_hold> blocks;
};

struct held_for_children {
  std::mutex mutex;  // taken with the fork handlers' other locks
  std::vector<child_holds> children;
  std::vector<std::function<bool()>> retries;  // see retry_after_fork_holds
  bool released = false;  // holds went since the retries last ran
  // children.size() + retries.size(), read without the lock.
  std::atomic<std::size_t> pending{0};

  void count_locked() noexcept { pending.store(children.size() + retries.size(), std::memory_order_relaxed); }
};

// Never destroyed: the work at exit sweeps it after other statics went.
held_for_children& held() {
  static auto& h = *new held_for_children;
  return h;
}

// Where a child's references on the blocks it inherits come from.
enum class child_refs {
  unlisted,  // the parent could not list them: the child takes its own as it starts
  own,       // the parent took one for it on each, before the fork (a batch's child)
  borrowed,  // it holds none: the parent (or the parent's own parent) holds them for it
};

// The fork under way, set before it with every lock held (by the prepare
// handler, or by a batch for all its forks) and read after it, in the
// parent and in the child.
struct fork_under_way {
  storage_list live;  // the shared storages alive as it began
  // A plain fork's: the child's holds, and the pipe's write end.
  child_holds holds;
  int child_end = -1;
  child_refs refs = child_refs::unlisted;
};
// Never destroyed, as held().
fork_under_way& under_way() {
  static auto& f = *new fork_under_way;
  return f;
}

// The table of storages first (after the locks of moves into shared
// memory, which a move holds as it takes the others), then the arena (the
// order allocate() takes its own locks in is kept inside
// lock_arena_for_fork), then the holds: a batch takes them in the same
// order, so a fork on another thread meanwhile waits rather than holding
// one the batch needs.
void lock_all() {
  lock_storages_for_fork();
  lock_arena_for_fork();
  held().mutex.lock();
}

void unlock_all() noexcept {
  held().mutex.unlock();
  unlock_arena_after_fork();
  unlock_storages_after_fork();
}

// A plain fork's prepare handler: with every lock held, a reference on
// each block this process holds, for the child, taken before the child
// exists so that nothing this process frees meanwhile is freed under it,
// and kept here until the child has exec'd or ended. What this process
// only borrowed (inherited over a plain fork itself) stays held by its own
// parent: the child keeps that parent's pipe open too. Nothing may throw
// out of a fork handler: without a list the child takes its references
// itself, as it did before, and without a pipe the references on all are
// the child's own, as a batch child's (a fork that then fails leaves them
// taken).
void before_plain_fork() noexcept {
  sweep_fork_holds(false);
  lock_all();
  auto& f = under_way();
  try {
    f.live = live_storages_locked();
  } catch (...) {
    return;
  }
  const auto own = [&f] {
    f.holds.blocks.clear();
    f.refs = child_refs::own;
    hold_for_child(f.live);
  };
  try {
    f.holds.blocks = holds_of(f.live);
    held().children.reserve(held().children.size() + 1);
  } catch (...) {
    return own();
  }
  f.refs = child_refs::borrowed;
  if (f.holds.blocks.empty()) return;  // nothing of its own here to hold
  int ends[2];
  if (::pipe2(ends, O_CLOEXEC | O_NONBLOCK) != 0) return own();
  for (const auto& b : f.holds.blocks) b.in->block(b.block).refs.fetch_add(1, std::memory_order_relaxed);
  f.holds.child_gone = ends[0];
  f.child_end = ends[1];
}

void after_plain_fork_in_parent() noexcept {
  auto& f = under_way();
  if (f.child_end >= 0) {
    // Held until the child has gone past its exec (or failed to be born:
    // the pipe ends now).
    ::close(f.child_end);
    held().children.push_back(std::move(f.holds));  // reserved
    held().count_locked();
  }
  f = fork_under_way{};
  unlock_all();
}

COHORT_FORKED_CHILD_PATH void in_child() {
  const bool batch = std::exchange(in_batch, false);
  auto& f = under_way();
  arena_after_fork_in_child();
  // What the parent holds for its other children is the parent's business.
  // Dropped once the table of storages is unlocked; the parent's retries
  // are never destroyed here: a queue that one keeps holds the parent's
  // hold on its memory through a storage in no table (a last hold's heir,
  // storage.cpp), which this child neither borrowed nor took a hold for.
  auto& h = held();
  std::vector<child_holds> parents_children;
  if (h.pending.load(std::memory_order_relaxed) != 0) {
    for (const auto& c : h.children) ::close(c.child_gone);
    parents_children.swap(h.children);
    // Moved, without allocating, where no destructor reaches.
    using retry_list = std::vector<std::function<bool()>>;
    alignas(retry_list) static std::byte never_destroyed[sizeof(retry_list)];
    new (never_destroyed) retry_list(std::move(h.retries));
    h.retries.clear();
    h.count_locked();
  }
  h.mutex.unlock();
  const storage_list live = std::move(f.live);
  // The pipe's write end stays open here, and the parent holds the blocks
  // until it goes.
  if (f.holds.child_gone >= 0) ::close(f.holds.child_gone);
  switch (batch ? child_refs::own : f.refs) {
    case child_refs::borrowed: borrow_in_child(live); break;
    case child_refs::own: own_in_child(live); break;
    case child_refs::unlisted: hold_inherited_in_child(); break;
  }
  f = fork_under_way{};
  unlock_storages_after_fork();
}

// Registered after the fork-safe locks' handlers, whatever the link order:
// these take shared memory's locks before those are taken, as a batch does
// (fork_batch before os::fork_safe_mutexes_held), and run in the child once
// the pid is forgotten and those are released.
[[maybe_unused]] const bool handlers = [] {
  os::take_fork_safe_mutexes_around_forks();
  ::pthread_atfork(
      [] {
        if (!in_batch) before_plain_fork();
      },
      [] {
        if (!in_batch) after_plain_fork_in_parent();
      },
      in_child);
  return true;
}();

}  // namespace

bool sweep_fork_holds(bool run_retries) noexcept {
  auto& h = held();
  if (h.pending.load(std::memory_order_relaxed) == 0) return false;
  std::vector<child_holds> running, gone;
  std::vector<std::function<bool()>> retries;
  {
    std::lock_guard lock(h.mutex);
    try {
      running.reserve(h.children.size());
      gone.reserve(h.children.size());
    } catch (...) {
      return false;  // looked at again by the next sweep
    }
    for (auto& c : h.children) {
      // Running: a read that would block (or was interrupted).
      char byte = 0;
      const ssize_t n = ::read(c.child_gone, &byte, 1);
      (n > 0 || (n < 0 && (errno == EAGAIN || errno == EINTR)) ? running : gone).push_back(std::move(c));
    }
    h.children.swap(running);
    // Let go of under the lock, so that a look at a block's holds
    // (holds_for_children) never finds them gone from the list and not
    // yet from the block.
    for (auto& c : gone) {
      ::close(c.child_gone);
      for (const auto& b : c.blocks) b.in->release(b.block);
    }
    h.released = h.released || !gone.empty();
    if (run_retries && (h.released || h.children.empty())) {
      retries.swap(h.retries);
      h.released = false;
    }
    h.count_locked();
  }
  // The segments' last pointers may go with `gone`, outside the lock; and
  // a retry may drop values, whose queues sweep in turn.
  const bool released = !gone.empty();
  gone.clear();
  std::erase_if(retries, [](const auto& retry) { return retry(); });
  if (retries.empty()) return released;
  std::lock_guard lock(h.mutex);
  try {
    h.retries.insert(h.retries.end(), std::make_move_iterator(retries.begin()), std::make_move_iterator(retries.end()));
  } catch (...) {
    // Dropped: what they would have let go of stays, as before.
  }
  h.count_locked();
  return released;
}

void retry_after_fork_holds(std::function<bool()> retry) {
  auto& h = held();
  std::lock_guard lock(h.mutex);
  h.retries.push_back(std::move(retry));
  h.count_locked();
}

holds_on_block holds_for_children(const storage& s) noexcept {
  auto& h = held();
  std::lock_guard lock(h.mutex);
  std::uint32_t kept = 0;
  for (const auto& c : h.children) {
    for (const auto& b : c.blocks) {
      kept += b.in->base() + b.block + sizeof(block_header) == s.data() ? 1 : 0;
    }
  }
  return {detail::shared_holders(s), kept};
}

fork_batch::fork_batch() {
  sweep_fork_holds(false);
  lock_all();
  try {
    under_way().live = live_storages_locked();
  } catch (...) {
    unlock_all();
    throw;
  }
  under_way().refs = child_refs::own;
  in_batch = true;
}

void fork_batch::before_fork() noexcept { hold_for_child(under_way().live); }

void fork_batch::fork_failed() noexcept { release_for_child(under_way().live); }

fork_batch::~fork_batch() {
  in_batch = false;
  under_way() = fork_under_way{};
  unlock_all();
}

}  // namespace cohort::shm

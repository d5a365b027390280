// Shared memory across fork: the handlers that keep this process's arena,
// registry of segments and table of storages whole in a child, the holds a
// child gets on the blocks it inherits, and batches of forks that take
// their locks once for all.
#pragma once

#include "cohort/storage.hpp"
#include "shm/segment.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace cohort::shm {

/// Held by a thread while it forks several children back to back, with
/// nothing else between the forks. The fork handlers lock the table of
/// storages, the arena and the registry of segments before each fork and
/// unlock them after it, in the parent and in the child. After a fork the
/// parent pays a page copy for each page it writes while a child still
/// shares it, so every lock released in the parent is a page copied per
/// fork. Under a batch the locks are taken when it begins and released when
/// it ends; each child releases its copies as ever. Nothing that takes them
/// (allocating shared memory, making or dropping a shared storage) may run
/// on this thread while the batch lasts.
///
/// Each child of a batch holds every shared storage it inherits, with a
/// reference of its own that this process takes for it (before_fork) before
/// it exists, so that nothing this process frees meanwhile is freed under
/// it; the child lets go of them as it drops them, or as a rank ends.
class fork_batch {
 public:
  fork_batch();
  fork_batch(const fork_batch&) = delete;
  fork_batch& operator=(const fork_batch&) = delete;
  ~fork_batch();
  /// Right before each fork: the next child's references.
  void before_fork() noexcept;
  /// After a fork that failed: gives back the references before_fork took.
  void fork_failed() noexcept;
};

/// Lets go of the blocks held for the children of plain forks (a fork()
/// outside a batch, the program's own) that have since exec'd or ended,
/// each with every process it forked in turn. Such a child's inherited
/// storages hold nothing of their own: it may exec, or end without
/// destructors, and nothing would give its references back. This process
/// holds the blocks for it instead, from before the fork until the child's
/// copy of a close-on-exec pipe's write end is gone. Called before forks,
/// on trims, as the arena grows, as a queue's last holder lets go, as a
/// fork rank ends and at exit; one atomic load when nothing is held.
/// `run_retries`: whether it may run the retries below, which drop values;
/// not inside a fork's handler nor inside an allocation. Returns whether
/// it let go of any hold.
bool sweep_fork_holds(bool run_retries = true) noexcept;

/// Runs `retry` in a sweep that may run it, once holds for children went
/// since the last run (or none is held), until it returns true. For work
/// that such holds put off: a queue's last holder here drains it once no
/// child can pop from it any more. A child still running when this
/// process ends leaves it undone.
void retry_after_fork_holds(std::function<bool()> retry);
/// A shared storage's block, read together (no sweep lets go meanwhile):
/// every reference on it, and those this process keeps on it for plain
/// forks' children.
struct holds_on_block {
  std::uint32_t refs;
  std::uint32_t for_children;
};
holds_on_block holds_for_children(const storage& s) noexcept;

/// A shared storage alive as a fork began, listed without a reference to
/// it (which the list's end could drop last): `impl` is used only while
/// the table of storages is locked, or in the child, where it names a
/// whole object as long as `weak` has not expired or its end waits for
/// that lock (the first thing the end of a storage does).
struct listed_storage {
  std::weak_ptr<detail::storage_impl> weak;
  detail::storage_impl* impl;
  bool held = false;  // hold_for_child took a reference on it for the next child
};
using storage_list = std::vector<listed_storage>;

// The handlers' parts, each kept beside what it locks: arena.cpp's (the
// arena and the registry) and storage.cpp's (the moves of private storages
// into shared memory, then the table of storages). The child's parts
// release the locks too.
void lock_arena_for_fork();
void unlock_arena_after_fork() noexcept;
void arena_after_fork_in_child();
void lock_storages_for_fork();
void unlock_storages_after_fork() noexcept;
/// With the table of storages locked, which keeps the set from changing
/// while it is held: the shared storages this process holds, those it
/// holds no reference of its own on included (a plain fork's child's
/// inherited ones, which a child of its own must hold all the same).
storage_list live_storages_locked();
/// With the table locked: one more reference on the block of each that has
/// not expired, for a child about to be forked, noted in `held`.
void hold_for_child(storage_list& live) noexcept;
/// Gives those references back: the fork failed.
void release_for_child(const storage_list& live) noexcept;
/// In a child, when the parent could not list them: one more reference on
/// each inherited storage's block, the child's own.
void hold_inherited_in_child();
/// In a child for which the parent took a reference on each (a batch's):
/// marks them as holding their own, those the parent only borrowed
/// included, and gives back the reference on any that expired before the
/// fork.
void own_in_child(const storage_list& live) noexcept;
/// In a child whose inherited storages hold nothing of their own (a plain
/// fork's): marks them so, so that dropping them gives nothing back.
void borrow_in_child(const storage_list& live) noexcept;

/// A block held for a plain fork's child.
struct block_hold {
  std::shared_ptr<segment> in;
  std::uint64_t block;
};
/// The blocks of those this process holds a reference of its own on.
std::vector<block_hold> holds_of(const storage_list& live);

}  // namespace cohort::shm

// Shared memory across fork: the handlers that keep this process's arena,
// registry of segments and table of storages whole in a child, and batches
// of forks that take their locks once for all.
#pragma once

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
class fork_batch {
 public:
  fork_batch();
  fork_batch(const fork_batch&) = delete;
  fork_batch& operator=(const fork_batch&) = delete;
  ~fork_batch();
};

// The handlers' parts, each kept beside what it locks: arena.cpp's (the
// arena and the registry) and storage.cpp's (the table of storages). The
// child's parts release the locks too.
void lock_arena_for_fork();
void unlock_arena_after_fork() noexcept;
void arena_after_fork_in_child();
void lock_storages_for_fork();
void unlock_storages_after_fork() noexcept;
void storages_after_fork_in_child();

}  // namespace cohort::shm

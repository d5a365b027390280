// The processes on the far side of a queue or event: a table of them in
// shared memory, and this process's watch on each through a pidfd.
#pragma once

#include "os/fork_safe_mutex.hpp"
#include "os/owned_fd.hpp"

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <utility>

namespace cohort::detail {

/// One process that has used a queue, in its shared state.
struct peer {
  pid_t pid;
  int rank;                  ///< its entry point rank, or -1
  std::uint32_t roles;       ///< peer_producer | peer_consumer
  std::uint64_t start_time;  ///< /proc/<pid>/stat's starttime: a recycled pid is a different process
};
inline constexpr std::uint32_t peer_producer = 1;
inline constexpr std::uint32_t peer_consumer = 2;
inline constexpr int max_peers = 256;

/// The table, in shared memory, guarded by its owner's lock.
struct peer_table {
  std::uint32_t count;
  /// Set, for good, once a process could not be recorded (every slot held
  /// by a process still there): the table no longer names every peer, and
  /// no wait may conclude from it that the other side has gone.
  std::uint32_t incomplete;
  peer peers[max_peers];

  /// Adds `roles` for this process (a table full of processes that have
  /// all gone is reused from the start). Call with the owner's lock held.
  void join(std::uint32_t roles) noexcept;
};

/// Tells this process's waits at once that a watched process has ended: a
/// thread of its own (one libc does not count, os/bare_thread.hpp) sleeps
/// in epoll on the pidfds armed, and at each end bumps `epoch` and wakes
/// whoever sleeps on it. A wait reads the epoch,
/// arms the pidfds of the peers it depends on, and sleeps on its own word
/// and the epoch together: an end before the arming is reported as soon as
/// it is armed (a pidfd of an ended process is readable), one after it by
/// the thread. One per process (a fork child makes its own).
class death_notice {
 public:
  static death_notice& of_this_process();

  /// Bumped at each end of an armed process; in this process's memory.
  std::atomic<std::uint32_t>& epoch() noexcept { return epoch_; }
  /// Watches `pidfd` for one end (re-arms it when already watched). Where it
  /// cannot (no thread, no epoll), the waits rely on their time slices.
  void arm(int pidfd) noexcept;
  /// Its epoll descriptor, made at the first arm(), kept for the process's
  /// life with the thread that sleeps on it; -1 before.
  int descriptor() const noexcept { return epoll_; }

 private:
  static constexpr std::size_t watcher_stack = 16 << 10;
  bool start() noexcept;
  // The watcher's loop; raw system calls only (os/bare_thread.hpp).
  static void watch(void* self) noexcept;
  std::atomic<std::uint32_t> epoch_{0};
  std::once_flag started_;
  int epoll_ = -1;  // set once, under started_
};

/// This process's view of which peers are alive.
class peer_watch {
 public:
  /// The last of the peers with `role` found gone when every one of them
  /// is (and at least one ever was in the table); nullopt while any lives.
  /// This process is never counted. When no other process ever had `role`
  /// and this one has it (`self_has_role`: it fed the queue it waits to
  /// pop), the other processes of any role count instead: one left alone
  /// with its own queue is told once they are all gone. With `notice`,
  /// arms it with the pidfd of each one alive. Descriptors are held only
  /// for peers still alive when last looked at, and only while the table
  /// names them.
  std::optional<peer> all_gone(const peer* peers, std::uint32_t count, std::uint32_t role,
                               death_notice* notice = nullptr, bool self_has_role = false);
  /// How many pidfds it holds now.
  std::size_t descriptors();

 private:
  bool alive(const peer& p, death_notice* notice);  // with mutex_ held
  // Held across system calls (/proc, pidfd_open, poll, epoll_ctl), so a
  // plain fork() by another thread must not copy it held: the child's
  // first wait on the queue it inherited would stop there for good.
  os::fork_safe_mutex mutex_;
  std::map<std::pair<pid_t, std::uint64_t>, os::owned_fd> pidfds_;
};

}  // namespace cohort::detail

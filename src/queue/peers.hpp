// The processes on the far side of a queue or event: a table of them in
// shared memory, and this process's watch on each through a pidfd.
#pragma once

#include "os/owned_fd.hpp"

#include <sys/types.h>

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
inline constexpr int max_peers = 64;

/// The table, in shared memory, guarded by its owner's lock.
struct peer_table {
  std::uint32_t count;
  peer peers[max_peers];

  /// Adds `roles` for this process (a table full of processes that have
  /// all gone is reused from the start). Call with the owner's lock held.
  void join(std::uint32_t roles) noexcept;
};

/// This process's view of which peers are alive.
class peer_watch {
 public:
  /// The last of the peers with `role` found gone when every one of them
  /// is (and at least one ever was in the table); nullopt while any lives.
  /// Descriptors are held only for peers still alive when last looked
  /// at, and only while the table names them.
  std::optional<peer> all_gone(const peer* peers, std::uint32_t count, std::uint32_t role);
  /// How many pidfds it holds now.
  std::size_t descriptors();

 private:
  bool alive(const peer& p);  // with mutex_ held
  std::mutex mutex_;
  std::map<std::pair<pid_t, std::uint64_t>, os::owned_fd> pidfds_;
};

}  // namespace cohort::detail

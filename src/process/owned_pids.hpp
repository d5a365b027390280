// The children cohort owns: started by it and not yet reaped or let go.
// Reaping a child is its owner's alone; children of this process that no
// one here owns (orphans handed to a subreaper) may be reaped by others.
#pragma once

#include <sys/types.h>

#include <functional>
#include <set>

namespace cohort::detail {

/// Notes `pid`, a child of this process, as owned. Thread-safe.
void own_pid(pid_t pid);
/// Lets go of `pid` (reaped, or no longer anyone's here). Thread-safe.
void disown_pid(pid_t pid);

/// Held while processes are started: from the fork or clone until each is
/// owned, a child is unowned though it is cohort's. Scans wait for it.
class launch_guard {
 public:
  launch_guard();
  ~launch_guard();
  launch_guard(const launch_guard&) = delete;
  launch_guard& operator=(const launch_guard&) = delete;
};

/// Calls `fn` with the pids owned now, with no launch in progress, and
/// keeps launches from starting until it returns; false (fn not called)
/// when a launch is in progress. `fn` must not own, disown or launch.
bool with_owned_pids(const std::function<void(const std::set<pid_t>&)>& fn);

}  // namespace cohort::detail

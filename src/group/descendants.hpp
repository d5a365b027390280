// Finding every process a group started, however far it wandered: each
// rank's environment carries a marker that its descendants inherit.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace cohort::detail {

/// Processes other than this one whose initial environment holds `marker`
/// ("NAME=value"), from /proc/<pid>/environ. Processes that exit during the
/// scan, or whose environment cannot be read, are skipped.
std::vector<pid_t> marked_processes(const std::string& marker);

/// SIGKILLs `pid`, and reaps it if it is this process's child (reparented
/// to it as a subreaper) and has died. True when it is gone for good: reaped,
/// or not this process's child (its own parent reaps it).
bool kill_and_reap(pid_t pid);

/// Whether this process has a child, running or unreaped. In a subreaper
/// whose ranks are all reaped, false means no descendant of theirs lives:
/// each one whose parent died was handed to this process.
bool has_children();

/// Makes this process a child subreaper (again: fork does not pass it on).
void become_subreaper();

}  // namespace cohort::detail

// Finding every process a group started, however far it wandered: by a
// rank's process group, by the group's marker in the environment, and by
// parent links from the live ranks.
#pragma once

#include <sys/types.h>

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace cohort::detail {

/// "COHORT_GROUP_<supervisor>_": how the marker variable of every group
/// started by process `supervisor` begins.
std::string group_marker_prefix(pid_t supervisor);

/// Calls fn(pid) for every process in /proc but this one.
void for_each_process(const std::function<void(pid_t)>& fn);

/// Whether the initial environment of `pid` (/proc/<pid>/environ) holds
/// `entry` ("NAME=value"), or with `as_prefix` a variable starting with it.
/// False for a process that is gone or whose environment cannot be read.
bool environment_holds(pid_t pid, std::string_view entry, bool as_prefix = false);

/// The pids allocated since a moment: every process a group starts gets
/// one of them, so the scans skip the processes that were there before.
/// Pids are allocated in turn (in a cycle up to pid_max), so they are those
/// after the last pid allocated then, up to the last allocated now, as long
/// as fewer processes than pid_max were made meanwhile (counted in
/// /proc/stat, from a reading at most a second older than the window: an
/// older count only makes it give up sooner); when that cannot be told,
/// every pid counts.
class pid_window {
 public:
  /// Opens the window now.
  pid_window();
  /// Whether `pid` may have been allocated since the window opened. Call
  /// refresh() first for the pids allocated up to now.
  bool holds(pid_t pid) const noexcept;
  void refresh();
  /// The pids the window holds, in allocation order, when they are known
  /// and at most `limit`: probing them beats listing /proc.
  std::optional<std::vector<pid_t>> pids(std::size_t limit) const;

 private:
  bool known_ = false;  // false: every pid counts
  pid_t first_ = 0;     // the last pid allocated when the window opened
  pid_t last_ = 0;      // the last allocated at the latest refresh()
  unsigned long long forks_ = 0;
  bool all_ = true;
  pid_t max_ = 0;       // pid_max at the latest refresh()
};

/// The processes of a group besides its ranks, as seen now: those in a
/// rank's process group (each rank leads its own; zombies included) or in
/// the session a rank leads (spawn_options::new_session), and
/// those whose initial environment (/proc/<pid>/environ) holds `marker`
/// ("NAME=value"). With `by_parent`, also the descendants of the live
/// `ranks` by parent links among the processes of this session: those a
/// rank forked that never executed a program and left its process group
/// (the ranks of a group it started in turn), which nothing else tells
/// apart once they have died. Only pids `window` holds are looked at.
/// Processes that exit during the scan are skipped.
std::vector<pid_t> group_descendants(const std::string& marker, const std::set<pid_t>& ranks, bool by_parent,
                                     const pid_window& window);

/// Processes held by pidfd, so that neither a signal nor a reap can reach
/// a recycled pid.
class tracked_processes {
 public:
  tracked_processes() = default;
  tracked_processes(const tracked_processes&) = delete;
  tracked_processes& operator=(const tracked_processes&) = delete;
  ~tracked_processes();

  /// Starts holding each of `pids` not held yet (those already gone are
  /// skipped). One that cannot be held for want of a descriptor (EMFILE,
  /// ENFILE) is noted as missed: a later scan finds it again.
  void add(const std::vector<pid_t>& pids);
  /// SIGKILLs every process held, reaps those that are this process's
  /// children and have died, and lets go of every one that is gone (reaped
  /// here, or dead and another's to reap). True when none is left and none
  /// was missed since the last call.
  bool kill_and_reap();
  /// Holds none and missed none since the last kill_and_reap().
  bool empty() const noexcept { return held_.empty() && !missed_; }
  /// Notes that a scan could not look (no descriptor to be had): as a
  /// process add() could not hold.
  void note_missed() noexcept { missed_ = true; }
  /// Whether the last kill_and_reap() found a process missed, or a scan
  /// that could not look, since the one before it.
  bool missed_in_last_pass() const noexcept { return missed_last_; }

 private:
  std::map<pid_t, int> held_;  // pid -> pidfd
  bool missed_ = false;
  bool missed_last_ = false;
};

/// The children of this process that were handed to it, as a subreaper, by
/// a run: those no one here owns (owned_pids.hpp) whose pid `window` holds
/// and that are outside this process's process group (a rank leads its own,
/// and what it starts stays in it or leaves for another; this process's own
/// forks stay in its group). Those that have died are reaped; those alive
/// are returned, for the caller to end. Nothing is done, and nothing
/// returned, while cohort starts processes: the scan comes again later.
/// Refreshes `window` when it finds a child no one here started. One alive
/// that carries the marker of another group of this process, but not
/// `marker` (this group's), is left to that group.
/// nullopt where this process's children could not be listed for want of a
/// descriptor: the caller looks again later.
std::optional<std::vector<pid_t>> reap_adopted(pid_window& window, const std::string& marker);

/// Keeps one descriptor aside, once per process, for reap_adopted's listing
/// of this process's children when no other is left. Called as a group
/// starts, while descriptors can still be had.
void keep_listing_reserve();

/// Whether this process has a child, running or unreaped. In a subreaper
/// whose ranks are all reaped, false means no descendant of theirs lives:
/// each one whose parent died was handed to this process.
bool has_children();

/// Whether every child of this process, running or unreaped, is one that
/// cohort started here (owned_pids.hpp): its guardian, other groups'
/// ranks. False when that cannot be told: while cohort starts a process,
/// where /proc lists no children, or when two listings differ. In a
/// subreaper whose ranks are all reaped here, true means no descendant of
/// theirs lives, as has_children() false does: a live one has an
/// ancestor among this process's children that cohort did not start.
bool only_owned_children();

/// Whether this process is a child subreaper now.
bool is_subreaper();

/// Makes this process a child subreaper while a group runs (again in a
/// forked child: fork does not pass the attribute on). Each call is matched
/// by one to end_subreaper(); when the last ends, the attribute the process
/// had before is restored, so orphans stop coming here after the runs.
void become_subreaper();
void end_subreaper();

}  // namespace cohort::detail

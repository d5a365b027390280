// A guardian process: what this process's groups started dies with it, even
// when it is killed outright.
#pragma once

#include "cohort/export.hpp"

#include <sys/types.h>

#include <cstddef>

COHORT_API_BEGIN

namespace cohort {

/// A small process, started from this one, that waits for this process to
/// end and then kills every process carrying the marker of one of its
/// groups (COHORT_GROUP_<this pid>_..., in the environment each rank and
/// each program it runs starts with), and every process in the process
/// group of one of their ranks (new_process_group, the default), whatever
/// its environment, until none is left. A rank's process group counts from
/// the rank's start until it is empty after the rank has been reaped, or
/// until its group's run has ended and swept it: past that its id could be
/// an unrelated process's, whose group must not be killed. The groups note
/// theirs with the first guardian of this process's that is running (a
/// program rank as its spawn returns, function ranks once all have
/// started); before that, from the end of its set-up on, before it runs
/// anything of the caller's (a before_exec hook, the exec, the function),
/// each rank has told the guardian of itself on the guardian's socket,
/// and that note stands in until the group's replaces it (or the rank's
/// start fails and it is withdrawn). When that guardian ends, the next one
/// running (the earliest started) takes every note of the groups, those
/// of the groups still running with the rest. Once this process has died
/// (not at a look it asked for), it also removes the files of file_system
/// segments (/dev/shm/cohort_<pid>_...) that this process and the ranks of
/// its groups made, which nothing else would remove: those of a rank that
/// has ended too, until its run has swept them itself (a process that took
/// the rank's pid since is told apart by its start time, which each
/// segment is stamped with), and those any process made with the marker of
/// a run not yet swept in its environment (a rank's own child), as each
/// segment records it. The ranks
/// themselves die by their parent-death signal; the guardian reaches what
/// they started, `setsid` grandchildren included, when this process could
/// not: killed with SIGKILL, also by a SIGKILL sent to this process's
/// whole process group, since the guardian leads a process group of its
/// own. A fork of a `fork` or `forkserver` rank that executes nothing
/// shows this process's or the server's initial environment in
/// /proc/<pid>/environ, without the marker: those carry a mapping instead,
/// which forks copy and an exec drops (a page of a memfd named
/// cohort-ranks-of-<this pid>, in /proc/<pid>/maps), and once this process
/// has died the guardian kills what carries it too: the forkserver, the
/// ranks, and their forks, `setsid` ones included (where a memfd can be
/// made and mapped: a seccomp filter that refuses memfd_create leaves them
/// unmarked). A look asked for reads no mappings, and leaves the
/// forkserver running for the next start. A process that another thread
/// of this process forks while a start forks `fork` ranks carries the
/// mapping too. The guardian spares every process that started before this
/// one (by the start time in /proc/<pid>/stat, in clock ticks): whatever
/// marker or mapping it carries names an earlier process that had this
/// one's pid. It ignores every signal but
/// SIGKILL and SIGSTOP (and the faults of its own code), so a Ctrl-C meant
/// for this process, or any signal sent to a process group, leaves it to
/// do its work; no handler of this process's ever runs in it. The
/// constructor returns once the guardian has its name (cohort-guardian),
/// by which every guardian spares every other, and leads its own process
/// group: it throws std::runtime_error where the guardian ended first.
///
/// On Linux 5.16 and later, on x86-64 and AArch64, the guardian shares this
/// process's memory (a clone with CLONE_VM, running on a stack of its own
/// and making only raw system calls), so starting it copies nothing;
/// elsewhere it is a copy, as a fork is. Either way it runs none of this
/// process's code but its own, so it may be started at any time, other
/// threads running or not. It learns of this process's end from a pidfd
/// as well as from the socket between them, so a child forked meanwhile
/// that holds a copy of this process's end does not hide it. Sharing
/// memory, it shares this process's fate under the OOM killer, which ends
/// every process of the memory it frees: were this process chosen, the
/// ranks would still end by their parent-death signal, but what they
/// started would be left. And when this process is killed, its memory is
/// freed only once the guardian has ended (its sweep takes at most about
/// 10 s).
///
/// Destroying the object (in the process that made it: a forked child's
/// copy only closes its descriptors) lets the guardian look once more and
/// reaps it:
/// that look kills as this process's end would, so the ranks of a group
/// still running then die too (SIGKILL, reported by their group as their
/// own failures). Destroy it once the groups have ended, or release() it;
/// after release(), it ends without looking.
class guardian {
 public:
  guardian();
  guardian(const guardian&) = delete;
  guardian& operator=(const guardian&) = delete;
  ~guardian();

  /// Ends the guardian without the look and reaps it: for a process whose
  /// groups have all ended and been swept (what they started is gone), so
  /// that its end does not wait on a pass over every process of the
  /// machine. Later calls do nothing.
  void release() noexcept;

  /// The guardian's pid.
  pid_t pid() const noexcept { return pid_; }

 private:
  void end(bool look) noexcept;

  pid_t pid_ = -1;
  int pidfd_ = -1;  // the guardian's, to wait for it by
  int line_ = -1;  // its end of the socket pair: closed when this process ends
  void* memory_ = nullptr;  // the guardian's stack and what it reads, freed once it has ended
  std::size_t memory_size_ = 0;
  pid_t owner_ = -1;  // the process that started it, the only one whose end tells it anything
};

}  // namespace cohort

COHORT_API_END

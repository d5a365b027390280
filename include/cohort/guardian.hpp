// A guardian process: what this process's groups started dies with it, even
// when it is killed outright.
#pragma once

#include "cohort/export.hpp"

#include <sys/types.h>

COHORT_API_BEGIN

namespace cohort {

/// A small process, forked from this one, that waits for this process to
/// end and then kills every process carrying the marker of one of its
/// groups (COHORT_GROUP_<this pid>_..., in the environment each rank and
/// each program it runs starts with), until none is left. The ranks
/// themselves die by their parent-death signal; the guardian reaches what
/// they started, `setsid` grandchildren included, when this process could
/// not: killed with SIGKILL. It ignores SIGINT, SIGTERM, SIGHUP and SIGQUIT,
/// so a Ctrl-C meant for this process leaves it to do its work.
///
/// Start it early in main, before other threads (it forks). Destroying the
/// object lets the guardian look once more and reaps it; after release(),
/// it ends without looking.
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
  int line_ = -1;  // its end of the socket pair: closed when this process ends
};

}  // namespace cohort

COHORT_API_END

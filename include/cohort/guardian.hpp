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
/// object (at a normal exit, when the groups have been swept already) lets
/// the guardian look once more and reaps it.
class guardian {
 public:
  guardian();
  guardian(const guardian&) = delete;
  guardian& operator=(const guardian&) = delete;
  ~guardian();

  /// The guardian's pid.
  pid_t pid() const noexcept { return pid_; }

 private:
  pid_t pid_ = -1;
  int pipe_ = -1;  // its end of the pipe: closed when this process ends
};

}  // namespace cohort

COHORT_API_END

// The mark a process's forked ranks carry: `fork` ranks and the
// forkserver's, and every fork of theirs that executes nothing. Such a
// process starts with no environment of its own (its /proc/<pid>/environ
// is the supervisor's or the server's, without the group's marker), so
// the guardian finds it by a mapping instead, which a fork copies and an
// exec drops: a page of a memfd named for the supervisor, never touched.
#pragma once

#include <sys/types.h>

#include <string>

namespace cohort::detail {

/// How the mark of process `owner`'s ranks begins in /proc/<pid>/maps,
/// space included: "/memfd:cohort-ranks-of-<owner> " (then "(deleted)").
std::string rank_mark_in_maps(pid_t owner);

/// Maps the mark of `owner`'s ranks into this process (PROT_NONE: it is
/// never read), for every fork of this process to carry: the forkserver
/// maps its requester's. False where it could not be made (no memfd, no
/// mapping left), the process then unmarked.
bool map_rank_mark(pid_t owner) noexcept;

/// While one lives, the forks this process makes carry the mark of its
/// ranks, which is mapped on first use in each process and kept out of its
/// other forks (MADV_DONTFORK): for the forks of `fork` ranks. Another
/// thread's fork in that time carries it too.
class ranks_marked {
 public:
  ranks_marked() noexcept;
  ranks_marked(const ranks_marked&) = delete;
  ranks_marked& operator=(const ranks_marked&) = delete;
  ~ranks_marked();

 private:
  bool counted_ = false;  // among the starts forking with the mark
};

}  // namespace cohort::detail

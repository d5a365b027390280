// The forkserver: a small single-threaded process, started on first use by
// re-executing this program, that forks function children on request. Its
// children are made with CLONE_PARENT, so they are the requester's own
// children: waited for, reaped and signalled like any other.
#pragma once

#include "cohort/entry_point.hpp"
#include "process/launch.hpp"

#include <span>

namespace cohort::detail {

/// The server's loop, run by child_main in the forkserver process. Returns
/// in the server when the requester goes (0), and in each forked child with
/// the child's exit code, for main to return.
int serve_forks(int socket);

/// The most descriptors (keep_fds) a forkserver child can be given.
inline constexpr std::size_t max_kept = 240;

/// Stops this process's forkserver, if it has one, and reaps it. Run when
/// the process exits (atexit, and after a function rank's function), so
/// that the server is not left to die an orphan (a zombie of whichever
/// subreaper supervises this process) by its parent-death signal.
void stop_forkserver() noexcept;

/// One rank for the forkserver to start: its plan, and what comes back.
struct server_request {
  launch_plan* plan;
  int rank;
  int result_fd;
  pid_t pid = -1;  ///< the child, this process's own (CLONE_PARENT)
};

/// Has the forkserver fork a child per request, starting the server first
/// when none runs. The requests go in as few messages as their descriptors
/// allow, each answered once its children are made. Returns how many
/// requests, from the first, have a child; when all have, `report_fd` is
/// the read end of the pipe their set-up reports come on (see
/// await_set_up), the caller's to close. At the first failure it stops,
/// with `f` saying why and no child of a later request left. The children
/// hand over to `keeper` (shm::keeper_for_ranks(); empty for none). Needs
/// child_main() in main (checked by the caller).
std::size_t start_from_server(std::span<server_request> requests, const function_call& call,
                              const std::string& keeper, int& report_fd, launch_failure& f) noexcept;

}  // namespace cohort::detail

// The forkserver: a small single-threaded process, started on first use by
// re-executing this program, that forks function children on request. Its
// children are made with CLONE_PARENT, so they are the requester's own
// children: waited for, reaped and signalled like any other.
#pragma once

#include "cohort/entry_point.hpp"
#include "process/launch.hpp"

namespace cohort::detail {

/// The server's loop, run by child_main in the forkserver process. Returns
/// in the server when the requester goes (0), and in each forked child with
/// the child's exit code, for main to return.
int serve_forks(int socket);

/// A process_starter: has the forkserver fork a child set up as `p` says
/// that runs `call` as `rank`, starting the server first when none runs.
/// Needs child_main() in main (checked by the caller).
int start_from_server(launch_plan& p, pid_t& pid, const function_call& call, int rank, int result_fd) noexcept;

}  // namespace cohort::detail

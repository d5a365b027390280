// A TCP port for a listener of the job's (the master's MASTER_PORT, a
// node's rendezvous address).
#pragma once

namespace cohort_run {

/// A port nothing listens on now, on any address (bind to port 0, then let
/// go): another process may take it before it is used. Throws
/// std::system_error when no socket can be had.
int free_port();

}  // namespace cohort_run

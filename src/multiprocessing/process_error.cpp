// The exceptions a failed rank becomes in its parent.
#include "cohort/process_error.hpp"

#include "cohort/group.hpp"

#include <fmt/format.h>

namespace cohort {

process_raised_error::process_raised_error(int rank, pid_t pid, std::string message, std::string trace)
    : process_error(fmt::format("rank {} (pid {}) raised {}{}{}", rank, pid, message, trace.empty() ? "" : "\n", trace),
                    rank, pid),
      message_(std::move(message)),
      trace_(std::move(trace)) {}

// A failed rank that exited with code 0 can only have left its function
// before it returned a value.
process_exited_error::process_exited_error(int rank, pid_t pid, exit_status status)
    : process_error(fmt::format("rank {} (pid {}) {}{}", rank, pid, status,
                                status.success() ? " before its function returned (exit() inside it?)" : ""),
                    rank, pid),
      status_(status) {}

void throw_first_failure(const run_result& result) {
  if (const rank_failure* f = result.first_failure()) {
    if (!f->message.empty()) throw process_raised_error(f->rank, f->pid, f->message, f->trace);
    // The supervisor could not see the rank's end: how the rank ended is
    // not known, and it raised nothing that was seen.
    if (!f->supervisor_error.empty()) {
      throw process_error(fmt::format("rank {} (pid {}) failed: {}", f->rank, f->pid, f->supervisor_error), f->rank,
                          f->pid);
    }
    throw process_exited_error(f->rank, f->pid, f->status);
  }
  if (!result.unreaped.empty()) {
    const int rank = result.unreaped.front();
    throw process_error(fmt::format("rank {} did not exit, even after SIGKILL", rank), rank, 0);
  }
  if (result.stopped) {
    throw process_error(result.signal ? fmt::format("the run was stopped by {}", signal_name(*result.signal))
                                      : std::string("the run was stopped"),
                        -1, 0);
  }
}

}  // namespace cohort

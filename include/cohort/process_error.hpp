// The exceptions a failed rank becomes in its parent, as torch's
// ProcessRaisedException and ProcessExitedException.
#pragma once

#include "cohort/export.hpp"

#include "cohort/exit_status.hpp"

#include <sys/types.h>

#include <stdexcept>
#include <string>

COHORT_API_BEGIN

namespace cohort {

struct run_result;

/// A rank of a group failed. Thrown as itself (neither kind below) when the
/// run ended with a rank never reaped, was stopped from outside, or when
/// the supervisor could not see how a rank ended (rank_failure::
/// supervisor_error): its wait failed, the rank reaped elsewhere, or its
/// result could not be read. what() is then "rank <r> (pid <p>) failed: "
/// and that error ("cohort: waiting for the rank's exit: ..." or "cohort:
/// reading the rank's result: ..."); a rank that wrote an error file is
/// thrown as process_raised_error all the same.
class process_error : public std::runtime_error {
 public:
  process_error(const std::string& what, int rank, pid_t pid) : std::runtime_error(what), rank_(rank), pid_(pid) {}
  int rank() const noexcept { return rank_; }
  pid_t pid() const noexcept { return pid_; }

 private:
  int rank_;
  pid_t pid_;
};

/// An exception escaped the rank's function (or the rank wrote an error
/// file). what(): "rank <r> (pid <p>) raised <type>: <what>", then the
/// child's stack trace when it had one.
class process_raised_error : public process_error {
 public:
  process_raised_error(int rank, pid_t pid, std::string message, std::string trace);
  /// "<type>: <what>" as the child reported it.
  const std::string& message() const noexcept { return message_; }
  /// The child's stack trace; empty where none was available.
  const std::string& trace() const noexcept { return trace_; }

 private:
  std::string message_;
  std::string trace_;
};

/// The rank exited with a non-zero code or was killed by a signal, without
/// an error file. what(): "rank <r> (pid <p>) exited with code 3" /
/// "... killed by signal SIGSEGV (11)". A rank whose function returns a
/// value and that exited with code 0 before it returned (exit() inside it)
/// failed too: exit_code() 0, and what() "... exited with code 0 before
/// its function returned (exit() inside it?)".
class process_exited_error : public process_error {
 public:
  process_exited_error(int rank, pid_t pid, exit_status status);
  const exit_status& status() const noexcept { return status_; }
  /// The exit code; -1 when a signal ended the rank.
  int exit_code() const noexcept { return status_.exited() ? status_.code() : -1; }
  /// The signal's number; 0 when the rank exited.
  int signal() const noexcept { return status_.signaled() ? status_.signal() : 0; }

 private:
  exit_status status_;
};

/// Throws the run's first failure (run_result::first_failure) as
/// process_raised_error (the rank wrote an error file) or
/// process_exited_error, or as process_error when the supervisor could not
/// see that rank's end (its supervisor_error). A run that ended with a rank
/// never reaped, or stopped from outside, throws process_error. Returns
/// when the run was ok().
void throw_first_failure(const run_result& result);

}  // namespace cohort

COHORT_API_END

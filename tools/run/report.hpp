// What cohort-run tells of a run: a line per restart, the summary of every
// failure (root cause first), and the outcome as JSON (--result-json, and
// result.json in the log folder).
#pragma once

#include <cohort/group.hpp>

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace cohort_run {

/// One attempt: the ranks of this node, started once, until they ended.
struct attempt_record {
  int attempt = 0;
  int node_rank = 0;
  int nnodes = 1;
  int world_size = 1;
  int first_rank = 0;  ///< RANK of local rank 0
  std::vector<pid_t> pids;
  std::chrono::system_clock::time_point started;
  std::chrono::steady_clock::duration lasted{};
  cohort::run_result result;
  /// "succeeded", "failed", "interrupted", or "re-formed" (the rendezvous
  /// ended it), and why, in words.
  std::string outcome;
  std::string reason;
};

struct run_record {
  std::string run_id;
  std::string role;
  std::string host;
  std::string rdzv_backend;
  int max_restarts = 0;
  int restarts = 0;  ///< restarts used
  std::filesystem::path log_dir;    ///< this run's folder, or empty
  std::filesystem::path error_dir;  ///< where the error files are kept, or empty
  std::vector<attempt_record> attempts;
  /// "succeeded", "failed" or "interrupted"; the exit code cohort-run gives.
  std::string outcome;
  int exit_code = 0;
  /// What ended the run when no rank did (the rendezvous, a start that failed).
  std::string message;
  /// The attempt whose rendezvous failed, where the run ended as it joined
  /// one after the first (the last of `attempts` is the one before it).
  std::optional<int> failed_joining;
};

/// "rank 3 (local 1, pid 42): exited with code 2: ValueError: bad batch".
std::string describe(const cohort::rank_failure& f, int first_rank);

/// The summary of the last attempt's failures, root cause first, and of the
/// log files that could not be written, to stderr.
void print_summary(const run_record& run);

/// The run as JSON.
std::string result_json(const run_record& run);

/// What torch's @record does for torchrun, for whatever supervises
/// cohort-run: when it was given an error file of its own
/// (cohort::error_file_path()), a run that failed leaves its root cause
/// there. That is the error file the root cause's rank wrote (or, where
/// that file could not be kept, the report as the group read it, in
/// torchelastic's shape), with the rank's exit code (minus the signal that
/// ended it) as the message's errorCode; nothing when the rank wrote none. A run that failed with no
/// rank to blame, or was interrupted, leaves what ended it.
void write_own_error_file(const run_record& run);

}  // namespace cohort_run

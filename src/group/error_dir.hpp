// Where a group's error files go when its spec names no directory: one
// private directory per process, made on first use, so that a run whose
// ranks all succeed touches no file system at all.
#pragma once

#include <filesystem>

namespace cohort::detail {

/// This process's directory for error files: $TMPDIR/cohort-errors-XXXXXX,
/// made on first use and removed when the process exits. The process holds
/// a lock on it (flock) while it lives; a directory left behind by a process
/// that died without removing it (SIGKILL) is unlocked, and the first use in
/// any later process of the same user removes it. Throws std::system_error
/// when it cannot be made.
const std::filesystem::path& private_error_dir();

/// Whether `dir` holds no entry (false when it cannot be read). One listing
/// costs less than a removal tried for each rank's error file when, as
/// after a run whose ranks all succeeded, there is none.
bool holds_nothing(const std::filesystem::path& dir) noexcept;

/// Removes the unlocked cohort-errors-* directories of this user in `parent`:
/// those of processes that died. Errors are ignored: one that cannot be
/// removed now is tried again by a later process.
void remove_stale_error_dirs(const std::filesystem::path& parent);

}  // namespace cohort::detail

// Where a group's error files go when its spec names no directory: one
// directory per user, $TMPDIR/cohort-errors-<uid> ($TMPDIR: the temporary
// directory as os::temp_directory finds it), in which each file's name
// says which process it belongs to. A run whose ranks all succeed makes and
// removes no file or directory: the file system only sees a lookup (unless
// someone else has taken the user's name: then each process makes and
// removes a directory of its own).
#pragma once

#include <filesystem>
#include <string>

namespace cohort::detail {

/// This user's directory for error files, $TMPDIR/cohort-errors-<uid>: made
/// (mode 0700) by the first process that needs it and kept, made private
/// again if it is not. When the name is taken by anything but a directory of
/// this user's, a link included (someone else's, in a shared $TMPDIR), a
/// directory of this process's own instead:
/// $TMPDIR/cohort-errors-<uid>-<this process's prefix (below)>XXXXXX, removed at
/// its exit. The first use in each process removes the files of processes
/// that have ended (killed outright, they could not remove their own), and,
/// when it uses a directory of its own, the own directories of such
/// processes. Throws std::system_error when no directory can be made.
const std::filesystem::path& error_dir_of_user();

/// The prefix of the names of group `group_number`'s files in the user's
/// directory: this process's, "<boot id>-<pid namespace>-<pid>-<start
/// time>-", then the group's number and '-'. Until
/// release_group_files() removes them, this process's exit looks for its
/// files left there and removes them; an exit after every claim was
/// released has none to look for.
std::string claim_group_files(unsigned group_number);
/// Removes the files named with `prefix` (from claim_group_files) from
/// `dir`, the user's directory; errors are ignored.
void release_group_files(const std::filesystem::path& dir, const std::string& prefix) noexcept;

/// Removes the files in `dir` whose names begin with `prefix`; errors are
/// ignored.
void remove_files_named(const std::filesystem::path& dir, const std::string& prefix) noexcept;

/// Removes the files in `dir` of processes that have ended: those whose
/// name begins with this machine's boot id and this pid namespace, then a
/// pid and a start time that no running process has. Others (of live
/// processes, of another machine sharing $TMPDIR, of another pid namespace
/// or boot, any other name) are kept; so is everything when the boot id or
/// the namespace cannot be read.
void remove_stale_error_files(const std::filesystem::path& dir) noexcept;

}  // namespace cohort::detail

// A file's content replaced whole or not at all: written beside it under a
// name of its own and renamed over it once complete.
#pragma once

#include <filesystem>
#include <string_view>

namespace cohort::os {

/// Writes all of `text` to `fd`, again where a write is interrupted or
/// short; false, with errno set, when it cannot.
bool write_all(int fd, std::string_view text);

/// `text` put at `path` whole or not at all: a reader finds the earlier
/// content or this, never part of it. A write that fails (a full disk,
/// RLIMIT_FSIZE: never SIGXFSZ) or that the process's end cuts short leaves
/// the earlier content, and an unfinished file beside it when the process
/// ended (unfinished_file names it). The new file takes the old one's mode.
/// Where a rename would change more than what the file holds, or cannot be
/// done, the file is written in place, as a program's own open for writing
/// would: a symbolic link (/dev/stderr names a descriptor's file, which a
/// rename would take from under it), something other than a regular file
/// (a FIFO), a file of several links or of another owner, a folder in which
/// this process may not create a file, a name too long for a suffix, a
/// rename refused (a file mounted on its own: EBUSY; a sticky folder:
/// EPERM). That open never waits: a FIFO that no process has open for
/// reading fails it (ENXIO). False, with errno set, when the text could
/// not be written.
bool replace_file(const std::filesystem::path& path, std::string_view text);

/// Whether replace_file renames its new file over what is at `path` (a
/// regular file of one link, this user's), rather than writing it in place
/// (anything else there); false when nothing is there.
bool replaced_by_rename(const std::filesystem::path& path) noexcept;

/// Where this process writes the `n`th content it puts at `path`:
/// "<path>.<pid>-<n>.tmp", beside it.
std::filesystem::path unfinished_file(const std::filesystem::path& path, unsigned n);

/// Whether `name`, a file name, is one that unfinished_file() gives a file
/// named `file_name` (a file name too): "<file_name>.<digits>-<digits>.tmp".
bool is_unfinished_file(std::string_view name, std::string_view file_name) noexcept;

}  // namespace cohort::os

// The directory for temporary files, found as Python's tempfile finds it,
// so that cohort's files go where torchrun's would.
#pragma once

#include <filesystem>
#include <system_error>

namespace cohort::os {

/// The first of $TMPDIR, $TEMP, $TMP, /tmp, /var/tmp, /usr/tmp and the
/// current directory that is a directory in which this process can make
/// and write a file (not on a full file system), made absolute: what Python's tempfile.gettempdir() answers. A
/// variable set to the empty string counts as unset. Each call looks again
/// (a directory that the checks of its mode and file system, its free
/// blocks and inodes included, do not pass is tried by making, writing
/// and removing a file there), so that a variable changed
/// since counts. Empty, with `ec` set, when none will do.
std::filesystem::path temp_directory(std::error_code& ec);
/// The same; throws std::filesystem::filesystem_error when none will do.
std::filesystem::path temp_directory();

}  // namespace cohort::os

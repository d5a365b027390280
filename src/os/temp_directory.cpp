// Looking for a usable temporary directory as Python's tempfile does.
#include "os/temp_directory.hpp"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string>
#include <vector>

namespace cohort::os {
namespace {

// Whether this process can make a file in `dir`, as Python tells it by
// making one there and writing to it, which a missing directory, one that
// is not a directory, a read-only one, one such as /proc (where even root
// makes nothing) or a full file system all refuse. Told first without
// making one: a directory this process may write and search, on a file
// system mounted writable that is not the kernel's own (proc, sysfs), with
// a block free and an inode free (where it counts them: btrfs reports no
// inodes at all), takes files. Making and removing one, named or not
// (O_TMPFILE), cost cohort-run -n 1 about 4% of its time on a journalled
// /tmp; that is left to the rest (root may still write into the blocks
// kept back for it).
bool can_make_file_in(const std::filesystem::path& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return false;
  struct statfs fs {};
  if (::access(dir.c_str(), W_OK | X_OK) == 0 && ::statfs(dir.c_str(), &fs) == 0 && (fs.f_flags & ST_RDONLY) == 0 &&
      fs.f_type != PROC_SUPER_MAGIC && fs.f_type != SYSFS_MAGIC && fs.f_bavail > 0 &&
      (fs.f_files == 0 || fs.f_ffree > 0)) {
    return true;
  }
  std::string pattern = (dir / ".cohort-tmp-XXXXXX").string();
  const int fd = ::mkostemp(pattern.data(), O_CLOEXEC);
  if (fd < 0) return false;
  const bool written = ::write(fd, "blat", 4) == 4;  // Python's four bytes
  ::unlink(pattern.c_str());
  ::close(fd);
  return written;
}

}  // namespace

std::filesystem::path temp_directory(std::error_code& ec) {
  ec.clear();
  std::vector<std::filesystem::path> candidates;
  for (const char* name : {"TMPDIR", "TEMP", "TMP"}) {
    if (const char* value = std::getenv(name); value != nullptr && *value != '\0') candidates.emplace_back(value);
  }
  for (const char* dir : {"/tmp", "/var/tmp", "/usr/tmp"}) candidates.emplace_back(dir);
  candidates.emplace_back(".");
  for (auto& dir : candidates) {
    if (!can_make_file_in(dir)) continue;
    std::error_code ignored;  // a current directory that is gone: the name as it was given
    if (auto absolute = std::filesystem::absolute(dir, ignored); !ignored) return absolute;
    return dir;
  }
  ec.assign(ENOENT, std::system_category());
  return {};
}

std::filesystem::path temp_directory() {
  std::error_code ec;
  auto dir = temp_directory(ec);
  if (ec) {
    throw std::filesystem::filesystem_error(
        "cohort: no usable temporary directory in $TMPDIR, $TEMP, $TMP, /tmp, /var/tmp, /usr/tmp or here", ec);
  }
  return dir;
}

}  // namespace cohort::os

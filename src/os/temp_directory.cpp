// Looking for a usable temporary directory as Python's tempfile does.
#include "os/temp_directory.hpp"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string>
#include <vector>

namespace cohort::os {
namespace {

// Whether this process can make a file in `dir`: a name is taken, as
// Python takes it, by making one there, which a missing directory, one
// that is not a directory, a read-only one or one such as /proc (where
// even root makes nothing) all refuse.
bool can_make_file_in(const std::filesystem::path& dir) {
  std::string pattern = (dir / ".cohort-tmp-XXXXXX").string();
  const int fd = ::mkostemp(pattern.data(), O_CLOEXEC);
  if (fd < 0) return false;
  ::unlink(pattern.c_str());
  ::close(fd);
  return true;
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

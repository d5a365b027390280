// The private error directory of a process, and the removal of those that
// processes killed outright left behind.
#include "group/error_dir.hpp"

#include <fmt/format.h>

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string_view>
#include <system_error>

namespace cohort::detail {
namespace {

constexpr std::string_view prefix = "cohort-errors-";

// The directory and the descriptor that holds its lock. The lock goes with
// the process, however it ends: the descriptor is close-on-exec and every
// child cohort starts closes the others.
class owned_dir {
 public:
  owned_dir() {
    const auto parent = std::filesystem::temp_directory_path();
    remove_stale_error_dirs(parent);
    // Made under a name the removal never matches, locked, then renamed:
    // no other process can find it unlocked.
    std::string staging = (parent / ".cohort-staging-XXXXXX").string();
    if (::mkdtemp(staging.data()) == nullptr) fail("mkdtemp " + staging, {});
    fd_ = ::open(staging.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd_ < 0 || ::flock(fd_, LOCK_EX) != 0) fail("locking " + staging, staging);
    path_ = parent / fmt::format("{}{}", prefix, staging.substr(staging.size() - 6));
    if (::rename(staging.c_str(), path_.c_str()) != 0) fail("renaming " + staging, staging);
  }
  owned_dir(const owned_dir&) = delete;
  owned_dir& operator=(const owned_dir&) = delete;
  // At exit, in the process that made it only: a child forked by other means
  // that calls exit() must not remove its parent's directory.
  ~owned_dir() {
    if (::getpid() != owner_) return;
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
    ::close(fd_);
  }

  const std::filesystem::path& path() const noexcept { return path_; }

 private:
  [[noreturn]] void fail(const std::string& what, const std::string& made) {
    const int error = errno;
    if (fd_ >= 0) ::close(fd_);
    if (!made.empty()) ::rmdir(made.c_str());
    throw std::system_error(error, std::system_category(), "cohort: the private error directory: " + what);
  }

  std::filesystem::path path_;
  int fd_ = -1;
  pid_t owner_ = ::getpid();
};

}  // namespace

const std::filesystem::path& private_error_dir() {
  static const owned_dir dir;
  return dir.path();
}

bool holds_nothing(const std::filesystem::path& dir) noexcept {
  DIR* listing = ::opendir(dir.c_str());
  if (listing == nullptr) return false;
  bool empty = true;
  while (const dirent* entry = ::readdir(listing)) {
    const std::string_view name = entry->d_name;
    if (name != "." && name != "..") {
      empty = false;
      break;
    }
  }
  ::closedir(listing);
  return empty;
}

void remove_stale_error_dirs(const std::filesystem::path& parent) {
  DIR* listing = ::opendir(parent.c_str());
  if (listing == nullptr) return;
  const uid_t self = ::geteuid();
  while (dirent* entry = ::readdir(listing)) {
    const std::string_view name = entry->d_name;
    if (!name.starts_with(prefix)) continue;
    const int fd = ::openat(::dirfd(listing), entry->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat st{};
    // Held while removing: its owner is gone, and no other sweep removes it
    // at the same time.
    if (::fstat(fd, &st) == 0 && st.st_uid == self && ::flock(fd, LOCK_EX | LOCK_NB) == 0) {
      std::error_code ignored;
      std::filesystem::remove_all(parent / name, ignored);
    }
    ::close(fd);
  }
  ::closedir(listing);
}

}  // namespace cohort::detail

// The per-user directory of error files, and the removal of the files that
// processes killed outright left there.
#include "group/error_dir.hpp"

#include "os/process_identity.hpp"

#include <fmt/format.h>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdint>
#include <mutex>
#include <string_view>
#include <system_error>

namespace cohort::detail {
namespace {

// The inode of this process's pid namespace: pids and start times are
// judged only among processes of the same namespace.
std::uint64_t pid_namespace() {
  static const std::uint64_t id = [] {
    struct stat st{};
    return ::stat("/proc/self/ns/pid", &st) == 0 ? static_cast<std::uint64_t>(st.st_ino) : 0;
  }();
  return id;
}

// Reads a decimal number and the '-' after it from the front of `text`.
bool take_number(std::string_view& text, std::uint64_t& value) {
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end == text.data() + text.size() || *end != '-') return false;
  text.remove_prefix(static_cast<std::size_t>(end - text.data()) + 1);
  return true;
}

// Calls `f(name)` for each entry of `dir` but "." and ".."; `dirfd` is the
// listing's descriptor, for unlinkat.
template <class F>
void for_each_name(const std::filesystem::path& dir, F&& f) noexcept {
  DIR* listing = ::opendir(dir.c_str());
  if (listing == nullptr) return;
  while (const dirent* entry = ::readdir(listing)) {
    const std::string_view name = entry->d_name;
    if (name != "." && name != "..") f(::dirfd(listing), name);
  }
  ::closedir(listing);
}

[[noreturn]] void fail(int error, const std::filesystem::path& dir, const char* what) {
  throw std::system_error(error, std::system_category(),
                          fmt::format("cohort: the error files' directory {}: {}", dir.string(), what));
}

// The directory, made or checked once per process. At the exit of the
// process that made this object (not of a child forked from it), the
// process's own files still there are removed.
class user_dir {
 public:
  user_dir() {
    const uid_t self = ::geteuid();
    path_ = std::filesystem::temp_directory_path() / fmt::format("cohort-errors-{}", self);
    if (::mkdir(path_.c_str(), 0700) != 0 && errno != EEXIST) fail(errno, path_, "mkdir");
    struct stat st{};
    if (::lstat(path_.c_str(), &st) != 0) fail(errno, path_, "lstat");
    // In a shared $TMPDIR the name may be taken by someone else: files
    // there could be read or replaced by them.
    if (!S_ISDIR(st.st_mode) || st.st_uid != self) {
      fail(EPERM, path_, "it is not a directory of this user; remove it, or set TMPDIR elsewhere");
    }
    if ((st.st_mode & 0777) != 0700 && ::chmod(path_.c_str(), 0700) != 0) fail(errno, path_, "chmod 0700");
    remove_stale_error_files(path_);
    // Made now, so that it outlives this object at exit (statics end in
    // the reverse order of their making).
    static_cast<void>(own_error_file_prefix());
  }
  user_dir(const user_dir&) = delete;
  user_dir& operator=(const user_dir&) = delete;
  ~user_dir() {
    if (::getpid() == owner_) remove_files_named(path_, own_error_file_prefix());
  }

  const std::filesystem::path& path() const noexcept { return path_; }

 private:
  std::filesystem::path path_;
  pid_t owner_ = ::getpid();
};

}  // namespace

const std::filesystem::path& error_dir_of_user() {
  static const user_dir dir;
  return dir.path();
}

// Made anew in a child forked from a process that had asked already.
std::string own_error_file_prefix() {
  static std::mutex mutex;
  static pid_t made_for = 0;
  static std::string prefix;
  std::lock_guard lock(mutex);
  if (made_for != os::this_process()) {
    made_for = os::this_process();
    prefix = fmt::format("{}-{}-{}-", pid_namespace(), made_for, os::own_start_time());
  }
  return prefix;
}

void remove_files_named(const std::filesystem::path& dir, const std::string& prefix) noexcept {
  for_each_name(dir, [&](int at, std::string_view name) {
    if (name.starts_with(prefix)) ::unlinkat(at, std::string(name).c_str(), 0);
  });
}

void remove_stale_error_files(const std::filesystem::path& dir) noexcept {
  const std::uint64_t ns = pid_namespace();
  for_each_name(dir, [&](int at, std::string_view name) {
    std::string_view rest = name;
    std::uint64_t file_ns = 0, pid = 0, start = 0;
    if (!take_number(rest, file_ns) || !take_number(rest, pid) || !take_number(rest, start)) return;
    if (file_ns != ns || pid == 0 || pid > static_cast<std::uint64_t>(INT32_MAX)) return;
    if (os::has_ended(static_cast<pid_t>(pid), start)) ::unlinkat(at, std::string(name).c_str(), 0);
  });
}

}  // namespace cohort::detail

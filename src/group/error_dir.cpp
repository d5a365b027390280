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
#include <atomic>
#include <string_view>
#include <system_error>

namespace cohort::detail {
namespace {

// Which machine, and which pid namespace on it, this process's pids and
// start times mean something in: "<boot id>-<pid namespace inode>-". Hosts
// that share a $TMPDIR (over NFS, say) have different boot ids; their
// initial pid namespaces all have the same inode. Empty when either cannot
// be read: then no file is judged stale.
const std::string& machine_key() {
  static const std::string key = [] {
    char boot[64]{};
    const int fd = ::open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    const ssize_t n = fd >= 0 ? ::read(fd, boot, sizeof boot - 1) : -1;
    if (fd >= 0) ::close(fd);
    struct stat ns{};
    if (n < 36 || ::stat("/proc/self/ns/pid", &ns) != 0) return std::string();
    return fmt::format("{}-{}-", std::string_view(boot, 36), ns.st_ino);
  }();
  return key;
}

// What the names of the files of process `pid` begin with.
std::string prefix_of(pid_t pid) {
  const std::string& key = machine_key();
  return fmt::format("{}{}-{}-", key.empty() ? "unknown-" : key, pid, os::own_start_time());
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

// The directory, made or checked once per process (its files of ended
// processes are removed after, outside the static's initialisation, which a
// fork must not find under way). At the exit of a process, its own files
// still there are removed: by the pid it has then, so a child forked from
// the process that made this object removes only its own.
class user_dir {
 public:
  user_dir() {
    const uid_t self = ::geteuid();
    path_ = std::filesystem::temp_directory_path() / fmt::format("cohort-errors-{}", self);
    if (::mkdir(path_.c_str(), 0700) != 0 && errno != EEXIST) fail(errno, path_, "mkdir");
    // Opened without following a link, then looked at and made private
    // through that descriptor: in a shared $TMPDIR the name may be someone
    // else's, and files there could be read or replaced by them.
    const int fd = ::open(path_.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
      const int error = errno;
      fail(error, path_, error == ELOOP || error == ENOTDIR
                             ? "it is not a directory of this user; remove it, or set TMPDIR elsewhere"
                             : "open");
    }
    struct stat st{};
    int error = ::fstat(fd, &st) == 0 ? 0 : errno;
    if (error == 0 && st.st_uid != self) error = EPERM;
    if (error == 0 && (st.st_mode & 0777) != 0700 && ::fchmod(fd, 0700) != 0) error = errno;
    ::close(fd);
    if (error == EPERM) fail(error, path_, "it is not a directory of this user; remove it, or set TMPDIR elsewhere");
    if (error != 0) fail(error, path_, "fstat or fchmod 0700");
    static_cast<void>(machine_key());  // made now, so that it outlives this object at exit
  }
  user_dir(const user_dir&) = delete;
  user_dir& operator=(const user_dir&) = delete;
  ~user_dir() { remove_files_named(path_, prefix_of(::getpid())); }

  const std::filesystem::path& path() const noexcept { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace

const std::filesystem::path& error_dir_of_user() {
  static const user_dir dir;
  static std::atomic<bool> swept{false};
  if (!swept.exchange(true)) remove_stale_error_files(dir.path());
  return dir.path();
}

std::string own_error_file_prefix() { return prefix_of(os::this_process()); }

void remove_files_named(const std::filesystem::path& dir, const std::string& prefix) noexcept {
  for_each_name(dir, [&](int at, std::string_view name) {
    if (name.starts_with(prefix)) ::unlinkat(at, std::string(name).c_str(), 0);
  });
}

void remove_stale_error_files(const std::filesystem::path& dir) noexcept {
  const std::string& key = machine_key();
  if (key.empty()) return;
  for_each_name(dir, [&](int at, std::string_view name) {
    if (!name.starts_with(key)) return;
    std::string_view rest = name.substr(key.size());
    std::uint64_t pid = 0, start = 0;
    if (!take_number(rest, pid) || !take_number(rest, start)) return;
    if (pid == 0 || pid > static_cast<std::uint64_t>(INT32_MAX)) return;
    if (os::has_ended(static_cast<pid_t>(pid), start)) ::unlinkat(at, std::string(name).c_str(), 0);
  });
}

}  // namespace cohort::detail

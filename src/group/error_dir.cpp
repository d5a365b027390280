// The per-user directory of error files, and the removal of the files that
// processes killed outright left there.
#include "group/error_dir.hpp"

#include "os/descriptor_limit.hpp"
#include "os/process_identity.hpp"
#include "os/temp_directory.hpp"

#include <fmt/format.h>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <optional>
#include <string_view>
#include <system_error>
#include <utility>

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
    const auto pid_namespace = os::pid_namespace();
    if (n < 36 || pid_namespace == 0) return std::string();
    return fmt::format("{}-{}-", std::string_view(boot, 36), pid_namespace);
  }();
  return key;
}

// Groups of this process whose files in the user's directory have not
// been removed yet (claim_group_files, release_group_files). A forked
// child starts with its parent's count, and so may look at its exit for
// files it never had.
std::atomic<int> claimed_group_files{0};

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

// Calls `f(at, name)` for each entry of `listing` but "." and "..", then
// closes it: `at` is the listing's descriptor, for the *at calls.
template <class F>
void for_each_entry(DIR* listing, F&& f) noexcept {
  if (listing == nullptr) return;
  while (const dirent* entry = ::readdir(listing)) {
    const std::string_view name = entry->d_name;
    if (name != "." && name != "..") f(::dirfd(listing), name);
  }
  ::closedir(listing);
}

// The same for the entries of `dir`.
template <class F>
void for_each_name(const std::filesystem::path& dir, F&& f) noexcept {
  for_each_entry(::opendir(dir.c_str()), std::forward<F>(f));
}

// How many directories deep remove_entry goes: each level holds a
// descriptor, and a rank may nest directories without end.
constexpr int max_removal_depth = 16;

// Removes `name` from the directory `at` whatever it is: a rank may leave a
// FIFO, a link or a directory at its error file's name. A directory goes
// with what it holds, down to max_removal_depth levels (one that holds
// more stays, with what could not be removed). A link is removed, never
// followed. Errors are ignored.
void remove_entry(int at, const std::string& name, int depth = 0) noexcept {
  if (::unlinkat(at, name.c_str(), 0) == 0 || errno != EISDIR || depth >= max_removal_depth) return;
  const int fd = ::openat(at, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return;
  DIR* listing = ::fdopendir(fd);
  if (listing == nullptr) {
    ::close(fd);
    return;
  }
  for_each_entry(listing, [&](int inside, std::string_view entry) {
    remove_entry(inside, std::string(entry), depth + 1);
  });
  ::unlinkat(at, name.c_str(), AT_REMOVEDIR);
}

[[noreturn]] void fail(int error, const std::filesystem::path& dir, const char* what) {
  throw std::system_error(error, std::system_category(),
                          fmt::format("cohort: the error files' directory {}: {}{}", dir.string(), what,
                                      os::descriptor_limit_note(error)));
}

// Whether `dir` is, or has now been made, a directory of user `self` that
// only that user can enter. It is opened without following a link, then
// looked at and made private through that descriptor. False when the name
// is taken by anything else: in a shared $TMPDIR, someone else may have
// taken it first.
bool own_private_dir(const std::filesystem::path& dir, uid_t self) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) fail(errno, dir, "mkdir");
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ELOOP || errno == ENOTDIR) return false;
    fail(errno, dir, "open");
  }
  struct stat st{};
  int error = ::fstat(fd, &st) == 0 ? 0 : errno;
  const bool own = error == 0 && st.st_uid == self;
  if (own && (st.st_mode & 0777) != 0700 && ::fchmod(fd, 0700) != 0) error = errno;
  ::close(fd);
  if (error != 0) fail(error, dir, "fstat or fchmod 0700");
  return own;
}

// The pid and start time that `name` holds after `prefix` and the machine
// key, as in "<prefix><key><pid>-<start>-..."; nullopt for any other name.
std::optional<std::pair<pid_t, std::uint64_t>> owner_in(std::string_view name, std::string_view prefix) {
  const std::string& key = machine_key();
  if (key.empty() || !name.starts_with(prefix) || !name.substr(prefix.size()).starts_with(key)) return std::nullopt;
  std::string_view rest = name.substr(prefix.size() + key.size());
  std::uint64_t pid = 0, start = 0;
  if (!take_number(rest, pid) || !take_number(rest, start)) return std::nullopt;
  if (pid == 0 || pid > static_cast<std::uint64_t>(INT32_MAX)) return std::nullopt;
  return std::pair{static_cast<pid_t>(pid), start};
}

// The directory, made or checked once per process: the user's,
// $TMPDIR/cohort-errors-<uid>, or, when that name is taken by someone else,
// one of this process's own, $TMPDIR/cohort-errors-<uid>-<its prefix>XXXXXX,
// removed at its exit. Files and own directories of ended processes are
// removed by sweep(), called outside the static's initialisation, which a
// fork must not find under way. At the exit of a process with a group's
// files unreleased, its own files still there are removed: by the pid it
// has then, so a child forked from the process that made this object
// removes only its own.
class user_dir {
 public:
  user_dir() {
    const uid_t self = ::geteuid();
    // $TMPDIR, or where Python's tempfile would look next when it is unset,
    // missing or not writable. Absolute, as every path a rank is given: a
    // rank may start in, or move to, another directory.
    parent_ = os::temp_directory();
    own_prefix_ = fmt::format("cohort-errors-{}-", self);
    path_ = parent_ / fmt::format("cohort-errors-{}", self);
    if (!own_private_dir(path_, self)) {
      std::string pattern = (parent_ / fmt::format("{}{}XXXXXX", own_prefix_, prefix_of(os::this_process()))).string();
      if (::mkdtemp(pattern.data()) == nullptr) fail(errno, pattern, "mkdtemp");
      path_ = pattern;
      owned_ = true;
    }
    static_cast<void>(machine_key());  // made now, so that it outlives this object at exit
  }
  user_dir(const user_dir&) = delete;
  user_dir& operator=(const user_dir&) = delete;
  ~user_dir() {
    if (claimed_group_files.load(std::memory_order_acquire) > 0) remove_files_named(path_, prefix_of(::getpid()));
    if (owned_ && ::getpid() == owner_) ::rmdir(path_.c_str());
  }

  const std::filesystem::path& path() const noexcept { return path_; }

  void sweep() const noexcept {
    if (!owned_) return remove_stale_error_files(path_);
    // Own directories are only looked for while the user's is taken.
    const uid_t self = ::geteuid();
    for_each_name(parent_, [&](int at, std::string_view name) {
      const auto owner = owner_in(name, own_prefix_);
      if (!owner || !os::has_ended(owner->first, owner->second)) return;
      const std::string entry(name);
      const int fd = ::openat(at, entry.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (fd < 0) return;
      struct stat st{};
      const bool own = ::fstat(fd, &st) == 0 && st.st_uid == self;
      ::close(fd);
      if (!own) return;
      remove_entry(at, entry);
    });
  }

 private:
  std::filesystem::path parent_;
  std::string own_prefix_;  // of this user's own directories' names
  std::filesystem::path path_;
  bool owned_ = false;  // path_ is this process's own directory
  pid_t owner_ = ::getpid();
};

}  // namespace

const std::filesystem::path& error_dir_of_user() {
  static const user_dir dir;
  static std::atomic<bool> swept{false};
  if (!swept.exchange(true)) dir.sweep();
  return dir.path();
}

std::string claim_group_files(unsigned group_number) {
  claimed_group_files.fetch_add(1, std::memory_order_relaxed);
  return fmt::format("{}{}-", prefix_of(os::this_process()), group_number);
}

void release_group_files(const std::filesystem::path& dir, const std::string& prefix) noexcept {
  remove_files_named(dir, prefix);
  claimed_group_files.fetch_sub(1, std::memory_order_release);
}

void remove_files_named(const std::filesystem::path& dir, const std::string& prefix) noexcept {
  for_each_name(dir, [&](int at, std::string_view name) {
    if (name.starts_with(prefix)) remove_entry(at, std::string(name));
  });
}

void remove_stale_error_files(const std::filesystem::path& dir) noexcept {
  for_each_name(dir, [&](int at, std::string_view name) {
    const auto owner = owner_in(name, "");
    if (owner && os::has_ended(owner->first, owner->second)) remove_entry(at, std::string(name));
  });
}

}  // namespace cohort::detail

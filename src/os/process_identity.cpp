// Process identity: the cached pid, start times read from /proc, and the
// rank this process runs as.
#include "os/process_identity.hpp"

#include "config.hpp"
#include "os/raw_syscall.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace cohort::os {

namespace {

std::atomic<pid_t> cached_pid{0};
std::atomic<std::uint64_t> cached_start_time{0};
int rank_of_this_process = -1;

// Every child of glibc's fork forgets its parent's pid before fork returns
// in it, whoever forked it. (Children made without glibc's fork call
// forget_process_id themselves; those that share the parent's memory until
// they exec touch neither.)
[[maybe_unused]] const bool forgotten_in_forked_children = [] {
  forget_process_id_in_forked_children();
  return true;
}();

}  // namespace

void forget_process_id_in_forked_children() noexcept {
  static const bool registered = [] {
    ::pthread_atfork(nullptr, nullptr, [] { forget_process_id(); });
    return true;
  }();
  (void)registered;
}

namespace {

// The fields of a /proc stat file (/proc/<pid>/stat, or a thread's
// /proc/<pid>/task/<tid>/stat) after the command's closing parenthesis
// (the command may hold any character), copied into `text`: nullptr when
// the process or thread has ended (`ended` set) or /proc could not tell.
const char* stat_fields(const char* path, char (&text)[1024], bool& ended) noexcept {
  ended = false;
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    ended = errno == ENOENT || errno == ESRCH;
    return nullptr;
  }
  const auto n = ::read(fd, text, sizeof text - 1);
  const int error = errno;
  ::close(fd);
  ended = n < 0 && error == ESRCH;  // ended between the open and the read
  if (n <= 0) return nullptr;
  text[n] = '\0';
  const char* p = std::strrchr(text, ')');
  return p != nullptr && p[1] == ' ' ? p : nullptr;
}

const char* stat_fields(pid_t pid, char (&text)[1024], bool& ended) noexcept {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  return stat_fields(path, text, ended);
}

}  // namespace

namespace {

// Field 22 of /proc/<pid>/stat; a zombie with no thread left counts as
// ended (0) unless `zombie_counts`.
std::optional<std::uint64_t> read_start_time(pid_t pid, bool zombie_counts) noexcept {
  char text[1024];
  bool ended = false;
  const char* p = stat_fields(pid, text, ended);
  if (p == nullptr) return ended ? std::optional<std::uint64_t>(0) : std::nullopt;
  // Fields counted after the parenthesis: 3 the state, 20 the number of
  // threads, 22 the start time.
  const char state = p[2];
  long threads = -1;
  for (int field = 2; field < 22 && p != nullptr; ++field) {
    p = std::strchr(p + 1, ' ');
    if (field == 19 && p != nullptr) threads = std::strtol(p + 1, nullptr, 10);
  }
  if (p == nullptr) return std::nullopt;
  // A leader that called pthread_exit shows Z while its other threads run.
  if (!zombie_counts && (state == 'Z' || state == 'X') && threads <= 1) return 0;
  return std::strtoull(p + 1, nullptr, 10);
}

}  // namespace

std::optional<std::uint64_t> start_time_of(pid_t pid) noexcept { return read_start_time(pid, false); }

std::optional<std::uint64_t> start_time_of_child(pid_t pid) noexcept { return read_start_time(pid, true); }

char state_of(pid_t pid) noexcept {
  char text[1024];
  bool ended = false;
  const char* p = stat_fields(pid, text, ended);
  return p == nullptr ? '\0' : p[2];
}

bool has_ended(pid_t pid, std::uint64_t start_time) noexcept {
  const auto now = start_time_of(pid);
  if (start_time == 0) return now == std::optional<std::uint64_t>(0);  // unknown then: by the pid alone
  return now && *now != start_time;
}

namespace {

// PF_EXITING in the flags of /proc/<pid>/stat (field 9): set by the kernel
// on a thread as it begins to exit, before it lets go of its memory and
// its descriptors, and kept until it is reaped.
constexpr unsigned long thread_exiting = 0x4;

// SIGKILL in a thread's own pending signals (SigPnd in its status): put
// there on every thread of a process that was killed or called
// exit_group, and taken off by the thread as it begins to exit. Nothing
// blocks or catches it: such a thread exits.
constexpr unsigned long long kill_pending = 1ULL << (SIGKILL - 1);

// Whether thread `tid` of `pid` has begun to exit or is bound to: true
// too when it has gone since its process's threads were listed.
bool thread_going(pid_t pid, const char* tid) noexcept {
  char path[128];
  std::snprintf(path, sizeof path, "/proc/%d/task/%s/stat", static_cast<int>(pid), tid);
  char text[1024];
  bool ended = false;
  const char* p = stat_fields(path, text, ended);
  if (p == nullptr) return ended;
  // Fields counted after the parenthesis: 3 the state, 9 the flags.
  for (int field = 2; field < 9 && p != nullptr; ++field) p = std::strchr(p + 1, ' ');
  if (p == nullptr) return false;
  if ((std::strtoul(p + 1, nullptr, 10) & thread_exiting) != 0) return true;
  std::snprintf(path, sizeof path, "/proc/%d/task/%s/status", static_cast<int>(pid), tid);
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT || errno == ESRCH;
  char status[4096];
  const auto n = ::read(fd, status, sizeof status - 1);
  const int error = errno;
  ::close(fd);
  if (n <= 0) return n < 0 && error == ESRCH;
  status[n] = '\0';
  const char* pending = std::strstr(status, "\nSigPnd:");
  return pending != nullptr && (std::strtoull(pending + 9, nullptr, 16) & kill_pending) != 0;
}

// Whether every thread of `pid` has begun to exit or is bound to: false
// when one has not, or when /proc could not tell. The leader alone does
// not tell: a leader that called pthread_exit is exiting while the other
// threads run on, and a killed process's leader may be a zombie while the
// others have yet to notice the kill.
bool every_thread_going(pid_t pid) noexcept {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/task", static_cast<int>(pid));
  DIR* const dir = ::opendir(path);
  if (dir == nullptr) return false;
  bool going = true;
  int threads = 0;
  while (const dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] < '0' || entry->d_name[0] > '9') continue;
    ++threads;
    if (!thread_going(pid, entry->d_name)) {
      going = false;
      break;
    }
  }
  ::closedir(dir);
  return going && threads > 0;
}

}  // namespace

bool has_ended_or_is_ending(pid_t pid, std::uint64_t start_time) noexcept {
  if (has_ended(pid, start_time)) return true;
  // The threads read may be those of a process that took the pid since
  // the one meant ended; asked again after, the start time tells.
  return every_thread_going(pid) || has_ended(pid, start_time);
}

std::uint64_t own_start_time() noexcept {
  auto t = cached_start_time.load(std::memory_order_relaxed);
  if (t == 0) {
    t = start_time_of(this_process()).value_or(0);
    cached_start_time.store(t, std::memory_order_relaxed);
  }
  return t;
}

std::uint64_t pid_namespace() noexcept {
  // A process does not change namespaces; the children it forks share its.
  static const std::uint64_t inode = [] {
    struct stat st {};
    return ::stat("/proc/self/ns/pid", &st) == 0 ? static_cast<std::uint64_t>(st.st_ino) : std::uint64_t{0};
  }();
  return inode;
}

long pid_max() noexcept {
  const int fd = ::open("/proc/sys/kernel/pid_max", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char text[32];
  const auto n = ::read(fd, text, sizeof text - 1);
  ::close(fd);
  if (n <= 0) return -1;
  text[n] = '\0';
  const long value = std::strtol(text, nullptr, 10);
  return value > 0 ? value : -1;
}

COHORT_FORKED_CHILD_PATH pid_t this_process() noexcept {
  pid_t pid = cached_pid.load(std::memory_order_relaxed);
  if (pid == 0) {
    // Raw: a forked child asks first thing, and libc's wrapper would be a
    // page of code for it to fault in.
    pid = static_cast<pid_t>(raw_syscall(SYS_getpid));
    cached_pid.store(pid, std::memory_order_relaxed);
  }
  return pid;
}

COHORT_FORKED_CHILD_PATH void forget_process_id() noexcept {
  cached_pid.store(0, std::memory_order_relaxed);
  cached_start_time.store(0, std::memory_order_relaxed);
}

COHORT_FORKED_CHILD_PATH int running_rank() noexcept { return rank_of_this_process; }

COHORT_FORKED_CHILD_PATH void set_running_rank(int rank) noexcept { rank_of_this_process = rank; }

}  // namespace cohort::os

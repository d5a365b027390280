// Looking at processes from the outside, as a test must.
#pragma once

#include "support/read_file.hpp"

#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <optional>
#include <system_error>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace cohort::test {

/// The state letter of `pid` in /proc/<pid>/stat; '\0' when it is gone.
inline char state_of(pid_t pid) {
  const std::string line = read_file("/proc/" + std::to_string(pid) + "/stat");
  auto close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() ? line[close + 2] : '\0';
}

/// The field `name` of `pid` in /proc/<pid>/status ("VmSize", "SigBlk"):
/// the text after its colon; nullopt when the process is gone or has no
/// such field.
inline std::optional<std::string> status_field(pid_t pid, std::string_view name) {
  std::istringstream status(read_file("/proc/" + std::to_string(pid) + "/status"));
  for (std::string line; std::getline(status, line);) {
    if (line.size() > name.size() && line.starts_with(name) && line[name.size()] == ':') {
      return line.substr(name.size() + 1);
    }
  }
  return std::nullopt;
}

/// The signal mask `name` ("SigBlk", "SigPnd", "ShdPnd", "SigIgn",
/// "SigCgt") of `pid` in /proc/<pid>/status, bit sig - 1 for signal sig;
/// nullopt when it is gone.
inline std::optional<std::uint64_t> signal_mask(pid_t pid, std::string_view name) {
  const auto mask = status_field(pid, name);
  if (!mask) return std::nullopt;
  return std::stoull(*mask, nullptr, 16);
}

/// The command line of `pid` (/proc/<pid>/cmdline), its arguments
/// separated by spaces; empty when it is gone.
inline std::string command_line(pid_t pid) {
  std::string args = read_file("/proc/" + std::to_string(pid) + "/cmdline");
  std::replace(args.begin(), args.end(), '\0', ' ');
  return args;
}

/// Whether `pid` exists and is not a zombie.
inline bool alive(pid_t pid) {
  const char state = state_of(pid);
  return state != '\0' && state != 'Z';
}

/// A child of this process, from /proc/<pid>/stat and cmdline.
struct child_entry {
  pid_t pid;
  char state;
  unsigned long long start_time;
  bool server_image;  ///< its command line is the forkserver's: the server or a rank it made
};

inline std::vector<child_entry> child_entries() {
  std::vector<child_entry> found;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const auto name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string line = read_file(entry.path() / "stat");
    const auto close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 2));
    child_entry c{std::stoi(name), 0, 0, false};
    pid_t ppid = 0;
    rest >> c.state >> ppid;
    if (ppid != ::getpid()) continue;
    std::string skip;
    for (int field = 5; field < 22; ++field) rest >> skip;  // to field 22, the start time
    rest >> c.start_time;
    c.server_image = command_line(c.pid).find("--cohort-forkserver") != std::string::npos;
    found.push_back(c);
  }
  return found;
}

/// This process's forkserver: of the children with the server's command
/// line that are not zombies, the one started first (its ranks are forks
/// of it, started after). 0 when there is none.
inline pid_t forkserver_of_self() {
  pid_t server = 0;
  unsigned long long first = 0;
  for (const auto& c : child_entries()) {
    if (c.server_image && c.state != 'Z' && (server == 0 || c.start_time < first)) {
      server = c.pid;
      first = c.start_time;
    }
  }
  return server;
}

/// Processes whose parent is this one, zombies included, but the
/// forkserver, which stays for the next start. With `all`, every one.
inline std::vector<pid_t> children_of_self(bool all = false) {
  const pid_t server = all ? 0 : forkserver_of_self();
  std::vector<pid_t> found;
  for (const auto& c : child_entries()) {
    if (c.pid != server) found.push_back(c.pid);
  }
  return found;
}

/// Number of descriptors this process has open.
inline int open_fd_count() {
  int n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

/// How many of this process's mappings (lines of /proc/self/maps) name
/// `what`: a memfd's name, a file's path.
inline int mappings_naming(std::string_view what) {
  std::ifstream maps("/proc/self/maps");
  int n = 0;
  for (std::string line; std::getline(maps, line);) n += line.find(what) != std::string::npos ? 1 : 0;
  return n;
}

/// How many of this process's descriptors link to what starts with
/// `prefix` ("socket:", "pipe:").
inline int descriptors_linking_to(std::string_view prefix) {
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ignored;
    n += std::filesystem::read_symlink(entry.path(), ignored).string().starts_with(prefix) ? 1 : 0;
  }
  return n;
}

/// The descriptors process `pid` holds on io_uring instances.
inline std::vector<int> ring_descriptors(pid_t pid) {
  std::vector<int> rings;
  const auto dir = std::filesystem::path("/proc") / std::to_string(pid) / "fd";
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    std::error_code ec;
    if (std::filesystem::read_symlink(entry.path(), ec).string() == "anon_inode:[io_uring]") {
      rings.push_back(std::stoi(entry.path().filename().string()));
    }
  }
  return rings;
}

/// The requests this process has submitted to the io_uring instances it
/// holds now: their submission queues' tails (SqTail in fdinfo), summed.
inline unsigned long ring_submissions() {
  unsigned long total = 0;
  for (int fd : ring_descriptors(::getpid())) {
    std::ifstream info("/proc/self/fdinfo/" + std::to_string(fd));
    for (std::string line; std::getline(info, line);) {
      if (line.rfind("SqTail:", 0) == 0) total += std::stoul(line.substr(7));
    }
  }
  return total;
}

/// FDSize in /proc/<pid>/status: the slots of its descriptor table; -1 when
/// unread. Only system calls and plain loops, for a vfork-style child's
/// before_exec.
inline long table_size(pid_t pid) noexcept {
  char digits[16];
  int count = 0;
  for (auto left = static_cast<unsigned>(pid); count == 0 || left > 0; left /= 10) {
    digits[count++] = static_cast<char>('0' + left % 10);
  }
  char path[64] = "/proc/";
  int end = 6;
  while (count > 0) path[end++] = digits[--count];
  for (const char* tail = "/status"; *tail != '\0';) path[end++] = *tail++;
  path[end] = '\0';
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char text[4096];
  const ssize_t n = ::read(fd, text, sizeof text - 1);
  ::close(fd);
  if (n <= 0) return -1;
  text[n] = '\0';
  const char* at = std::strstr(text, "FDSize:");
  if (at == nullptr) return -1;
  long size = 0;
  for (at += 7; *at == ' ' || *at == '\t'; ++at) {
  }
  for (; *at >= '0' && *at <= '9'; ++at) size = size * 10 + (*at - '0');
  return size;
}

/// Sets the soft RLIMIT_NOFILE for a scope (never above the hard limit),
/// and puts it back: lowered, for a test of running out; raised, for a test
/// that needs more descriptors than a low soft limit allows (a process may
/// always lower its own soft limit, and raise it up to the hard one).
struct nofile_limit {
  rlimit saved{};
  explicit nofile_limit(rlim_t soft) {
    ::getrlimit(RLIMIT_NOFILE, &saved);
    rlimit next = saved;
    next.rlim_cur = std::min(soft, saved.rlim_max);
    if (::setrlimit(RLIMIT_NOFILE, &next) != 0) throw std::system_error(errno, std::system_category(), "setrlimit");
  }
  nofile_limit(const nofile_limit&) = delete;
  nofile_limit& operator=(const nofile_limit&) = delete;
  ~nofile_limit() { ::setrlimit(RLIMIT_NOFILE, &saved); }
  /// A soft limit of at least `soft` for a scope: one already higher stays.
  static nofile_limit at_least(rlim_t soft) {
    rlimit now{};
    ::getrlimit(RLIMIT_NOFILE, &now);
    return nofile_limit(std::max(soft, now.rlim_cur));
  }
  rlim_t current() const {
    rlimit now{};
    ::getrlimit(RLIMIT_NOFILE, &now);
    return now.rlim_cur;
  }
};

/// Exactly `free` more descriptors to be had for a scope (fewer where this
/// process holds descriptors above the limit): the soft limit lowered to
/// the open ones plus `free`, the gaps below it filled with /dev/null, and
/// those closed again at its end.
struct descriptors_left {
  nofile_limit limit;
  std::vector<int> filler;
  explicit descriptors_left(int free) : limit(static_cast<rlim_t>(open_fd_count() + free)) {
    for (int fd; (fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) filler.push_back(fd);
    for (int i = 0; i < free && !filler.empty(); ++i) {
      ::close(filler.back());
      filler.pop_back();
    }
  }
  descriptors_left(const descriptors_left&) = delete;
  descriptors_left& operator=(const descriptors_left&) = delete;
  ~descriptors_left() {
    for (int fd : filler) ::close(fd);
  }
};

/// A process that traces `pid` (PTRACE_SEIZE) and never waits for it. A
/// tracer collects a traced process's exit before its parent can: once
/// `pid` dies, its parent cannot reap it until the holder ends. Not while
/// it runs: seized, it goes on. The holder ends by end() or the destructor
/// (SIGKILL, reaped), else by itself after `lifetime_s` seconds. It stays
/// in this process's group, so no group sweep takes it for a rank's. With
/// `stop_at_exit` (PTRACE_O_TRACEEXIT, as strace traces) the process stops
/// as it begins to exit, before its descriptors close or it leaves its
/// process group: it stays there, alive, until the holder ends.
class exit_holder {
 public:
  explicit exit_holder(pid_t pid, unsigned lifetime_s = 20, bool stop_at_exit = false) {
    int ends[2];
    if (::pipe2(ends, O_CLOEXEC) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(ends[0]);
      ::alarm(lifetime_s);
      // Refused while the process's own checks (Yama) would refuse it; a
      // few tries cover a target that allows it only as it starts.
      char held = 'n';
      for (int tries = 0; tries < 100; ++tries) {
        if (::ptrace(PTRACE_SEIZE, pid, nullptr, stop_at_exit ? PTRACE_O_TRACEEXIT : 0) == 0) {
          held = 'y';
          break;
        }
        if (errno != EPERM) break;
        ::usleep(10000);
      }
      (void)!::write(ends[1], &held, 1);
      for (;;) ::pause();
    }
    ::close(ends[1]);
    char held = 'n';
    if (pid_ > 0 && ::read(ends[0], &held, 1) == 1) held_ = held == 'y';
    ::close(ends[0]);
  }
  exit_holder(const exit_holder&) = delete;
  exit_holder& operator=(const exit_holder&) = delete;
  ~exit_holder() { end(); }

  /// Whether ptrace let it hold the process (a seccomp profile or Yama's
  /// scope may refuse).
  bool held() const noexcept { return held_; }
  void end() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
  bool held_ = false;
};

/// CPU time this process has used, all threads.
inline std::chrono::nanoseconds process_cpu_time() {
  timespec t{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return std::chrono::seconds(t.tv_sec) + std::chrono::nanoseconds(t.tv_nsec);
}

inline int lowest_free_descriptor() {
  const int probe = ::dup(0);
  ::close(probe);
  return probe;
}

/// Makes system call `number` fail with `error` in this process and what
/// it starts from now on (a seccomp filter), as an older kernel or a
/// container's profile would; false where filters are refused.
inline bool refuse_system_call(long number, int error) {
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, static_cast<unsigned>(number), 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (static_cast<unsigned>(error) & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog program{static_cast<unsigned short>(std::size(filter)), filter};
  return ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 && ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) == 0;
}

}  // namespace cohort::test

// Launching a child: everything is prepared in the parent, then a
// vfork-style clone (CLONE_VM | CLONE_VFORK | CLONE_PIDFD) runs a short,
// allocation-free child routine that sets the process up and execs. The
// parent thread sleeps until the exec or the child's _exit, and the child
// writes its failure, if any, into the shared plan: a failed launch is known
// before spawn returns, with no pipe to read and no zombie left.
#include "cohort/spawn.hpp"

#include "config.hpp"
#include "process/child_state.hpp"
#include "os/descriptor_limit.hpp"
#include "process/launch.hpp"
#include "os/open_without_waiting.hpp"
#include "os/owned_fd.hpp"
#include "os/process_identity.hpp"
#include "os/clone3.hpp"
#include "os/raw_syscall.hpp"
#include "uring/service.hpp"

#include <asio/io_context.hpp>

#include <fmt/format.h>

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>

extern char** environ;

namespace cohort {
namespace detail {
namespace {

using failure = launch_failure;

constexpr int all_signals = 64;

bool failed(launch_plan& p, stage where, int error = errno) {
  p.failed_at = where;
  p.error = error;
  return false;
}

constexpr std::uint64_t bit(int sig) { return std::uint64_t{1} << (sig - 1); }

// A signal that is handled here, or ignored where a shell would reset it.
bool needs_reset(int sig) noexcept {
  struct sigaction sa {};
  if (::sigaction(sig, nullptr, &sa) != 0) return false;
  const bool handled = sa.sa_handler != SIG_DFL && sa.sa_handler != SIG_IGN;
  return handled || (sa.sa_handler == SIG_IGN && (sig == SIGPIPE || sig == SIGXFSZ));
}

// The mask on the line of /proc/<pid>/status that starts with `name`
// (16 hex digits, a bit per signal); false when there is none.
COHORT_FORKED_CHILD_PATH bool status_mask(const char* text, std::size_t size, std::string_view name,
                                          std::uint64_t& mask) noexcept {
  for (std::size_t line = 0; line < size;) {
    std::size_t end = line;
    while (end < size && text[end] != '\n') ++end;
    if (end - line > name.size() && std::string_view(text + line, name.size()) == name) {
      std::size_t at = line + name.size();
      while (at < end && (text[at] == ' ' || text[at] == '\t')) ++at;
      if (at == end || end - at > 16) return false;
      mask = 0;
      for (; at < end; ++at) {
        const char c = text[at];
        const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (digit < 0) return false;
        mask = mask << 4 | static_cast<std::uint64_t>(digit);
      }
      return end < size;  // a whole line
    }
    line = end + 1;
  }
  return false;
}

// Reads `path`, a /proc status file, into `text`; how many bytes came (0
// where it cannot be read: no /proc).
COHORT_FORKED_CHILD_PATH std::size_t read_status(const char* path, char (&text)[4096]) noexcept {
  const long fd = ::syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  std::size_t size = 0;
  for (long n = 0; size < sizeof text; size += static_cast<std::size_t>(n)) {
    n = ::syscall(SYS_read, fd, text + size, sizeof text - size);
    if (n <= 0) break;
  }
  ::syscall(SYS_close, fd);
  return size;
}

// This process's handled (SigCgt) and ignored (SigIgn) signals, from the
// kernel's account of it in /proc/self/status: three system calls, where
// asking each signal takes 64, each of which a virtual machine can make
// dear (about 1.2 us each against 13 us for the read, on one such). False
// where it cannot be read (no /proc).
COHORT_FORKED_CHILD_PATH bool dispositions_from_status(std::uint64_t& handled, std::uint64_t& ignored) noexcept {
  char text[4096];  // about 1.5 KiB; the masks come in its first half
  const std::size_t size = read_status("/proc/self/status", text);
  return status_mask(text, size, "SigCgt:", handled) && status_mask(text, size, "SigIgn:", ignored);
}

// The umask on the Umask line of a status file (its second line, four octal
// digits); -1 where there is none.
int status_umask(std::string_view status) noexcept {
  const auto at = status.find("\nUmask:\t");
  if (at == std::string_view::npos) return -1;
  int mask = 0;
  for (char c : status.substr(at + 8, 4)) {
    if (c < '0' || c > '7') return -1;
    mask = mask * 8 + (c - '0');
  }
  return mask;
}

// Those ignored where a shell would reset them.
constexpr std::uint64_t shell_resets = bit(SIGPIPE) | bit(SIGXFSZ);

// Sets, in a child about to be set up, what differs of the requester's
// resource limits, nice value and CPU affinity from its maker's.
COHORT_FORKED_CHILD_PATH bool take_requester_state(launch_plan& p) noexcept {
  const requester_state& want = *p.requester;
  const requester_state& have = *p.maker;
  if (want.umask >= 0 && want.umask != have.umask) os::raw_syscall(SYS_umask, want.umask);
  for (std::size_t r = 0; r < want.limits.size(); ++r) {
    const rlimit& w = want.limits[r];
    if (w.rlim_cur == have.limits[r].rlim_cur && w.rlim_max == have.limits[r].rlim_max) continue;
    const long rc = os::raw_syscall(SYS_prlimit64, 0, static_cast<long>(r), reinterpret_cast<long>(&w), 0);
    if (rc < 0) return failed(p, stage::inherit, static_cast<int>(-rc));
  }
  if (want.nice != have.nice) {
    const long rc = os::raw_syscall(SYS_setpriority, PRIO_PROCESS, 0, want.nice);
    if (rc < 0) return failed(p, stage::inherit, static_cast<int>(-rc));
  }
  const std::size_t words = want.affinity_words;
  if (words != 0 && (words != have.affinity_words || !std::equal(want.affinity.begin(), want.affinity.begin() + words,
                                                                  have.affinity.begin()))) {
    const long rc = os::raw_syscall(SYS_sched_setaffinity, 0, static_cast<long>(words * sizeof(std::uint64_t)),
                                    reinterpret_cast<long>(want.affinity.data()));
    if (rc < 0) return failed(p, stage::inherit, static_cast<int>(-rc));
  }
  return true;
}

}  // namespace

COHORT_FORKED_CHILD_PATH std::uint64_t signals_to_reset() noexcept {
  std::uint64_t handled = 0, ignored = 0;
  if (dispositions_from_status(handled, ignored)) return handled | (ignored & shell_resets);
  std::uint64_t set = 0;
  for (int sig = 1; sig <= all_signals; ++sig) {
    if (needs_reset(sig)) set |= bit(sig);
  }
  return set;
}

// One read of the calling thread's status gives the ignored signals (the
// process's) and its umask (a thread may have one of its own, after
// unshare(CLONE_FS); umask(2) alone would set it, for a moment, under the
// feet of other threads).
requester_state current_requester_state() noexcept {
  requester_state s;
  char text[4096];
  const std::size_t size = read_status("/proc/thread-self/status", text);
  s.umask = status_umask(std::string_view(text, size));
  if (!status_mask(text, size, "SigIgn:", s.ignored)) {
    s.ignored = 0;
    for (int sig = 1; sig <= all_signals; ++sig) {
      struct sigaction sa {};
      if (::sigaction(sig, nullptr, &sa) == 0 && sa.sa_handler == SIG_IGN) s.ignored |= bit(sig);
    }
  }
  for (std::size_t r = 0; r < s.limits.size(); ++r) {
    if (::getrlimit(static_cast<__rlimit_resource>(r), &s.limits[r]) != 0) s.limits[r] = {RLIM_INFINITY, RLIM_INFINITY};
  }
  errno = 0;
  const int nice = ::getpriority(PRIO_PROCESS, 0);  // the calling thread's
  s.nice = errno == 0 ? nice : 0;
  // The system call says how many bytes of the mask it wrote; glibc's
  // wrapper does not.
  const long n = ::syscall(SYS_sched_getaffinity, 0, sizeof s.affinity, s.affinity.data());
  s.affinity_words = n > 0 ? static_cast<std::size_t>(n) / sizeof(std::uint64_t) : 0;
  return s;
}

namespace {

// Whether an exec would leave nothing of descriptor `fd`: it is closed, or
// marked close-on-exec.
bool closes_at_exec(int fd) noexcept {
  const long flags = os::raw_syscall(SYS_fcntl, fd, F_GETFD);
  return flags < 0 || (flags & FD_CLOEXEC) != 0;
}

}  // namespace

void close_streams_an_exec_would(launch_plan& p) noexcept {
  for (int target = 0; target < 3; ++target) {
    auto& src = p.source[static_cast<std::size_t>(target)];
    if ((src == -1 || src == target) && closes_at_exec(target)) src = closed_stream;
  }
  if (p.source[2] == 1 && p.source[1] == closed_stream) p.source[2] = closed_stream;  // stderr as stdout
}

COHORT_FORKED_CHILD_PATH bool set_up_child(launch_plan& p) noexcept {
  // Handlers of the parent must not run here (they would run on the
  // parent's memory); ignored SIGPIPE/SIGXFSZ are reset as a shell would.
  // Taken here, not from the parent before the clone, unless the parent
  // says: this child's dispositions are those of the moment of the clone,
  // and another thread may have set a handler since the parent looked.
  // Where the clone reset the handlers itself, only the two ignored
  // signals are left, set to their defaults whatever they were (a no-op
  // for either one that is not ignored).
  // (glibc's sigaction is a plain system call wrapper; it refuses glibc's
  // own internal signals, which stay blocked until the exec.)
  std::uint64_t reset = p.handlers_cleared          ? shell_resets
                        : p.reset_signals != nullptr ? *p.reset_signals
                                                     : signals_to_reset();
  // A child of another process than its requester ignores what the
  // requester ignores, as the requester's own child would, and nothing else.
  std::uint64_t ignore = 0;
  if (p.requester != nullptr && p.maker != nullptr) {
    const std::uint64_t wanted = p.requester->ignored & ~shell_resets;
    reset |= p.maker->ignored & ~wanted;
    ignore = wanted & ~p.maker->ignored;
  }
  for (int sig = 1; sig <= all_signals; ++sig) {
    if (((reset | ignore) & bit(sig)) != 0) {
      struct sigaction to {};
      to.sa_handler = (ignore & bit(sig)) != 0 ? SIG_IGN : SIG_DFL;
      ::sigaction(sig, &to, nullptr);
    }
  }
  // From here by raw system calls: each wrapper of libc would be one more
  // page of code for a forked child to fault in. `done` records a call's
  // failure as failed() does.
  const auto done = [&p](long result, stage where) {
    return result >= 0 || failed(p, where, static_cast<int>(-result));
  };
  const sigset_t none{};
  if (!done(os::raw_syscall(SYS_rt_sigprocmask, SIG_SETMASK, reinterpret_cast<long>(&none), 0, _NSIG / 8),
            stage::signals)) {
    return false;
  }
  if (p.requester != nullptr && p.maker != nullptr && !take_requester_state(p)) return false;
  if (p.new_session) {
    if (!done(os::raw_syscall(SYS_setsid), stage::setsid)) return false;
  } else if (p.new_group && !done(os::raw_syscall(SYS_setpgid, 0, 0), stage::setpgid)) {
    return false;
  }
  if (p.death_signal != 0) {
    if (!done(os::raw_syscall(SYS_prctl, PR_SET_PDEATHSIG, p.death_signal), stage::pdeathsig)) return false;
    // The parent already gone: its pid is not this one's parent's. A parent
    // in another pid namespace (this one made by unshare(CLONE_NEWPID)) is
    // pid 0 here, and cannot be told.
    const long parent = os::raw_syscall(SYS_getppid);
    if (parent != 0 && parent != p.parent) return failed(p, stage::pdeathsig, ESRCH);
  }
  for (int target = 0; target < 3; ++target) {
    const int src = p.source[static_cast<std::size_t>(target)];
    // dup2's way: a descriptor already in place is left as it is.
    if (src >= 0 && src != target && !done(os::raw_syscall(SYS_dup3, src, target, 0), stage::dup2)) return false;
    if (src == closed_stream) os::raw_syscall(SYS_close, target);
  }
  if (p.cwd != nullptr && !done(os::raw_syscall(SYS_chdir, reinterpret_cast<long>(p.cwd)), stage::chdir)) return false;
  // Told before anything of the caller's runs, and closed at once: the
  // socket is the launcher's, and a child holding it would hide the
  // launcher's end from its reader.
  if (p.announce_fd >= 0) {
    const start_note note{'+', {}, static_cast<std::int32_t>(os::raw_syscall(SYS_getpid))};
    p.announced = send_start_note(p.announce_fd, note);
    os::raw_syscall(SYS_close, p.announce_fd);
  }
  if (p.close_fds && p.close_now) {
    if (const int error = os::close_all_but(p.keep, p.keep_count); error != 0) return failed(p, stage::fds, error);
  } else if (p.close_fds && os::raw_syscall(SYS_close_range, 3, ~0U, config::close_range_cloexec) != 0) {
    // No CLOEXEC for close_range (Linux < 5.11): each number below the limit.
    rlimit lim{};
    const bool known = os::raw_syscall(SYS_prlimit64, 0, RLIMIT_NOFILE, 0, reinterpret_cast<long>(&lim)) == 0;
    const int limit = known ? static_cast<int>(std::min<rlim_t>(lim.rlim_cur, 1 << 20)) : 1 << 20;
    for (int fd = 3; fd < limit; ++fd) os::raw_syscall(SYS_fcntl, fd, F_SETFD, FD_CLOEXEC);
  }
  for (std::size_t i = 0; i < p.keep_count; ++i) {
    if (!done(os::raw_syscall(SYS_fcntl, p.keep[i], F_SETFD, 0), stage::fds)) return false;
  }
  if (p.hook != nullptr) {
    if (int error = p.hook(p.hook_context); error != 0) {
      // -1 as C's calls fail, errno saying why (an errno of 0 as EINVAL);
      // another negative value as the kernel's, -errno.
      if (error == -1) error = errno > 0 ? errno : EINVAL;
      else if (error < 0) error = -error;
      p.failed_at = stage::hook;
      p.error = error;
      return false;
    }
  }
  return true;
}

namespace {

// Runs in the vfork-style child, on its own stack, sharing the parent's
// memory: only system calls, no allocation, no locks.
int exec_routine(void* arg) {
  auto& p = *static_cast<launch_plan*>(arg);
  if (set_up_child(p)) {
    p.exec_reached = true;
    ::execve(p.path, p.argv, p.envp);
    p.failed_at = stage::exec;
    p.error = errno;
  }
  ::_exit(127);
}

// The child routine's stack: one per spawning thread, reused, with a guard
// region below it. The thread sleeps while its child uses it. A child that
// overruns it dies of SIGSEGV before its exec (start_exec tells). The child
// shares this process's memory: a frame that reached past the guard would
// write into whatever mapping lies below, unseen (a hook's large buffer,
// written from its low end first, in code built without stack-clash
// probes). So the guard is far larger than a page: address space only,
// never backed by memory.
class child_stack {
 public:
  static constexpr std::size_t guard = 1024 * 1024;
  static constexpr std::size_t size = guard + 60 * 1024;
  /// What of it the before_exec hook may use, as spawn_options says: the
  /// usable part less the frames of the set-up below the hook (about
  /// 1 KiB), with room to spare.
  static constexpr std::size_t for_hook = 48 * 1024;
  child_stack() {
    void* m = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (m == MAP_FAILED || ::mprotect(m, guard, PROT_NONE) != 0) {
      const int error = errno;
      if (m != MAP_FAILED) ::munmap(m, size);
      throw std::system_error(error, std::system_category(), "cohort::spawn: mapping the child's stack");
    }
    base_ = m;
  }
  ~child_stack() { ::munmap(base_, size); }
  void* top() const { return static_cast<char*>(base_) + size; }
  /// The usable part, above the guard page.
  void* bottom() const { return static_cast<char*>(base_) + guard; }
  std::size_t usable_size() const { return size - guard; }

 private:
  void* base_;
};

// execvp's search, done in the parent so a missing program is a clear error
// before anything starts. The child execs what it finds after moving to
// `cwd`, as execvp there would search: a relative entry of PATH (or an
// empty one, the current directory) is looked at from `cwd`.
std::string find_program(const std::string& program, const environment& env, const std::filesystem::path& cwd,
                         failure& f) {
  if (program.empty()) {
    f = {stage::path_lookup, ENOENT, ""};
    return {};
  }
  if (program.find('/') != std::string::npos) return program;
  // The first file found that cannot be executed (a directory, a file
  // without execute permission): execvp goes on past it, and reports it
  // (EACCES) when nothing else is found. Else the first path that could
  // not be looked at for another reason than its absence (a name too
  // long, ENAMETOOLONG; a loop of links), which says more than ENOENT. A
  // folder of PATH this user may not search (EACCES) holds nothing found.
  std::string refused;
  failure unseen{stage::path_lookup, ENOENT, ""};
  for (const auto& candidate : env.path_candidates(program)) {
    const std::string seen_from_here = cwd.empty() || candidate.front() == '/' ? candidate : (cwd / candidate).string();
    if (is_executable_file(seen_from_here)) return candidate;
    if (!refused.empty()) continue;
    if (::access(seen_from_here.c_str(), F_OK) == 0) {
      refused = seen_from_here;
    } else if (unseen.error == ENOENT && errno != ENOENT && errno != ENOTDIR && errno != EACCES) {
      unseen = {stage::path_lookup, errno, seen_from_here};
    }
  }
  f = refused.empty() ? unseen : failure{stage::path_lookup, EACCES, refused};
  return {};
}

// The first 256 bytes of `file`, as much as the kernel reads for a #!
// line; nullopt where it cannot be read (gone, or not this user's to read).
std::optional<std::string> head_of(const std::string& file) {
  const os::owned_fd fd(::open(file.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0) return std::nullopt;
  std::array<char, 256> head{};
  const ssize_t got = ::read(fd.get(), head.data(), head.size());
  return std::string(head.data(), got > 0 ? static_cast<std::size_t>(got) : 0);
}

// Why an execve gave ENOENT when the file (whose first bytes are `text`)
// is there: the interpreter it asks for is missing, the one its #! line
// names or an ELF program's loader.
std::string missing_interpreter(std::string_view text) {
  if (text.starts_with("#!")) {
    // The kernel ends the name at a blank or at the line's end, and no
    // sooner: a carriage return is part of it.
    const std::size_t begin = text.find_first_not_of(" \t", 2);
    const std::size_t end = text.find_first_of(" \t\n", begin);
    std::string_view interpreter = begin == std::string_view::npos ? "" : text.substr(begin, end - begin);
    if (interpreter.ends_with('\r')) {
      interpreter.remove_suffix(1);
      return fmt::format("its #! line ends in a carriage return (DOS line endings), so the interpreter looked for is "
                         "'{}\\r', which is missing",
                         interpreter);
    }
    if (::access(std::string(interpreter).c_str(), F_OK) == 0) {
      return fmt::format("the interpreter its #! line names, '{}', is there, but one it asks for in turn is missing",
                         interpreter);
    }
    return fmt::format("the interpreter its #! line names, '{}', is missing", interpreter);
  }
  if (text.starts_with("\x7f" "ELF")) return "the program loader (ELF interpreter) it names is missing";
  return "the file is there; the interpreter it asks for is missing";
}

// Why the arguments and environment were too long for execve (E2BIG), as
// the kernel judges: one string over MAX_ARG_STRLEN (32 pages), or all of
// them with their pointers over the room it gives them: a quarter of the
// stack limit, at most 6 MiB (3/4 of _STK_LIM) and at least ARG_MAX
// (128 KiB). Empty where neither is seen here (a before_exec hook that
// lowered the stack limit).
std::string too_long_for_exec(char* const* argv, char* const* envp) {
  const std::size_t max_string = 32 * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  std::size_t total = 0;
  for (char* const* list : {argv, envp}) {
    for (std::size_t i = 0; list[i] != nullptr; ++i) {
      const std::string_view text(list[i]);
      if (text.size() + 1 > max_string) {
        const std::string what = list == argv ? fmt::format("argument {}", i)
                                              : fmt::format("environment variable {}", text.substr(0, text.find('=')));
        return fmt::format("{} is {} bytes, over the kernel's limit of {} bytes for one string (MAX_ARG_STRLEN)",
                           what, text.size() + 1, max_string);
      }
      total += text.size() + 1 + sizeof(char*);
    }
  }
  std::size_t room = 6 * 1024 * 1024;
  if (rlimit stack{}; ::getrlimit(RLIMIT_STACK, &stack) == 0 && stack.rlim_cur != RLIM_INFINITY) {
    room = std::min<std::size_t>(room, stack.rlim_cur / 4);
  }
  room = std::max<std::size_t>(room, 128 * 1024);
  if (total <= room) return {};
  return fmt::format("the arguments and environment take {} bytes with their pointers, over the {} bytes the kernel "
                     "gives them (a quarter of the stack limit RLIMIT_STACK, at most 6 MiB, at least ARG_MAX)",
                     total, room);
}

// What an execve's error leaves unsaid, for `file` (the path as this
// process sees it): a missing interpreter (ENOENT with the file there), a
// directory (EACCES), a file of no executable format (ENOEXEC: no shell
// runs it, unlike execvp's fallback), arguments too long (E2BIG). Worked
// out in the parent once the child has failed.
std::string exec_failure(const std::string& file, int error, char* const* argv, char* const* envp) {
  std::error_code ec;
  switch (error) {
    case ENOENT: {
      const auto head = head_of(file);
      return head ? missing_interpreter(*head) : "";
    }
    case EACCES: return std::filesystem::is_directory(file, ec) ? "it is a directory" : "";
    case ENOEXEC: {
      const auto head = head_of(file);
      if (head && head->starts_with("#!")) return "its #! line names no interpreter, or one of no executable format";
      return "no #! line and not an executable format (cohort does not run such a file with /bin/sh, as execvp "
             "would)";
    }
    case E2BIG: return too_long_for_exec(argv, envp);
    default: return {};
  }
}

int open_cloexec(const std::filesystem::path& path, int flags, failure& f) {
  int fd = ::open(path.c_str(), flags | O_CLOEXEC, 0644);
  if (fd < 0) f = {stage::open_file, errno, path.string()};
  return fd;
}

// Makes sure the descriptor given to the child is >= 3, so placing one
// stream never overwrites the source of another.
int above_stdio(int fd, std::vector<os::owned_fd>& owned, failure& f) {
  if (fd >= 3) return fd;
  int copy = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
  if (copy < 0) {
    f = {stage::dup2, errno, ""};
    return -1;
  }
  owned.emplace_back(copy);
  return copy;
}

struct pipe_ends {
  os::owned_fd parent;
  int target = -1;  // 0, 1 or 2
};

// A string the kernel reads up to its first NUL: refused, where it would
// be cut short without a word.
void refuse_nul(const std::string& text, std::string_view what) {
  if (text.find('\0') != std::string::npos) {
    throw std::invalid_argument(fmt::format("cohort::spawn: {} holds NUL", what));
  }
}

// Resolves one stream's option into the descriptor the child gets.
// Returns -1 for "leave it", sets `f` on failure.
int prepare_stream(const stdio& option, int target, std::vector<os::owned_fd>& owned,
                   std::vector<pipe_ends>& pipes, failure& f) {
  return std::visit(
      [&](const auto& kind) -> int {
        using K = std::decay_t<decltype(kind)>;
        if constexpr (std::is_same_v<K, stdio::inherit_t>) {
          return -1;
        } else if constexpr (std::is_same_v<K, stdio::stdout_t>) {
          if (target != 2) throw std::invalid_argument("cohort::spawn: same_as_stdout() is for stderr only");
          return 1;  // placed after stdout
        } else if constexpr (std::is_same_v<K, stdio::null_t>) {
          int fd = open_cloexec("/dev/null", target == 0 ? O_RDONLY : O_WRONLY, f);
          if (fd < 0) return -1;
          owned.emplace_back(fd);
          return above_stdio(fd, owned, f);
        } else if constexpr (std::is_same_v<K, stdio::file_t>) {
          refuse_nul(kind.path.string(), "a stream's file path");
          if (target == 0 && kind.flags != 0 && (kind.flags & O_ACCMODE) == O_WRONLY) {
            throw std::invalid_argument("cohort::spawn: stdin from a file opened for writing only (stdio::append?)");
          }
          int fd = open_stream_file(kind, target);
          if (fd < 0) {
            f = {stage::open_file, errno, kind.path.string()};
            return -1;
          }
          owned.emplace_back(fd);
          return above_stdio(fd, owned, f);
        } else if constexpr (std::is_same_v<K, stdio::fd_t>) {
          if (::fcntl(kind.fd, F_GETFD) < 0) {
            f = {stage::dup2, EBADF, fmt::format("descriptor {}", kind.fd)};
            return -1;
          }
          return above_stdio(kind.fd, owned, f);
        } else {
          int ends[2];
          if (::pipe2(ends, O_CLOEXEC) != 0) {
            f = {stage::pipe, errno, ""};
            return -1;
          }
          os::owned_fd read_end(ends[0]), write_end(ends[1]);
          int child_end = target == 0 ? read_end.get() : write_end.get();
          pipes.push_back({target == 0 ? std::move(write_end) : std::move(read_end), target});
          owned.push_back(target == 0 ? std::move(read_end) : std::move(write_end));
          return above_stdio(child_end, owned, f);
        }
      },
      option.get());
}

void check_keep_fds(const std::vector<int>& keep) {
  for (int fd : keep) {
    if (fd < 3) throw std::invalid_argument(fmt::format("cohort::spawn: keep_fds holds {}; use in/out/err for 0..2", fd));
    if (::fcntl(fd, F_GETFD) < 0) throw std::invalid_argument(fmt::format("cohort::spawn: keep_fds holds {}, which is not open", fd));
  }
}

// How the process ended, once it has.
siginfo_t reap_blocking(int pidfd) {
  siginfo_t info{};
  while (::waitid(static_cast<idtype_t>(config::p_pidfd), static_cast<id_t>(pidfd), &info, WEXITED) != 0 &&
         errno == EINTR) {
  }
  return info;
}

void kill_and_reap(int pidfd) {
  config::pidfd_send_signal(pidfd, SIGKILL);
  reap_blocking(pidfd);
}

// Whether clone3 with CLONE_CLEAR_SIGHAND is refused here (an older
// kernel, a seccomp filter that answers ENOSYS or EPERM, no entry for this
// architecture): learnt on the first refusal, after which launches clone
// as before.
std::atomic<bool> clone3_refused{!os::clone3_run_supported()};

// The clone of start_exec. With clone3, the kernel resets the handled
// signals as it clones, so the child reads no account of its dispositions:
// reading /proc/self/status there made /proc entries for the child, which
// the kernel then drops when the child is reaped, on the way from its
// exit to the wait that reaps it.
pid_t clone_for_exec(launch_plan& p, child_stack& stack, int& pidfd) {
  if (!clone3_refused.load(std::memory_order_relaxed)) {
    os::clone3_args args;
    args.flags = CLONE_VM | CLONE_VFORK | CLONE_PIDFD | os::clone_clear_sighand;
    args.pidfd = reinterpret_cast<std::uintptr_t>(&pidfd);
    args.exit_signal = SIGCHLD;
    args.stack = reinterpret_cast<std::uintptr_t>(stack.bottom());
    args.stack_size = stack.usable_size();
    p.handlers_cleared = true;
    const long pid = os::clone3_run(args, exec_routine, &p);
    if (pid >= 0) return static_cast<pid_t>(pid);
    p.handlers_cleared = false;
    if (pid != -ENOSYS && pid != -EINVAL && pid != -EPERM) {
      errno = static_cast<int>(-pid);
      return -1;
    }
    clone3_refused.store(true, std::memory_order_relaxed);
  }
  return ::clone(exec_routine, stack.top(), CLONE_VM | CLONE_VFORK | CLONE_PIDFD | SIGCHLD, &p, &pidfd);
}

// Whether the child behind `pidfd` ends within `ms` milliseconds.
bool ended_within(int pidfd, int ms) {
  pollfd ended{pidfd, POLLIN, 0};
  int polled;
  do polled = ::poll(&ended, 1, ms);
  while (polled < 0 && errno == EINTR);
  return polled == 1;
}

// The vfork-style start of a program: the parent thread sleeps until the
// child has exec'd or failed.
int start_exec(launch_plan& p, pid_t& pid) {
  static thread_local child_stack stack;
  int pidfd = -1;
  pid = clone_for_exec(p, stack, pidfd);
  if (pid < 0) {
    p.failed_at = stage::clone;
    p.error = errno;
    return -1;
  }
  // The child has ended, unreaped, when its launch failed: its start note
  // goes while its pid is still its own.
  if (p.failed_at != stage::none) {
    if (p.announced) withdraw_start_note(p.announce_fd, pid);
    reap_blocking(pidfd);  // it has called _exit
    ::close(pidfd);
    return -1;
  }
  // Ended in its set-up without a word: killed (a hook that overran the
  // stack above), or the hook's own _exit. A launch that failed, as any
  // other: nothing is left of it. A child that has not ended within
  // 100 ms was replaced by a program its hook exec'd itself, which runs
  // on as the child.
  if (!p.exec_reached && ended_within(pidfd, 100)) {
    if (p.announced) withdraw_start_note(p.announce_fd, pid);
    const siginfo_t info = reap_blocking(pidfd);
    ::close(pidfd);
    // No system call failed: the error only says that the process is gone,
    // and died_as how it ended.
    p.failed_at = stage::died;
    p.error = ESRCH;
    p.died_as = info.si_code == CLD_EXITED ? exit_status::from_code(info.si_status)
                                           : exit_status::from_signal(info.si_status, info.si_code == CLD_DUMPED);
    return -1;
  }
  return pidfd;
}


std::string describe(const command& cmd, const failure& f) {
  std::string what = fmt::format("cohort::spawn '{}'", cmd.program);
  if (f.where == stage::path_lookup) {
    if (cmd.program.empty()) return what + ": empty program name";
    if (f.detail.empty()) return what + ": not found in PATH";
    if (f.error == ENAMETOOLONG && cmd.program.size() > NAME_MAX) {
      return fmt::format("{}: cannot be looked for in PATH: the name is {} bytes, over the {} a file name may have "
                         "(NAME_MAX)",
                         what, cmd.program.size(), NAME_MAX);
    }
    if (f.error != EACCES) return fmt::format("{}: not found in PATH, where '{}' cannot be looked at", what, f.detail);
    std::error_code ec;
    return fmt::format("{}: '{}' found in PATH is {}", what, f.detail,
                       std::filesystem::is_directory(f.detail, ec) ? "a directory" : "not executable");
  }
  return describe_failure(what, f);
}

}  // namespace

bool launches_use_clone3() noexcept { return !clone3_refused.load(std::memory_order_relaxed); }

std::shared_ptr<child_state> launch_program(const asio::any_io_executor& executor, const command& cmd,
                                            const spawn_options& options, failure& f, int announce_fd) {
  // Refused before a process is made: its wait could run nowhere else (an
  // executor given of another kind, asio::system_executor's).
  auto context = context_lifetime(executor);
  refuse_nul(cmd.program, "the program name");
  for (std::size_t i = 0; i < cmd.args.size(); ++i) refuse_nul(cmd.args[i], fmt::format("argument {}", i + 1));
  std::string path = find_program(cmd.program, options.env, options.cwd, f);
  if (f.where != stage::none) return nullptr;
  std::vector<std::string> args;
  args.reserve(cmd.args.size() + 1);
  args.push_back(cmd.program);
  args.insert(args.end(), cmd.args.begin(), cmd.args.end());
  std::vector<char*> argv;
  argv.reserve(args.size() + 1);
  for (auto& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  auto state = launch(executor, std::move(context), options, [&](launch_plan& p, pid_t& pid) {
    p.path = path.c_str();
    p.argv = argv.data();
    p.announce_fd = announce_fd;
    return start_exec(p, pid);
  }, f);
  if (!state && f.where == stage::exec) {
    std::vector<char> env_text;
    std::vector<char*> envp;
    if (f.error == E2BIG && !options.env.unchanged_inherit()) options.env.materialize(env_text, envp);
    f.detail = exec_failure(options.cwd.empty() || path.front() == '/' ? path : (options.cwd / path).string(), f.error,
                            argv.data(), envp.empty() ? environ : envp.data());
  }
  return state;
}

std::string describe_failure(const std::string& what, const launch_failure& f) {
  std::string cause;
  switch (f.where) {
    case stage::path_lookup: cause = ": not found"; break;
    case stage::open_file: cause = ": " + cannot_open(f.detail, f.error); break;
    case stage::pipe: cause = ": pipe2"; break;
    case stage::clone: cause = ": clone"; break;
    case stage::signals: cause = ": resetting signals"; break;
    case stage::inherit: cause = ": taking the requester's resource limits, nice value or CPU affinity"; break;
    case stage::setpgid: cause = ": setpgid"; break;
    case stage::setsid: cause = ": setsid"; break;
    case stage::pdeathsig: cause = ": prctl(PR_SET_PDEATHSIG)"; break;
    case stage::dup2: cause = fmt::format(": placing standard streams{}", f.detail.empty() ? "" : " (" + f.detail + ")"); break;
    case stage::chdir: cause = fmt::format(": cannot change directory to '{}'", f.detail); break;
    case stage::fds: cause = ": keeping inherited descriptors"; break;
    case stage::hook: cause = ": spawn_options::before_exec"; break;
    case stage::exec: cause = f.detail.empty() ? ": execve" : ": execve: " + f.detail; break;
    case stage::start: cause = f.detail.empty() ? "" : ": " + f.detail; break;
    case stage::reactor: cause = ": bringing up asio's reactor for the io_context"; break;
    case stage::died: cause = ": ended before its exec, " + f.detail; break;
    case stage::none: break;
  }
  return what + cause + os::descriptor_limit_note(f.error) +
         (f.where == stage::clone ? os::process_limit_note(f.error) : std::string());
}

launch_failure failure_of_step(const std::string& step, const launch_failure& f) {
  // The descriptor limit's note is the whole start's message's to add, at
  // its end, where it adds it anyway.
  std::string told = describe_failure(step, f);
  const std::string note = os::descriptor_limit_note(f.error);
  if (told.ends_with(note)) told.resize(told.size() - note.size());
  return {stage::start, f.error, std::move(told)};
}

namespace {

// Whether `bring_up` (the cohort service's making) ran without the
// system_error of a reactor that could not be made; `f` says why not.
template <class BringUp>
bool brought_up(BringUp bring_up, launch_failure& f) {
  try {
    bring_up();
    return true;
  } catch (const std::system_error& e) {
    f = {stage::reactor, e.code().value(), ""};
    return false;
  }
}

[[noreturn]] void throw_launch_failure(const std::string& what, const launch_failure& f) {
  throw std::system_error(f.error, std::system_category(), describe_failure(what, f));
}

}  // namespace

bool ready_to_wait(const asio::any_io_executor& executor, launch_failure& f, const char* what) {
  return brought_up([&] { (void)uring::service_of(executor, what); }, f);
}

void ready_to_wait(const asio::any_io_executor& executor, const std::string& what) {
  if (launch_failure f; !ready_to_wait(executor, f, what.c_str())) throw_launch_failure(what, f);
}

void ready_to_wait_on_reactor_only(asio::io_context& io, const std::string& what) {
  if (launch_failure f; !brought_up([&] { uring::use_reactor_only(io); }, f)) throw_launch_failure(what, f);
}

std::size_t descriptors_per_child(const asio::any_io_executor& executor, const spawn_options& options) {
  std::size_t count = 1;  // the pidfd
  for (const stdio* s : {&options.in, &options.out, &options.err}) {
    if (std::holds_alternative<stdio::pipe_t>(s->get())) ++count;
  }
  if (!uring::service_of(executor).caps().waitid) ++count;  // the reactor's own pidfd (uring/waitid.hpp)
  return count;
}

struct prepared_launch::parts {
  std::vector<char> env_text;  // the entries of envp, packed
  std::vector<char*> envp;
  std::vector<os::owned_fd> owned;  // closed in the parent when the launch ends
  std::vector<pipe_ends> pipes;
  std::vector<int> keep;
  std::string cwd;
  bool new_group = true;
  launch_plan plan;
  launch_failure failure;
};

prepared_launch::prepared_launch(const spawn_options& options, const std::vector<int>& extra_keep, launch_failure& f)
    : parts_(std::make_unique<parts>()) {
  check_keep_fds(options.keep_fds);
  auto& x = *parts_;
  // An unchanged inherited environment is passed as it is, uncopied.
  if (!options.env.unchanged_inherit()) options.env.materialize(x.env_text, x.envp);
  auto& p = x.plan;
  const stdio* streams[3] = {&options.in, &options.out, &options.err};
  for (int target = 0; target < 3; ++target) {
    p.source[static_cast<std::size_t>(target)] = prepare_stream(*streams[target], target, x.owned, x.pipes, x.failure);
    if (x.failure.where != stage::none) {
      f = x.failure;
      return;
    }
  }
  // Before an exec as without one: stderr as stdout, with stdout closed
  // here and its number taken by a descriptor of this process's own,
  // would otherwise be that descriptor, kept across the exec.
  close_streams_an_exec_would(p);
  x.keep = options.keep_fds;
  x.keep.insert(x.keep.end(), extra_keep.begin(), extra_keep.end());
  std::sort(x.keep.begin(), x.keep.end());
  x.keep.erase(std::unique(x.keep.begin(), x.keep.end()), x.keep.end());
  x.cwd = options.cwd.string();
  refuse_nul(x.cwd, "the working directory");
  x.new_group = options.new_process_group || options.new_session;
  p.envp = x.envp.empty() ? environ : x.envp.data();
  p.cwd = x.cwd.empty() ? nullptr : x.cwd.c_str();
  p.new_group = options.new_process_group;
  p.new_session = options.new_session;
  p.death_signal = options.parent_death_signal;
  // Asked, not cached: a process made by _Fork() or a raw clone has its
  // parent's pid cached, and no fork handler ran in it to forget that.
  p.parent = static_cast<pid_t>(os::raw_syscall(SYS_getpid));
  p.close_fds = options.close_other_fds;
  p.keep = x.keep.data();
  p.keep_count = x.keep.size();
  p.hook = options.before_exec;
  p.hook_context = options.before_exec_context;
}

prepared_launch::~prepared_launch() = default;

bool prepared_launch::ok() const noexcept { return parts_->failure.where == stage::none; }

launch_plan& prepared_launch::plan() noexcept { return parts_->plan; }

launch_failure prepared_launch::failure() const {
  const auto& p = parts_->plan;
  if (parts_->failure.where != stage::none) return parts_->failure;
  if (p.failed_at == stage::died) {
    const int sig = p.died_as.signal();
    const bool overran = p.hook != nullptr && (sig == SIGSEGV || sig == SIGBUS);
    return {p.failed_at, p.error,
            fmt::format("{}{}", p.died_as, overran ? fmt::format(" (the before_exec hook has {} KiB of stack)",
                                                                 child_stack::for_hook / 1024)
                                                   : "")};
  }
  return {p.failed_at, p.error, p.failed_at == stage::chdir ? parts_->cwd : ""};
}

// The child runs from here on: should adopting it fail (no memory, asio
// refusing a pipe), it is killed and reaped, not left behind.
std::shared_ptr<child_state> prepared_launch::adopt(const asio::any_io_executor& executor,
                                                    std::weak_ptr<const void> context, pid_t pid, int pidfd) {
  std::shared_ptr<child_state> state;
  try {
    state = std::make_shared<child_state>(executor, pid, pidfd);
  } catch (...) {
    end_and_withdraw(parts_->plan.announce_fd, std::span(&pid, 1));
    kill_and_reap(pidfd);
    ::close(pidfd);
    throw;
  }
  try {
    state->group_leader = parts_->new_group;
    state->context = std::move(context);
    for (auto& end : parts_->pipes) {
      const int fd = end.parent.get();
      if (end.target == 0) state->in = std::make_unique<asio::writable_pipe>(executor, fd);
      else if (end.target == 1) state->out = std::make_unique<asio::readable_pipe>(executor, fd);
      else state->err = std::make_unique<asio::readable_pipe>(executor, fd);
      end.parent.release();  // the pipe object owns it now
    }
    if (!parts_->pipes.empty()) watch_pipes(state);
  } catch (...) {
    end_and_withdraw(parts_->plan.announce_fd, std::span(&pid, 1));
    config::pidfd_send_signal(state->pidfd, SIGKILL);
    std::error_code ignored;
    state->reap(true, ignored);
    throw;
  }
  return state;
}

void end_and_withdraw(int announce_fd, std::span<const pid_t> pids) noexcept {
  if (announce_fd < 0) return;
  for (const pid_t pid : pids) ::kill(pid, SIGKILL);
  for (const pid_t pid : pids) {
    siginfo_t info{};
    while (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOWAIT) != 0 && errno == EINTR) {
    }
    withdraw_start_note(announce_fd, pid);
  }
}

signals_blocked::signals_blocked() noexcept {
  sigset_t all;
  sigfillset(&all);
  ::syscall(SYS_rt_sigprocmask, SIG_SETMASK, &all, &old_, _NSIG / 8);
}

signals_blocked::~signals_blocked() { ::syscall(SYS_rt_sigprocmask, SIG_SETMASK, &old_, nullptr, _NSIG / 8); }

std::shared_ptr<child_state> launch(const asio::any_io_executor& executor, std::weak_ptr<const void> context,
                                    const spawn_options& options, const process_starter& start, launch_failure& f,
                                    const std::vector<int>& extra_keep) {
  prepared_launch prepared(options, extra_keep, f);
  if (!prepared.ok()) return nullptr;
  const launch_guard launching;
  pid_t pid = -1;
  int pidfd;
  {
    const signals_blocked blocked;
    pidfd = start(prepared.plan(), pid);
  }
  if (pidfd < 0) {
    f = prepared.failure();
    return nullptr;
  }
  return prepared.adopt(executor, std::move(context), pid, pidfd);
}

}  // namespace detail

child spawn(const asio::any_io_executor& executor, const command& cmd, const spawn_options& options,
            std::error_code& ec) {
  detail::launch_failure f;
  auto state = detail::ready_to_wait(executor, f) ? detail::launch_program(executor, cmd, options, f) : nullptr;
  if (!state) {
    ec.assign(f.error, std::system_category());
    return child();
  }
  ec.clear();
  return child(std::move(state));
}

child spawn(const asio::any_io_executor& executor, const command& cmd, const spawn_options& options) {
  return detail::spawn_announced(executor, cmd, options, -1);
}

child detail::spawn_announced(const asio::any_io_executor& executor, const command& cmd, const spawn_options& options,
                              int announce_fd) {
  launch_failure f;
  auto state = ready_to_wait(executor, f) ? launch_program(executor, cmd, options, f, announce_fd) : nullptr;
  if (!state) throw std::system_error(f.error, std::system_category(), describe(cmd, f));
  return child(std::move(state));
}

// A spawn cancelled before it runs never gets here (the spawn overloads
// start it with async_awaitable_stoppable_until_started); once here, the
// launch is too short to stop.
asio::awaitable<child> detail::spawn_on(asio::any_io_executor executor, command cmd, spawn_options options) {
  co_return spawn(executor, cmd, options);
}

// Opened without waiting for a FIFO's other end, so that a FIFO never
// holds up the spawning thread (an io_context's, under co_await): opened
// for writing with no reader it fails (ENXIO) where a blocking open would
// wait for one; opened for reading it is the child's to read, end of file
// until a writer comes. A file under a lease is waited for, as any open
// waits.
// The child gets it blocking, as a program expects its streams, unless the
// caller's flags asked otherwise.
int detail::open_stream_file(const stdio::file_t& file, int target) noexcept {
  const int flags = file.flags != 0 ? file.flags : target == 0 ? O_RDONLY : O_WRONLY | O_CREAT | O_TRUNC;
  return os::open_without_waiting(file.path.c_str(), flags | O_CLOEXEC, 0644);
}

std::string detail::cannot_open(const std::string& path, int error) {
  struct stat st {};
  const bool unread_fifo = error == ENXIO && ::stat(path.c_str(), &st) == 0 && S_ISFIFO(st.st_mode);
  return fmt::format("cannot open '{}'{}", path,
                     unread_fifo ? " for writing: a FIFO that no process has open for reading" : "");
}

const char* detail::piped_stream(const spawn_options& options) noexcept {
  const std::pair<const stdio*, const char*> streams[] = {
      {&options.in, "in"}, {&options.out, "out"}, {&options.err, "err"}};
  for (const auto& [stream, name] : streams) {
    if (std::holds_alternative<stdio::pipe_t>(stream->get())) return name;
  }
  return nullptr;
}

void detail::refuse_piped_streams(const spawn_options& options, std::string_view where) {
  const char* piped = piped_stream(options);
  if (piped == nullptr) return;
  throw std::invalid_argument(fmt::format("{}.{} is a pipe, which nothing {} for the ranks; use a file, "
                                          "stdio::null() or stdio::fd()",
                                          where, piped, std::string_view(piped) == "in" ? "writes" : "reads"));
}

namespace {

void refuse_pipes(const spawn_options& options) {
  if (detail::piped_stream(options) != nullptr) {
    throw std::invalid_argument("cohort::run: pipes need an io_context; use spawn()");
  }
}

}  // namespace

exit_status run(const command& cmd, const spawn_options& options) {
  refuse_pipes(options);
  asio::io_context io;
  return spawn(io.get_executor(), cmd, options).join();
}

exit_status run(const command& cmd, const spawn_options& options, std::error_code& ec) {
  refuse_pipes(options);
  asio::io_context io;
  child c = spawn(io.get_executor(), cmd, options, ec);
  if (ec) return exit_status::from_code(127);
  return c.join(ec);
}

}  // namespace cohort

// The scan of /proc for a group's processes, holding them by pidfd, and the
// subreaper setting.
#include "group/descendants.hpp"

#include "config.hpp"
#include "os/descriptor_limit.hpp"
#include "os/per_process.hpp"
#include "os/process_identity.hpp"
#include "process/owned_pids.hpp"
#include "shm/segment.hpp"

#include <fmt/format.h>

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <utility>

namespace cohort::detail {
namespace {

// Reads a small /proc file whole; nullopt when it cannot be read.
std::optional<std::string> read_whole(const char* path) {
  std::string text;
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  char buf[8192];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) text.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  if (n < 0) return std::nullopt;
  return text;
}

// The same, empty when it cannot be read.
std::string read_file(const char* path) { return read_whole(path).value_or(std::string()); }

std::string read_proc(pid_t pid, const char* name) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/%s", pid, name);
  return read_file(path);
}

// The parent of `pid`, from /proc/<pid>/stat (the fields after the command
// name, which may hold anything but ends at the last ')'); 0 when gone.
pid_t parent_of(pid_t pid) {
  const std::string stat = read_proc(pid, "stat");
  const auto close = stat.rfind(')');
  char state = 0;
  int ppid = 0;
  if (close == std::string::npos || std::sscanf(stat.c_str() + close + 1, " %c %d", &state, &ppid) != 2) return 0;
  return ppid;
}

}  // namespace

std::string group_marker_prefix(pid_t supervisor) {
  return fmt::format("{}{}_", shm::run_marker_start, supervisor);
}

void for_each_process(const std::function<void(pid_t)>& fn) {
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return;
  const pid_t self = ::getpid();
  while (dirent* entry = ::readdir(proc)) {
    char* end = nullptr;
    const long pid = std::strtol(entry->d_name, &end, 10);
    if (end != entry->d_name && *end == '\0' && pid != self) fn(static_cast<pid_t>(pid));
  }
  ::closedir(proc);
}

bool environment_holds(pid_t pid, std::string_view entry, bool as_prefix) {
  const std::string block = read_proc(pid, "environ");
  for (std::size_t begin = 0; begin < block.size();) {
    std::size_t end = block.find('\0', begin);
    if (end == std::string::npos) end = block.size();
    const auto variable = std::string_view(block).substr(begin, end - begin);
    if (as_prefix ? variable.starts_with(entry) : variable == entry) return true;
    begin = end + 1;
  }
  return false;
}

namespace {

long read_number(const char* path) {
  const std::string text = read_file(path);
  return text.empty() ? -1 : std::strtol(text.c_str(), nullptr, 10);
}

// The last count of processes made since boot that was read, and when.
// The count only grows, so any earlier reading is a safe count for a
// window that opens later: counted from before its opening, the forks seem
// more, and the window only gives up on its pids sooner. /proc/stat costs
// 10 us a read here, and far more on a machine of many CPUs and
// interrupts, where the kernel sums every interrupt over every CPU for it.
// Atomics, not a lock, which a fork could catch held: a count paired with
// another reading's time is still an earlier count.
std::atomic<long long> last_count{-1};
std::atomic<std::chrono::steady_clock::rep> last_count_at{0};

// How long a reading serves the windows that open after it.
constexpr std::chrono::seconds reading_serves{1};

// Processes made since boot, from the "processes" line of /proc/stat.
long long forks_since_boot() {
  const std::string stat = read_file("/proc/stat");
  const auto at = stat.find("\nprocesses ");
  const long long count = at == std::string::npos ? -1 : std::strtoll(stat.c_str() + at + 11, nullptr, 10);
  if (count >= 0) {
    long long seen = last_count.load(std::memory_order_relaxed);
    while (seen < count && !last_count.compare_exchange_weak(seen, count, std::memory_order_relaxed)) {
    }
    last_count_at.store(std::chrono::steady_clock::now().time_since_epoch().count(), std::memory_order_relaxed);
  }
  return count;
}

// The count for a window opening now: the last reading while it is
// recent, else a new one.
long long forks_before_now() {
  const long long count = last_count.load(std::memory_order_relaxed);
  const std::chrono::steady_clock::duration age(std::chrono::steady_clock::now().time_since_epoch().count() -
                                                last_count_at.load(std::memory_order_relaxed));
  return count >= 0 && age < reading_serves ? count : forks_since_boot();
}

}  // namespace

pid_window::pid_window() {
  const long last = read_number("/proc/sys/kernel/ns_last_pid");
  const long long forks = forks_before_now();
  if (last <= 0 || forks < 0) return;
  known_ = true;
  first_ = last_ = static_cast<pid_t>(last);
  forks_ = static_cast<unsigned long long>(forks);
}

void pid_window::refresh() {
  all_ = true;
  if (!known_) return;
  const long last = read_number("/proc/sys/kernel/ns_last_pid");
  const long long forks = forks_since_boot();
  const long pid_max = os::pid_max();
  if (last <= 0 || forks < 0 || pid_max <= 0) return;
  // The count covers every pid namespace, so it errs on the side of
  // looking at every pid.
  if (static_cast<unsigned long long>(forks) - forks_ >= static_cast<unsigned long long>(pid_max) / 2) return;
  last_ = static_cast<pid_t>(last);
  max_ = static_cast<pid_t>(pid_max);
  all_ = false;
}

std::optional<std::vector<pid_t>> pid_window::pids(std::size_t limit) const {
  if (all_) return std::nullopt;
  // Past pid_max the allocation starts again low (above the reserved pids:
  // from 1 is safe, as those are probed and found gone or too old).
  const std::size_t count = first_ <= last_ ? static_cast<std::size_t>(last_ - first_)
                                            : static_cast<std::size_t>(max_ - first_) + static_cast<std::size_t>(last_);
  if (count > limit) return std::nullopt;
  std::vector<pid_t> list;
  list.reserve(count);
  for (pid_t pid = first_ + 1; pid != last_ + 1; ++pid) {
    if (pid >= max_) pid = 1;
    list.push_back(pid);
    if (pid == last_) break;
  }
  return list;
}

bool pid_window::holds(pid_t pid) const noexcept {
  if (all_) return true;
  if (first_ <= last_) return pid > first_ && pid <= last_;
  return pid > first_ || pid <= last_;  // the allocation went round past pid_max
}

// getpgid and getsid are cheap system calls; /proc/<pid>/stat is not (the
// kernel gathers every field), so parents are read only for the few
// processes of this session.
std::vector<pid_t> group_descendants(const std::string& marker, const std::set<pid_t>& ranks, bool by_parent,
                                     const pid_window& window) {
  std::vector<pid_t> found;
  std::multimap<pid_t, pid_t> children;  // parent -> child, within this session
  const pid_t self = ::getpid(), session = ::getsid(0);
  const auto look_at = [&](pid_t pid) {
    if (pid == self || ranks.contains(pid) || !window.holds(pid)) return;
    // A member of a rank's group or session, but not a leader: a leader
    // whose pid equals a reaped rank's would be a recycled pid, which no
    // group or session still in use can have.
    const pid_t pgid = ::getpgid(pid);
    if (pgid < 0) return;  // no such process
    const pid_t sid = ::getsid(pid);
    if ((pgid != pid && ranks.contains(pgid)) || (sid != pid && ranks.contains(sid)) ||
        environment_holds(pid, marker)) {
      found.push_back(pid);
    } else if (by_parent && sid == session) {
      if (const pid_t parent = parent_of(pid); parent > 0) children.emplace(parent, pid);
    }
  };
  if (auto few = window.pids(256)) {  // a system call each, no listing of /proc
    for (pid_t pid : *few) look_at(pid);
  } else {
    for_each_process(look_at);
  }
  std::vector<pid_t> parents(ranks.begin(), ranks.end());
  while (!parents.empty()) {
    const pid_t parent = parents.back();
    parents.pop_back();
    auto [first, last] = children.equal_range(parent);
    for (auto it = first; it != last; ++it) {
      found.push_back(it->second);
      parents.push_back(it->second);
    }
  }
  return found;
}

tracked_processes::~tracked_processes() {
  for (const auto& [pid, pidfd] : held_) ::close(pidfd);
}

void tracked_processes::add(const std::vector<pid_t>& pids) {
  for (pid_t pid : pids) {
    if (held_.contains(pid)) continue;
    const int pidfd = config::pidfd_open(pid);
    if (pidfd >= 0) held_.emplace(pid, pidfd);
    else if (os::out_of_descriptors(errno)) missed_ = true;
  }
}

// A process that is not this one's child is dropped only once every process
// held is dead: a dead one whose parent was held is handed to this process
// when that parent dies, and is reaped here then.
bool tracked_processes::kill_and_reap() {
  bool any_alive = false;
  for (auto it = held_.begin(); it != held_.end();) {
    const int pidfd = it->second;
    config::pidfd_send_signal(pidfd, SIGKILL);
    siginfo_t info{};
    if (::waitid(static_cast<idtype_t>(config::p_pidfd), static_cast<id_t>(pidfd), &info, WEXITED | WNOHANG) == 0) {
      if (info.si_pid != 0) {  // reaped
        ::close(pidfd);
        it = held_.erase(it);
        continue;
      }
      any_alive = true;
    } else {
      pollfd p{pidfd, POLLIN, 0};  // readable once it has died
      if (::poll(&p, 1, 0) != 1) any_alive = true;
    }
    ++it;
  }
  missed_last_ = std::exchange(missed_, false);
  if (missed_last_ || any_alive) return false;
  for (const auto& [pid, pidfd] : held_) {
    siginfo_t info{};
    ::waitid(static_cast<idtype_t>(config::p_pidfd), static_cast<id_t>(pidfd), &info, WEXITED | WNOHANG);
    ::close(pidfd);
  }
  held_.clear();
  return true;
}

namespace {

// This process's children from each thread's /proc children list (a child
// is on its parent thread's, zombies included); nullopt where the kernel
// keeps no such lists, or one could not be read. `threads`, when given, is
// set to the number of threads listed.
std::optional<std::vector<pid_t>> listed_children_of_self(std::size_t* threads = nullptr) {
  // The threads first, their folder closed before a list is read: one
  // descriptor at a time, for a process that has few left.
  std::vector<std::string> tids;
  {
    const std::unique_ptr<DIR, int (*)(DIR*)> tasks(::opendir("/proc/self/task"), ::closedir);
    if (!tasks) return std::nullopt;
    while (dirent* entry = ::readdir(tasks.get())) {
      if (entry->d_name[0] != '.') tids.emplace_back(entry->d_name);
    }
  }
  std::optional<std::vector<pid_t>> found;  // stays empty until a list is read
  const std::size_t listed = tids.size();
  for (const auto& tid : tids) {
    const std::string path = "/proc/self/task/" + tid + "/children";
    // Unreadable: a kernel without the lists, or a thread that ended
    // meanwhile and may have handed its children to one already read, so
    // that the listing is not whole.
    const auto text = read_whole(path.c_str());
    if (!text) return std::nullopt;
    if (!found) found.emplace();
    const char* at = text->c_str();
    for (char* end = nullptr;; at = end) {
      const long pid = std::strtol(at, &end, 10);
      if (end == at) break;
      found->push_back(static_cast<pid_t>(pid));
    }
  }
  if (threads != nullptr) *threads = listed;
  return found;
}

// One descriptor a supervisor keeps while it runs groups, given up for the
// listing of its children where it has none left: the ranks' pidfds and
// the descendants' can take the last ones, and a listing that could not be
// read left the children handed to it unreaped, zombies holding their
// process groups alive, so that a shutdown waited out its whole term_grace.
struct listing_reserve {
  std::mutex mutex;
  int fd = -1;
};

// The descriptor the reserve holds: -1 where none could be had.
int open_reserve() { return ::open("/dev/null", O_RDONLY | O_CLOEXEC); }

// Runs `use` with the reserve given up for it (and taken back after,
// unless another thread took the descriptor meanwhile); nullopt where no
// reserve is kept. `use` must close what it opens.
template <class Use>
auto with_reserve(Use use) -> std::optional<decltype(use())> {
  auto& reserve = os::of_this_process<listing_reserve>();
  std::lock_guard lock(reserve.mutex);
  if (reserve.fd < 0) return std::nullopt;
  ::close(reserve.fd);
  auto result = use();
  const int error = errno;
  reserve.fd = open_reserve();
  errno = error;
  return result;
}

// Whether `pid` carries the marker of another group of this process
// (`own_groups`, their prefix) and not this group's (`marker`): a process
// handed over as that group's rank died, left to that group while it runs.
// One whose environment cannot be read is not.
bool another_groups(pid_t pid, const std::string& own_groups, const std::string& marker) {
  return environment_holds(pid, own_groups, true) && !environment_holds(pid, marker, false);
}

// The listing again, with the reserve given up for it.
std::optional<std::vector<pid_t>> listed_with_reserve() {
  auto listed = with_reserve([] { return listed_children_of_self(); });
  return listed ? std::move(*listed) : std::nullopt;
}

// SIGKILL to `pid`, a live child of this process that no pidfd could be
// opened for, through one opened in the reserve's place. Not by its pid:
// another thread may reap the child once it dies, and the pid may then be
// another process's. Its environment is read again first, with the
// reserve: another group's process is left to that group.
void kill_through_reserve(pid_t pid, const std::string& own_groups, const std::string& marker) {
  (void)with_reserve([&] {
    if (another_groups(pid, own_groups, marker)) return false;
    const int pidfd = config::pidfd_open(pid);
    if (pidfd < 0) return false;
    config::pidfd_send_signal(pidfd, SIGKILL);
    ::close(pidfd);
    return true;
  });
}

// This process's children, from the lists, or, where the kernel has none,
// by the parent of every process; nullopt where neither could be read for
// want of a descriptor.
std::optional<std::vector<pid_t>> children_of_self() {
  if (auto listed = listed_children_of_self()) return listed;
  if (os::out_of_descriptors(errno)) {
    if (auto listed = listed_with_reserve()) return listed;
  }
  if (const int error = errno; os::out_of_descriptors(error)) return std::nullopt;
  std::vector<pid_t> found;
  const pid_t self = ::getpid();
  for_each_process([&](pid_t pid) {
    if (parent_of(pid) == self) found.push_back(pid);
  });
  return found;
}

}  // namespace

void keep_listing_reserve() {
  auto& reserve = os::of_this_process<listing_reserve>();
  std::lock_guard lock(reserve.mutex);
  if (reserve.fd < 0) reserve.fd = open_reserve();
}

std::optional<std::vector<pid_t>> reap_adopted(pid_window& window, const std::string& marker) {
  std::vector<pid_t> alive;
  const std::string own_groups = group_marker_prefix(::getpid());
  if (!has_children()) return alive;
  const pid_t own_group = ::getpgrp();
  bool refreshed = false;
  bool listed = true;
  with_owned_pids([&](const std::set<pid_t>& owned) {
    const auto children = children_of_self();
    listed = children.has_value();
    for (pid_t pid : children.value_or(std::vector<pid_t>{})) {
      if (owned.contains(pid) || ::getpgid(pid) == own_group) continue;
      // Only for a child no one here started (most calls find none): the
      // window then covers every child listed.
      if (!refreshed) {
        window.refresh();
        refreshed = true;
      }
      if (!window.holds(pid)) continue;
      const int pidfd = config::pidfd_open(pid);
      siginfo_t info{};
      int waited;
      if (pidfd >= 0) {
        waited = ::waitid(static_cast<idtype_t>(config::p_pidfd), static_cast<id_t>(pidfd), &info, WEXITED | WNOHANG);
      } else if (os::out_of_descriptors(errno)) {
        // No descriptor to be had (a start that ran out of them ends its
        // ranks): by its pid, which stays this child's until it is reaped
        // here (reaped meanwhile by another thread, the pid is no child of
        // this process's, and the wait fails).
        waited = ::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG);
      } else {
        continue;
      }
      // One alive that is another group's is left to it.
      if (waited == 0 && info.si_pid == 0 && !another_groups(pid, own_groups, marker)) {
        alive.push_back(pid);
        // None to hold it by either (the caller's hold fails and is noted
        // missed): ended now, so that a look that follows reaps it by its
        // pid, as above. Left alive, no pass would ever end it.
        if (pidfd < 0) kill_through_reserve(pid, own_groups, marker);
      }
      if (pidfd >= 0) ::close(pidfd);
    }
  });
  if (!listed) return std::nullopt;
  return alive;
}

bool has_children() {
  siginfo_t info{};
  return ::waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) == 0 || errno != ECHILD;
}

// A list is read a child at a time, and a child reaped meanwhile (by
// another thread) can make it skip the next one, as can a thread that ends
// and hands its children to a thread already read. So with other threads
// about, the children are listed twice and believed only when both lists
// agree. A process of one thread (the caller's) has no other thread to
// reap, end or start one meanwhile, and one list is whole: children
// handed to it meanwhile are the orphans of one that stays on the list, a
// zombie until this very thread reaps it.
bool only_owned_children() {
  bool only_owned = false;
  with_owned_pids([&](const std::set<pid_t>& owned) {
    std::size_t threads = 0;
    auto first = listed_children_of_self(&threads);
    if (!first || !std::all_of(first->begin(), first->end(), [&](pid_t pid) { return owned.contains(pid); })) return;
    if (threads == 1) {
      only_owned = true;
      return;
    }
    auto second = listed_children_of_self();
    if (!second) return;
    std::sort(first->begin(), first->end());
    std::sort(second->begin(), second->end());
    only_owned = *first == *second;
  });
  return only_owned;
}

bool is_subreaper() {
  int attribute = 0;
  return ::prctl(PR_GET_CHILD_SUBREAPER, &attribute) == 0 && attribute != 0;
}

namespace {

// Per process: a forked child inherits the count but not the attribute.
struct subreaper_use {
  std::mutex mutex;
  int groups = 0;
  int before = 0;  // the attribute when the first group began
};

}  // namespace

void become_subreaper() {
  auto& use = os::of_this_process<subreaper_use>();
  std::lock_guard lock(use.mutex);
  if (use.groups++ == 0) {
    ::prctl(PR_GET_CHILD_SUBREAPER, &use.before);
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  }
}

void end_subreaper() {
  auto& use = os::of_this_process<subreaper_use>();
  std::lock_guard lock(use.mutex);
  if (--use.groups == 0 && use.before == 0) ::prctl(PR_SET_CHILD_SUBREAPER, 0);
}

}  // namespace cohort::detail

// The marker scan over /proc, and the subreaper setting.
#include "group/descendants.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string_view>

namespace cohort::detail {
namespace {

bool environment_holds(pid_t pid, std::string_view marker) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/environ", pid);
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  std::string block;
  char buf[8192];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) block.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  for (std::size_t begin = 0; begin < block.size();) {
    std::size_t end = block.find('\0', begin);
    if (end == std::string::npos) end = block.size();
    if (std::string_view(block).substr(begin, end - begin) == marker) return true;
    begin = end + 1;
  }
  return false;
}

}  // namespace

std::vector<pid_t> marked_processes(const std::string& marker) {
  std::vector<pid_t> found;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return found;
  const pid_t self = ::getpid();
  while (dirent* entry = ::readdir(proc)) {
    char* end = nullptr;
    long pid = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || pid == self) continue;
    if (environment_holds(static_cast<pid_t>(pid), marker)) found.push_back(static_cast<pid_t>(pid));
  }
  ::closedir(proc);
  return found;
}

bool kill_and_reap(pid_t pid) {
  ::kill(pid, SIGKILL);
  siginfo_t info{};
  if (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG) != 0) return errno == ECHILD;
  return info.si_pid == pid;
}

bool has_children() {
  siginfo_t info{};
  return ::waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) == 0 || errno != ECHILD;
}

// Not remembered in a flag: a forked child inherits the flag but not the
// attribute.
void become_subreaper() { ::prctl(PR_SET_CHILD_SUBREAPER, 1); }

}  // namespace cohort::detail

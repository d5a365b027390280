// Running out of descriptors: telling it from other errors, telling whether
// there is room for more, and naming the descriptor limit in messages about
// it; the process limits, in messages about a fork they refused; and the
// file size limit, in messages about a write it refused.
#pragma once

#include <fmt/format.h>

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <iterator>
#include <string>

namespace cohort::os {

/// Whether `error` says no descriptor could be had: this process's limit
/// (EMFILE) or the system's (ENFILE).
inline bool out_of_descriptors(int error) noexcept { return error == EMFILE || error == ENFILE; }

/// " (open file limit RLIMIT_NOFILE is N)" for EMFILE and ENFILE; empty
/// for any other error.
inline std::string descriptor_limit_note(int error) {
  if (!out_of_descriptors(error)) return {};
  rlimit lim{};
  ::getrlimit(RLIMIT_NOFILE, &lim);
  return fmt::format(" (open file limit RLIMIT_NOFILE is {})", lim.rlim_cur);
}

/// How many more descriptors, up to `most` (at most 256), can be had now:
/// copies of `fd` are made to tell, and closed. Another thread may take
/// them after.
inline std::size_t descriptors_free_up_to(int fd, std::size_t most) noexcept {
  int copies[256];
  std::size_t made = 0;
  while (made < most && made < std::size(copies)) {
    const int copy = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (copy < 0) break;
    copies[made++] = copy;
  }
  const std::size_t room = made;
  while (made > 0) ::close(copies[--made]);
  return room;
}

/// Whether `count` more descriptors (at most 256) can be had now.
inline bool descriptors_free(int fd, std::size_t count) noexcept {
  return descriptors_free_up_to(fd, count) == count;
}

/// For a fork or clone that failed with EAGAIN: the limits that refuse a
/// new process, RLIMIT_NPROC (where finite: it binds all but the first
/// user namespace's root and holders of CAP_SYS_RESOURCE or CAP_SYS_ADMIN
/// there, which cannot be told from here) and the system's. Empty for any
/// other error.
inline std::string process_limit_note(int error) {
  if (error != EAGAIN) return {};
  constexpr const char* system = "kernel.threads-max, kernel.pid_max, a cgroup's pids.max";
  rlimit lim{};
  if (::getrlimit(RLIMIT_NPROC, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY) {
    return fmt::format(" (process limit RLIMIT_NPROC is {} for this user, where it binds; or the system's: {})",
                       lim.rlim_cur, system);
  }
  return fmt::format(" (no room for a process under the system's limits: {})", system);
}

/// " (longer than RLIMIT_FSIZE allows, N bytes)" for EFBIG; empty for any
/// other error.
inline std::string file_size_limit_note(int error) {
  if (error != EFBIG) return {};
  rlimit lim{};
  ::getrlimit(RLIMIT_FSIZE, &lim);
  return fmt::format(" (longer than RLIMIT_FSIZE allows, {} bytes)", lim.rlim_cur);
}

}  // namespace cohort::os

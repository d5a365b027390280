// Running out of descriptors: telling it from other errors, and naming the
// descriptor limit in messages about it; and the file size limit, in
// messages about a write it refused.
#pragma once

#include <fmt/format.h>

#include <sys/resource.h>

#include <cerrno>
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

/// " (longer than RLIMIT_FSIZE allows, N bytes)" for EFBIG; empty for any
/// other error.
inline std::string file_size_limit_note(int error) {
  if (error != EFBIG) return {};
  rlimit lim{};
  ::getrlimit(RLIMIT_FSIZE, &lim);
  return fmt::format(" (longer than RLIMIT_FSIZE allows, {} bytes)", lim.rlim_cur);
}

}  // namespace cohort::os

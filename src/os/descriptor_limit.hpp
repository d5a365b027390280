// Naming the descriptor limit in messages about running out of descriptors.
#pragma once

#include <fmt/format.h>

#include <sys/resource.h>

#include <cerrno>
#include <string>

namespace cohort::os {

/// " (open file limit RLIMIT_NOFILE is N)" for EMFILE and ENFILE; empty
/// for any other error.
inline std::string descriptor_limit_note(int error) {
  if (error != EMFILE && error != ENFILE) return {};
  rlimit lim{};
  ::getrlimit(RLIMIT_NOFILE, &lim);
  return fmt::format(" (open file limit RLIMIT_NOFILE is {})", lim.rlim_cur);
}

}  // namespace cohort::os

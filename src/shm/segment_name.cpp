// The names of segments (file_system ones in /dev/shm, memfds), and the
// sweep of the files that processes which have ended left behind.
#include "shm/segment_name.hpp"

#include <sys/mman.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>

namespace cohort::shm {

std::string segment_name(pid_t maker, std::uint64_t nonce) {
  return fmt::format("/cohort_{}_{:016x}", maker, nonce);
}

std::string memfd_name_of(std::uint64_t nonce) { return fmt::format("cohort-{:016x}", nonce); }

int sweep_segments_of(std::span<const pid_t> pids) noexcept {
  int swept = 0;
  try {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
      const auto name = e.path().filename().string();
      pid_t maker = 0;
      char rest[17]{};
      if (std::sscanf(name.c_str(), "cohort_%d_%16[0-9a-f]", &maker, rest) != 2 || std::strlen(rest) != 16 ||
          name != segment_name(maker, std::strtoull(rest, nullptr, 16)).substr(1) ||
          std::find(pids.begin(), pids.end(), maker) == pids.end()) {
        continue;
      }
      if (::shm_unlink(("/" + name).c_str()) == 0) ++swept;
    }
  } catch (...) {
  }
  return swept;
}

}  // namespace cohort::shm

// The names of segments (file_system ones in /dev/shm, memfds), and the
// listing of the files in /dev/shm that are segments.
#include "shm/segment_name.hpp"

#include <fmt/format.h>

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

void for_each_named_segment(const std::function<void(pid_t, std::uint64_t)>& fn) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const auto name = e.path().filename().string();
    pid_t maker = 0;
    char rest[17]{};
    if (std::sscanf(name.c_str(), "cohort_%d_%16[0-9a-f]", &maker, rest) != 2 || std::strlen(rest) != 16) continue;
    const auto nonce = std::strtoull(rest, nullptr, 16);
    if (name == segment_name(maker, nonce).substr(1)) fn(maker, nonce);
  }
}

}  // namespace cohort::shm

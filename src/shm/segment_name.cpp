// The names of file_system segments in /dev/shm, and the sweep of those
// that processes which have ended left behind, save those still named by
// values in flight.
#include "shm/segment_name.hpp"

#include "shm/segment.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>

namespace cohort::shm {

namespace {

// Whether messages naming blocks of the segment `name` have been sent and
// not received: a value in a queue that a live process holds may still
// need to open it by name, and its receiver unlinks it (segment::orphaned).
bool named_by_messages(const std::string& name) noexcept {
  const int fd = ::shm_open(("/" + name).c_str(), O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) return false;
  alignas(segment_header) std::byte bytes[sizeof(segment_header)];
  const bool read = ::pread(fd, bytes, sizeof bytes, 0) == static_cast<ssize_t>(sizeof bytes);
  ::close(fd);
  const auto& h = *reinterpret_cast<const segment_header*>(bytes);
  // received first, as segment::messages_in_flight reads them.
  return read && h.magic == segment_magic && h.received.load(std::memory_order_relaxed) != h.sent.load(std::memory_order_relaxed);
}

}  // namespace

std::string segment_name(pid_t maker, std::uint64_t nonce) {
  return fmt::format("/cohort_{}_{:016x}", maker, nonce);
}

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
      if (!named_by_messages(name) && ::shm_unlink(("/" + name).c_str()) == 0) ++swept;
    }
  } catch (...) {
  }
  return swept;
}

}  // namespace cohort::shm

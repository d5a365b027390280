// Reading a file whole, as tests read /proc.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <filesystem>
#include <string>

namespace cohort::test {

/// The whole of a file, byte for byte; empty when it cannot be read. By
/// read(2), not a stream: libstdc++'s file buffer throws where a read
/// fails, as one of /proc/<pid>/maps does (ESRCH) once the process ends.
inline std::string read_file(const std::filesystem::path& file) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  std::string text;
  char block[4096];
  for (;;) {
    const ssize_t n = ::read(fd, block, sizeof block);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) text.clear();
    if (n <= 0) break;
    text.append(block, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return text;
}

}  // namespace cohort::test

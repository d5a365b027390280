// Growing the descriptor table by allocating its last needed slot once.
#include "os/descriptor_table.hpp"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>

namespace cohort::os {

void reserve_descriptors(std::size_t more) noexcept {
  if (more == 0) return;
  // Allocated lowest first: its number is the lowest free one.
  const int lowest = ::open("/", O_PATH | O_CLOEXEC);
  if (lowest < 0) return;
  rlimit limit{};
  std::size_t ceiling = 0;  // the highest descriptor number allowed
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur > 0) {
    ceiling = static_cast<std::size_t>(std::min<rlim_t>(limit.rlim_cur - 1, 1u << 30));
  }
  const std::size_t last = std::min(static_cast<std::size_t>(lowest) + more, ceiling);
  if (last > static_cast<std::size_t>(lowest)) {
    // A duplicate at `last` or above grows the table to hold it (the kernel
    // rounds up); closing it leaves the table as grown.
    const int high = ::fcntl(lowest, F_DUPFD_CLOEXEC, static_cast<int>(last));
    if (high >= 0) ::close(high);
  }
  ::close(lowest);
}

}  // namespace cohort::os

#include "os/unwaiting_write.hpp"

#include <fcntl.h>

#include <cstdio>

namespace cohort::os {

unwaiting_output make_unwaiting(int fd, const struct stat& st) noexcept {
  unwaiting_output out;
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0 && (flags & O_NONBLOCK) != 0) return out;  // its writes answer EAGAIN already
  if (S_ISSOCK(st.st_mode)) {
    out.way = write_way::send;
  } else if (S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode)) {
    char path[48];
    std::snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    owned_fd again(::open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY));
    struct stat same {};
    if (again.get() >= 0 && ::fstat(again.get(), &same) == 0 && same.st_dev == st.st_dev && same.st_ino == st.st_ino) {
      out.reopened = std::move(again);
    } else {
      out.way = write_way::if_room;
    }
  }
  return out;
}

}  // namespace cohort::os

// A descriptor that closes itself.
#pragma once

#include <unistd.h>

#include <utility>

namespace cohort::os {

class owned_fd {
 public:
  owned_fd() = default;
  explicit owned_fd(int fd) : fd_(fd) {}
  owned_fd(owned_fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  owned_fd& operator=(owned_fd&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  ~owned_fd() { reset(); }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }
  void reset() {
    if (fd_ >= 0) ::close(std::exchange(fd_, -1));
  }

 private:
  int fd_ = -1;
};

}  // namespace cohort::os

#include "os/descriptor_passing.hpp"

#include "support/process_probe.hpp"

#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>

using namespace cohort;

namespace {

// Sends `n` descriptors of /dev/null over a fresh socket pair and receives
// them with room for `capacity`; what came, and whether it was truncated.
struct received {
  std::size_t count = 0;
  bool truncated = false;
  ssize_t size = -1;
};

received pass(std::size_t n, std::size_t capacity) {
  int ends[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, ends) == 0);
  std::array<int, 8> sent{};
  for (std::size_t i = 0; i < n; ++i) sent[i] = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  const char byte = 'x';
  REQUIRE(os::send_with_fds(ends[0], &byte, 1, sent.data(), n));
  for (std::size_t i = 0; i < n; ++i) ::close(sent[i]);
  std::array<int, 8> fds{};
  char got = 0;
  received r;
  r.size = os::receive_with_fds(ends[1], &got, 1, fds.data(), capacity, r.count, r.truncated);
  for (std::size_t i = 0; i < r.count; ++i) ::close(fds[i]);
  ::close(ends[0]);
  ::close(ends[1]);
  return r;
}

}  // namespace

TEST_CASE("descriptors past the receiver's capacity: none kept, none left open, and said to be truncated") {
  const int before = test::open_fd_count();
  for (const auto& [n, capacity] : {std::pair<std::size_t, std::size_t>{2, 2}, {3, 3}, {2, 1}, {4, 3}, {3, 2}}) {
    CAPTURE(n);
    CAPTURE(capacity);
    const auto r = pass(n, capacity);
    CHECK(r.size == 1);
    CHECK(r.truncated == (n > capacity));
    CHECK(r.count == (n > capacity ? 0 : n));
    CHECK(test::open_fd_count() == before);  // as many closed as came
  }
}

// The socket through which a process hands out its chunks' descriptors and
// its event table: the same for a memfd as for the driver's descriptors, so
// it runs on every machine, with or without a device.
#include "cuda/exchange.hpp"

#include "cohort/queue.hpp"
#include "cohort/spawn_and_join.hpp"

#include <doctest/doctest.h>

#include <grp.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <future>
#include <string>
#include <tuple>

using namespace cohort;

namespace exchange_tests {

constexpr std::uint64_t chunk_id = 7;
constexpr char contents[] = "bytes of a chunk";

// In a rank: serves a memfd holding `contents` as chunk 7 of its own, and
// as the chunk of another maker, and a memfd as its event table; says its
// pid and port on `where`, then waits for `done` before it ends.
void serve(int, queue<std::int64_t> where, queue<int> done) {
  const int fd = ::memfd_create("exchange-test", MFD_CLOEXEC);
  if (fd < 0 || ::write(fd, contents, sizeof contents) != static_cast<ssize_t>(sizeof contents)) {
    throw std::runtime_error("memfd");
  }
  cuda::detail::serve_chunk(::getpid(), chunk_id, fd);
  cuda::detail::serve_chunk(1, chunk_id + 1, fd);  // a chunk another process made, passed on from here
  cuda::detail::serve_event_table(fd);
  ::close(fd);  // the table holds its own
  where.put(::getpid());
  where.put(cuda::detail::own_port());
  done.get();
}
COHORT_ENTRYPOINT(serve);

std::string read_all(int fd) {
  char buffer[64] = {};
  const auto n = ::pread(fd, buffer, sizeof buffer, 0);
  ::close(fd);
  return n > 0 ? std::string(buffer, static_cast<std::size_t>(n) - 1) : std::string();
}

}  // namespace exchange_tests

using namespace exchange_tests;

TEST_CASE("a process hands out the descriptors it serves, says which it has not, and is found gone once ended") {
  queue<std::int64_t> where(4);
  queue<int> done(1);
  std::string why;
  pid_t pid = 0;
  std::uint32_t port = 0;
  auto server = std::async(std::launch::async, [&] { spawn_and_join(serve, std::tuple{where, done}, 1); });
  pid = static_cast<pid_t>(*where.get());
  port = static_cast<std::uint32_t>(*where.get());

  // Another user gets nothing (asked from a child of this process, forked
  // before this process connects: a connection is kept per peer). Before,
  // anyone who found the socket's name in /proc/net/unix was served.
  if (::geteuid() == 0) {
    const pid_t other = ::fork();
    if (other == 0) {
      if (::setgroups(0, nullptr) != 0 || ::setresgid(65534, 65534, 65534) != 0 ||
          ::setresuid(65534, 65534, 65534) != 0) {
        ::_exit(77);
      }
      std::string refused;
      const int got = cuda::detail::fetch_chunk(pid, port, pid, chunk_id, refused);
      const int table = cuda::detail::fetch_event_table(pid, port, refused);
      ::_exit(got < 0 && table < 0 && refused.find("refuses another user") != std::string::npos ? 0 : 1);
    }
    REQUIRE(other > 0);
    int status = 0;
    REQUIRE(::waitpid(other, &status, 0) == other);
    REQUIRE(WIFEXITED(status));
    if (WEXITSTATUS(status) == 77) MESSAGE("the child could not become another user: not checked");
    else CHECK(WEXITSTATUS(status) == 0);
  } else {
    MESSAGE("not root: no other user to ask as, not checked");
  }

  const int fd = cuda::detail::fetch_chunk(pid, port, pid, chunk_id, why);
  REQUIRE(fd >= 0);
  CHECK(read_all(fd) == contents);
  // A chunk it holds for another maker, and its event table.
  const int passed_on = cuda::detail::fetch_chunk(pid, port, 1, chunk_id + 1, why);
  REQUIRE(passed_on >= 0);
  CHECK(read_all(passed_on) == contents);
  const int table = cuda::detail::fetch_event_table(pid, port, why);
  REQUIRE(table >= 0);
  CHECK(read_all(table) == contents);

  // One it does not serve: no descriptor, and the reason.
  CHECK(cuda::detail::fetch_chunk(pid, port, pid, chunk_id + 100, why) == -1);
  CHECK(why.find("has none") != std::string::npos);
  // The wrong port: nobody answers there.
  CHECK(cuda::detail::fetch_chunk(pid, port + 1, pid, chunk_id, why) == -1);
  CHECK(why.find("does not answer") != std::string::npos);

  done.put(1);
  server.get();
  // Once it has ended, the connection kept to it says so.
  CHECK(cuda::detail::fetch_chunk(pid, port, pid, chunk_id, why) == -1);
  CHECK(why.find("does not answer") != std::string::npos);
}

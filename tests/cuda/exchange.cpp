// The socket through which a process hands out its chunks' descriptors and
// its event table: the same for a memfd as for the driver's descriptors, so
// it runs on every machine, with or without a device.
#include "cuda/exchange.hpp"

#include "cohort/queue.hpp"
#include "cohort/spawn_and_join.hpp"

#include <doctest/doctest.h>

#include <fmt/format.h>

#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <future>
#include <string>
#include <tuple>
#include <vector>

using namespace cohort;

namespace exchange_tests {

constexpr std::uint64_t chunk_id = 7;
constexpr char contents[] = "bytes of a chunk";
constexpr char other_contents[] = "bytes of another chunk";

// A memfd holding `bytes` (with its NUL).
template <std::size_t n>
int memfd_of(const char (&bytes)[n]) {
  const int fd = ::memfd_create("exchange-test", MFD_CLOEXEC);
  if (fd < 0 || ::write(fd, bytes, n) != static_cast<ssize_t>(n)) throw std::runtime_error("memfd");
  return fd;
}

// In a rank: serves a memfd holding `contents` as chunk 7 of its own, and
// chunks of other makers, passed on from here: chunk 8 of two processes
// that had the same pid, 1, and differ by their ports, 10 (`contents`) and
// 11 (`other_contents`); and chunk 9 of process 1 at port 12, served again
// (`other_contents`) before its first holder stopped serving it. And a
// memfd as its event table. Says its pid and port on `where`, then waits
// for `done` before it ends.
void serve(int, queue<std::int64_t> where, queue<int> done) {
  const int fd = memfd_of(contents);
  const int other = memfd_of(other_contents);
  const auto port = cuda::detail::own_port();
  cuda::detail::serve_chunk(::getpid(), port, chunk_id, fd);
  cuda::detail::serve_chunk(1, 10, chunk_id + 1, fd);
  cuda::detail::serve_chunk(1, 11, chunk_id + 1, other);
  cuda::detail::serve_chunk(1, 12, chunk_id + 2, fd);
  cuda::detail::serve_chunk(1, 12, chunk_id + 2, other);
  cuda::detail::stop_serving_chunk(1, 12, chunk_id + 2, fd);
  cuda::detail::serve_event_table(fd);  // the table holds a descriptor of its own
  where.put(::getpid());
  where.put(port);
  done.get();
  // The served chunks' descriptors stay this rank's, open while served.
  cuda::detail::stop_serving_chunk(::getpid(), port, chunk_id, fd);
  cuda::detail::stop_serving_chunk(1, 10, chunk_id + 1, fd);
  cuda::detail::stop_serving_chunk(1, 11, chunk_id + 1, other);
  cuda::detail::stop_serving_chunk(1, 12, chunk_id + 2, other);
  ::close(fd);
  ::close(other);
}
COHORT_ENTRYPOINT(serve);

std::string read_all(int fd) {
  char buffer[64] = {};
  const auto n = ::pread(fd, buffer, sizeof buffer, 0);
  ::close(fd);
  return n > 0 ? std::string(buffer, static_cast<std::size_t>(n) - 1) : std::string();
}

// A process forked from here (which never serves, so the child starts its
// own socket) that serves `contents` as chunk 7 of its own, having asked
// itself for it, so its socket's thread is up, and for one it does not
// serve, so the descriptor answered before is closed: a limit then put on
// it finds no descriptor going away on its own. Told to over a socket
// pair, it puts itself under a limit (`squeeze`) and lifts it (`lift`),
// saying when it has.
class forked_server {
 public:
  forked_server(void (*squeeze)(), void (*lift)()) {
    int pair[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) throw std::runtime_error("socketpair");
    pid = ::fork();
    if (pid == 0) {
      ::close(pair[0]);
      ::_exit(run(pair[1], squeeze, lift));
    }
    ::close(pair[1]);
    control_ = pair[0];
    if (pid < 0 || ::recv(control_, &port, sizeof port, MSG_WAITALL) != sizeof port) {
      throw std::runtime_error("the forked server did not start");
    }
  }
  ~forked_server() {
    if (pid > 0 && running()) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    ::close(control_);
  }
  forked_server(const forked_server&) = delete;
  forked_server& operator=(const forked_server&) = delete;

  void squeeze() { tell('s'); }
  void lift() { tell('l'); }
  bool running() const { return ::waitpid(pid, nullptr, WNOHANG) == 0; }
  // Tells it to end; its exit status.
  int end() {
    tell('e');
    int status = 0;
    ::waitpid(std::exchange(pid, 0), &status, 0);
    return status;
  }

  pid_t pid = 0;
  std::uint32_t port = 0;

 private:
  void tell(char what) {
    char heard = 0;
    if (::send(control_, &what, 1, MSG_NOSIGNAL) != 1) return;
    std::ignore = ::recv(control_, &heard, 1, 0);
  }

  static int run(int control, void (*squeeze)(), void (*lift)()) {
    const int fd = memfd_of(contents);
    const auto port = cuda::detail::own_port();
    cuda::detail::serve_chunk(::getpid(), port, chunk_id, fd);
    std::string why;
    if (read_all(cuda::detail::fetch_chunk(::getpid(), port, ::getpid(), port, chunk_id, why)) != contents) return 3;
    // And for one it does not serve: answered with no descriptor, once the
    // answering thread has closed the one it sent before.
    if (cuda::detail::fetch_chunk(::getpid(), port, ::getpid(), port, chunk_id + 100, why) != -1) return 3;
    if (::send(control, &port, sizeof port, MSG_NOSIGNAL) != sizeof port) return 4;
    for (char what = 0; ::recv(control, &what, 1, 0) == 1;) {
      if (what == 's') squeeze();
      else if (what == 'l') lift();
      if (::send(control, &what, 1, MSG_NOSIGNAL) != 1 || what == 'e') break;
    }
    return 0;
  }

  int control_ = -1;
};

// No room in the address space for another thread's stack: what the
// process maps now and 1 MiB more.
rlimit address_space_limit{};
void no_room_for_a_thread() {
  ::getrlimit(RLIMIT_AS, &address_space_limit);
  long pages = 0;
  std::ifstream("/proc/self/statm") >> pages;
  rlimit tight = address_space_limit;
  tight.rlim_cur = static_cast<rlim_t>(pages) * static_cast<rlim_t>(::sysconf(_SC_PAGESIZE)) + (1 << 20);
  ::setrlimit(RLIMIT_AS, &tight);
}
void room_for_threads() { ::setrlimit(RLIMIT_AS, &address_space_limit); }

// Every descriptor taken, under a soft limit of 256.
rlimit descriptor_limit{};
std::vector<int> taken;
void no_descriptor_left() {
  ::getrlimit(RLIMIT_NOFILE, &descriptor_limit);
  rlimit tight = descriptor_limit;
  tight.rlim_cur = 256;
  ::setrlimit(RLIMIT_NOFILE, &tight);
  taken.reserve(256);
  for (int fd; (fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) taken.push_back(fd);
}
void descriptors_back() {
  for (const int fd : taken) ::close(fd);
  taken.clear();
  ::setrlimit(RLIMIT_NOFILE, &descriptor_limit);
}

// A connection to the socket of process `pid` at `port` that asks nothing.
// (The socket's name as exchange.cpp makes it.)
int connect_silently(pid_t pid, std::uint32_t port) {
  const int s = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  const auto name = fmt::format("cohort-cuda.{}.{}", pid, port);
  std::memcpy(a.sun_path + 1, name.data(), name.size());
  const auto length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  if (s >= 0 && ::connect(s, reinterpret_cast<const sockaddr*>(&a), length) == 0) return s;
  if (s >= 0) ::close(s);
  return -1;
}

// Whether the process closes a connection that asks nothing at once (well
// within 30 s) rather than waiting for its requests.
bool closed_at_once(pid_t pid, std::uint32_t port) {
  const int quiet = connect_silently(pid, port);
  const timeval limit{30, 0};
  ::setsockopt(quiet, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  char byte = 0;
  return quiet >= 0 && ::recv(quiet, &byte, 1, 0) == 0;
}

// Reaps `other`, a child that became another user to check something and
// exits 0 when it held, 77 when it could not become one.
void check_other_user(pid_t other) {
  int status = 0;
  REQUIRE(::waitpid(other, &status, 0) == other);
  REQUIRE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 77) MESSAGE("the child could not become another user: not checked");
  else CHECK(WEXITSTATUS(status) == 0);
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
      const int got = cuda::detail::fetch_chunk(pid, port, pid, port, chunk_id, refused);
      const int table = cuda::detail::fetch_event_table(pid, port, refused);
      if (got >= 0 || table >= 0 || refused.find("refuses another user") == std::string::npos) ::_exit(1);
      // Its connection is closed at once, before anything is started for
      // it. Before, each got a thread of its own, which waited for requests
      // while the connection stayed open: any user could start threads
      // there without end.
      ::_exit(closed_at_once(pid, port) ? 0 : 2);
    }
    REQUIRE(other > 0);
    check_other_user(other);
  } else {
    MESSAGE("not root: no other user to ask as, not checked");
  }

  // A process with one descriptor left, for its connection, and none for
  // the chunk's: told so (forked before this process connects, as above).
  const pid_t crowded = ::fork();
  if (crowded == 0) {
    rlimit tight{64, 64};
    ::setrlimit(RLIMIT_NOFILE, &tight);
    int last = -1;
    for (int fd; (fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) last = fd;
    ::close(last);
    std::string short_of;
    const int got = cuda::detail::fetch_chunk(pid, port, pid, port, chunk_id, short_of);
    ::_exit(got < 0 && short_of.find("no descriptor left here") != std::string::npos ? 0 : 1);
  }
  REQUIRE(crowded > 0);
  int crowded_status = 0;
  REQUIRE(::waitpid(crowded, &crowded_status, 0) == crowded);
  CHECK(WIFEXITED(crowded_status));
  CHECK(WEXITSTATUS(crowded_status) == 0);

  const int fd = cuda::detail::fetch_chunk(pid, port, pid, port, chunk_id, why);
  REQUIRE(fd >= 0);
  CHECK(read_all(fd) == contents);
  // Chunks it holds for other makers: two that had one pid, each by its
  // maker's port. Before, a chunk was served by its maker's pid and id, the
  // first one served kept: a maker's pid reused, the new maker's chunk was
  // answered with the old one's memory.
  const int passed_on = cuda::detail::fetch_chunk(pid, port, 1, 10, chunk_id + 1, why);
  REQUIRE(passed_on >= 0);
  CHECK(read_all(passed_on) == contents);
  const int other_maker = cuda::detail::fetch_chunk(pid, port, 1, 11, chunk_id + 1, why);
  REQUIRE(other_maker >= 0);
  CHECK(read_all(other_maker) == other_contents);
  // A chunk served again, then let go of by its first holder: still
  // served, with the latest descriptor. Before, the first holder's end
  // stopped serving it.
  const int served_again = cuda::detail::fetch_chunk(pid, port, 1, 12, chunk_id + 2, why);
  REQUIRE(served_again >= 0);
  CHECK(read_all(served_again) == other_contents);
  // Its event table.
  const int table = cuda::detail::fetch_event_table(pid, port, why);
  REQUIRE(table >= 0);
  CHECK(read_all(table) == contents);

  // One it does not serve: no descriptor, and the reason.
  CHECK(cuda::detail::fetch_chunk(pid, port, pid, port, chunk_id + 100, why) == -1);
  CHECK(why.find("has none") != std::string::npos);
  CHECK(cuda::detail::fetch_chunk(pid, port, 1, 13, chunk_id + 1, why) == -1);
  CHECK(why.find("has none") != std::string::npos);
  // The wrong port: nobody answers there.
  CHECK(cuda::detail::fetch_chunk(pid, port + 1, pid, port, chunk_id, why) == -1);
  CHECK(why.find("does not answer") != std::string::npos);

  done.put(1);
  server.get();
  // Once it has ended, the connection kept to it says so.
  CHECK(cuda::detail::fetch_chunk(pid, port, pid, port, chunk_id, why) == -1);
  CHECK(why.find("does not answer") != std::string::npos);
}

TEST_CASE("a process in a user namespace that maps no ids refuses another user, who reads as its own id there") {
  if (::geteuid() != 0) {
    MESSAGE("not root: no other user to connect as, not checked");
    return;
  }
  int ready[2];
  REQUIRE(::pipe2(ready, O_CLOEXEC) == 0);
  const pid_t server = ::fork();
  REQUIRE(server >= 0);
  if (server == 0) {
    // Its id there reads as the overflow id, as every other user's does.
    std::uint32_t port = 0;
    if (::unshare(CLONE_NEWUSER) == 0) {
      port = cuda::detail::own_port();
      cuda::detail::serve_chunk(::getpid(), port, chunk_id, memfd_of(contents));
    }
    std::ignore = ::write(ready[1], &port, sizeof port);
    ::pause();
    ::_exit(0);
  }
  ::close(ready[1]);
  std::uint32_t port = 0;
  const bool told = ::read(ready[0], &port, sizeof port) == sizeof port;
  ::close(ready[0]);
  if (told && port != 0) {
    const pid_t other = ::fork();
    REQUIRE(other >= 0);
    if (other == 0) {
      if (::setgroups(0, nullptr) != 0 || ::setresgid(12345, 12345, 12345) != 0 ||
          ::setresuid(12345, 12345, 12345) != 0) {
        ::_exit(77);
      }
      // Closed at once. Before, it was taken for the server's own user and
      // answered: a request on it got the chunk.
      ::_exit(closed_at_once(server, port) ? 0 : 2);
    }
    check_other_user(other);
  } else {
    MESSAGE("no user namespace could be made here: not checked");
  }
  ::kill(server, SIGKILL);
  ::waitpid(server, nullptr, 0);
}

TEST_CASE("a connection that no thread can be started for is closed, and the process goes on serving") {
  forked_server server(no_room_for_a_thread, room_for_threads);
  server.squeeze();
  std::string why;
  CHECK(cuda::detail::fetch_chunk(server.pid, server.port, server.pid, server.port, chunk_id, why) == -1);
  CHECK(why.find("does not answer") != std::string::npos);
  // Before, the failure to start the thread ended the process (an
  // exception out of its socket's thread: SIGABRT).
  REQUIRE(server.running());
  server.lift();
  const int fd = cuda::detail::fetch_chunk(server.pid, server.port, server.pid, server.port, chunk_id, why);
  REQUIRE(fd >= 0);
  CHECK(read_all(fd) == contents);
  const int status = server.end();
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("a process out of descriptors closes a new connection at once, and serves again once it has some") {
  forked_server server(no_descriptor_left, descriptors_back);
  server.squeeze();
  // Its socket's thread took the descriptor it waited with: this connection
  // has it, and the next accept finds none.
  const int first = connect_silently(server.pid, server.port);
  REQUIRE(first >= 0);
  std::string why;
  CHECK(cuda::detail::fetch_chunk(server.pid, server.port, server.pid, server.port, chunk_id, why) == -1);
  CHECK(why.find("does not answer") != std::string::npos);
  // Before, the connection stayed queued while the accept loop spun,
  // failing at once again and again, and the asker waited out its limit.
  CHECK(why.find("no answer within") == std::string::npos);
  REQUIRE(server.running());
  server.lift();
  const int fd = cuda::detail::fetch_chunk(server.pid, server.port, server.pid, server.port, chunk_id, why);
  REQUIRE(fd >= 0);
  CHECK(read_all(fd) == contents);
  ::close(first);
  const int status = server.end();
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

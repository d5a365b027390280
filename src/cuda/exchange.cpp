// The socket on which a process hands out its chunks' descriptors and its
// events' handles, and the connections on which it asks others for theirs.
#include "cuda/exchange.hpp"

#include "os/descriptor_passing.hpp"

#include <fmt/format.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>
#include <tuple>
#include <utility>

namespace cohort::cuda::detail {
namespace {

enum class op : std::uint32_t { chunk = 1, event = 2, event_table = 3 };

struct request {
  op what;
  std::uint32_t slot;        // event
  std::uint32_t maker;       // chunk: its maker's pid,
  std::uint32_t maker_port;  // that process's port,
  std::uint64_t id;          // and the chunk's id there
};

struct reply {
  std::int32_t status;  // 0, or an errno saying why not
  std::uint32_t zero;
  ipc_event_handle handle;  // event
};

constexpr int answer_timeout_seconds = 10;
// Connections answered at once, each by a thread of its own; one more is
// closed unanswered. An asker keeps one connection to each process it
// asked, while that process lives.
constexpr int max_connections = 1024;

sockaddr_un address_of(pid_t pid, std::uint32_t port, socklen_t& length) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  // Abstract: a leading NUL, gone with the socket, nothing to unlink.
  const auto name = fmt::format("cohort-cuda.{}.{}", pid, port);
  std::memcpy(a.sun_path + 1, name.data(), name.size());
  length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return a;
}

// A chunk by its maker's pid and port, random in each process (a pid may
// be another process's by the time a relay hands out a chunk of a maker
// that has ended), and its id there.
using chunk_key = std::tuple<pid_t, std::uint32_t, std::uint64_t>;

struct served {
  std::mutex mutex;
  std::map<chunk_key, int> chunks;  // descriptors their holders keep open while here
  std::map<std::uint32_t, ipc_event_handle> events;
  int event_table = -1;
};
served& table() {
  static auto* t = new served;  // answered from until the process ends
  return *t;
}

// The id that this process's user namespace shows for every user it does
// not map (/proc/sys/kernel/overflowuid, 65534 unless changed), when that
// id is not also a user it maps (nobody, where the namespace maps it);
// nullopt when it is, or cannot be told.
std::optional<uid_t> unmapped_uid() noexcept {
  static const std::optional<uid_t> id = []() -> std::optional<uid_t> {
    unsigned long overflow = 0;
    std::FILE* f = std::fopen("/proc/sys/kernel/overflowuid", "re");
    if (f == nullptr) return std::nullopt;
    const bool read = std::fscanf(f, "%lu", &overflow) == 1;
    std::fclose(f);
    if (!read) return std::nullopt;
    f = std::fopen("/proc/self/uid_map", "re");
    if (f == nullptr) return std::nullopt;
    bool mapped = false;
    for (unsigned long inside = 0, outside = 0, count = 0;
         std::fscanf(f, "%lu %lu %lu", &inside, &outside, &count) == 3;) {
      mapped = mapped || (overflow >= inside && overflow - inside < count);
    }
    std::fclose(f);
    return mapped ? std::nullopt : std::optional<uid_t>(static_cast<uid_t>(overflow));
  }();
  return id;
}

// Whether the process at the other end of `connection` may have what this
// one serves: a process of this user, or root, as a memfd's /proc entry
// allows. An abstract socket has no permissions of its own, and its name
// is listed in /proc/net/unix for every user to see. The id shown for
// users the namespace does not map names no one: in a namespace that maps
// no ids, this process and every other user read as it.
bool trusted_peer(int connection) noexcept {
  ucred peer{};
  socklen_t length = sizeof peer;
  return ::getsockopt(connection, SOL_SOCKET, SO_PEERCRED, &peer, &length) == 0 && peer.uid != unmapped_uid() &&
         (peer.uid == ::geteuid() || peer.uid == 0);
}

std::atomic<int> answering{0};  // connections with a thread answering them

// Answers one peer's requests until it hangs up, then closes `connection`.
void answer(int connection) {
  for (;;) {
    request q{};
    ssize_t n;
    do n = ::recv(connection, &q, sizeof q, 0);
    while (n < 0 && errno == EINTR);
    if (n != static_cast<ssize_t>(sizeof q)) break;
    reply r{};
    // Sent on a duplicate, taken under the lock: the table's own may be
    // closed by its holder once the lock is let go of.
    int fd = -1;
    {
      auto& t = table();
      std::lock_guard lock(t.mutex);
      if (q.what == op::chunk) {
        const auto found = t.chunks.find(chunk_key{static_cast<pid_t>(q.maker), q.maker_port, q.id});
        if (found == t.chunks.end()) r.status = ENOENT;
        else if ((fd = ::fcntl(found->second, F_DUPFD_CLOEXEC, 0)) < 0) r.status = errno;
      } else if (q.what == op::event_table) {
        if (t.event_table < 0) r.status = ENOENT;
        else if ((fd = ::fcntl(t.event_table, F_DUPFD_CLOEXEC, 0)) < 0) r.status = errno;
      } else if (q.what == op::event) {
        const auto found = t.events.find(q.slot);
        if (found == t.events.end()) r.status = ENOENT;
        else r.handle = found->second;
      } else {
        r.status = EINVAL;
      }
    }
    const bool sent = os::send_with_fds(connection, &r, sizeof r, &fd, fd >= 0 ? 1 : 0);
    if (fd >= 0) ::close(fd);
    if (!sent) break;
  }
  ::close(connection);
  answering.fetch_sub(1, std::memory_order_relaxed);
}

// Starts a thread that answers `connection` and then closes it; false, the
// connection still the caller's, when max_connections are answered already
// or no thread can be started (RLIMIT_NPROC, no address space for a stack).
bool start_answering(int connection) noexcept {
  if (answering.fetch_add(1, std::memory_order_relaxed) >= max_connections) {
    answering.fetch_sub(1, std::memory_order_relaxed);
    return false;
  }
  try {
    std::thread(answer, connection).detach();
    return true;
  } catch (...) {  // std::system_error, std::bad_alloc
    answering.fetch_sub(1, std::memory_order_relaxed);
    return false;
  }
}

int open_spare() noexcept { return ::open("/dev/null", O_RDONLY | O_CLOEXEC); }

// Takes connections on `listener` for good. One from another user is
// closed at once, before anything is started for it; so is one that no
// thread can be started for: its asker is told this process does not
// answer. Out of descriptors (EMFILE, ENFILE), accept fails at once and
// leaves the connection queued, its asker waiting out its 10 seconds:
// the loop waits in poll(2), which takes no descriptor, until one is
// queued, tries again, and if there is still none to take it on, takes it
// on the number of a spare descriptor kept for this, closes it and opens
// the spare again; with no spare, it tries again every 10 ms.
void take_connections(int listener) noexcept {
  int spare = open_spare();
  bool short_of_descriptors = false;  // the last accept found none
  const auto back_off = [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (spare < 0) spare = open_spare();
  };
  for (;;) {
    if (short_of_descriptors) {
      pollfd queued{listener, POLLIN, 0};
      if (::poll(&queued, 1, -1) < 0 && errno != EINTR) back_off();
    }
    const int connection = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (connection >= 0) {
      short_of_descriptors = false;
      if (!trusted_peer(connection) || !start_answering(connection)) ::close(connection);
      if (spare < 0) spare = open_spare();
      continue;
    }
    const int e = errno;
    if (e == EINTR || e == ECONNABORTED) continue;
    if (e == ENOBUFS || e == ENOMEM) {
      back_off();
    } else if (e == EMFILE || e == ENFILE) {
      if (short_of_descriptors && spare >= 0) {
        ::close(spare);
        const int refused = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
        if (refused >= 0) ::close(refused);
        spare = open_spare();
      } else if (short_of_descriptors) {
        back_off();
      }
      short_of_descriptors = true;
    } else {
      return;
    }
  }
}

std::uint32_t start_serving() {
  std::uint32_t port = 0;
  while (port == 0) {
    if (::getrandom(&port, sizeof port, 0) != sizeof port) port = static_cast<std::uint32_t>(::getpid()) * 2654435761u;
  }
  const int listener = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (listener < 0) throw std::system_error(errno, std::generic_category(), "cohort::cuda: socket");
  socklen_t length = 0;
  const auto a = address_of(::getpid(), port, length);
  if (::bind(listener, reinterpret_cast<const sockaddr*>(&a), length) != 0 || ::listen(listener, 64) != 0) {
    const int e = errno;
    ::close(listener);
    throw std::system_error(e, std::generic_category(), "cohort::cuda: the socket that hands out device memory");
  }
  try {
    std::thread(take_connections, listener).detach();
  } catch (...) {
    ::close(listener);
    throw;
  }
  return port;
}

// The connections this process asks on, one per peer, one request at a
// time on each.
struct connection {
  std::mutex mutex;
  int fd = -1;
  ~connection() {
    if (fd >= 0) ::close(fd);
  }
};
struct connections {
  std::mutex mutex;
  std::map<std::pair<pid_t, std::uint32_t>, std::shared_ptr<connection>> peers;
};
connections& peers() {
  static auto* c = new connections;
  return *c;
}

}  // namespace

void forget_ended_peers() noexcept {
  auto& all = peers();
  std::lock_guard lock(all.mutex);
  // A request in flight holds its connection, which closes once it is done.
  std::erase_if(all.peers, [](const auto& peer) { return ::kill(peer.first.first, 0) != 0 && errno == ESRCH; });
}

namespace {

// Sends `q` to `pid`, and reads the reply and any descriptor with it;
// false with the reason in `why`.
bool ask(pid_t pid, std::uint32_t port, const request& q, reply& r, int& fd, std::string& why) {
  fd = -1;
  std::shared_ptr<connection> c;
  {
    auto& all = peers();
    std::lock_guard lock(all.mutex);
    auto& slot = all.peers[{pid, port}];
    if (!slot) slot = std::make_shared<connection>();
    c = slot;
  }
  std::lock_guard lock(c->mutex);
  const auto drop = [&](const std::string& reason) {
    why = fmt::format("process {} does not answer ({})", pid, reason);
    if (c->fd >= 0) ::close(std::exchange(c->fd, -1));
    return false;
  };
  if (c->fd < 0) {
    const int s = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (s < 0) return drop(std::strerror(errno));
    const timeval limit{answer_timeout_seconds, 0};
    ::setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
    ::setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit);
    socklen_t length = 0;
    const auto a = address_of(pid, port, length);
    if (::connect(s, reinterpret_cast<const sockaddr*>(&a), length) != 0) {
      const int e = errno;
      ::close(s);
      return drop(e == ECONNREFUSED ? "it has ended, or never sent device memory" : std::strerror(e));
    }
    // A process of another user closes the connection unanswered
    // (trusted_peer); its credentials, as it listened, say so here.
    ucred server{};
    socklen_t size = sizeof server;
    if (::getsockopt(s, SOL_SOCKET, SO_PEERCRED, &server, &size) == 0 && server.uid != ::geteuid() &&
        ::geteuid() != 0) {
      ::close(s);
      why = fmt::format("process {} refuses another user", pid);
      return false;
    }
    c->fd = s;
  }
  errno = 0;
  if (!os::send_with_fds(c->fd, &q, sizeof q, nullptr, 0)) return drop(errno != 0 ? std::strerror(errno) : "a short send");
  std::size_t count = 0;
  bool truncated = false;
  const ssize_t n = os::receive_with_fds(c->fd, &r, sizeof r, &fd, 1, count, truncated);
  if (n != static_cast<ssize_t>(sizeof r)) {
    if (fd >= 0) ::close(std::exchange(fd, -1));
    return drop(n == 0                                          ? "it hung up: it has ended, or could not answer"
                : n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) ? "no answer within 10 seconds"
                : n < 0                                         ? std::strerror(errno)
                                                                : "a short reply");
  }
  if (r.status != 0) {
    if (fd >= 0) ::close(std::exchange(fd, -1));
    why = fmt::format("process {} has none ({})", pid, std::strerror(r.status));
    return false;
  }
  if (truncated && fd < 0) {
    why = fmt::format("no descriptor left here to take process {}'s on (RLIMIT_NOFILE)", pid);
    return false;
  }
  return true;
}

}  // namespace

std::uint32_t own_port() {
  static const std::uint32_t port = start_serving();
  return port;
}

void serve_chunk(pid_t maker, std::uint32_t port, std::uint64_t id, int fd) {
  auto& t = table();
  std::lock_guard lock(t.mutex);
  t.chunks.insert_or_assign(chunk_key{maker, port, id}, fd);
}

void stop_serving_chunk(pid_t maker, std::uint32_t port, std::uint64_t id, int fd) noexcept {
  auto& t = table();
  std::lock_guard lock(t.mutex);
  if (auto found = t.chunks.find(chunk_key{maker, port, id}); found != t.chunks.end() && found->second == fd) {
    t.chunks.erase(found);
  }
}

void serve_event(std::uint32_t slot, const ipc_event_handle& handle) {
  auto& t = table();
  std::lock_guard lock(t.mutex);
  t.events[slot] = handle;
}

void serve_event_table(int fd) {
  const int own = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (own < 0) throw std::system_error(errno, std::generic_category(), "cohort::cuda: the event table's descriptor");
  auto& t = table();
  std::lock_guard lock(t.mutex);
  if (t.event_table >= 0) ::close(t.event_table);
  t.event_table = own;
}

int fetch_event_table(pid_t pid, std::uint32_t port, std::string& why) {
  const request q{op::event_table, 0, 0, 0, 0};
  reply r{};
  int fd = -1;
  if (!ask(pid, port, q, r, fd, why)) return -1;
  if (fd < 0) why = fmt::format("process {} sent no descriptor", pid);
  return fd;
}

int fetch_chunk(pid_t pid, std::uint32_t port, pid_t maker, std::uint32_t maker_port, std::uint64_t id,
                std::string& why) {
  const request q{op::chunk, 0, static_cast<std::uint32_t>(maker), maker_port, id};
  reply r{};
  int fd = -1;
  if (!ask(pid, port, q, r, fd, why)) return -1;
  if (fd < 0) why = fmt::format("process {} sent no descriptor", pid);
  return fd;
}

bool fetch_event(pid_t pid, std::uint32_t port, std::uint32_t slot, ipc_event_handle& handle, std::string& why) {
  const request q{op::event, slot, 0, 0, 0};
  reply r{};
  int fd = -1;
  if (!ask(pid, port, q, r, fd, why)) return false;
  if (fd >= 0) ::close(fd);
  handle = r.handle;
  return true;
}

}  // namespace cohort::cuda::detail

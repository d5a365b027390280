// Gathering each node's rank count at node 0 (run/node_sizes.hpp).
#include "run/node_sizes.hpp"

#include <fmt/format.h>

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>

namespace cohort_run {

namespace {

using clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr std::size_t longest_greeting = 128;
constexpr int largest_count = 1 << 20;
// The longest line node 0 sends to a job of `nnodes`: its answer names
// every node's count (7 digits at most, and a space).
std::size_t longest_answer(int nnodes) { return 1024 + 8 * static_cast<std::size_t>(nnodes); }
// How many missing nodes a message names before it counts the rest.
constexpr std::size_t named_at_most = 10;

class socket_fd {
 public:
  socket_fd() = default;
  explicit socket_fd(int fd) noexcept : fd_(fd) {}
  socket_fd(socket_fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  socket_fd& operator=(socket_fd&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  ~socket_fd() { reset(); }
  int get() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }
  void reset() noexcept {
    if (fd_ >= 0) ::close(std::exchange(fd_, -1));
  }
  // Closes with a reset rather than an orderly end, for node 0's side of a
  // connection it ends before its peer does: nothing of it then stays on
  // the master's port (TIME_WAIT, FIN_WAIT) to keep rank 0's store from
  // binding it.
  void abort() noexcept {
    if (fd_ < 0) return;
    const linger now{1, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_LINGER, &now, sizeof now);
    reset();
  }

 private:
  int fd_ = -1;
};

std::string seconds_of(milliseconds d) { return fmt::format("{:g}", static_cast<double>(d.count()) / 1000); }

// Sends `text` whole on a non-blocking socket, waiting for room at most
// 2 s; false when it could not.
bool send_line(int fd, const std::string& text) noexcept {
  const auto until = clock::now() + std::chrono::seconds(2);
  std::size_t sent = 0;
  while (sent < text.size()) {
    const ssize_t n = ::send(fd, text.data() + sent, text.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && clock::now() < until) {
      pollfd room{fd, POLLOUT, 0};
      ::poll(&room, 1, 100);
      continue;
    }
    if (n <= 0) return false;
    sent += static_cast<std::size_t>(n);
  }
  return true;
}

// Reads what a non-blocking socket has into `got`. The outcome: a whole
// line in `got` (its newline dropped), more to wait for, or the end (the
// peer closed, failed, or sent a line longer than `longest`).
enum class line_state { whole, more, ended };
line_state read_line(int fd, std::string& got, std::size_t longest) {
  char buffer[512];
  for (;;) {
    const ssize_t n = ::recv(fd, buffer, sizeof buffer, MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK ? line_state::more : line_state::ended;
    if (n == 0) return line_state::ended;
    got.append(buffer, static_cast<std::size_t>(n));
    if (const auto end = got.find('\n'); end != std::string::npos) {
      got.resize(end);
      return line_state::whole;
    }
    if (got.size() > longest) return line_state::ended;
  }
}

// Whole numbers from `text`, space-separated; nullopt when anything else.
std::optional<std::vector<int>> numbers_in(std::string_view text) {
  std::vector<int> out;
  while (!text.empty()) {
    const auto space = text.find(' ');
    const auto word = text.substr(0, space);
    int value = 0;
    const auto [end, ec] = std::from_chars(word.data(), word.data() + word.size(), value);
    if (ec != std::errc{} || end != word.data() + word.size() || word.empty()) return std::nullopt;
    out.push_back(value);
    text = space == std::string_view::npos ? std::string_view{} : text.substr(space + 1);
  }
  return out;
}

bool pause_for(const node_sizes_config& c, milliseconds d) {
  if (c.pause) return c.pause(d);
  std::this_thread::sleep_for(d);
  return true;
}

int poll_for(std::vector<pollfd>& fds, clock::time_point deadline, milliseconds slice) {
  const auto left = std::chrono::duration_cast<milliseconds>(deadline - clock::now());
  const auto wait = std::clamp(left, milliseconds(0), slice);
  const int n = ::poll(fds.data(), fds.size(), static_cast<int>(wait.count()));
  return n < 0 && errno != EINTR ? -1 : std::max(n, 0);
}

// A listening socket on every address at `port`: IPv6 taking IPv4 too, or
// IPv4 alone where there is no IPv6.
socket_fd listen_on(int port) {
  socket_fd fd(::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  const int one = 1, zero = 0;
  int error = 0;
  if (fd) {
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    a.sin6_port = htons(static_cast<std::uint16_t>(port));
    ::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && ::listen(fd.get(), 128) == 0) return fd;
    error = errno;
    fd.reset();
  }
  if (error == 0 || error == EAFNOSUPPORT || error == EADDRNOTAVAIL) {
    fd = socket_fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (fd) {
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_ANY);
      a.sin_port = htons(static_cast<std::uint16_t>(port));
      ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && ::listen(fd.get(), 128) == 0) return fd;
    }
    error = errno;
  }
  throw node_sizes_error(fmt::format("node 0 cannot listen on port {} for the other nodes' rank counts: {}", port,
                                     std::strerror(error)));
}

// Room for a descriptor per node at node 0, while it waits for them: the
// soft limit raised within the hard one where it is lower, and put back
// once the exchange is over (the ranks start with what was given).
class descriptor_room {
 public:
  explicit descriptor_room(int nnodes) noexcept {
    if (::getrlimit(RLIMIT_NOFILE, &given_) != 0) return;
    const rlim_t wanted = 256 + static_cast<rlim_t>(nnodes);
    if (given_.rlim_cur == RLIM_INFINITY || given_.rlim_cur >= wanted) return;
    rlimit raised = given_;
    raised.rlim_cur = given_.rlim_max == RLIM_INFINITY ? wanted : std::min(wanted, given_.rlim_max);
    raised_ = raised.rlim_cur > given_.rlim_cur && ::setrlimit(RLIMIT_NOFILE, &raised) == 0;
  }
  descriptor_room(const descriptor_room&) = delete;
  descriptor_room& operator=(const descriptor_room&) = delete;
  ~descriptor_room() {
    if (raised_) ::setrlimit(RLIMIT_NOFILE, &given_);
  }

 private:
  rlimit given_{};
  bool raised_ = false;
};

// "1, 2, 3", naming at most named_at_most of `ranks` and counting the rest.
std::string some_of(const std::vector<int>& ranks) {
  const auto named = std::min(ranks.size(), named_at_most);
  const auto end = ranks.begin() + static_cast<std::ptrdiff_t>(named);
  std::string text = fmt::format("{}", fmt::join(ranks.begin(), end, ", "));
  if (ranks.size() > named) text += fmt::format(" and {} more", ranks.size() - named);
  return text;
}

// Sends `line`, node 0's last, to each of `fds`, and closes each once its
// node has closed its own end, as a node does once it has that line: an
// orderly end that leaves nothing on the master's port. What a node sends
// meanwhile (a greeting not read yet) is read and dropped, as a socket
// closed with unread bytes ends with a reset. Those that send more than a
// greeting, or are still open after 2 s, are reset.
void send_last_line(const std::vector<socket_fd*>& fds, const std::string& line) {
  struct closing {
    socket_fd* fd;
    std::size_t read = 0;
  };
  std::vector<closing> open;
  for (auto* fd : fds) {
    if (fd == nullptr || !*fd) continue;
    send_line(fd->get(), line);
    open.push_back({fd});
  }
  const auto until = clock::now() + std::chrono::seconds(2);
  while (!open.empty() && clock::now() < until) {
    std::vector<pollfd> polled;
    for (const auto& o : open) polled.push_back({o.fd->get(), POLLIN, 0});
    if (poll_for(polled, until, milliseconds(100)) < 0) break;
    for (std::size_t i = polled.size(); i-- > 0;) {
      if (polled[i].revents == 0) continue;
      auto& o = open[i];
      char buffer[longest_greeting + 1];
      ssize_t n = 0;
      do {
        n = ::recv(polled[i].fd, buffer, sizeof buffer, MSG_DONTWAIT);
        if (n > 0) o.read += static_cast<std::size_t>(n);
      } while ((n > 0 && o.read <= longest_greeting) || (n < 0 && errno == EINTR));
      const bool chatty = o.read > longest_greeting;
      if (!chatty && n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) continue;  // still open
      if (!chatty && n == 0) {
        o.fd->reset();  // closed by the node: an orderly end
      } else {
        o.fd->abort();
      }
      open.erase(open.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }
  for (const auto& o : open) o.fd->abort();
}

// Node 0: waits for a greeting from every other node, then answers each.
std::optional<std::vector<int>> serve(const node_sizes_config& c) {
  const descriptor_room room(c.nnodes);
  socket_fd listener = listen_on(c.master_port);
  const auto deadline = clock::now() + c.timeout;
  struct joining {
    socket_fd fd;
    std::string got;
    clock::time_point since;
  };
  std::vector<joining> pending;
  std::vector<socket_fd> joined(static_cast<std::size_t>(c.nnodes));  // by node rank; [0] stays empty
  std::vector<int> sizes(static_cast<std::size_t>(c.nnodes), 0);
  sizes[0] = c.nproc;
  // Tells every node that joined, every connection yet to say what it is,
  // and `also`, `why` the job ends, as node 0's last line to them.
  const auto tell_all = [&](const std::string& why, socket_fd* also) {
    std::vector<socket_fd*> told;
    for (auto& fd : joined) told.push_back(&fd);
    for (auto& p : pending) told.push_back(&p.fd);
    told.push_back(also);
    listener.reset();
    send_last_line(told, "error " + why + "\n");
  };
  const auto fail = [&](const std::string& why, socket_fd* also) {
    tell_all(why, also);
    throw node_sizes_error(why);
  };
  const auto missing = [&] {
    std::vector<int> ranks;
    for (int k = 1; k < c.nnodes; ++k) {
      if (!joined[static_cast<std::size_t>(k)]) ranks.push_back(k);
    }
    return ranks;
  };
  for (;;) {
    // A node that joined and then closed its end has ended: its place is
    // free again, for the same node started anew. One that sends more
    // than its greeting is not a node of ours: dropped too. Looked at
    // last before the answer goes.
    for (auto& fd : joined) {
      if (!fd) continue;
      char byte;
      const ssize_t n = ::recv(fd.get(), &byte, 1, MSG_DONTWAIT | MSG_PEEK);
      if (n >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) fd.abort();
    }
    const auto left = missing();
    if (left.empty()) break;
    if (clock::now() >= deadline) {
      fail(fmt::format("node 0 waited {} s on port {} for node{} {} of {} to say how many ranks {} "
                       "(--rdzv-conf join_timeout sets the wait)",
                       seconds_of(c.timeout), c.master_port, left.size() > 1 ? "s" : "", some_of(left), c.nnodes,
                       left.size() > 1 ? "they run" : "it runs"),
           nullptr);
    }
    std::vector<pollfd> fds{{listener.get(), POLLIN, 0}};
    for (const auto& p : pending) fds.push_back({p.fd.get(), POLLIN, 0});
    for (const auto& fd : joined) {
      if (fd) fds.push_back({fd.get(), POLLIN, 0});
    }
    if (poll_for(fds, deadline, milliseconds(100)) < 0) {
      throw node_sizes_error(fmt::format("node 0: poll: {}", std::strerror(errno)));
    }
    if (!pause_for(c, milliseconds(0))) {
      // The job ends here: the nodes that joined need not wait out theirs.
      tell_all("node 0 was stopped by a signal before every node joined", nullptr);
      return std::nullopt;
    }
    for (;;) {
      const int fd = ::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd >= 0) {
        pending.push_back({socket_fd(fd), {}, clock::now()});
        continue;
      }
      if (errno == EMFILE || errno == ENFILE) {
        rlimit limit{};
        ::getrlimit(RLIMIT_NOFILE, &limit);
        fail(fmt::format("node 0 ran out of file descriptors holding a connection per node ({}; its limit is {}): "
                         "raise the limit (ulimit -n) to above --nnodes {}",
                         std::strerror(errno), static_cast<long long>(limit.rlim_cur), c.nnodes),
             nullptr);
      }
      break;
    }
    for (auto it = pending.begin(); it != pending.end();) {
      const auto state = read_line(it->fd.get(), it->got, longest_greeting);
      if (state == line_state::more) {
        if (clock::now() - it->since >= c.greeting_timeout) {
          it->fd.abort();
          it = pending.erase(it);
        } else {
          ++it;
        }
        continue;
      }
      joining p = std::move(*it);
      it = pending.erase(it);
      const auto g = state == line_state::whole ? parse_greeting(p.got) : std::nullopt;
      if (!g) {  // not a node of ours: dropped
        p.fd.abort();
        continue;
      }
      if (g->nnodes != c.nnodes) {
        fail(fmt::format("node {} runs with --nnodes {} and node 0 with --nnodes {}", g->node_rank, g->nnodes,
                         c.nnodes),
             &p.fd);
      }
      if (g->node_rank <= 0 || g->node_rank >= c.nnodes || joined[static_cast<std::size_t>(g->node_rank)]) {
        fail(fmt::format("two nodes of the job say they are node {} (--node-rank)", g->node_rank), &p.fd);
      }
      sizes[static_cast<std::size_t>(g->node_rank)] = g->nproc;
      joined[static_cast<std::size_t>(g->node_rank)] = std::move(p.fd);
    }
  }
  // The port is the master's: rank 0's store binds it once the ranks start.
  listener.reset();
  for (auto& p : pending) p.fd.abort();
  pending.clear();
  std::vector<socket_fd*> answered;
  for (auto& fd : joined) answered.push_back(&fd);
  send_last_line(answered, fmt::format("ok {}\n", fmt::join(sizes, " ")));
  return sizes;
}

// What came of one try of another node at node 0.
struct try_result {
  std::optional<std::vector<int>> sizes;
  bool interrupted = false;
  // Something took the greeting and ended the connection without a line.
  // Node 0 answers every greeting it reads, its errors too, unless it is
  // killed outright or ends as the node connects.
  bool unanswered = false;
  // Node 0's address was not found: no lookup answered in time, or it
  // said the name does not resolve.
  bool unresolved = false;
  // Node 0 took the greeting and held the connection with no answer until
  // the deadline: it answers once every node has greeted it, so some node
  // had not joined.
  bool held = false;
};

// The fewest tries in a row, unanswered over node_sizes_config's
// `unanswered_for`, before a node gives up on what listens at node 0's
// address: a store of an old job still ending, or node 0 killed and started
// again, leaves a few unanswered and is then gone or answers.
constexpr int unanswered_at_least = 3;

// A lookup of node 0's address, shared by the node and the thread that
// resolves it, which may outlive the node's wait.
struct lookup {
  std::mutex mutex;
  std::condition_variable done_cv;
  bool done = false;
  int rc = 0;
  addrinfo* found = nullptr;
  ~lookup() {
    if (found != nullptr) ::freeaddrinfo(found);
  }
};

// Resolves node 0's address on a thread of its own and waits for it until
// the deadline or a shutdown signal: a resolver that does not answer (a
// name server out of reach) holds the node no longer than its wait. The
// addresses, or none with `why` said; `interrupted` when a signal came.
std::shared_ptr<lookup> resolve_node_zero(const node_sizes_config& c, clock::time_point deadline, std::string& why,
                                          bool& interrupted) {
  auto l = std::make_shared<lookup>();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  const std::string service = std::to_string(c.master_port);
  if (!c.resolve) {
    // An address given as numbers asks no name server: read here, with no
    // thread, as most jobs give it.
    addrinfo numeric = hints;
    numeric.ai_flags = AI_NUMERICHOST;
    if (::getaddrinfo(c.master_addr.c_str(), service.c_str(), &numeric, &l->found) == 0) return l;
    l->found = nullptr;
  }
  const auto resolve = [l, hints, host = c.master_addr, service, fn = c.resolve] {
    addrinfo* found = nullptr;
    const int rc = fn ? fn(host.c_str(), service.c_str(), &hints, &found)
                      : ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
    const std::lock_guard lock(l->mutex);
    l->rc = rc;
    l->found = found;
    l->done = true;
    l->done_cv.notify_all();
  };
  try {
    std::thread(resolve).detach();
  } catch (const std::system_error&) {
    resolve();  // no thread to be had: resolved here, unbounded
  }
  // A name in /etc/hosts resolves at once; a wait for a name server looks
  // for a signal every 100 ms. Given 100 ms at least, even at the deadline,
  // so that the last try says what a name's lookup says.
  for (bool first = true;; first = false) {
    std::unique_lock lock(l->mutex);
    const auto next = clock::now() + milliseconds(100);
    if (l->done_cv.wait_until(lock, first ? next : std::min(next, deadline), [&] { return l->done; })) break;
    lock.unlock();
    if (!pause_for(c, milliseconds(0))) {
      interrupted = true;
      return nullptr;
    }
    if (clock::now() >= deadline) {
      why = fmt::format("resolving {} took longer than the wait", c.master_addr);
      return nullptr;
    }
  }
  if (l->rc != 0) {
    why = fmt::format("{} does not resolve: {}", c.master_addr, ::gai_strerror(l->rc));
    return nullptr;
  }
  return l;
}

// One try of node k: connects to node 0 (any of its addresses), greets it
// and reads its answer. Returns no sizes when it is worth trying again
// (node 0 not listening yet, or gone before it answered), saying why in
// `why`.
try_result try_node_zero(const node_sizes_config& c, clock::time_point deadline, std::string& why) {
  bool unanswered = false;
  bool interrupted = false;
  const auto addresses = resolve_node_zero(c, deadline, why, interrupted);
  if (interrupted) return {.sizes = std::nullopt, .interrupted = true};
  if (!addresses) return {.sizes = std::nullopt, .interrupted = false, .unanswered = false, .unresolved = true};
  for (const addrinfo* a = addresses->found; a != nullptr; a = a->ai_next) {
    socket_fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
    if (!fd) {
      why = std::strerror(errno);
      continue;
    }
    if (::connect(fd.get(), a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
      why = std::strerror(errno);
      continue;
    }
    std::vector<pollfd> one{{fd.get(), POLLOUT, 0}};
    const auto connect_by = std::min(deadline, clock::now() + std::chrono::seconds(2));
    // Looked at once at least: a refusal is known at once, even at the deadline.
    int ready = 0;
    do {
      ready = poll_for(one, connect_by, milliseconds(100));
      if (ready == 0 && !pause_for(c, milliseconds(0))) return {.sizes = std::nullopt, .interrupted = true};
    } while (ready == 0 && clock::now() < connect_by);
    int error = 0;
    socklen_t len = sizeof error;
    if (one[0].revents == 0) error = ETIMEDOUT;
    else if (::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &error, &len) != 0) error = errno;
    if (error != 0) {
      why = std::strerror(error);
      continue;
    }
    if (!send_line(fd.get(), greeting_of(c.nnodes, c.node_rank, c.nproc))) {
      why = "node 0 closed the connection";
      continue;
    }
    // Node 0 answers once every node has greeted it: as long as the job's
    // whole wait.
    std::string got;
    line_state state = line_state::more;
    one[0] = {fd.get(), POLLIN, 0};
    while (state == line_state::more) {
      if (clock::now() >= deadline) {
        why = "node 0 did not answer";
        return {.sizes = std::nullopt, .interrupted = false, .unanswered = false, .unresolved = false, .held = true};
      }
      poll_for(one, deadline, milliseconds(100));
      if (!pause_for(c, milliseconds(0))) return {.sizes = std::nullopt, .interrupted = true};
      state = read_line(fd.get(), got, longest_answer(c.nnodes));
    }
    if (state == line_state::ended) {
      why = "node 0 closed the connection before it answered";
      unanswered = true;
      continue;
    }
    if (got.rfind("error ", 0) == 0) throw node_sizes_error("node 0 ended the job: " + got.substr(6));
    const auto sizes = got.rfind("ok ", 0) == 0 ? numbers_in(std::string_view(got).substr(3)) : std::nullopt;
    if (!sizes || sizes->size() != static_cast<std::size_t>(c.nnodes) ||
        (*sizes)[static_cast<std::size_t>(c.node_rank)] != c.nproc ||
        std::any_of(sizes->begin(), sizes->end(), [](int n) { return n < 1 || n > largest_count; })) {
      throw node_sizes_error(fmt::format("something other than cohort-run's node 0 answers at {}:{}: '{}'",
                                         c.master_addr, c.master_port, got.substr(0, 80)));
    }
    return {.sizes = sizes};
  }
  return {.sizes = std::nullopt, .interrupted = false, .unanswered = unanswered};
}

// Node k > 0: tries node 0 until it answers or the wait is over.
std::optional<std::vector<int>> join(const node_sizes_config& c) {
  const auto deadline = clock::now() + c.timeout;
  std::string why = "not tried";
  int unanswered = 0;  // tries in a row
  clock::time_point unanswered_since;  // the first of them began
  for (;;) {
    const auto began = clock::now();
    auto result = try_node_zero(c, deadline, why);
    if (result.interrupted) return std::nullopt;
    if (result.sizes) return result.sizes;
    const bool over = clock::now() >= deadline;
    // A try cut short by the deadline tells nothing of what listens.
    if (result.unanswered) {
      if (unanswered++ == 0) unanswered_since = began;
    } else if (!over) {
      unanswered = 0;
    }
    // At the deadline, a row long enough says more than the timeout.
    if (const auto lasted = clock::now() - unanswered_since;
        unanswered >= unanswered_at_least && (lasted >= c.unanswered_for || over)) {
      throw node_sizes_error(fmt::format(
          "something other than cohort-run's node 0 seems to listen at {}:{}: it took this node's greeting and ended "
          "the connection without an answer, {} times in a row over {:.1f} s, where node 0 answers every greeting. It "
          "may be the store of a job whose ranks have started (node 0 answers only before its ranks start: a node "
          "started again after that cannot join, and the job must start again on every node), or another program "
          "on that port",
          c.master_addr, c.master_port, unanswered, std::chrono::duration<double>(lasted).count()));
    }
    if (over && result.unresolved) {
      throw node_sizes_error(fmt::format("node 0's address was not found within {} s ({}); --rdzv-conf join_timeout "
                                         "sets the wait",
                                         seconds_of(c.timeout), why));
    }
    // Node 0 names the nodes it waits for only at its own timeout, to the
    // nodes still connected then: this node's wait ended first.
    if (over && result.held) {
      throw node_sizes_error(fmt::format(
          "what listens at {}:{} took this node's greeting but gave no answer within {} s. cohort-run's node 0 "
          "answers once every node of the {} has greeted it, so a node has likely not joined yet (node 0's own "
          "message names the missing ones); otherwise what listens there is not a node 0 that works. --rdzv-conf "
          "join_timeout sets the wait. TORCH_ELASTIC_WORKER_IDENTICAL=1 skips the exchange when every node runs as "
          "many ranks",
          c.master_addr, c.master_port, seconds_of(c.timeout), c.nnodes));
    }
    if (over) {
      throw node_sizes_error(fmt::format(
          "node 0 did not answer at {}:{} within {} s ({}); --rdzv-conf join_timeout sets the wait. Node 0 answers "
          "only before its ranks start: a node started again after that cannot join, and the job must start again "
          "on every node. TORCH_ELASTIC_WORKER_IDENTICAL=1 skips the exchange when every node runs as many ranks",
          c.master_addr, c.master_port, seconds_of(c.timeout), why));
    }
    if (!pause_for(c, std::min(milliseconds(250), std::chrono::duration_cast<milliseconds>(deadline - clock::now())))) {
      return std::nullopt;
    }
  }
}

}  // namespace

std::string greeting_of(int nnodes, int node_rank, int nproc) {
  return fmt::format("cohort-run nodes 1 {} {} {}\n", nnodes, node_rank, nproc);
}

std::optional<greeting> parse_greeting(const std::string& line) {
  constexpr std::string_view head = "cohort-run nodes 1 ";
  if (line.rfind(head, 0) != 0) return std::nullopt;
  const auto n = numbers_in(std::string_view(line).substr(head.size()));
  if (!n || n->size() != 3) return std::nullopt;
  const greeting g{(*n)[0], (*n)[1], (*n)[2]};
  if (g.nnodes < 1 || g.node_rank < 0 || g.node_rank >= g.nnodes || g.nproc < 1 || g.nproc > largest_count) {
    return std::nullopt;
  }
  return g;
}

std::optional<std::vector<int>> gather_node_sizes(const node_sizes_config& config) {
  if (config.nnodes < 1 || config.node_rank < 0 || config.node_rank >= config.nnodes || config.nproc < 1) {
    throw std::invalid_argument("gather_node_sizes: a node rank below --nnodes and at least one rank");
  }
  if (config.nnodes == 1) return std::vector<int>{config.nproc};
  return config.node_rank == 0 ? serve(config) : join(config);
}

}  // namespace cohort_run

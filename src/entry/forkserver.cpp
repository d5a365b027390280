// The forkserver and its client. A request is one message on a
// SOCK_SEQPACKET socket carrying descriptors (SCM_RIGHTS): the standard
// streams, the result memfd, the set-up report pipe and a memfd holding the
// rest (rank, name, directory, environment, arguments) in cohort's encoding.
// The reply is the child's pid, or -errno.
#include "entry/forkserver.hpp"

#include "config.hpp"
#include "entry/entry.hpp"
#include "process/per_process.hpp"
#include "shm/segment.hpp"

#include <asio/io_context.hpp>

#include <fmt/format.h>

#include <fcntl.h>
#include <linux/sched.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <span>

extern char** environ;

namespace cohort::detail {
namespace {

// The descriptors of a request, in this order, then those the child keeps
// (keep_fds), at most max_kept of them.
enum slot { in_fd, out_fd, err_fd, result_slot, report_slot, request_slot, slots };
constexpr std::size_t max_fds = slots + max_kept;  // under the kernel's 253 a message
using fd_array = std::array<int, max_fds>;

// rank, parent pid, death signal, new group, close other fds, name, cwd,
// environment, arguments, the numbers the kept descriptors have in the
// requester (and must have in the child).
using request = std::tuple<int, int, int, bool, bool, std::string, std::string, std::vector<std::string>,
                           std::vector<std::byte>, std::vector<int>>;

bool send_with_fds(int socket, const void* data, std::size_t size, const int* fds, std::size_t count) {
  iovec iov{const_cast<void*>(data), size};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * max_fds)]{};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (count > 0) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * count);
    cmsghdr* cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int) * count);
    std::memcpy(CMSG_DATA(cm), fds, sizeof(int) * count);
  }
  ssize_t n;
  do {
    n = ::sendmsg(socket, &msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  return n == static_cast<ssize_t>(size);
}

// Receives one message; returns its size (0 at EOF, -1 on error) and the
// descriptors that came with it (close-on-exec).
ssize_t receive_with_fds(int socket, void* data, std::size_t size, fd_array& fds, std::size_t& count) {
  iovec iov{data, size};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * max_fds)]{};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  do {
    n = ::recvmsg(socket, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  count = 0;
  for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm != nullptr; cm = CMSG_NXTHDR(&msg, cm)) {
    if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
      count = std::min<std::size_t>((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int), max_fds);
      std::memcpy(fds.data(), CMSG_DATA(cm), sizeof(int) * count);
    }
  }
  return n;
}

// Where glibc keeps this thread's tid (set_tid_address at start-up): the
// kernel writes the child's tid there, as glibc's own fork does, so raise()
// and friends see the child's tid, not the server's.
struct thread_identity {
  int* tid = nullptr;
  void* robust_head = nullptr;
  std::size_t robust_size = 0;
};

pid_t clone_as_sibling(const thread_identity& self) {
  clone_args args{};
  args.flags = CLONE_PARENT | CLONE_CHILD_SETTID | CLONE_CHILD_CLEARTID;
  args.child_tid = reinterpret_cast<std::uint64_t>(self.tid);
  const auto pid = static_cast<pid_t>(::syscall(SYS_clone3, &args, sizeof args));
  if (pid == 0 && self.robust_head != nullptr) ::syscall(SYS_set_robust_list, self.robust_head, self.robust_size);
  if (pid == 0) shm::forget_process_id();
  return pid;
}

// In the forked child: puts the kept descriptors at the numbers they had in
// the requester, sets itself up, reports, runs the function.
int run_forked(request& r, const fd_array& received, const sigset_t& reset) {
  auto& [rank, parent, death_signal, new_group, close_fds, name, cwd, env, args, kept] = r;
  std::vector<char*> envp;
  for (auto& entry : env) envp.push_back(entry.data());
  envp.push_back(nullptr);
  // Every descriptor needed is first moved above all the numbers involved,
  // so that placing one never overwrites another.
  int top = 2;
  for (std::size_t i = 0; i < slots + kept.size(); ++i) top = std::max(top, received[i]);
  for (int number : kept) top = std::max(top, number);
  fd_array fds{};
  for (std::size_t i = 0; i < slots + kept.size(); ++i) {
    fds[i] = ::fcntl(received[i], F_DUPFD_CLOEXEC, top + 1);
    if (fds[i] < 0) ::_exit(127);  // no report pipe to say so on yet: the parent sees it end
  }
  std::vector<int> keep{fds[result_slot], fds[report_slot]};
  for (std::size_t i = 0; i < kept.size(); ++i) {
    if (::dup2(fds[slots + i], kept[i]) < 0) ::_exit(127);
    keep.push_back(kept[i]);
  }
  std::sort(keep.begin(), keep.end());
  launch_plan p;
  p.envp = envp.data();
  p.source = {fds[in_fd], fds[out_fd], fds[err_fd]};
  p.cwd = cwd.empty() ? nullptr : cwd.c_str();
  p.new_group = new_group;
  p.death_signal = death_signal;
  p.parent = parent;
  p.close_fds = true;  // this server's descriptors never reach a child
  p.close_now = true;
  p.keep = keep.data();
  p.keep_count = keep.size();
  p.reset_signals = &reset;
  set_up_or_report(p, fds[report_slot]);
  environ = envp.data();
  static_cast<void>(close_fds);
  const encoded call_args = encoded::from_bytes(std::move(args));
  return run_entry(name, rank, call_args, fds[result_slot]);
}

// The client's end: one server per process, started on first use and again
// after it died. Requests are taken one at a time.
struct server_link {
  asio::io_context io;  // never run: holds the server's child object
  child server;
  int socket = -1;

  ~server_link() {
    if (socket >= 0) ::close(socket);
  }
};

struct server_slot {
  std::mutex mutex;
  std::unique_ptr<server_link> link;
  bool stops_at_exit = false;  // stop_forkserver() is registered with atexit
};

int start_server(server_link& l) {
  int ends[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, ends) != 0) return errno;
  spawn_options options;
  options.env.set(forkserver_env, std::to_string(ends[1]));
  options.keep_fds = {ends[1]};
  std::error_code ec;
  const command cmd("/proc/self/exe", {"--cohort-forkserver"});
  l.server = spawn(l.io.get_executor(), cmd, options, ec);
  ::close(ends[1]);
  if (ec) {
    ::close(ends[0]);
    return ec.value();
  }
  l.socket = ends[0];
  return 0;
}

void drop_server(server_link& l) {
  if (l.socket >= 0) ::close(l.socket);
  l.socket = -1;
  l.server = child();  // killed and reaped
}

}  // namespace

int serve_forks(int socket) {
  thread_identity self;
  const bool known = ::prctl(PR_GET_TID_ADDRESS, &self.tid) == 0 && self.tid != nullptr;
  ::syscall(SYS_get_robust_list, 0, &self.robust_head, &self.robust_size);
  const sigset_t reset = signals_to_reset();  // this server sets no handler later
  for (;;) {
    int header = 0;
    fd_array fds{};
    std::size_t count = 0;
    const ssize_t n = receive_with_fds(socket, &header, sizeof header, fds, count);
    if (n <= 0) return 0;  // the requester is gone
    int reply;
    std::optional<request> r;
    std::vector<std::byte> bytes;
    if (count < slots) {
      reply = -EINVAL;
    } else if (!known) {
      reply = -ENOSYS;  // no PR_GET_TID_ADDRESS (a kernel without CONFIG_CHECKPOINT_RESTORE)
    } else if (!read_whole(fds[request_slot], bytes)) {
      reply = -errno;
    } else {
      try {
        r = decode<request>(encoded::from_bytes(std::move(bytes)));
        if (count != slots + std::get<9>(*r).size()) throw std::invalid_argument("descriptors");
        const pid_t pid = clone_as_sibling(self);
        if (pid == 0) {
          ::close(socket);
          return run_forked(*r, fds, reset);
        }
        reply = pid > 0 ? pid : -errno;
      } catch (const std::exception&) {
        reply = -EINVAL;
      }
    }
    for (std::size_t i = 0; i < count; ++i) ::close(fds[i]);
    if (!send_with_fds(socket, &reply, sizeof reply, nullptr, 0)) return 0;
  }
}

namespace {

// A request's descriptors as sent, and the read end of its report pipe.
struct outgoing {
  fd_array fds{};
  std::size_t count = slots;
  int request_fd = -1;
  int report[2]{-1, -1};
  outgoing() = default;
  outgoing(const outgoing&) = delete;
  outgoing& operator=(const outgoing&) = delete;
  ~outgoing() {
    for (int fd : {request_fd, report[0], report[1]}) {
      if (fd >= 0) ::close(fd);
    }
  }
};

// Writes request `r` into a memfd and makes its report pipe; 0 or errno.
int prepare(const server_request& r, const function_call& call, outgoing& o, stage& where) {
  const launch_plan& p = *r.plan;
  std::vector<std::string> env;
  for (char* const* e = p.envp; *e != nullptr; ++e) env.emplace_back(*e);
  const auto args = call.args.bytes();
  std::vector<int> kept;  // the plan keeps the result memfd too: it has a slot of its own
  for (std::size_t i = 0; i < p.keep_count; ++i) {
    if (p.keep[i] != r.result_fd) kept.push_back(p.keep[i]);
  }
  if (kept.size() > max_kept) {
    where = stage::fds;
    return E2BIG;
  }
  const request req{r.rank, p.parent, p.death_signal, p.new_group, p.close_fds, call.name,
                    p.cwd != nullptr ? p.cwd : "", std::move(env), std::vector<std::byte>(args.begin(), args.end()), kept};
  where = stage::start;
  o.request_fd = ::memfd_create("cohort-request", MFD_CLOEXEC);
  if (o.request_fd < 0 || !write_whole(o.request_fd, encode(req).bytes())) return errno;
  where = stage::pipe;
  if (::pipe2(o.report, O_CLOEXEC) != 0) return errno;
  for (std::size_t i = 0; i < 3; ++i) o.fds[i] = p.source[i] >= 0 ? p.source[i] : static_cast<int>(i);
  o.fds[result_slot] = r.result_fd;
  o.fds[report_slot] = o.report[1];
  o.fds[request_slot] = o.request_fd;
  for (std::size_t i = 0; i < kept.size(); ++i) o.fds[slots + i] = kept[i];
  o.count = slots + kept.size();
  return 0;
}

// Receives one reply: the server's answer, or -errno.
int receive_reply(int socket) {
  int reply = 0;
  fd_array none{};
  std::size_t count = 0;
  const ssize_t n = receive_with_fds(socket, &reply, sizeof reply, none, count);
  for (std::size_t i = 0; i < count; ++i) ::close(none[i]);
  if (n != static_cast<ssize_t>(sizeof reply)) return n == 0 ? -EPIPE : -errno;
  return reply;
}

bool server_gone(int reply) { return reply == -EPIPE || reply == -ECONNRESET; }

}  // namespace

std::size_t start_from_server(std::span<server_request> requests, const function_call& call,
                              launch_failure& f) noexcept {
  // Never destroyed: a forked child that calls exit() must not touch its
  // copy, whose descriptors it may have closed. The server ends by itself
  // when this process goes (its socket closes; parent-death signal).
  auto& slot = of_this_process<server_slot>();
  // Requests in flight hold their descriptors in the socket: a window at a
  // time keeps them well under the limit on descriptors in flight.
  constexpr std::size_t window = 16;
  std::size_t started = 0;
  try {
    std::lock_guard lock(slot.mutex);
    if (!slot.link) slot.link = std::make_unique<server_link>();
    if (!slot.stops_at_exit) slot.stops_at_exit = std::atexit(stop_forkserver) == 0;
    auto& l = *slot.link;
    // A server that died since the last start has closed its end.
    if (l.socket >= 0) {
      pollfd p{l.socket, POLLRDHUP, 0};
      if (::poll(&p, 1, 0) != 0) drop_server(l);
    }
    bool restarted = false;
    while (started < requests.size()) {
      const std::size_t end = std::min(requests.size(), started + window);
      if (l.socket < 0) {
        if (int error = start_server(l); error != 0) {
          f = {stage::start, error, ""};
          return started;
        }
      }
      std::vector<std::unique_ptr<outgoing>> batch;
      std::size_t sent = started;
      int error = 0;
      for (; sent < end; ++sent) {
        auto o = std::make_unique<outgoing>();
        stage where{};
        if (int e = prepare(requests[sent], call, *o, where); e != 0) {
          f = {where, e, ""};
          break;
        }
        int header = 0;
        if (!send_with_fds(l.socket, &header, sizeof header, o->fds.data(), o->count)) {
          error = errno;
          break;
        }
        ::close(std::exchange(o->request_fd, -1));
        ::close(std::exchange(o->report[1], -1));
        batch.push_back(std::move(o));
      }
      int failed_reply = 0;
      for (std::size_t i = 0; i < batch.size(); ++i) {
        const int reply = receive_reply(l.socket);
        auto& r = requests[started + i];
        if (reply > 0 && failed_reply == 0) {
          r.pid = reply;  // ours: CLONE_PARENT
          r.report_fd = std::exchange(batch[i]->report[0], -1);
        } else if (reply > 0) {
          ::kill(reply, SIGKILL);  // after a failure: not handed out, so not left behind
          ::waitpid(reply, nullptr, 0);
        } else if (failed_reply == 0) {
          failed_reply = reply;
        }
        if (server_gone(reply)) break;
      }
      const bool gone = server_gone(failed_reply) || (error != 0 && server_gone(-error));
      if (gone && started == 0 && requests[0].pid <= 0 && !restarted) {  // a server dead at once: started again, once
        restarted = true;
        drop_server(l);
        continue;
      }
      if (gone) drop_server(l);
      for (std::size_t i = 0; i < batch.size() && requests[started].pid > 0; ++i) ++started;
      if (failed_reply != 0) {
        f = {stage::start, -failed_reply, ""};
        return started;
      }
      if (error != 0) {
        f = {stage::start, error, ""};
        return started;
      }
      if (f.where != stage::none) return started;
    }
  } catch (const std::bad_alloc&) {
    f = {stage::start, ENOMEM, ""};
  } catch (const std::system_error& e) {
    f = {stage::start, e.code().value(), ""};
  }
  return started;
}

void stop_forkserver() noexcept {
  try {
    auto& slot = of_this_process<server_slot>();
    std::lock_guard lock(slot.mutex);
    if (slot.link) drop_server(*slot.link);
  } catch (...) {
    // No memory for a first use: there is no server to stop.
  }
}

}  // namespace cohort::detail

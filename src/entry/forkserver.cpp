// The forkserver and its client. A request is one message on a
// SOCK_SEQPACKET socket carrying descriptors (SCM_RIGHTS): the standard
// streams, the result memfd, the set-up report pipe and a memfd holding the
// rest (rank, name, directory, environment, arguments) in cohort's encoding.
// The reply is the child's pid, or -errno.
#include "entry/forkserver.hpp"

#include "config.hpp"
#include "entry/entry.hpp"

#include <asio/io_context.hpp>

#include <fmt/format.h>

#include <linux/sched.h>
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

extern char** environ;

namespace cohort::detail {
namespace {

// The descriptors of a request, in this order.
enum slot { in_fd, out_fd, err_fd, result_slot, report_slot, request_slot, slots };

// rank, parent pid, death signal, new group, close other fds, name, cwd,
// environment, arguments.
using request = std::tuple<int, int, int, bool, bool, std::string, std::string, std::vector<std::string>,
                           std::vector<std::byte>>;

bool send_with_fds(int socket, const void* data, std::size_t size, const int* fds, std::size_t count) {
  iovec iov{const_cast<void*>(data), size};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * slots)]{};
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
ssize_t receive_with_fds(int socket, void* data, std::size_t size, std::array<int, slots>& fds, std::size_t& count) {
  iovec iov{data, size};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * slots)]{};
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
      count = std::min<std::size_t>((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int), slots);
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
  return pid;
}

// In the forked child: sets itself up, reports, runs the function.
int run_forked(request& r, const std::array<int, slots>& fds) {
  auto& [rank, parent, death_signal, new_group, close_fds, name, cwd, env, args] = r;
  std::vector<char*> envp;
  for (auto& entry : env) envp.push_back(entry.data());
  envp.push_back(nullptr);
  std::array<int, 2> keep{fds[result_slot], fds[report_slot]};
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
  pid_t owner = 0;
  std::unique_ptr<server_link> link;
};

// This process's link. A forked child finds its parent's link copied, with
// descriptors it has closed: it lets that go untouched and starts afresh.
server_link& link_of_this_process(server_slot& slot) {
  if (slot.owner != ::getpid()) {
    static_cast<void>(slot.link.release());
    slot.owner = ::getpid();
  }
  if (!slot.link) slot.link = std::make_unique<server_link>();
  return *slot.link;
}

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

// One request and its reply; the server's answer, or -errno when the
// server could not be reached.
int ask(server_link& l, const std::array<int, slots>& fds) {
  int reply = 0;
  if (!send_with_fds(l.socket, &reply, sizeof reply, fds.data(), fds.size())) return -errno;
  std::array<int, slots> none{};
  std::size_t count = 0;
  const ssize_t n = receive_with_fds(l.socket, &reply, sizeof reply, none, count);
  for (std::size_t i = 0; i < count; ++i) ::close(none[i]);
  if (n != static_cast<ssize_t>(sizeof reply)) return n == 0 ? -EPIPE : -errno;
  return reply;
}

}  // namespace

int serve_forks(int socket) {
  thread_identity self;
  const bool known = ::prctl(PR_GET_TID_ADDRESS, &self.tid) == 0 && self.tid != nullptr;
  ::syscall(SYS_get_robust_list, 0, &self.robust_head, &self.robust_size);
  for (;;) {
    int header = 0;
    std::array<int, slots> fds{};
    std::size_t count = 0;
    const ssize_t n = receive_with_fds(socket, &header, sizeof header, fds, count);
    if (n <= 0) return 0;  // the requester is gone
    int reply;
    std::optional<request> r;
    std::vector<std::byte> bytes;
    if (count != slots) {
      reply = -EINVAL;
    } else if (!known) {
      reply = -ENOSYS;  // no PR_GET_TID_ADDRESS (a kernel without CONFIG_CHECKPOINT_RESTORE)
    } else if (!read_whole(fds[request_slot], bytes)) {
      reply = -errno;
    } else {
      try {
        r = decode<request>(encoded::from_bytes(std::move(bytes)));
        const pid_t pid = clone_as_sibling(self);
        if (pid == 0) {
          ::close(socket);
          return run_forked(*r, fds);
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

int start_from_server(launch_plan& p, pid_t& pid, const function_call& call, int rank, int result_fd) noexcept {
  const auto fail = [&](stage where, int error) {
    p.failed_at = where;
    p.error = error;
    return -1;
  };
  try {
    std::vector<std::string> env;
    for (char* const* e = p.envp; *e != nullptr; ++e) env.emplace_back(*e);
    const auto args = call.args.bytes();
    const request r{rank, p.parent, p.death_signal, p.new_group, p.close_fds, call.name,
                    p.cwd != nullptr ? p.cwd : "", std::move(env), std::vector<std::byte>(args.begin(), args.end())};
    const int request_fd = ::memfd_create("cohort-request", MFD_CLOEXEC);
    if (request_fd < 0) return fail(stage::start, errno);
    const bool written = write_whole(request_fd, encode(r).bytes());
    const int write_error = errno;
    int report[2];
    if (!written || ::pipe2(report, O_CLOEXEC) != 0) {
      const int error = written ? errno : write_error;
      ::close(request_fd);
      return fail(written ? stage::pipe : stage::start, error);
    }
    std::array<int, slots> fds{};
    for (int i = 0; i < 3; ++i) fds[static_cast<std::size_t>(i)] = p.source[static_cast<std::size_t>(i)] >= 0 ? p.source[static_cast<std::size_t>(i)] : i;
    fds[result_slot] = result_fd;
    fds[report_slot] = report[1];
    fds[request_slot] = request_fd;

    // Never destroyed: a forked child that calls exit() must not touch its
    // copy. The server ends by itself when this process goes (its socket
    // closes; parent-death signal).
    static server_slot& slot = *new server_slot;
    std::lock_guard lock(slot.mutex);
    auto& l = link_of_this_process(slot);
    int reply = -EPIPE;
    for (int attempt = 0; attempt < 2 && (reply == -EPIPE || reply == -ECONNRESET); ++attempt) {
      if (attempt > 0 || l.socket < 0) {
        drop_server(l);
        if (int error = start_server(l); error != 0) {
          reply = -error;
          break;
        }
      }
      reply = ask(l, fds);
    }
    ::close(report[1]);
    ::close(request_fd);
    if (reply < 0) {
      ::close(report[0]);
      return fail(stage::start, -reply);
    }
    pid = reply;  // ours: CLONE_PARENT
    return adopt_after_set_up(p, pid, report[0]);
  } catch (const std::bad_alloc&) {
    return fail(stage::start, ENOMEM);
  } catch (const std::system_error& e) {
    return fail(stage::start, e.code().value());
  }
}

}  // namespace cohort::detail

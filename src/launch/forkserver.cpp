// The forkserver and its client. A request is one message on a
// SOCK_SEQPACKET socket: its bytes say which ranks it carries, and its
// descriptors (SCM_RIGHTS) are the write end of the set-up report pipe the
// ranks share, a memfd holding the call and every rank's plan in cohort's
// encoding, then each rank's standard streams, result memfd and kept
// descriptors. The reply is 0, or the errno that refused the request as a
// whole; then each rank's pid in turn, up to the first that could not be
// cloned: -errno for it.
#include "launch/forkserver.hpp"

#include "config.hpp"
#include "launch/entry.hpp"
#include "launch/rank_mark.hpp"
#include "os/descriptor_limit.hpp"
#include "os/demangle.hpp"
#include "os/descriptor_passing.hpp"
#include "os/owned_fd.hpp"
#include "os/per_process.hpp"
#include "os/process_identity.hpp"
#include "os/raw_syscall.hpp"
#include "process/launch.hpp"
#include "process/parallel.hpp"
#include "shm/keeper.hpp"

#include <asio/io_context.hpp>

#include <fmt/format.h>

#include <fcntl.h>
#include <linux/sched.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>

extern char** environ;

namespace cohort::detail {
namespace {

// The descriptors of a request: the shared ones, then each rank's, at most
// max_kept kept ones for a rank alone.
// dir_slot: the requester's working directory (O_PATH), or a stand-in;
// announce_slot: the socket the ranks announce their start on
// (launch_plan::announce_fd), or a stand-in.
enum shared_slot { report_slot, request_slot, dir_slot, announce_slot, shared_slots };
enum rank_slot { in_fd, out_fd, err_fd, result_slot, rank_slots };
constexpr std::size_t max_fds = std::size_t{shared_slots} + rank_slots + max_kept;
static_assert(max_fds <= os::max_passed, "more descriptors than one message carries");
using fd_array = std::array<int, max_fds>;

// rank, parent pid, death signal, new group, cwd (options.cwd: a relative
// one is entered from the requester's directory, as below), environment
// (indices of the request's entries), the numbers the kept descriptors have
// in the requester (and must have in the child), the standard streams it
// closes (bit i: stream i, whose message slot holds a stand-in).
using rank_plan = std::tuple<int, int, int, int, std::string, std::vector<int>, std::vector<int>, int>;
// The function's name, its arguments, whether it returns a value (each
// rank then sends a result memfd), the "NAME=value" entries of the ranks'
// environments (each once: the ranks share nearly all of theirs), every
// rank's plan, and the ranks' keeper (shm::keeper_for_ranks(); empty for
// none), which the server parses once for all of them: a forked rank then
// runs no environment or string code of libc's to find it; last, what a
// forked rank would have inherited of the requester: whether the message's
// dir_slot holds its working directory, where each rank starts, before
// options.cwd (entered by descriptor: whatever its path's length, or the
// permissions above it), whether its announce_slot holds the socket the
// ranks announce their start on, and its requester_state (state_wire:
// umask, ignored signals, limits, nice value, affinity).
using state_wire = std::tuple<int, std::uint64_t, std::vector<std::uint64_t>, int, std::vector<std::uint64_t>>;
using request = std::tuple<std::string, std::vector<std::byte>, bool, std::vector<std::string>,
                           std::vector<rank_plan>, std::string, bool, bool, state_wire>;

// A requester_state as a request carries it: the umask, the ignored
// signals, the limits (soft, hard, for each resource), the nice value, the
// affinity.
state_wire to_wire(const requester_state& s) {
  std::vector<std::uint64_t> limits;
  limits.reserve(2 * s.limits.size());
  for (const rlimit& l : s.limits) limits.insert(limits.end(), {l.rlim_cur, l.rlim_max});
  return {s.umask, s.ignored, std::move(limits), s.nice,
          std::vector<std::uint64_t>(s.affinity.begin(), s.affinity.begin() + s.affinity_words)};
}

// Throws std::invalid_argument for one no requester sends.
requester_state from_wire(const state_wire& w) {
  const auto& [umask, ignored, limits, nice, affinity] = w;
  requester_state s;
  if (umask < -1 || umask > 0777 || limits.size() != 2 * s.limits.size() || affinity.size() > s.affinity.size()) {
    throw std::invalid_argument("requester state");
  }
  s.umask = umask;
  s.ignored = ignored;
  for (std::size_t r = 0; r < s.limits.size(); ++r) s.limits[r] = {limits[2 * r], limits[2 * r + 1]};
  s.nice = nice;
  s.affinity_words = affinity.size();
  std::copy(affinity.begin(), affinity.end(), s.affinity.begin());
  return s;
}

// Where a rank's kept descriptors start among its own: after the result
// memfd, when it sends one.
std::size_t first_kept(bool returns_value) { return returns_value ? rank_slots : result_slot; }

// How many descriptors of a message are the rank's.
std::size_t descriptors_of(const rank_plan& plan, bool returns_value) {
  return first_kept(returns_value) + std::get<6>(plan).size();
}

// The refusal of a server that runs more than one thread (serve_forks).
constexpr int refused_threaded = EDEADLK;

// Which plans of the request a message carries the descriptors of.
struct batch {
  std::uint32_t first;
  std::uint32_t count;
};

// Where glibc keeps this thread's tid (set_tid_address at start-up): the
// kernel writes the child's tid there, as glibc's own fork does, so raise()
// and friends see the child's tid, not the server's.
struct thread_identity {
  int* tid = nullptr;
  void* robust_head = nullptr;
  std::size_t robust_size = 0;
};

// Whether clone3 was refused here (a kernel before 5.3, or a seccomp
// filter that answers ENOSYS, as container runtimes' default profiles do):
// learnt on the first refusal, after which the server clones with clone.
std::atomic<bool> clone3_refused{false};

// clone(2) as clone3 is called below: no new stack (the child goes on with
// a copy of the server's, as a fork's does). Its arguments' order is the
// architecture's.
COHORT_FORKED_CHILD_PATH long clone_without_clone3(long flags, int* child_tid) {
#if defined(__x86_64__)
  return os::raw_syscall(SYS_clone, flags, 0, 0, reinterpret_cast<long>(child_tid), 0);
#elif defined(__s390__) || defined(__CRIS__)
  return os::raw_syscall(SYS_clone, 0, flags, 0, reinterpret_cast<long>(child_tid), 0);
#else
  return os::raw_syscall(SYS_clone, flags, 0, 0, 0, reinterpret_cast<long>(child_tid));
#endif
}

COHORT_FORKED_CHILD_PATH pid_t clone_as_sibling(const thread_identity& self) {
  clone_args args{};
  args.flags = CLONE_PARENT | CLONE_CHILD_SETTID | CLONE_CHILD_CLEARTID;
  args.child_tid = reinterpret_cast<std::uint64_t>(self.tid);
  // Raw calls: the child returns from the clone into no code of libc's,
  // each page of which it would fault in.
  long pid = -ENOSYS;
  if (!clone3_refused.load(std::memory_order_relaxed)) {
    pid = os::raw_syscall(SYS_clone3, reinterpret_cast<long>(&args), sizeof args);
    if (pid == -ENOSYS || pid == -EPERM) clone3_refused.store(true, std::memory_order_relaxed);
  }
  if (clone3_refused.load(std::memory_order_relaxed)) {
    pid = clone_without_clone3(static_cast<long>(args.flags), self.tid);
  }
  if (pid == 0 && self.robust_head != nullptr) {
    os::raw_syscall(SYS_set_robust_list, reinterpret_cast<long>(self.robust_head), static_cast<long>(self.robust_size));
  }
  if (pid == 0) os::forget_process_id();
  if (pid < 0) errno = static_cast<int>(-pid);
  return static_cast<pid_t>(pid);
}

// How many threads this process runs (Threads: in /proc/self/status); 1
// where /proc cannot tell.
int threads_running() noexcept {
  const int fd = ::open("/proc/self/status", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 1;
  char text[4096];  // about 1.5 KiB, the count in its first half
  const ssize_t n = ::read(fd, text, sizeof text - 1);
  ::close(fd);
  if (n <= 0) return 1;
  text[n] = '\0';
  const char* line = std::strstr(text, "\nThreads:");
  return line != nullptr ? std::atoi(line + 9) : 1;
}

// What the server hands each child of a request besides the request: the
// signals whose handling the child resets, the server's own requester_state
// (the child's, as it starts) and the requester's.
struct server_state {
  std::uint64_t reset = 0;
  requester_state self;
  requester_state asked;
};

// In the forked child: puts the kept descriptors at the numbers they had in
// the requester, sets itself up, reports, runs the function. `own` are the
// rank's descriptors as received (rank_slot order, then the kept ones); the
// other ranks' and the server's are closed first. What escapes ends the
// rank through std::terminate.
COHORT_FORKED_CHILD_PATH int run_forked(request& r, rank_plan& plan, char** envp, const shm::keeper_address& keeper,
                                        std::span<const int> own, int report, int dir, int announce,
                                        const server_state& server, const from_forking_process& inherited) noexcept {
  auto& [name, args, returns_value, entries, plans, keeper_text, dir_sent, announce_sent, state] = r;
  auto& [rank, parent, death_signal, leads, cwd, env, kept, closed] = plan;
  if (dir_sent) os::raw_syscall(SYS_fchdir, dir);
  // Placed under the higher of the two descriptor limits: a kept number
  // may lie above the server's (the requester raised its limit since the
  // server started), and a descriptor of the request above the requester's
  // (it lowered its own). A lower one is the set-up's to set, with the
  // others.
  const rlimit& files = server.asked.limits[RLIMIT_NOFILE];
  if (files.rlim_cur > server.self.limits[RLIMIT_NOFILE].rlim_cur) {
    os::raw_syscall(SYS_prlimit64, 0, RLIMIT_NOFILE, reinterpret_cast<long>(&files), 0);
  }
  // Only the rank's own descriptors and the report stay: the other ranks'
  // and the server's would go with the set-up anyway, and each held now
  // takes a number under the limit. (Where close_range is refused they
  // stay, and the set-up fails as it would have.)
  fd_array held{};  // increasing, as close_all_but wants them
  std::size_t held_count = 0;
  for (int fd : own) held[held_count++] = fd;
  held[held_count++] = report;
  if (!announce_sent) announce = -1;
  if (announce >= 0) held[held_count++] = announce;
  std::sort(held.begin(), held.begin() + static_cast<std::ptrdiff_t>(held_count));
  os::close_all_but(held.data(), held_count);
  // Then each kept one goes to its number, whatever sits there first
  // moving to the lowest free number, and each is closed where it was as
  // soon as it is placed: the rank holds no more descriptors than it was
  // sent, and one more for a moment, so it keeps as many under the
  // requester's limit as a spawned or forked rank does. The kept numbers
  // increase (the server checked), so none of them is taken twice.
  fd_array fds{};
  std::copy(own.begin(), own.end(), fds.begin());
  const auto vacate = [&](long number) {
    int* occupant = report == number ? &report : announce == number ? &announce : nullptr;
    for (std::size_t i = 0; occupant == nullptr && i < own.size(); ++i) {
      if (fds[i] == number) occupant = &fds[i];
    }
    if (occupant == nullptr) return;
    const long to = os::raw_syscall(SYS_fcntl, *occupant, F_DUPFD_CLOEXEC, 3);
    if (to < 0) report_failure(report, rank, stage::fds, static_cast<int>(-to));
    os::raw_syscall(SYS_close, *occupant);
    *occupant = static_cast<int>(to);
  };
  fd_array keep{};  // in increasing order, as set_up_child wants them
  std::size_t keep_count = 0;
  for (std::size_t i = 0; i < kept.size(); ++i) {
    int& source = fds[first_kept(returns_value) + i];
    if (source != kept[i]) {
      vacate(kept[i]);
      if (const long e = os::raw_syscall(SYS_dup3, source, kept[i], 0); e < 0) {
        report_failure(report, rank, stage::fds, static_cast<int>(-e));
      }
      os::raw_syscall(SYS_close, source);
      source = kept[i];
    }
    keep[keep_count++] = kept[i];
  }
  // The rest (the streams' sources, the result, the report, the socket to
  // announce the start on) anywhere but
  // where set_up_child places the streams: a source left at 1 would be
  // overwritten by standard input's before it is placed. Every kept
  // number is taken now, so none of them lands on one.
  for (long stream = 0; stream < 3; ++stream) vacate(stream);
  const int result = returns_value ? fds[result_slot] : -1;
  if (result >= 0) keep[keep_count++] = result;
  keep[keep_count++] = report;
  std::sort(keep.begin(), keep.begin() + static_cast<std::ptrdiff_t>(keep_count));
  launch_plan p;
  p.envp = envp;
  p.source = {fds[in_fd], fds[out_fd], fds[err_fd]};
  for (std::size_t i = 0; i < 3; ++i) {
    if ((closed & (1 << i)) != 0) p.source[i] = closed_stream;
  }
  p.cwd = cwd.empty() ? nullptr : cwd.c_str();
  p.new_group = leads != 0;
  p.new_session = leads == 2;
  p.death_signal = death_signal;
  p.parent = parent;
  p.close_fds = true;  // this server's descriptors never reach a child
  p.close_now = true;
  p.keep = keep.data();
  p.keep_count = keep_count;
  p.reset_signals = &server.reset;
  p.requester = &server.asked;
  p.maker = &server.self;
  p.announce_fd = announce;  // closed by the set-up, once told
  set_up_or_report(p, report, rank);
  environ = envp;
  shm::set_keeper(keeper);
  // Never destroyed: the rank ends with _exit, and freeing it would write
  // pages of the heap that the server shares.
  alignas(encoded) std::byte storage[sizeof(encoded)];
  const auto& call_args = *new (storage) encoded(encoded::from_bytes(std::move(args)));
  return run_entry(name, rank, call_args, result, inherited);
}

// The forked child's way from the server's loop to its exit.
[[noreturn]] COHORT_FORKED_CHILD_PATH void become_rank(int socket, std::unique_ptr<request> r, rank_plan& plan,
                                                       char** envp, const shm::keeper_address& keeper,
                                                       std::span<const int> own, int report, int dir, int announce,
                                                       const server_state& server,
                                                       const from_forking_process& inherited) noexcept {
  os::raw_syscall(SYS_close, socket);
  // The child's for good: its environment points into it, and what it
  // leaves behind need not be freed page by page.
  end_forked_rank(run_forked(*r.release(), plan, envp, keeper, own, report, dir, announce, server, inherited));
}

// Each rank's environment as environ wants it, pointing into the request's
// entries; made before the forks, so that no child allocates. A child never
// returns to the loop that frees the server's copy: its own stays to its
// exit, exit handlers included.
std::vector<std::vector<char*>> environments(request& r, std::span<const rank_plan> ranks) {
  auto& entries = std::get<3>(r);
  std::vector<std::vector<char*>> envps(ranks.size());
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const auto& env = std::get<5>(ranks[i]);
    envps[i].reserve(env.size() + 1);
    for (int entry : env) envps[i].push_back(entries[static_cast<std::size_t>(entry)].data());
    envps[i].push_back(nullptr);
  }
  return envps;
}

// The client's end: one server per process, started on first use and again
// after it died. Requests are taken one at a time.
struct server_link {
  asio::io_context io;  // never run: holds the server's child object
  child server;
  int socket = -1;
  rlim_t fd_limit = 0;  // the hard RLIMIT_NOFILE when it started: the server's soft one (it raises its own)
  std::size_t most_fds = max_fds;  // in one message: fewer under a low fd_limit, and fewer once one was refused

  ~server_link() {
    if (socket >= 0) ::close(socket);
  }
};

// The descriptors a server may hold of its own beside a message's: its
// standard streams and socket, and a few the program opened before
// child_main.
constexpr rlim_t server_own_fds = 16;

struct server_slot {
  std::mutex mutex;
  std::unique_ptr<server_link> link;
  bool stops_at_exit = false;  // stop_forkserver() is registered with atexit
};

// Starts the server; false with `f` saying why not.
bool start_server(server_link& l, launch_failure& f) {
  const auto cmd = reexecution({"--cohort-forkserver"});
  if (!cmd) {  // refused before, saying why (start_functions)
    f = {stage::start, ENOEXEC, ""};
    return false;
  }
  int ends[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, ends) != 0) {
    f = {stage::start, errno, "socketpair"};
    return false;
  }
  spawn_options options;
  options.env.set(forkserver_env, std::to_string(ends[1]));
  options.keep_fds = {ends[1]};
  // Its standard streams are none of the caller's: each request sends the
  // ones its ranks inherit, and the caller's pipes and terminal reach
  // their end of file as the caller lets go of them.
  options.in = stdio::null();
  options.out = stdio::null();
  options.err = stdio::null();
  // Launched as spawn() launches, but without bringing up the reactor of
  // an io_context that never runs (ready_to_wait): three descriptors (four
  // with a ring) held for the server's life, for nothing.
  auto state = launch_program(l.io.get_executor(), *cmd, options, f);
  ::close(ends[1]);
  if (!state) {
    ::close(ends[0]);
    return false;
  }
  l.server = child(std::move(state));
  l.socket = ends[0];
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0) l.fd_limit = limit.rlim_max;
  const rlim_t room = l.fd_limit > server_own_fds ? l.fd_limit - server_own_fds : 0;
  l.most_fds = static_cast<std::size_t>(std::min<rlim_t>(max_fds, room));
  return true;
}

void drop_server(server_link& l) {
  if (l.socket >= 0) ::close(l.socket);
  l.socket = -1;
  l.server = child();  // killed and reaped
}

}  // namespace

// Hot: each child returns from its clone through this loop.
COHORT_FORKED_CHILD_PATH int serve_forks(int socket) {
  thread_identity self;
  const bool known = ::prctl(PR_GET_TID_ADDRESS, &self.tid) == 0 && self.tid != nullptr;
  ::syscall(SYS_get_robust_list, 0, &self.robust_head, &self.robust_size);
  // A thread of the program's running here (started before main, by a
  // static initialiser of the program or of a library it loads) may hold
  // a lock at any clone, which the raw clone below copies held into the
  // child for good (glibc's fork takes its own locks around a fork; this
  // clone does not): every request is refused until that thread ends.
  bool threaded = threads_running() > 1;
  server_state server;
  server.reset = signals_to_reset();  // this server sets no handler later
  // Its soft descriptor limit raised to the hard one, which the client
  // sizes its messages by: a request's descriptors then fit whatever soft
  // limit the requester has set since. Each rank takes the requester's.
  if (rlimit files{}; ::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &files);
  }
  server.self = current_requester_state();
  from_forking_process inherited;  // each request names its function
  inherited.terminate_handler_set = ranks_inherit_terminate_handler();
  // Bound here, once, the symbols the children's flush at their end calls:
  // a child binding one itself faults in the dynamic linker's tables of
  // every library, each child again.
  flush_standard_streams();
  // The mark of the requester's ranks (the server's parent), which every
  // child, and each fork of theirs that executes nothing, carries: the
  // requester's guardian finds them by it.
  map_rank_mark(::getppid());
  // Mapped once for all children, each of which has its own copy.
  std::optional<entry_stack> stack;
  inherited.stack = entry_stack::ahead_of_forks(stack);
  for (;;) {
    batch b{};
    fd_array fds{};
    std::size_t count = 0;
    bool truncated = false;
    const ssize_t n = os::receive_with_fds(socket, &b, sizeof b, fds.data(), fds.size(), count, truncated);
    if (n <= 0) return 0;  // the requester is gone
    std::vector<int> replies{0};  // the request's refusal, then a pid per rank up to the first failure: -errno
    std::vector<std::byte> bytes;
    std::unique_ptr<request> r;
    std::span<rank_plan> ranks;  // those to fork, in r
    std::vector<std::vector<char*>> envps;  // theirs
    shm::keeper_address keeper;  // theirs
    if (threaded) threaded = threads_running() > 1;
    if (truncated) {
      replies[0] = EMFILE;  // its descriptors did not fit under this server's limit
    } else if (n != static_cast<ssize_t>(sizeof b) || count < shared_slots) {
      replies[0] = EINVAL;
    } else if (!known) {
      replies[0] = ENOSYS;  // no PR_GET_TID_ADDRESS (a kernel without CONFIG_CHECKPOINT_RESTORE)
    } else if (threaded) {
      replies[0] = refused_threaded;
    } else if (!read_whole(fds[request_slot], bytes)) {
      replies[0] = errno != 0 ? errno : EIO;
    } else {
      try {
        r = std::make_unique<request>(decode<request>(encoded::from_bytes(std::move(bytes))));
        auto& [name, args, returns_value, entries, plans, keeper_text, dir_sent, announce_sent, state] = *r;
        server.asked = from_wire(state);
        if (b.count == 0 || b.first > plans.size() || b.count > plans.size() - b.first) {
          throw std::invalid_argument("ranks");
        }
        std::size_t needed = shared_slots;
        for (const auto& plan : std::span(plans).subspan(b.first, b.count)) {
          for (int entry : std::get<5>(plan)) {
            if (entry < 0 || static_cast<std::size_t>(entry) >= entries.size()) throw std::invalid_argument("environment");
          }
          // Increasing, as the client sorts them: a child relies on it.
          const auto& kept = std::get<6>(plan);
          const bool increasing = std::adjacent_find(kept.begin(), kept.end(), std::greater_equal<>()) == kept.end();
          if (!increasing || (!kept.empty() && kept.front() < 0)) throw std::invalid_argument("kept descriptors");
          needed += descriptors_of(plan, returns_value);
        }
        if (needed != count) throw std::invalid_argument("descriptors");
        ranks = std::span(plans).subspan(b.first, b.count);
        envps = environments(*r, ranks);
        keeper = shm::parse_keeper(keeper_text);
        inherited.entry = look_up_entry(name);
      } catch (const std::bad_alloc&) {
        ranks = {};
        replies[0] = ENOMEM;
      } catch (const std::exception&) {
        // Whatever threw after `ranks` was set: none of them is forked.
        ranks = {};
        replies[0] = EINVAL;
      }
    }
    for (std::size_t i = 0, at = shared_slots; i < ranks.size(); ++i) {
      const std::size_t own = descriptors_of(ranks[i], std::get<2>(*r));
      const pid_t pid = clone_as_sibling(self);
      if (pid == 0) {
        become_rank(socket, std::move(r), ranks[i], envps[i].data(), keeper, std::span<const int>(fds).subspan(at, own),
                    fds[report_slot], fds[dir_slot], fds[announce_slot], server, inherited);
      }
      replies.push_back(pid > 0 ? pid : -errno);
      if (pid < 0) break;
      at += own;
    }
    for (std::size_t i = 0; i < count; ++i) ::close(fds[i]);
    if (!os::send_with_fds(socket, replies.data(), replies.size() * sizeof(int), nullptr, 0)) return 0;
  }
}

namespace {

// The descriptors a rank keeps at their numbers. The plan keeps the result
// memfd too: it has a slot of its own.
std::vector<int> kept_by(const server_request& r) {
  const launch_plan& p = *r.plan;
  std::vector<int> kept;
  for (std::size_t i = 0; i < p.keep_count; ++i) {
    if (p.keep[i] != r.result_fd) kept.push_back(p.keep[i]);
  }
  return kept;
}

// Writes the call, every rank's plan and their keeper into a memfd;
// returns it, or -1 with `f` saying why. `kept[i]` is kept_by(requests[i]).
int write_plans(std::span<const server_request> requests, std::span<const std::vector<int>> kept,
                const function_call& call, const std::string& keeper, bool dir_sent, bool announce_sent,
                launch_failure& f) {
  std::vector<std::string> entries;
  std::unordered_map<std::string_view, int> numbers;  // of the entries, by their text in the plans
  std::vector<rank_plan> plans;
  plans.reserve(requests.size());
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const server_request& r = requests[i];
    const launch_plan& p = *r.plan;
    std::vector<int> env;
    for (char* const* e = p.envp; *e != nullptr; ++e) {
      const auto [at, fresh] = numbers.try_emplace(*e, static_cast<int>(entries.size()));
      if (fresh) entries.emplace_back(*e);
      env.push_back(at->second);
    }
    if (kept[i].size() > max_kept) {
      f = {stage::fds, E2BIG, ""};
      return -1;
    }
    // What the rank leads: 0 nothing, 1 a process group, 2 a session.
    const int leads = p.new_session ? 2 : p.new_group ? 1 : 0;
    int closed = 0;
    for (std::size_t s = 0; s < 3; ++s) closed |= p.source[s] == closed_stream ? 1 << s : 0;
    plans.emplace_back(r.rank, p.parent, p.death_signal, leads, p.cwd != nullptr ? p.cwd : "", std::move(env), kept[i],
                       closed);
  }
  const auto args = call.args.bytes();
  const request req{call.name, std::vector<std::byte>(args.begin(), args.end()), call.returns_value,
                    std::move(entries), std::move(plans), keeper, dir_sent, announce_sent,
                    to_wire(current_requester_state())};
  const int fd = ::memfd_create("cohort-request", MFD_CLOEXEC);
  if (fd < 0 || !write_whole(fd, encode(req).bytes())) {
    f = {stage::start, errno, fd < 0 ? "the request's memfd" : "writing the request" + os::file_size_limit_note(errno)};
    if (fd >= 0) ::close(fd);
    return -1;
  }
  return fd;
}

// Sends the ranks from `first` on whose descriptors number at most `most`
// (always one rank, up to max_fds); returns how many it sent, or 0 with
// errno set, and in `carried` how many descriptors the message held.
// `kept` as for write_plans.
std::size_t send_batch(int socket, std::span<const server_request> requests, std::span<const std::vector<int>> kept,
                       bool returns_value, std::size_t first, std::size_t most, int report_fd, int request_fd,
                       int dir_fd, int announce_fd, std::size_t& carried) {
  fd_array fds{};
  fds[report_slot] = report_fd;
  fds[request_slot] = request_fd;
  fds[dir_slot] = dir_fd >= 0 ? dir_fd : request_fd;  // the request says which
  fds[announce_slot] = announce_fd >= 0 ? announce_fd : request_fd;
  std::size_t count = shared_slots;
  std::size_t end = first;
  for (; end < requests.size(); ++end) {
    const launch_plan& p = *requests[end].plan;
    const std::size_t with = count + first_kept(returns_value) + kept[end].size();
    if (with > max_fds || (with > most && end > first)) break;
    // Inherited streams are the caller's own; stderr as stdout (source 1,
    // "stdout once placed") is what stdout gets; a stream the rank closes
    // has a stand-in, the request's descriptor (its plan says so).
    const auto sent = [&p, request_fd](std::size_t i) {
      return p.source[i] == closed_stream ? request_fd : p.source[i] >= 0 ? p.source[i] : static_cast<int>(i);
    };
    for (std::size_t i = 0; i < 3; ++i) fds[count++] = i == 2 && p.source[2] == 1 ? sent(1) : sent(i);
    if (returns_value) fds[count++] = requests[end].result_fd;
    for (int fd : kept[end]) fds[count++] = fd;
  }
  if (end == first) {  // a rank with more than max_kept: refused before this
    errno = E2BIG;
    return 0;
  }
  const batch b{static_cast<std::uint32_t>(first), static_cast<std::uint32_t>(end - first)};
  carried = count;
  return os::send_with_fds(socket, &b, sizeof b, fds.data(), count) ? end - first : 0;
}

bool server_gone(int error) { return error == EPIPE || error == ECONNRESET; }

// How long a start waits for a reply from a server that is neither stopped
// nor traced: a batch is a few dozen clones, which take milliseconds.
constexpr std::chrono::seconds reply_patience{30};

// Waits for the server's reply: 0 once it can be read (or the server has
// closed its end), ETIMEDOUT when it never will be: the server was stopped
// (SIGSTOP, SIGTSTP), or answered nothing for reply_patience though it ran.
// A server stopped by a tracer is waited on for as long as it stays so.
int wait_for_reply(const server_link& l) noexcept {
  constexpr int slice_ms = 100;
  using steady = std::chrono::steady_clock;
  auto until = steady::now() + reply_patience;
  for (;;) {
    pollfd p{l.socket, POLLIN, 0};
    const int n = ::poll(&p, 1, slice_ms);  // a signal cuts it short (EINTR): the clock says how long it was
    if (n > 0) return 0;
    if (n < 0 && errno != EINTR) return errno;
    const char state = os::state_of(l.server.pid());
    if (state == 'T') return ETIMEDOUT;
    if (state == 't') until = steady::now() + reply_patience;  // counted from the tracer's letting go
    if (steady::now() >= until) return ETIMEDOUT;
  }
}

// How long a failed start waits for the set-up reports of children the
// server made but did not name.
constexpr std::chrono::milliseconds unnamed_patience{2000};

}  // namespace

std::size_t start_from_server(std::span<server_request> requests, const function_call& call,
                              const std::string& keeper, int& report_fd, launch_failure& f) noexcept {
  // Never destroyed: a forked child that calls exit() must not touch its
  // copy, whose descriptors it may have closed. The server ends by itself
  // when this process goes (its socket closes; parent-death signal).
  auto& slot = os::of_this_process<server_slot>();
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
    std::vector<std::vector<int>> kept;
    kept.reserve(requests.size());
    for (const auto& r : requests) kept.push_back(kept_by(r));
    // The working directory by descriptor: a rank enters it whatever its
    // path (none when it cannot be opened: the server's then).
    const os::owned_fd here(::open(".", O_PATH | O_DIRECTORY | O_CLOEXEC));
    // The ranks' shared socket to announce their start on, when they have one.
    const int announce = requests.empty() ? -1 : requests.front().plan->announce_fd;
    const os::owned_fd plans(write_plans(requests, kept, call, keeper, here.get() >= 0, announce >= 0, f));
    if (plans.get() < 0) return 0;
    for (bool restarted = false;;) {
      if (l.socket < 0) {
        // From a thread that lives as long as the process: the server's
        // ranks are its siblings (CLONE_PARENT), and the parent-death
        // signal of both follows the thread that started the server. Begun
        // on a caller's thread, they were killed when it ended, in the
        // middle of another thread's run.
        launch_failure why;
        bool started_server = false;
        run_on_lasting_thread([&] { started_server = start_server(l, why); });
        if (!started_server) {
          f = failure_of_step("starting the forkserver", why);
          return 0;
        }
      }
      // A fresh pipe for each server: a child a dead server made unasked
      // cannot report into this one.
      int ends[2];
      if (::pipe2(ends, O_CLOEXEC) != 0) {
        f = {stage::pipe, errno, ""};
        return 0;
      }
      os::owned_fd report_read(ends[0]), report_write(ends[1]);
      // One message at a time: its descriptors in flight stay under the
      // limit on them.
      int error = 0;
      bool refused = false;  // the request as a whole, before any clone
      bool clone_failed = false;  // the server's clone of requests[started]
      while (started < requests.size() && error == 0) {
        std::size_t carried = 0;
        const std::size_t sent = send_batch(l.socket, requests, kept, call.returns_value, started, l.most_fds,
                                            report_write.get(), plans.get(), here.get(), announce, carried);
        if (sent == 0) {
          error = errno;
          break;
        }
        error = wait_for_reply(l);
        if (error != 0) break;
        std::array<int, max_fds> replies{};
        fd_array none{};
        std::size_t count = 0;
        bool truncated = false;
        const ssize_t n =
            os::receive_with_fds(l.socket, replies.data(), sizeof replies, none.data(), none.size(), count, truncated);
        for (std::size_t i = 0; i < count; ++i) ::close(none[i]);
        if (n <= 0) {
          error = n == 0 ? EPIPE : errno;
          break;
        }
        const std::size_t ints = static_cast<std::size_t>(n) / sizeof(int);
        if (ints > 0 && replies[0] == EMFILE && sent > 1) {
          // More descriptors than the server had room for, its own more
          // than server_own_fds: from now on in messages of half as many.
          l.most_fds = carried / 2;
          continue;
        }
        if (ints == 0 || replies[0] != 0) {
          refused = true;
          error = ints > 0 && replies[0] > 0 ? replies[0] : EPROTO;
          break;
        }
        const std::size_t answered = std::min(sent, ints - 1);
        for (std::size_t i = 1; i <= answered && error == 0; ++i) {
          if (replies[i] > 0) {
            requests[started++].pid = replies[i];  // ours: CLONE_PARENT
          } else {
            clone_failed = replies[i] < 0;
            error = clone_failed ? -replies[i] : EPROTO;
          }
        }
        if (error == 0 && answered < sent) error = EPROTO;
      }
      if (error == 0) {
        report_fd = report_read.release();
        return started;
      }
      const pid_t server = l.server.pid();
      const bool stuck = error == ETIMEDOUT;  // not answering: ended as if gone
      const bool gone = server_gone(error) || stuck;
      if (gone) drop_server(l);
      // Children the server made but never named (it died, or its reply
      // was short) are this process's: found by their reports and ended.
      report_write.reset();
      std::vector<pid_t> known;
      for (std::size_t r = 0; r < started; ++r) known.push_back(requests[r].pid);
      end_unknown_ranks(report_read.get(), known, unnamed_patience, announce);
      if (gone && started == 0 && !restarted) {  // a server dead at once: started again, once
        restarted = true;
        continue;
      }
      f = {stage::start, error,
           clone_failed ? "the forkserver's clone of the rank" + os::process_limit_note(error)
           : refused && error == EMFILE
               ? fmt::format("the forkserver could not take one rank's descriptors under its open file limit, {}",
                             l.fd_limit)
           : refused && error == refused_threaded
               ? std::string("the forkserver runs more than one thread, started before main (by a static initialiser "
                             "of the program or of a library it loads), and a rank cloned from it could hang on a "
                             "lock that thread holds; use the spawn or fork start method")
           : refused ? std::string("the forkserver refused the request")
           : stuck   ? fmt::format("the forkserver (pid {}) stopped answering during the start, after {} of its {} "
                                   "ranks, and was ended (the next start starts another)",
                                   server, started, requests.size())
           : gone    ? fmt::format("the forkserver ended during the start, after {} of its {} ranks (the next start "
                                   "starts another)", started, requests.size())
                     : std::string("the request to the forkserver")};
      return started;
    }
  } catch (const std::bad_alloc&) {
    f = {stage::start, ENOMEM, ""};
  } catch (const std::system_error& e) {
    // Its own words without the error's, which the failure adds (the
    // thread the server is started from could not be made, say).
    std::string what = os::system_error_words(e);
    if (what.starts_with("cohort: ")) what.erase(0, 8);
    f = {stage::start, e.code().value(), what};
  }
  return started;
}

COHORT_FORKED_CHILD_PATH void stop_forkserver() noexcept {
  // A process that never asked for a server (a forked rank, whose parent's
  // is not its own) has none to stop.
  auto* slot = os::made_in_this_process<server_slot>();
  if (slot == nullptr) return;
  std::lock_guard lock(slot->mutex);
  if (slot->link) drop_server(*slot->link);
}

}  // namespace cohort::detail

// The keeper's socket, what ranks hand over on it, and how receivers find
// what a keeper holds.
#include "shm/keeper.hpp"

#include "config.hpp"

#include "os/descriptor_limit.hpp"
#include "os/descriptor_passing.hpp"
#include "os/owned_fd.hpp"
#include "os/process_identity.hpp"
#include "os/watcher.hpp"
#include "cohort/storage.hpp"
#include "shm/arena.hpp"
#include "shm/registry.hpp"
#include "shm/segment_name.hpp"

#include <dirent.h>
#include <signal.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <system_error>
#include <cstring>
#include <mutex>
#include <string_view>
#include <thread>

namespace cohort::shm {

namespace {

// This process as a keeper, under the registry's lock. A fork child finds
// its parent's here, and starts afresh (owner differs): the descriptors it
// names are the parent's, closed in the child.
struct keeper_state {
  pid_t owner = 0;
  int socket = -1;
  std::string name;  // the socket's abstract address, without its leading 0 byte
  std::vector<std::shared_ptr<segment>> kept;
  bool watching = false;  // a watcher thread lets go of kept segments as the values naming them end
  // Messages left in the socket for want of descriptors to take them with,
  // and since when the first of them has waited.
  bool waiting_for_room = false;
  std::chrono::steady_clock::time_point waiting_since{};
  // What was handed over and lost here, and why (why_not_kept).
  struct loss {
    pid_t sender;
    std::uint64_t nonce;  // 0: any of the sender's
    std::string why;
  };
  std::vector<loss> lost;
};

keeper_state& own_state() {
  // Never destroyed: segments unmapped at exit take the registry's lock.
  static keeper_state* state = nullptr;
  if (state == nullptr || state->owner != os::this_process()) {
    state = new keeper_state;  // a parent's is left as it is: its segments name the parent's descriptors
    state->owner = os::this_process();
  }
  return *state;
}

// What may still receive values naming kept segments (note_ranks_running).
std::atomic<int> ranks_running{0};
std::atomic<int> queue_objects{0};

// The keeper this process hands over to, as keeper_env said.
keeper_address keeper_found;

sockaddr_un address_of(std::string_view name, socklen_t& length) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  const auto n = std::min(name.size(), sizeof a.sun_path - 1);
  std::memcpy(a.sun_path + 1, name.data(), n);  // sun_path[0] = 0: the abstract namespace, nothing on disk
  length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
  return a;
}

// Opens the descriptor in `dir` (/proc/<pid>/fd) that links to `target`;
// -1 with errno ENOENT when none does.
int open_linked(const std::string& dir, std::string_view target) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return -1;
  int fd = -1;
  int error = ENOENT;
  char link[256];
  while (const dirent* e = ::readdir(d)) {
    const auto n = ::readlinkat(::dirfd(d), e->d_name, link, sizeof link);
    if (n < 0 || std::string_view(link, static_cast<std::size_t>(n)) != target) continue;
    // Opened by path: the number may have been reused since, which the
    // segment's header tells once mapped.
    fd = ::open(fmt::format("{}/{}", dir, e->d_name).c_str(), O_RDWR | O_CLOEXEC | O_NOCTTY);
    if (fd >= 0 || errno != ENOENT) {
      error = errno;
      break;
    }
  }
  ::closedir(d);
  errno = error;
  return fd;
}

}  // namespace

std::string keeper_for_ranks() noexcept {
  try {
    auto& r = segments();
    std::lock_guard lock(r.mutex);
    auto& k = own_state();
    if (k.socket >= 0) return fmt::format("{},{}", k.owner, k.name);
    std::uint64_t nonce = 0;
    if (::getrandom(&nonce, sizeof nonce, 0) != static_cast<ssize_t>(sizeof nonce)) return {};
    const int s = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s < 0) return {};
    const int on = 1;
    // The kernel then names each sender's uid: only this user's are taken.
    ::setsockopt(s, SOL_SOCKET, SO_PASSCRED, &on, sizeof on);
    const auto name = fmt::format("cohort-keeper-{}-{:016x}", k.owner, nonce);
    socklen_t length = 0;
    const auto a = address_of(name, length);
    if (::bind(s, reinterpret_cast<const sockaddr*>(&a), length) != 0) {
      ::close(s);
      return {};
    }
    k.socket = s;
    k.name = name;
    return fmt::format("{},{}", k.owner, k.name);
  } catch (...) {
    return {};
  }
}

keeper_address parse_keeper(std::string_view value) noexcept {
  keeper_address k;
  const auto comma = value.find(',');
  pid_t pid = 0;
  const auto digits = value.substr(0, comma);
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), pid);
  if (comma == std::string_view::npos || error != std::errc{} || end != digits.data() + digits.size() || pid <= 0 ||
      comma + 1 >= value.size()) {
    return k;
  }
  const auto name = value.substr(comma + 1);
  if (name.size() > sizeof k.name) return k;  // no address holds it: none of this program's making
  k.pid = pid;
  std::memcpy(k.name, name.data(), name.size());
  k.name_size = name.size();
  return k;
}

COHORT_FORKED_CHILD_PATH void set_keeper(const keeper_address& keeper) noexcept {
  keeper_found = keeper;
  keeper_found.of = keeper.pid != 0 ? os::this_process() : 0;
}

void find_keeper_in_environment() noexcept {
  const char* value = std::getenv(keeper_env);
  if (value == nullptr) return;
  set_keeper(parse_keeper(value));
  ::unsetenv(keeper_env);
}

pid_t own_keeper() noexcept { return keeper_found.of == os::this_process() ? keeper_found.pid : 0; }

namespace {

// This process's socket to its keeper, connected once values first name its
// shared memory: a rank that runs out of descriptors after that still has
// the one its hand-over needs. `socket_of` tells a fork child that the
// socket is its parent's.
std::atomic<int> keeper_socket{-1};
std::atomic<pid_t> keeper_socket_of{0};

// A socket connected to this process's keeper, -1 (errno set) when none
// could be made. The sender waits at most 2 s for room in the keeper's queue.
int connect_to_keeper() noexcept {
  const int s = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return -1;
  const timeval patience{2, 0};
  ::setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &patience, sizeof patience);
  socklen_t length = 0;
  const auto a = address_of({keeper_found.name, keeper_found.name_size}, length);
  if (::connect(s, reinterpret_cast<const sockaddr*>(&a), length) != 0) {
    const int error = errno;
    ::close(s);
    errno = error;
    return -1;
  }
  return s;
}

// Makes keeper_socket for this process, once, where it has a keeper.
void keep_socket_to_keeper() noexcept {
  if (own_keeper() == 0 || keeper_socket_of.load(std::memory_order_acquire) == os::this_process()) return;
  const int s = connect_to_keeper();
  if (s < 0) return;  // made again as it ends
  // The descriptor, then whose it is (release): a reader that sees its own
  // pid (acquire) sees the descriptor too.
  keeper_socket.store(s, std::memory_order_relaxed);
  keeper_socket_of.store(os::this_process(), std::memory_order_release);
}

// Sends `fds` to this process's keeper; whether it could. Each message's
// byte says how many descriptors it carries, so that the keeper can make
// room for them before it takes them. Apart from hand_over_to_keeper,
// whose frame then stays small: a forked rank with nothing to hand over
// touches no further page of its stack for it.
[[gnu::noinline]] bool send_to_keeper(const std::vector<int>& fds) noexcept {
  if (own_keeper() == 0) return false;
  const bool kept = keeper_socket_of.load(std::memory_order_acquire) == os::this_process();
  const os::owned_fd made(kept ? -1 : connect_to_keeper());
  const int s = kept ? keeper_socket.load(std::memory_order_relaxed) : made.get();
  if (s < 0) return false;
  for (std::size_t first = 0; first < fds.size(); first += os::max_passed) {
    const auto count = std::min(os::max_passed, fds.size() - first);
    const auto byte = static_cast<unsigned char>(count);  // max_passed < 256
    if (!os::send_with_fds(s, &byte, 1, fds.data() + first, count)) return false;
  }
  return true;
}

}  // namespace

COHORT_FORKED_CHILD_PATH bool hand_over_to_keeper() noexcept {
  auto* known = segments_if_made();
  // No segment was ever mapped here, or no value names one through this
  // process: nothing to look through, and no lock to take.
  if (known == nullptr || !known->named_by_values.load(std::memory_order_acquire)) return true;
  std::vector<std::shared_ptr<segment>> held;  // so that `fds` stay open until sent
  std::vector<int> fds;
  std::vector<os::owned_fd> opened;  // named files, opened to be handed over: the group sweeps their names
  try {
    std::lock_guard lock(known->mutex);
    for (auto& [nonce, weak] : known->segments) {
      auto s = weak.lock();
      if (!s || !s->messages_in_flight()) continue;
      const auto ref = s->ref();
      if (ref.strategy == sharing_strategy::file_system) {
        if (!s->made_here()) {
          // Kept here for a rank of this process's, whose group has swept
          // its name: only the descriptor reaches it. Another's received
          // here is its maker's keeper's to hand on.
          if (const int fd = s->kept_descriptor(); fd >= 0) {
            fds.push_back(fd);
            held.push_back(std::move(s));
          }
          continue;
        }
        const int fd = ::shm_open(segment_name(ref.maker, ref.nonce).c_str(), O_RDWR | O_CLOEXEC, 0);
        if (fd < 0) return false;
        opened.emplace_back(fd);
        fds.push_back(fd);
      } else {
        if (ref.source != os::this_process() || ref.fd < 0) continue;  // values name another holder
        fds.push_back(ref.fd);
      }
      held.push_back(std::move(s));
    }
  } catch (...) {
    return false;
  }
  if (fds.empty()) return true;  // the common case
  return send_to_keeper(fds);
}

namespace {

// let_values_go's once, and what let_values_go_at_exit armed; the pids
// tell a forked child that its parent's state is not its own.
std::atomic<pid_t> values_let_go_by{0};
std::atomic<pid_t> exit_armed_by{0};
std::atomic<pid_t> exit_registered_by{0};
std::chrono::steady_clock::duration exit_limit{};

void let_values_go_as_exiting() { let_values_go(exit_limit, true); }

}  // namespace

void let_values_go(std::chrono::steady_clock::duration limit, bool wait) noexcept {
  if (values_let_go_by.exchange(os::this_process()) == os::this_process()) return;
  if (!hand_over_to_keeper() && wait) wait_for_receivers(limit);
  // A device's memory cannot go to the keeper: its receivers fetch it here.
  if (wait) detail::wait_for_device_receivers(limit);
}

void let_values_go_at_exit(std::chrono::steady_clock::duration limit) noexcept {
  exit_limit = limit;
  exit_armed_by.store(os::this_process(), std::memory_order_release);
  // Values named already (a fork rank's parent's): registered now.
  if (auto* r = segments_if_made(); r != nullptr && r->named_by_values.load(std::memory_order_acquire)) {
    on_first_values_named();
  }
}

void on_first_values_named() noexcept {
  const pid_t self = os::this_process();
  if (exit_armed_by.load(std::memory_order_acquire) != self) return;
  if (exit_registered_by.exchange(self) == self) return;
  // Its end will hand values over: the socket for it is made now, while
  // the rank's function has not had the chance to use up its descriptors.
  keep_socket_to_keeper();
  std::atexit(let_values_go_as_exiting);
}

namespace {

// How often the watcher looks at what is kept.
constexpr std::chrono::milliseconds kept_check{100};

// Lets go of the kept segments that no value names any more; whether the
// watcher is done: none is kept. A keeper that has received what its ranks
// sent, and dropped it, does not hold the memory until its next trim or
// rank.
bool look_at_kept() {
  auto& r = segments();
  std::vector<std::shared_ptr<segment>> gone;  // unmapped after the lock is released
  std::lock_guard lock(r.mutex);
  auto& k = own_state();
  if (k.waiting_for_room) {
    take_handed_over_locked(gone);
  } else {
    release_kept_locked(gone);
  }
  if (!k.kept.empty() || k.waiting_for_room) return false;
  k.watching = false;
  return true;
}

// Records that what `sender` handed over (the segment `nonce`, or 0: any
// of its) was lost here, and why, for the receiver that looks for it.
void note_lost(keeper_state& k, pid_t sender, std::uint64_t nonce, std::string why) noexcept {
  try {
    // A bounded record: the oldest go first.
    constexpr std::size_t at_most = 1024;
    if (k.lost.size() >= at_most) k.lost.erase(k.lost.begin());
    k.lost.push_back({sender, nonce, std::move(why)});
  } catch (...) {
    // Unrecorded: its receiver is told its sender exited.
  }
}

// Whether `count` more descriptors can be had here; when not, the
// registry's caches give up what they hold in descriptors first (what
// they let go of is moved to `gone`). The registry's lock is held.
bool make_room(const keeper_state& k, std::size_t count, std::vector<std::shared_ptr<segment>>& gone) noexcept {
  if (os::descriptors_free(k.socket, count)) return true;
  try {
    segments().shed(gone);
  } catch (...) {
    return false;
  }
  return os::descriptors_free(k.socket, count);
}

// A hand-over taken past room_patience is taken as far as room goes while
// `spare` descriptors stay free for the rest of this process (its next
// io_context, a rank's start); the kernel drops the others.
constexpr std::size_t spare = 16;

// The credentials a message came with, when they are this user's.
const ucred* from_this_user(msghdr& m) noexcept {
  for (cmsghdr* c = CMSG_FIRSTHDR(&m); c != nullptr; c = CMSG_NXTHDR(&m, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS) {
      const auto* sender = reinterpret_cast<const ucred*>(CMSG_DATA(c));
      return sender->uid == ::geteuid() ? sender : nullptr;
    }
  }
  return nullptr;
}

}  // namespace

void take_handed_over_locked(std::vector<std::shared_ptr<segment>>& gone) noexcept {
  auto& k = own_state();
  if (k.socket < 0) return;
  // What no value names any more goes first: its descriptor makes room.
  release_kept_locked(gone);
  k.waiting_for_room = false;
  for (;;) {
    // The next message's sender, and its byte, which says how many
    // descriptors it carries, without taking it: with room for its
    // credentials alone, none of its descriptors comes with the look.
    unsigned char carried = 0;
    iovec look_io{&carried, 1};
    alignas(cmsghdr) char credentials[CMSG_SPACE(sizeof(ucred))];
    msghdr look{};
    look.msg_iov = &look_io;
    look.msg_iovlen = 1;
    look.msg_control = credentials;
    look.msg_controllen = sizeof credentials;
    const ssize_t peeked = ::recvmsg(k.socket, &look, MSG_PEEK | MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (peeked < 0 && errno == EINTR) continue;
    if (peeked < 0) break;  // none left (EAGAIN)
    if (peeked == 0 || from_this_user(look) == nullptr) {
      // Not a rank's (any user can reach the socket's name): taken without
      // room for descriptors, which the kernel closes.
      while (::recv(k.socket, &carried, 1, MSG_DONTWAIT) < 0 && errno == EINTR) {
      }
      continue;
    }
    // Received without room for them all, the kernel would drop the rest,
    // and the values naming them would be lost for good: without room, it
    // stays queued (the queue holds its segments) a while, as some is made.
    const std::size_t count = std::min<std::size_t>(carried, os::max_passed);
    std::size_t room = count;  // descriptors the message may install here
    if (!make_room(k, count, gone)) {
      const auto now = std::chrono::steady_clock::now();
      if (k.waiting_since == std::chrono::steady_clock::time_point{}) k.waiting_since = now;
      if (now - k.waiting_since < room_patience) {
        k.waiting_for_room = true;
        break;
      }
      const std::size_t free = os::descriptors_free_up_to(k.socket, count + spare);
      room = free > spare ? free - spare : 0;
    }
    k.waiting_since = {};
    // Room for the credentials and `room` descriptors: the kernel installs
    // no more than the buffer holds, and drops the rest.
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * os::max_passed) + CMSG_SPACE(sizeof(ucred))];
    char byte = 0;
    iovec io{&byte, 1};
    msghdr m{};
    m.msg_iov = &io;
    m.msg_iovlen = 1;
    m.msg_control = control;
    m.msg_controllen = CMSG_SPACE(sizeof(ucred)) + (room > 0 ? CMSG_SPACE(sizeof(int) * room) : 0);
    const ssize_t n = ::recvmsg(k.socket, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    std::vector<int> fds;
    for (cmsghdr* c = CMSG_FIRSTHDR(&m); c != nullptr; c = CMSG_NXTHDR(&m, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const auto got = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      const auto* first = reinterpret_cast<const int*>(CMSG_DATA(c));
      for (std::size_t i = 0; i < got; ++i) {
        int fd;
        std::memcpy(&fd, first + i, sizeof fd);
        try {
          fds.push_back(fd);
        } catch (...) {
          ::close(fd);
        }
      }
    }
    const ucred* const sender = from_this_user(m);
    const bool trusted = sender != nullptr;
    // Taken past its patience without room for all, or another thread took
    // the room made (or the sender said less than it sent): the kernel
    // dropped what did not fit.
    if (trusted && (m.msg_flags & MSG_CTRUNC) != 0) {
      note_lost(k, sender->pid, 0,
                fmt::format("descriptors pid {} handed over to its keeper, this process, were dropped: they did not "
                            "fit under its descriptor limit{}",
                            sender->pid, os::descriptor_limit_note(EMFILE)));
    }
    for (const int fd : fds) {
      if (!trusted) {
        ::close(fd);
        continue;
      }
      const auto nonce = segment::nonce_in(fd);
      try {
        k.kept.push_back(segment::keep(fd, sender->pid, nonce));
      } catch (const std::exception& e) {
        // Not a segment (keep closed it), or no room to map it: its values
        // are lost, and their receivers here are told why.
        note_lost(k, sender->pid, nonce, fmt::format("its keeper, this process, could not keep it: {}", e.what()));
      } catch (...) {
        note_lost(k, sender->pid, nonce, "its keeper, this process, could not keep it");
      }
    }
  }
  release_kept_locked(gone);
  if ((k.kept.empty() && !k.waiting_for_room) || k.watching) return;
  // Without a thread, what is kept goes (and what waits for room comes) as
  // the next rank ends, at the next trim, or as the last queue object goes.
  k.watching = os::start_watcher(kept_check, look_at_kept);
}

bool waiting_for_room_locked() noexcept { return own_state().waiting_for_room; }

std::string why_not_kept(pid_t source, std::uint64_t nonce) {
  auto& k = own_state();
  for (auto it = k.lost.rbegin(); it != k.lost.rend(); ++it) {
    if ((nonce != 0 && it->nonce == nonce) || (it->nonce == 0 && it->sender == source)) return it->why;
  }
  if (k.waiting_for_room) {
    return fmt::format("what was handed over to its keeper, this process, waits for descriptors to take it: {}{}",
                       std::system_category().message(EMFILE), os::descriptor_limit_note(EMFILE));
  }
  return {};
}

void note_ranks_running(int change) noexcept { ranks_running.fetch_add(change, std::memory_order_relaxed); }
void note_queue_objects(int change) noexcept {
  // The last one gone: what is kept may have no receiver left.
  if (queue_objects.fetch_add(change, std::memory_order_relaxed) + change == 0) forget_dead_segments();
}

void release_kept_locked(std::vector<std::shared_ptr<segment>>& gone) noexcept {
  auto& k = own_state();
  if (k.kept.empty()) return;
  // A process with a keeper of its own hands what values still name over
  // as it ends: a receiver may be there, or a rank it starts.
  const bool nobody_left = own_keeper() == 0 && ranks_running.load(std::memory_order_relaxed) <= 0 &&
                           queue_objects.load(std::memory_order_relaxed) <= 0;
  std::erase_if(k.kept, [&gone, nobody_left](auto& s) {
    if (s->messages_in_flight() && !(nobody_left && s->others_ended())) return false;
    s->unkeep();
    try {
      gone.push_back(std::move(s));
    } catch (...) {
      // Unmapped here, under the lock: its destructor would take it again.
      return false;
    }
    return true;
  });
}

void take_handed_over() noexcept {
  auto* r = segments_if_made();
  if (r == nullptr) return;
  std::vector<std::shared_ptr<segment>> gone;  // unmapped after the lock is released
  std::lock_guard lock(r->mutex);
  take_handed_over_locked(gone);
}

int open_kept(pid_t keeper, pid_t source, const std::string& link) {
  using clock = std::chrono::steady_clock;
  const auto dir = fmt::format("/proc/{}/fd", keeper);
  // The source hands over before it ends, and the keeper takes what it
  // handed as it records that end: soon after the source is reaped.
  constexpr auto after_end = std::chrono::milliseconds(100);
  constexpr auto at_most = std::chrono::seconds(2);
  const auto start = clock::now();
  auto seen = start;
  for (;;) {
    const int fd = open_linked(dir, link);
    if (fd >= 0 || errno != ENOENT) return fd;
    const auto now = clock::now();
    if (os::has_ended(keeper, 0)) {
      errno = ESRCH;
      return -1;
    }
    // A source that is ending closes its descriptors before it shows as
    // ended, so one that seems to run gets `after_end` too; still running
    // then, it holds what it sent itself: the handle names a descriptor it
    // does not have, and no keeper will be given it.
    if (::kill(source, 0) == 0 && os::has_ended(source, 0)) seen = now;  // ended, not yet reaped
    if (now - seen > after_end || now - start > at_most) {
      errno = ENOENT;
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace cohort::shm

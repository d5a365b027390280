// Which processes on the far side of a queue are still there.
#include "queue/peers.hpp"

#include "config.hpp"
#include "os/bare_thread.hpp"
#include "os/futex.hpp"
#include "os/per_process.hpp"
#include "os/process_identity.hpp"
#include "os/raw_syscall.hpp"

#include <linux/futex.h>
#include <poll.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <optional>
#include <thread>
#include <utility>

namespace cohort::detail {

void peer_table::join(std::uint32_t roles) noexcept {
  const pid_t self = os::this_process();
  const std::uint64_t started = os::own_start_time();
  for (std::uint32_t i = 0; i < count && i < max_peers; ++i) {
    if (peers[i].pid != self) continue;
    // 0 is a start time that could not be read: this process's own entry
    // from a time /proc failed it, or now; either way, taken as its own.
    if (peers[i].start_time == started || peers[i].start_time == 0 || started == 0) {
      peers[i].roles |= roles;
      if (peers[i].start_time == 0) peers[i].start_time = started;
    } else {
      // An ended process that had this pid: its entry is this one's now,
      // or a watcher would take this process for it, and find it gone.
      peers[i] = {self, os::running_rank(), roles, started};
    }
    return;
  }
  if (count >= max_peers) {
    // Full: keep the table to the processes still there (by start time:
    // a pid recycled since is another process), and, for the side that
    // none of them nor this one is on, the last of the ended ones that was
    // on it: a wait still finds that side gone, and whom to name.
    std::uint32_t kept = 0, live_roles = roles;
    std::optional<peer> last_ended[2];  // producer, consumer
    for (std::uint32_t i = 0; i < max_peers; ++i) {
      const peer p = peers[i];
      if (!os::has_ended(p.pid, p.start_time)) {
        peers[kept++] = p;
        live_roles |= p.roles;
        continue;
      }
      if ((p.roles & peer_producer) != 0) last_ended[0] = p;
      if ((p.roles & peer_consumer) != 0) last_ended[1] = p;
    }
    const std::uint32_t missing = (peer_producer | peer_consumer) & ~live_roles;  // one side at most
    const auto& last = last_ended[missing == peer_producer ? 0 : 1];
    if (missing != 0 && last && kept + 1 < max_peers) peers[kept++] = *last;  // room left for this one
    count = kept;
    if (count >= max_peers) {
      incomplete = 1;  // this one goes unrecorded
      return;
    }
  }
  peers[count++] = {self, os::running_rank(), roles, started};
}

bool peer_watch::alive(const peer& p, death_notice* notice) {
  auto key = std::pair{p.pid, p.start_time};
  auto it = pidfds_.find(key);
  if (it == pidfds_.end()) {
    os::owned_fd fd(config::pidfd_open(p.pid));
    if (fd.get() < 0) return errno != ESRCH;
    // The pid may already name another process: the start time tells.
    if (os::has_ended(p.pid, p.start_time)) return false;
    it = pidfds_.emplace(key, std::move(fd)).first;
  }
  if (it->second.get() < 0) return false;  // seen gone before
  pollfd f{it->second.get(), POLLIN, 0};
  if (::poll(&f, 1, 0) == 0) {
    if (notice != nullptr) notice->arm(it->second.get());
    return true;
  }
  // Gone for good: a process never comes back, so its descriptor goes now
  // and the entry stays, empty, while the table names it.
  it->second.reset();
  return false;
}

std::optional<peer> peer_watch::all_gone(const peer* peers, std::uint32_t count, std::uint32_t role,
                                         death_notice* notice, bool self_has_role) {
  const pid_t self = os::this_process();
  std::lock_guard lock(mutex_);
  // Entries of processes the table no longer names go: a long-lived side
  // of a queue keeps nothing for the peers that came and went.
  const auto named = [&](const std::pair<pid_t, std::uint64_t>& key) {
    for (std::uint32_t i = 0; i < count && i < max_peers; ++i) {
      if (peers[i].pid == key.first && peers[i].start_time == key.second) return true;
    }
    return false;
  };
  std::erase_if(pidfds_, [&](const auto& entry) { return !named(entry.first); });
  // Every peer is looked at, so that each live one is armed.
  std::optional<peer> last;
  bool any_alive = false;
  const auto look = [&](std::uint32_t roles) {
    for (std::uint32_t i = 0; i < count && i < max_peers; ++i) {
      if ((peers[i].roles & roles) == 0 || peers[i].pid == self) continue;
      if (alive(peers[i], notice)) {
        any_alive = true;
      } else {
        last = peers[i];
      }
    }
  };
  look(role);
  if (any_alive) return std::nullopt;
  // No other process ever had the role, and this one has: whoever else
  // used the queue is all that could still end the wait.
  if (!last && self_has_role) look(~0u);
  if (any_alive) return std::nullopt;
  return last;
}

death_notice& death_notice::of_this_process() { return os::of_this_process<death_notice>(); }

bool death_notice::start() noexcept {
  // Made on first use, not at construction: of_this_process may make and
  // drop a spare one when threads race, which must own no thread.
  std::call_once(started_, [this] {
    epoll_ = ::epoll_create1(EPOLL_CLOEXEC);
    if (epoll_ < 0) return;
    // A thread libc does not count where it can (os/bare_thread.hpp): a
    // process whose only other thread is this one keeps libc's and
    // cohort's single-threaded paths, which every tensor sent or received
    // takes several times. Where it cannot start (another architecture,
    // the clone refused, ids that differ, capabilities it could not give
    // up), a std::thread.
    bool started = os::start_bare_thread(watch, this, watcher_stack) == 0;
    if (!started) {
      try {
        std::thread([this] { watch(this); }).detach();
        started = true;
      } catch (...) {
      }
    }
    if (!started) ::close(std::exchange(epoll_, -1));
  });
  return epoll_ >= 0;
}

void death_notice::arm(int pidfd) noexcept {
  if (!start()) return;
  epoll_event e{};
  e.events = EPOLLIN | EPOLLONESHOT;
  e.data.fd = pidfd;
  if (::epoll_ctl(epoll_, EPOLL_CTL_MOD, pidfd, &e) != 0 && errno == ENOENT) ::epoll_ctl(epoll_, EPOLL_CTL_ADD, pidfd, &e);
}

COHORT_BARE_CODE void death_notice::watch(void* self) noexcept {
  auto& notice = *static_cast<death_notice*>(self);
  COHORT_UNINITIALIZED epoll_event events[16];
  for (;;) {
    const long n = os::raw_syscall(SYS_epoll_pwait, notice.epoll_, reinterpret_cast<long>(events), 16, -1, 0, 0);
    if (n < 0 && n != -EINTR) return;
    if (n <= 0) continue;
    // Bumped before the wake: a wait that sees the new epoch does not sleep.
    notice.epoch_.fetch_add(1, std::memory_order_release);
    os::raw_syscall(SYS_futex, reinterpret_cast<long>(&notice.epoch_), FUTEX_WAKE, INT_MAX);
  }
}

std::size_t peer_watch::descriptors() {
  std::lock_guard lock(mutex_);
  return static_cast<std::size_t>(
      std::count_if(pidfds_.begin(), pidfds_.end(), [](const auto& entry) { return entry.second.get() >= 0; }));
}

}  // namespace cohort::detail

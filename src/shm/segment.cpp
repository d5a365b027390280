// Segments: making them (sealed memfd or O_EXCL named file, reserved in
// full), opening another process's (checked against what the sender said),
// the per-process registry that maps each one once, and the arena.
#include "shm/segment.hpp"
#include "config.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <new>
#include <system_error>
#include <unordered_map>
#include <vector>

namespace cohort::shm {

namespace {

constexpr std::uint64_t magic = 0x746d67737472686fULL;  // "ohrtsgmt"
constexpr std::size_t first_arena = std::size_t{4} << 20;
constexpr std::size_t largest_arena = std::size_t{64} << 20;
constexpr unsigned seals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

std::string errno_text(int error) { return std::system_category().message(error); }

std::uint64_t random_nonce() {
  std::uint64_t n = 0;
  if (::getrandom(&n, sizeof n, 0) != static_cast<ssize_t>(sizeof n)) {
    throw shm_error(fmt::format("cohort: getrandom for a segment name: {}", errno_text(errno)));
  }
  return n;
}

std::size_t dev_shm_free() {
  struct statvfs s {};
  if (::statvfs("/dev/shm", &s) != 0) return 0;
  return static_cast<std::size_t>(s.f_bavail) * s.f_frsize;
}

std::size_t memory_available() {
  std::FILE* f = std::fopen("/proc/meminfo", "re");
  if (f == nullptr) return SIZE_MAX;
  char line[128];
  std::size_t kib = 0;
  bool found = false;
  while (!found && std::fgets(line, sizeof line, f) != nullptr) found = std::sscanf(line, "MemAvailable: %zu kB", &kib) == 1;
  std::fclose(f);
  return found ? kib * 1024 : SIZE_MAX;
}

// Every segment mapped in this process, by nonce; and the ones other
// processes made, kept mapped while they live so that a stream of values
// from one segment maps it once, not once per value.
struct registry {
  std::mutex mutex;
  std::unordered_map<std::uint64_t, std::weak_ptr<segment>> segments;
  std::vector<std::shared_ptr<segment>> received;
  // Moves out the received segments no storage here uses, all of them or
  // only those no block of which is in use anywhere (their memory goes once
  // every process has unmapped them); with the lock held. The caller
  // destroys them after unlocking.
  std::vector<std::shared_ptr<segment>> forget(bool only_dead) {
    std::vector<std::shared_ptr<segment>> gone;
    std::erase_if(received, [&](auto& s) {
      if (s.use_count() != 1 || (only_dead && s->header().live.load(std::memory_order_acquire) != 0)) return false;
      gone.push_back(std::move(s));
      return true;
    });
    return gone;
  }
};
// Set once segments() has made the registry: a process that never mapped a
// segment has nothing to look through at its end, and need not allocate it.
std::atomic<registry*> registry_made{nullptr};

registry& segments() {
  static auto* r = [] {
    auto* made = new registry;  // outlives every static storage that unmaps at exit
    registry_made.store(made, std::memory_order_release);
    return made;
  }();
  return *r;
}

// Whether this process has made its arena: a fork child has a copy to
// drop only then. Release when made, acquire in the child (which forks
// from whichever thread): a child that sees it finds the arena whole.
std::atomic<bool> arena_made{false};

// Lets go of a segment this process made that nothing here uses and that
// only ended processes still hold (killed outright, they never gave their
// holds back), as if it were free; whether it did.
bool let_go_if_dead_weight(const std::shared_ptr<segment>& s) noexcept {
  if (s.use_count() != 1 || !s->held_only_by_ended()) return false;
  s->abandon();
  return true;
}

// This process's arena and the large segments it made that others still hold.
// The lock is taken for each block carved: segments are made, and /proc is
// read, outside it.
struct arena_state {
  spin_mutex mutex;
  std::mutex growth;  // held while a segment is made for the arena
  std::vector<std::shared_ptr<segment>> arenas;
  std::vector<std::shared_ptr<segment>> lingering;
  arena_state() { arena_made.store(true, std::memory_order_release); }
  ~arena_state() {
    for (auto& a : arenas) {
      if (!let_go_if_dead_weight(a)) a->retire();
    }
    for (auto& s : lingering) let_go_if_dead_weight(s);
  }
};
arena_state& arena() {
  static arena_state a;
  return a;
}

std::atomic<pid_t> cached_pid{0};
std::atomic<std::uint64_t> cached_start_time{0};


// A fork child makes its own arena: the parent's goes on being carved by
// the parent, which also holds the descriptors others open.
// The locks are held across the fork, the arena's first (the order
// allocate() takes them in), so the child finds neither a lock no thread
// of its own will release nor a list in the middle of a change. The arena
// is not made for this when the parent has none: every child would pay.
bool arena_held_for_fork = false;
COHORT_FORKED_CHILD_PATH void after_fork_in_child() {
  forget_process_id();
  auto& r = segments();
  for (auto& [nonce, weak] : r.segments) {
    if (auto s = weak.lock()) s->note_mapper();
  }
  r.mutex.unlock();
  if (!arena_held_for_fork) return;
  auto& a = arena();
  std::vector<std::shared_ptr<segment>>().swap(a.arenas);
  std::vector<std::shared_ptr<segment>>().swap(a.lingering);
  a.mutex.unlock();
  a.growth.unlock();
}

[[maybe_unused]] const bool fork_handlers = [] {
  ::pthread_atfork(
      [] {
        arena_held_for_fork = arena_made.load(std::memory_order_acquire);
        if (arena_held_for_fork) {
          arena().growth.lock();
          arena().mutex.lock();
        }
        segments().mutex.lock();
      },
      [] {
        segments().mutex.unlock();
        if (arena_held_for_fork) {
          arena().mutex.unlock();
          arena().growth.unlock();
        }
      },
      after_fork_in_child);
  return true;
}();

}  // namespace

static_assert(sizeof(segment_header) <= segment::single_block, "the header runs into the first block");

std::optional<std::uint64_t> start_time_of(pid_t pid) noexcept {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT || errno == ESRCH ? std::optional<std::uint64_t>(0) : std::nullopt;
  char text[1024];
  const auto n = ::read(fd, text, sizeof text - 1);
  const int error = errno;
  ::close(fd);
  if (n < 0 && error == ESRCH) return 0;  // ended between the open and the read
  if (n <= 0) return std::nullopt;
  text[n] = '\0';
  // Fields counted after the command's closing parenthesis (the command may
  // hold spaces): 3 the state, 20 the number of threads, 22 the start time.
  const char* p = std::strrchr(text, ')');
  if (p == nullptr || p[1] != ' ') return std::nullopt;
  const char state = p[2];
  long threads = -1;
  for (int field = 2; field < 22 && p != nullptr; ++field) {
    p = std::strchr(p + 1, ' ');
    if (field == 19 && p != nullptr) threads = std::strtol(p + 1, nullptr, 10);
  }
  if (p == nullptr) return std::nullopt;
  // A leader that called pthread_exit shows Z while its other threads run.
  if ((state == 'Z' || state == 'X') && threads <= 1) return 0;
  return std::strtoull(p + 1, nullptr, 10);
}

bool has_ended(pid_t pid, std::uint64_t start_time) noexcept {
  const auto now = start_time_of(pid);
  if (start_time == 0) return now == std::optional<std::uint64_t>(0);  // unknown then: by the pid alone
  return now && *now != start_time;
}

std::uint64_t own_start_time() noexcept {
  auto t = cached_start_time.load(std::memory_order_relaxed);
  if (t == 0) {
    t = start_time_of(this_process()).value_or(0);
    cached_start_time.store(t, std::memory_order_relaxed);
  }
  return t;
}

pid_t this_process() noexcept {
  pid_t pid = cached_pid.load(std::memory_order_relaxed);
  if (pid == 0) {
    pid = ::getpid();
    cached_pid.store(pid, std::memory_order_relaxed);
  }
  return pid;
}

COHORT_FORKED_CHILD_PATH void forget_process_id() noexcept {
  cached_pid.store(0, std::memory_order_relaxed);
  cached_start_time.store(0, std::memory_order_relaxed);
}

std::string segment_name(pid_t maker, std::uint64_t nonce) {
  return fmt::format("/cohort_{}_{:016x}", maker, nonce);
}

int sweep_segments_of(std::span<const pid_t> pids) noexcept {
  int swept = 0;
  try {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
      const auto name = e.path().filename().string();
      pid_t maker = 0;
      char rest[17]{};
      if (std::sscanf(name.c_str(), "cohort_%d_%16[0-9a-f]", &maker, rest) != 2 || std::strlen(rest) != 16 ||
          name != segment_name(maker, std::strtoull(rest, nullptr, 16)).substr(1) ||
          std::find(pids.begin(), pids.end(), maker) == pids.end()) {
        continue;
      }
      if (::shm_unlink(("/" + name).c_str()) == 0) ++swept;
    }
  } catch (...) {
  }
  return swept;
}

int size_class_of(std::size_t nbytes) noexcept {
  if (nbytes > largest_class) return size_classes;
  const auto units = std::max<std::size_t>(1, (nbytes + alignment - 1) / alignment);
  return std::bit_width(units - 1);
}

segment::segment(std::byte* base, std::size_t size, sharing_strategy strategy, int fd, pid_t maker, int maker_fd)
    : base_(base), size_(size), strategy_(strategy), fd_(fd), maker_(maker), maker_fd_(maker_fd),
      nonce_(header().nonce) {}

segment::~segment() {
  {
    auto& r = segments();
    std::lock_guard lock(r.mutex);
    auto it = r.segments.find(nonce());
    if (it != r.segments.end() && it->second.expired()) r.segments.erase(it);
  }
  ::munmap(base_, size_);
  if (fd_ >= 0) ::close(fd_);
}

std::shared_ptr<segment> segment::make(std::size_t size, sharing_strategy strategy, bool is_arena) {
  const std::uint64_t nonce = random_nonce();
  const pid_t self = this_process();
  int fd = -1;
  std::string name;
  if (strategy == sharing_strategy::file_descriptor) {
    fd = ::memfd_create("cohort", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) throw shm_error(fmt::format("cohort: memfd_create: {}", errno_text(errno)), size);
  } else {
    name = segment_name(self, nonce);
    fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) throw shm_error(fmt::format("cohort: shm_open {}: {}", name, errno_text(errno)), size);
  }
  auto fail = [&](std::string_view what, int error) {
    ::close(fd);
    if (!name.empty()) ::shm_unlink(name.c_str());
    const auto free = strategy == sharing_strategy::file_system ? dev_shm_free() : 0;
    if (error == ENOSPC || error == ENOMEM) {
      if (strategy == sharing_strategy::file_system) {
        throw shm_error(fmt::format("cohort: no room for {} bytes of shared memory in /dev/shm ({}): {} bytes free",
                                    size, what, free),
                        size, free);
      }
      const auto available = memory_available();
      throw shm_error(fmt::format("cohort: no room for a {}-byte memfd ({}): {} bytes of memory available", size,
                                  what, available),
                      size, available);
    }
    throw shm_error(fmt::format("cohort: {} of a {}-byte segment: {}", what, size, errno_text(error)), size, free);
  };
  // memfds have no size limit of their own: reserving more than the
  // machine has would wake the OOM killer rather than fail.
  if (strategy == sharing_strategy::file_descriptor && size > (std::size_t{64} << 20) && size > memory_available()) {
    fail("more than the memory available", ENOMEM);
  }
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0) fail("ftruncate", errno);
  // Reserved now, so a full /dev/shm is this exception and never a SIGBUS
  // on first touch.
  if (const int e = ::posix_fallocate(fd, 0, static_cast<off_t>(size)); e != 0) fail("posix_fallocate", e);
  if (fd >= 0 && strategy == sharing_strategy::file_descriptor && ::fcntl(fd, F_ADD_SEALS, seals) != 0) {
    fail("sealing", errno);
  }
  void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) fail("mmap", errno);
  if (strategy == sharing_strategy::file_system) {
    ::close(fd);
    fd = -1;
  }
  auto* h = new (base) segment_header{};
  h->magic = magic;
  h->nonce = nonce;
  h->size = size;
  h->live.store(1, std::memory_order_relaxed);
  h->bump = single_block;
  if (!is_arena) {
    auto* b = new (static_cast<std::byte*>(base) + single_block) block_header{};
    b->refs.store(1, std::memory_order_relaxed);
    b->size_class = size_classes;
    b->capacity = size - header_size;
    h->bump = size;
  }
  std::shared_ptr<segment> s(new segment(static_cast<std::byte*>(base), size, strategy, fd, self, fd));
  auto& r = segments();
  std::lock_guard lock(r.mutex);
  r.segments[nonce] = s;
  return s;
}

namespace {

// The segment this thread found last: a stream of values from one sender
// names the same one again and again, and this skips the registry's lock.
// Weak, so it keeps nothing mapped; a fork child's copy names segments it
// maps too. The weak_ptr lives in place in a trivially destructible
// initial-exec thread-local, so reaching it costs no __tls_get_addr call;
// a second thread-local, made with it, ends it as the thread ends.
struct last_found {
  std::uint64_t nonce;
  bool made;
  bool ended;
  alignas(std::weak_ptr<segment>) std::byte weak[sizeof(std::weak_ptr<segment>)];

  std::weak_ptr<segment>& get() noexcept { return *std::launder(reinterpret_cast<std::weak_ptr<segment>*>(weak)); }
};
[[gnu::tls_model("initial-exec")]] thread_local last_found last_seen{};

struct last_found_end {
  ~last_found_end() {
    last_seen.get().~weak_ptr();
    last_seen.made = false;
    last_seen.ended = true;
  }
};

std::shared_ptr<segment> found_last(std::uint64_t nonce) noexcept {
  if (!last_seen.made || last_seen.nonce != nonce) return nullptr;
  return last_seen.get().lock();
}

void remember(std::uint64_t nonce, const std::shared_ptr<segment>& s) noexcept {
  if (!last_seen.made) {
    if (last_seen.ended) return;
    thread_local last_found_end end;
    (void)end;
    new (last_seen.weak) std::weak_ptr<segment>();
    last_seen.made = true;
  }
  last_seen.nonce = nonce;
  last_seen.get() = s;
}

}  // namespace

std::shared_ptr<segment> segment::open(const segment_ref& ref) {
  if (auto s = found_last(ref.nonce)) return s;
  auto& r = segments();
  std::vector<std::shared_ptr<segment>> dead;  // unmapped after the lock is released
  std::lock_guard lock(r.mutex);
  if (auto it = r.segments.find(ref.nonce); it != r.segments.end()) {
    if (auto s = it->second.lock()) {
      remember(ref.nonce, s);
      return s;
    }
  }
  int fd = -1;
  std::string where;
  if (ref.strategy == sharing_strategy::file_descriptor) {
    // Through the sender, or else through the maker (the sender passed on
    // what it received and is gone).
    where = fmt::format("/proc/{}/fd/{}", ref.source, ref.fd);
    fd = ::open(where.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0 && (errno == ENOENT || errno == ESRCH) && ref.maker != ref.source) {
      where = fmt::format("/proc/{}/fd/{}", ref.maker, ref.maker_fd);
      fd = ::open(where.c_str(), O_RDWR | O_CLOEXEC);
    }
    if (fd < 0 && (errno == ENOENT || errno == ESRCH)) {
      throw shm_error(fmt::format("cohort: the processes holding a segment (pid {}{}) have exited or let it go",
                                  ref.source, ref.maker != ref.source ? fmt::format(", its maker pid {}", ref.maker) : ""));
    }
  } else {
    where = "/dev/shm" + segment_name(ref.maker, ref.nonce);
    fd = ::shm_open(segment_name(ref.maker, ref.nonce).c_str(), O_RDWR | O_CLOEXEC, 0);
  }
  if (fd < 0) throw shm_error(fmt::format("cohort: opening segment {}: {}", where, errno_text(errno)));
  // Whether it is the segment named is told by its header, once mapped; a
  // memfd must be sealed, so that nobody can shrink it under the mapping
  // (F_GET_SEALS fails, -1, on a file that cannot be sealed at all).
  struct stat st {};
  const auto sealed = [fd] {
    const int got = ::fcntl(fd, F_GET_SEALS);
    return got >= 0 && (got & static_cast<int>(seals)) == static_cast<int>(seals);
  };
  const bool fits = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == ::geteuid() &&
                    static_cast<std::uint64_t>(st.st_size) >= header_size &&
                    static_cast<std::uint64_t>(st.st_size) <= (std::uint64_t{1} << 47) &&
                    (ref.strategy == sharing_strategy::file_system || sealed());
  if (!fits) {
    ::close(fd);
    throw shm_error(fmt::format("cohort: {} is not the segment the handle names", where));
  }
  const auto size = static_cast<std::size_t>(st.st_size);
  void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int error = errno;
  // A memfd's descriptor is kept, so this process can pass the segment on.
  if (base == MAP_FAILED || ref.strategy == sharing_strategy::file_system) {
    ::close(fd);
    fd = -1;
  }
  if (base == MAP_FAILED) throw shm_error(fmt::format("cohort: mapping {}: {}", where, errno_text(error)));
  const auto* h = static_cast<const segment_header*>(base);
  if (h->magic != magic || h->nonce != ref.nonce || h->size != size) {
    ::munmap(base, size);
    if (fd >= 0) ::close(fd);
    throw shm_error(fmt::format("cohort: {} does not hold the segment the handle names", where));
  }
  std::shared_ptr<segment> s(
      new segment(static_cast<std::byte*>(base), size, ref.strategy, fd, ref.maker, ref.maker_fd));
  r.segments[ref.nonce] = s;
  remember(ref.nonce, s);
  s->note_mapper();
  dead = r.forget(true);
  r.received.push_back(s);
  return s;
}

segment_ref segment::ref() const noexcept {
  const bool through_here = strategy_ == sharing_strategy::file_descriptor && fd_ >= 0;
  return {strategy_, through_here ? this_process() : maker_, through_here ? fd_ : maker_fd_, maker_, maker_fd_,
          nonce_};
}

bool segment::made_here() const noexcept { return maker_ == this_process(); }

std::uint64_t segment::carve(std::size_t nbytes) {
  const int k = size_class_of(nbytes);
  const std::size_t capacity = alignment << k;
  auto& h = header();
  std::lock_guard lock(mutex_);
  if (retired_) return 0;
  std::uint64_t offset = h.free_lists[k];
  if (offset == 0) {
    reclaim_locked();
    offset = h.free_lists[k];
  }
  if (offset != 0) {
    h.free_lists[k] = block(offset).next_free;
  } else if (h.bump + sizeof(block_header) + capacity <= size_) {
    offset = h.bump;
    h.bump += sizeof(block_header) + capacity;
  } else {
    return 0;
  }
  auto* b = new (base_ + offset) block_header{};
  b->size_class = static_cast<std::uint32_t>(k);
  b->capacity = capacity;
  b->refs.store(1, std::memory_order_relaxed);
  h.live.fetch_add(1, std::memory_order_relaxed);
  return offset;
}

void segment::release(std::uint64_t offset) noexcept {
  auto& b = block(offset);
  if (b.refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  if (b.size_class >= size_classes) {
    drop_live(1);
    return;
  }
  auto& h = header();
  if (made_here()) {
    std::unique_lock lock(mutex_);
    if (!retired_) {
      b.next_free = h.free_lists[b.size_class];
      h.free_lists[b.size_class] = offset;
      lock.unlock();
      drop_live(1);  // the arena's own hold keeps it above zero
      return;
    }
  } else {
    // Onto the maker's stack; its `live` goes when the maker takes it.
    auto head = h.remote_free.load(std::memory_order_acquire);
    while (head != segment_header::retired) {
      b.next_free = head;
      if (h.remote_free.compare_exchange_weak(head, offset, std::memory_order_release, std::memory_order_acquire)) return;
    }
  }
  drop_live(1);
}

void segment::reclaim() noexcept {
  std::lock_guard lock(mutex_);
  if (!retired_) reclaim_locked();
}

void segment::reclaim_locked() noexcept {
  auto& h = header();
  std::uint64_t offset = h.remote_free.exchange(0, std::memory_order_acquire);
  std::uint64_t count = 0;
  while (offset != 0) {
    auto& b = block(offset);
    const auto next = b.next_free;
    b.next_free = h.free_lists[b.size_class];
    h.free_lists[b.size_class] = offset;
    offset = next;
    ++count;
  }
  if (count > 0) drop_live(count);  // the arena's own hold keeps it above zero
}

bool segment::holds(std::uint64_t offset, std::uint64_t nbytes) const noexcept {
  return offset >= single_block && offset % alignment == 0 && offset <= size_ - sizeof(block_header) &&
         nbytes <= size_ - sizeof(block_header) - offset;
}

void segment::retire() noexcept {
  std::uint64_t waiting = 0;
  {
    std::lock_guard lock(mutex_);
    if (retired_) return;
    retired_ = true;
    // Blocks freed elsewhere until now are counted here; later frees find
    // the mark and count themselves.
    for (auto offset = header().remote_free.exchange(segment_header::retired, std::memory_order_acq_rel); offset != 0;
         offset = block(offset).next_free) {
      ++waiting;
    }
  }
  drop_live(waiting + 1);
}

void segment::note_mapper() noexcept {
  auto& h = header();
  const pid_t self = this_process();
  const auto start = own_start_time();
  if (start == 0) {
    h.unrecorded.store(1, std::memory_order_release);
    return;
  }
  const auto used = std::min(h.mapper_count.load(std::memory_order_acquire), segment_header::max_mappers);
  for (std::uint32_t i = 0; i < used; ++i) {
    if (h.mappers[i].pid.load(std::memory_order_acquire) == self && h.mappers[i].start_time == start) return;
  }
  if (const auto i = h.mapper_count.fetch_add(1, std::memory_order_acq_rel); i < segment_header::max_mappers) {
    h.mappers[i].start_time = start;
    h.mappers[i].pid.store(self, std::memory_order_release);
    return;
  }
  // All used: the slot of one that has ended, emptied (0: being filled in,
  // so alive to a reader) before its start time changes.
  for (auto& m : h.mappers) {
    pid_t pid = m.pid.load(std::memory_order_acquire);
    if (pid != 0 && pid != self && has_ended(pid, m.start_time) &&
        m.pid.compare_exchange_strong(pid, 0, std::memory_order_acq_rel)) {
      m.start_time = start;
      m.pid.store(self, std::memory_order_release);
      return;
    }
  }
  h.unrecorded.store(1, std::memory_order_release);
}

bool segment::held_only_by_ended() const noexcept {
  if (messages_in_flight()) return false;
  const auto& h = header();
  if (h.unrecorded.load(std::memory_order_acquire) != 0) return false;
  const auto used = std::min(h.mapper_count.load(std::memory_order_acquire), segment_header::max_mappers);
  const pid_t self = this_process();
  for (std::uint32_t i = 0; i < used; ++i) {
    const pid_t pid = h.mappers[i].pid.load(std::memory_order_acquire);
    if (pid == 0) return false;  // being recorded: alive
    if (pid != self && !has_ended(pid, h.mappers[i].start_time)) return false;
  }
  return true;
}

void segment::abandon() noexcept {
  retire();
  if (strategy_ == sharing_strategy::file_system && header().live.load(std::memory_order_acquire) > 0) {
    ::shm_unlink(segment_name(maker_, header().nonce).c_str());
  }
}

void segment::drop_live(std::uint64_t count) noexcept {
  if (header().live.fetch_sub(count, std::memory_order_acq_rel) == count &&
      strategy_ == sharing_strategy::file_system) {
    ::shm_unlink(segment_name(maker_, header().nonce).c_str());
  }
}

std::pair<std::shared_ptr<segment>, std::uint64_t> allocate(std::size_t nbytes) {
  const auto strategy = get_sharing_strategy();
  auto& a = arena();
  if (size_class_of(nbytes) == size_classes) {
    std::vector<std::shared_ptr<segment>> freed;  // unmapped after the lock is released
    {
      std::lock_guard lock(a.mutex);
      std::erase_if(a.lingering, [&](auto& s) {
        if (s->header().live.load(std::memory_order_acquire) != 0) return false;
        freed.push_back(std::move(s));
        return true;
      });
    }
    const std::size_t size = header_size + (nbytes + 4095) / 4096 * 4096;
    return {segment::make(size, strategy, false), segment::single_block};
  }
  // Carves from the newest segment that has room; else sets `size` to
  // what the next one should have.
  std::size_t size = first_arena;
  const auto carve = [&]() -> std::pair<std::shared_ptr<segment>, std::uint64_t> {
    std::lock_guard lock(a.mutex);
    for (auto it = a.arenas.rbegin(); it != a.arenas.rend(); ++it) {
      if ((*it)->strategy() != strategy) continue;
      if (const auto offset = (*it)->carve(nbytes)) return {*it, offset};
    }
    for (const auto& s : a.arenas) {
      if (s->strategy() == strategy) size = std::min(largest_arena, s->size() * 2);
    }
    return {nullptr, 0};
  };
  if (auto found = carve(); found.first) return found;
  // One thread grows the arena at a time, and a thread that waited for it
  // carves from what the other made rather than making one of its own.
  std::lock_guard growing(a.growth);
  if (auto found = carve(); found.first) return found;
  auto s = segment::make(size, strategy, true);
  const auto offset = s->carve(nbytes);
  std::lock_guard lock(a.mutex);
  a.arenas.push_back(s);
  return {std::move(s), offset};
}

void linger(std::shared_ptr<segment> s) {
  auto& a = arena();
  std::lock_guard lock(a.mutex);
  a.lingering.push_back(std::move(s));
}

COHORT_FORKED_CHILD_PATH void wait_for_receivers(std::chrono::steady_clock::duration limit) noexcept {
  auto* known = registry_made.load(std::memory_order_acquire);
  if (known == nullptr) return;  // no segment was ever mapped here
  std::vector<std::shared_ptr<segment>> made;
  {
    auto& r = *known;
    std::lock_guard lock(r.mutex);
    for (auto& [nonce, weak] : r.segments) {
      if (auto s = weak.lock(); s && s->made_here()) made.push_back(std::move(s));
    }
  }
  if (made.empty()) return;  // the common case, with no clock to read
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (const auto& s : made) {
    while (s->messages_in_flight() && std::chrono::steady_clock::now() < deadline) {
      ::usleep(1000);
    }
  }
}

int trim() {
  std::vector<std::shared_ptr<segment>> unused;
  {
    auto& r = segments();
    std::lock_guard lock(r.mutex);
    unused = r.forget(false);
  }
  // Taken out of the arena while they are looked at (which reads /proc),
  // and the ones kept put back; an allocation meanwhile makes a segment.
  auto& a = arena();
  std::vector<std::shared_ptr<segment>> arenas, lingering;
  {
    std::lock_guard lock(a.mutex);
    arenas.swap(a.arenas);
    lingering.swap(a.lingering);
  }
  const auto before = arenas.size() + lingering.size();
  std::erase_if(lingering, [](const auto& s) {
    return s->header().live.load(std::memory_order_acquire) == 0 || let_go_if_dead_weight(s);
  });
  // Out of the arena, nothing here carves them: a count of one (the
  // arena's own hold) cannot grow meanwhile.
  std::erase_if(arenas, [](const auto& s) {
    s->reclaim();
    if (s->header().live.load(std::memory_order_acquire) != 1) return let_go_if_dead_weight(s);
    s->retire();
    return true;
  });
  const auto kept = arenas.size() + lingering.size();
  {
    std::lock_guard lock(a.mutex);
    a.arenas.insert(a.arenas.begin(), arenas.begin(), arenas.end());
    a.lingering.insert(a.lingering.end(), lingering.begin(), lingering.end());
  }
  return static_cast<int>(unused.size() + before - kept);
}

}  // namespace cohort::shm

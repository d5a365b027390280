// Segments: making them (sealed memfd or O_EXCL named file, reserved in
// full), opening another process's (checked against what the sender said),
// and the block bookkeeping in their headers.
#include "shm/segment.hpp"

#include "os/descriptor_limit.hpp"
#include "os/process_identity.hpp"
#include "shm/keeper.hpp"
#include "shm/registry.hpp"
#include "shm/segment_name.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cerrno>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <new>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace cohort::shm {

namespace {

constexpr unsigned seals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

std::string errno_text(int error) { return std::system_category().message(error) + os::descriptor_limit_note(error); }

// Runs `open` (a descriptor, or -1 with errno set); where it ran out of
// descriptors, has `shed` give up those a cache holds (how many it closed)
// and runs it once more. errno is the failure's own when it still fails.
template <class Open, class Shed>
int with_descriptor_room(const Open& open, const Shed& shed) {
  const int fd = open();
  const int error = errno;
  if (fd >= 0 || !os::out_of_descriptors(error)) return fd;
  if (shed() > 0) return open();
  errno = error;
  return -1;
}

// What an mmap's ENOMEM means: no room in this process's address space.
const char* address_space_note(int error) noexcept {
  return error == ENOMEM ? " (no room in this process's address space: its RLIMIT_AS, or vm.max_map_count mappings)"
                         : "";
}

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

// Records in `h` the run markers in this process's environment. Read as
// each segment is made, not once per process: a forked rank is given its
// environment, its run's marker with it, after the fork, and making a
// segment costs several system calls anyway.
void record_run_markers(segment_header& h) noexcept {
  std::size_t n = 0;
  for (char** e = environ; e != nullptr && *e != nullptr && n < max_run_markers; ++e) {
    const std::string_view entry(*e);
    if (entry.starts_with(run_marker_start)) h.run_markers[n++] = run_marker_hash(entry);
  }
}

// Whether an unnamed file in /dev/shm could not be linked under its name
// here: file_system segments are then named from the start.
std::atomic<bool> unnamed_refused{false};

// Links the unnamed file `fd` (O_TMPFILE) under `name` in /dev/shm: by
// its /proc/self/fd entry, or where /proc is not mounted by the
// descriptor itself (AT_EMPTY_PATH, which takes CAP_DAC_READ_SEARCH).
// False with errno set, EEXIST where the name is taken.
bool link_under(int fd, const std::string& name) noexcept {
  char own[40];
  std::snprintf(own, sizeof own, "/proc/self/fd/%d", fd);
  char path[96];
  std::snprintf(path, sizeof path, "/dev/shm%s", name.c_str());
  if (::linkat(AT_FDCWD, own, AT_FDCWD, path, AT_SYMLINK_FOLLOW) == 0) return true;
  if (errno != ENOENT) return false;
  return ::linkat(fd, "", AT_FDCWD, path, AT_EMPTY_PATH) == 0;
}

// The segment at `base` mapped again through its file opened by `name`,
// and the first mapping dropped: one made through the unnamed file shows
// in /proc/<pid>/maps as "/dev/shm/#<inode> (deleted)" even once the file
// is linked, this one by its name, as a receiver's does. The same pages
// either way: where the file cannot be opened or mapped again, `base`.
void* remap_by_name(void* base, std::size_t size, const std::string& name) noexcept {
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return base;
  void* named = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (named == MAP_FAILED) return base;
  ::munmap(base, size);
  return named;
}

}  // namespace

static_assert(sizeof(segment_header) <= segment::single_block, "the header runs into the first block");

segment::segment(std::byte* base, std::size_t size, sharing_strategy strategy, int fd, pid_t maker, int maker_fd,
                 pid_t keeper)
    : base_(base), size_(size), strategy_(strategy), fd_(fd), maker_(maker), maker_fd_(maker_fd), keeper_(keeper),
      nonce_(header().nonce) {}

segment::~segment() {
  {
    auto& r = segments();
    std::lock_guard lock(r.mutex);
    auto it = r.segments.find(nonce());
    if (it != r.segments.end() && it->second.expired()) r.segments.erase(it);
  }
  const bool unlink = orphaned();
  ::munmap(base_, size_);
  if (const int fd = fd_.load(std::memory_order_relaxed); fd >= 0) ::close(fd);
  if (unlink) unlink_name();
}

std::shared_ptr<segment> segment::make(std::size_t size, sharing_strategy strategy, bool is_arena) {
  const std::uint64_t nonce = random_nonce();
  const pid_t self = os::this_process();
  int fd = -1;
  std::string name;
  bool unnamed = false;  // a file_system segment's file, until it is linked under `name`
  if (strategy == sharing_strategy::file_descriptor) {
    // Named by its nonce, so that a keeper's descriptor of it can be found.
    const auto memfd_name = memfd_name_of(nonce);
    fd = with_descriptor_room(
        [&memfd_name] { return ::memfd_create(memfd_name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING); },
        shed_descriptors);
    if (fd < 0) throw shm_error(fmt::format("cohort: memfd_create: {}", errno_text(errno)), size);
  } else {
    name = segment_name(self, nonce);
    // Unnamed until its header is stamped, then linked under its name: a
    // process killed while it makes one (posix_fallocate of megabytes
    // takes a while) leaves no file without a stamp saying whose it is. Named
    // from the start where /dev/shm makes no unnamed files, or where one
    // could not be linked.
    int unnamed_error = 0;
    if (!unnamed_refused.load(std::memory_order_relaxed)) {
      fd = with_descriptor_room([] { return ::open("/dev/shm", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600); },
                                shed_descriptors);
      if (fd < 0) unnamed_error = errno;
    }
    unnamed = fd >= 0;
    if (unnamed_error == EMFILE || unnamed_error == ENFILE) {
      throw shm_error(fmt::format("cohort: open /dev/shm: {}", errno_text(unnamed_error)), size);
    }
    if (!unnamed) {
      fd = with_descriptor_room(
          [&name] { return ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600); },
          shed_descriptors);
    }
    if (fd < 0) throw shm_error(fmt::format("cohort: shm_open {}: {}", name, errno_text(errno)), size);
  }
  auto fail = [&](std::string_view what, int error) {
    ::close(fd);
    if (!name.empty() && !unnamed) ::shm_unlink(name.c_str());
    const auto free = strategy == sharing_strategy::file_system ? dev_shm_free() : 0;
    // ENOMEM from mmap is this process's address space (RLIMIT_AS) or its
    // count of mappings, not the room the memory was reserved in.
    const bool mapping = what == "mmap";
    if (error == ENOSPC || (error == ENOMEM && !mapping)) {
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
    throw shm_error(fmt::format("cohort: {} of a {}-byte segment: {}{}{}", what, size, errno_text(error),
                                mapping ? address_space_note(error) : "", os::file_size_limit_note(error)),
                    size, free);
  };
  // memfds have no size limit of their own: reserving more than the
  // machine has would wake the OOM killer rather than fail.
  if (strategy == sharing_strategy::file_descriptor && size > (std::size_t{64} << 20) && size > memory_available()) {
    fail("more than the memory available", ENOMEM);
  }
  // A file longer than RLIMIT_FSIZE is SIGXFSZ, whose default action ends
  // the process: refused here instead, as the limit stands now.
  if (rlimit limit{};
      ::getrlimit(RLIMIT_FSIZE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY && size > limit.rlim_cur) {
    fail("ftruncate", EFBIG);
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
  auto* h = new (base) segment_header{};
  // The run markers before the magic: a file a sweep takes for a segment
  // holds them already.
  record_run_markers(*h);
  std::atomic_signal_fence(std::memory_order_release);  // kept in this order by the compiler too
  h->magic = segment_magic;
  h->nonce = nonce;
  h->maker_pid_namespace = os::pid_namespace();
  h->maker_start_time = os::own_start_time();
  h->size = size;
  h->live.store(1, std::memory_order_relaxed);
  h->bump = single_block;
  if (!is_arena) {
    auto* b = new (static_cast<std::byte*>(base) + single_block) block_header{};
    b->refs.store(1, std::memory_order_relaxed);
    b->size_class = size_classes;
    b->capacity = size - header_size;
    b->stamp = block_stamp(nonce, single_block);
    h->bump = size;
  }
  if (unnamed && !link_under(fd, name)) {
    const int error = errno;
    ::munmap(base, size);
    if (error == EEXIST) fail("linkat", error);
    // No way to link it here (a /proc of another pid namespace, and no
    // CAP_DAC_READ_SEARCH): from now on named from the start.
    ::close(fd);
    unnamed_refused.store(true, std::memory_order_relaxed);
    return make(size, strategy, is_arena);
  }
  if (unnamed) base = remap_by_name(base, size, name);
  if (strategy == sharing_strategy::file_system) {
    ::close(fd);
    fd = -1;
  }
  std::shared_ptr<segment> s(new segment(static_cast<std::byte*>(base), size, strategy, fd, self, fd, 0));
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
  const auto known = [&r, &ref]() -> std::shared_ptr<segment> {
    auto it = r.segments.find(ref.nonce);
    auto s = it != r.segments.end() ? it->second.lock() : nullptr;
    if (s) remember(ref.nonce, s);
    return s;
  };
  if (auto s = known()) return s;
  int fd = -1;
  std::string where;
  // The lock is held: the registry sheds directly, and what it lets go of
  // is unmapped once the lock is released.
  const auto shed = [&] { return r.shed(dead); };
  // What this process, as a keeper, has taken of what its ranks handed
  // over, or takes now. What a hand-over waiting for room names comes once
  // room is made, or once it has waited room_patience, taken as far as
  // room goes.
  const auto taken_here = [&]() -> std::shared_ptr<segment> {
    const auto until = std::chrono::steady_clock::now() + room_patience + std::chrono::milliseconds(100);
    for (;;) {
      take_handed_over_locked(dead);
      if (auto s = known()) return s;
      if (!waiting_for_room_locked() || std::chrono::steady_clock::now() >= until) return nullptr;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  };
  pid_t kept_by = ref.keeper;  // whose descriptor through_keeper opened
  // Through the keeper `ref` names, to which `source` handed it over as it
  // ended: the keeper's descriptor that links to `link` (fd set), or, when
  // this process is the keeper, what it has taken (returned).
  const auto through_keeper = [&](const std::string& link, pid_t source) -> std::shared_ptr<segment> {
    if (ref.keeper == os::this_process()) {
      if (auto s = taken_here()) return s;
      if (auto why = why_not_kept(source, ref.nonce); !why.empty()) {
        throw shm_error(fmt::format("cohort: opening segment {}: {}", where, why));
      }
      errno = ENOENT;
      return nullptr;
    }
    fd = with_descriptor_room([&] { return open_kept(ref.keeper, source, link); }, shed);
    if (fd >= 0 || errno != ESRCH) return nullptr;
    // The keeper has ended too (a rank that started ranks of its own), and
    // handed what it kept to its own keeper as it ended: this process, or
    // the one this process hands over to, which started both (a sibling's).
    if (auto s = taken_here()) return s;
    const pid_t further = own_keeper();
    if (further == 0 || further == ref.keeper) {
      errno = ESRCH;
      return nullptr;
    }
    kept_by = further;
    fd = with_descriptor_room([&] { return open_kept(further, ref.keeper, link); }, shed);
    return nullptr;
  };
  if (ref.strategy == sharing_strategy::file_descriptor) {
    // Through the sender, or else through the maker (the sender passed on
    // what it received and is gone), or else through the sender's keeper
    // (the sender handed it over as it ended).
    // Only a descriptor that links to the segment's memfd is opened: one a
    // bad handle names (a FIFO, a device, a file of another program) is
    // never opened, which for some has effects of its own; a number since
    // taken by another file is passed over as gone. What the link names
    // is told again, once mapped, by the header.
    const std::string memfd_link = fmt::format("/memfd:{} (deleted)", memfd_name_of(ref.nonce));
    const auto by_path = [&where, &memfd_link] {
      char link[128];
      const ssize_t length = ::readlink(where.c_str(), link, sizeof link);
      if (length < 0) return -1;  // as the open would fail: ENOENT, ESRCH, EACCES
      if (std::string_view(link, static_cast<std::size_t>(length)) != memfd_link) {
        errno = ENOENT;
        return -1;
      }
      return ::open(where.c_str(), O_RDWR | O_CLOEXEC | O_NOCTTY);
    };
    where = fmt::format("/proc/{}/fd/{}", ref.source, ref.fd);
    fd = with_descriptor_room(by_path, shed);
    if (fd < 0 && (errno == ENOENT || errno == ESRCH) && ref.maker != ref.source) {
      where = fmt::format("/proc/{}/fd/{}", ref.maker, ref.maker_fd);
      fd = with_descriptor_room(by_path, shed);
    }
    if (fd < 0 && (errno == ENOENT || errno == ESRCH) && ref.keeper > 0) {
      where = fmt::format("/proc/{}/fd (kept for pid {})", ref.keeper, ref.source);
      if (auto s = through_keeper(memfd_link, ref.source)) return s;
    }
    if (fd < 0 && (errno == ENOENT || errno == ESRCH)) {
      throw segment_gone(
          fmt::format("cohort: the processes holding a segment (pid {}{}) have exited or let it go", ref.source,
                      ref.maker != ref.source ? fmt::format(", its maker pid {}", ref.maker) : ""),
          ref.source);
    }
  } else {
    where = "/dev/shm" + segment_name(ref.maker, ref.nonce);
    fd = with_descriptor_room(
        [&ref] { return ::shm_open(segment_name(ref.maker, ref.nonce).c_str(), O_RDWR | O_CLOEXEC, 0); }, shed);
    // Swept with its maker's other files once the maker ended, and kept
    // open by the maker's keeper while values name it.
    if (fd < 0 && errno == ENOENT && ref.keeper > 0) {
      if (auto s = through_keeper(where + " (deleted)", ref.maker)) return s;
      if (fd >= 0) where = fmt::format("{} (kept by pid {})", where, kept_by);
    }
    if (fd < 0 && (errno == ENOENT || errno == ESRCH) && os::has_ended(ref.maker, 0)) {
      throw segment_gone(fmt::format("cohort: {} went with its maker, pid {}, which has exited", where, ref.maker),
                         ref.maker);
    }
  }
  if (fd < 0) throw shm_error(fmt::format("cohort: opening segment {}: {}", where, errno_text(errno)));
  auto s = map_checked(fd, where, ref, ref.strategy == sharing_strategy::file_descriptor);
  remember(ref.nonce, s);
  s->note_mapper();
  // What the open before left goes now (unmapped after the lock is
  // released); what this one finds no longer needed waits for the next
  // wait or open: its memory's release is not this receive's to pay.
  r.take_deferred(dead);
  r.defer(r.forget_dead());
  r.received.push_back(s);
  return s;
}

std::shared_ptr<segment> segment::map_checked(int fd, const std::string& where, const segment_ref& ref,
                                              bool keep_descriptor) {
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
  if (base == MAP_FAILED || !keep_descriptor) {
    ::close(fd);
    fd = -1;
  }
  if (base == MAP_FAILED) {
    throw shm_error(fmt::format("cohort: mapping {}: {}{}", where, errno_text(error), address_space_note(error)));
  }
  const auto* h = static_cast<const segment_header*>(base);
  // A nonce of 0 in `ref`: any segment's (one handed over, which names none).
  if (h->magic != segment_magic || (ref.nonce != 0 && h->nonce != ref.nonce) || h->size != size) {
    ::munmap(base, size);
    if (fd >= 0) ::close(fd);
    throw shm_error(fmt::format("cohort: {} does not hold the segment the handle names", where));
  }
  std::shared_ptr<segment> s(
      new segment(static_cast<std::byte*>(base), size, ref.strategy, fd, ref.maker, ref.maker_fd, ref.keeper));
  segments().segments[s->nonce()] = s;
  return s;
}

std::shared_ptr<segment> segment::keep(int fd, pid_t sender, std::uint64_t nonce) {
  auto& r = segments();
  note_named_by_values(r);  // values of the ended sender now need this process
  if (nonce != 0) {
    if (auto it = r.segments.find(nonce); it != r.segments.end()) {
      if (auto s = it->second.lock()) {
        if (s->made_here()) {  // this process's own: it holds it already
          ::close(fd);
          return s;
        }
        int none = -1;
        if (!s->fd_.compare_exchange_strong(none, fd, std::memory_order_relaxed)) ::close(fd);
        s->kept_.store(true, std::memory_order_relaxed);
        return s;
      }
    }
  }
  segment_ref ref;
  // Only memfds are sealed (a named file cannot be).
  const int got = ::fcntl(fd, F_GET_SEALS);
  const bool sealed = got >= 0 && (got & static_cast<int>(seals)) == static_cast<int>(seals);
  ref.strategy = sealed ? sharing_strategy::file_descriptor : sharing_strategy::file_system;
  ref.source = ref.maker = sender;
  ref.keeper = os::this_process();  // what a value passed on from here names, of a named segment
  ref.nonce = nonce;
  auto s = map_checked(fd, fmt::format("a segment handed over by pid {}", sender), ref, true);
  s->kept_.store(true, std::memory_order_relaxed);
  s->note_mapper();
  return s;
}

std::uint64_t segment::nonce_in(int fd) noexcept {
  segment_stamp stamp;
  if (::pread(fd, &stamp, sizeof stamp, 0) != static_cast<ssize_t>(sizeof stamp)) return 0;
  return stamp.magic == segment_magic ? stamp.nonce : 0;
}

segment_ref segment::ref() const noexcept {
  // Relaxed: a descriptor given up meanwhile is closed after the exchange,
  // and a receiver checks what it opens through a number since reused.
  const int fd = fd_.load(std::memory_order_relaxed);
  const bool through_here = strategy_ == sharing_strategy::file_descriptor && fd >= 0;
  // A named segment made here goes to this process's keeper as it ends,
  // as a memfd it holds does: once the group has swept the name, a
  // receiver finds it there.
  return {strategy_, through_here ? os::this_process() : maker_, through_here ? fd : maker_fd_, maker_, maker_fd_,
          through_here || made_here() ? own_keeper() : keeper_, nonce_};
}

segment_ref segment::pass_on() noexcept {
  const auto r = ref();
  if (r.fd >= 0 && r.source == os::this_process() && !passed_on_.load(std::memory_order_relaxed)) {
    passed_on_.store(true, std::memory_order_relaxed);
  }
  return r;
}

bool segment::give_up_descriptor() noexcept {
  if (made_here() || kept_.load(std::memory_order_relaxed)) return false;
  const int fd = fd_.exchange(-1, std::memory_order_relaxed);
  if (fd < 0) return false;
  ::close(fd);
  return true;
}

bool segment::made_here() const noexcept { return maker_ == os::this_process(); }

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
    --free_blocks_;  // counted in `live` all along
  } else if (h.bump + sizeof(block_header) + capacity <= size_) {
    offset = h.bump;
    h.bump += sizeof(block_header) + capacity;
    h.live.fetch_add(1, std::memory_order_relaxed);
  } else {
    return 0;
  }
  auto* b = new (base_ + offset) block_header{};
  b->size_class = static_cast<std::uint32_t>(k);
  b->capacity = capacity;
  b->stamp = block_stamp(nonce_, offset);
  b->refs.store(1, std::memory_order_relaxed);
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
    std::lock_guard lock(mutex_);
    if (!retired_) {
      b.next_free = h.free_lists[b.size_class];
      h.free_lists[b.size_class] = offset;
      ++free_blocks_;  // still in `live`, until retire()
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

bool segment::unused() noexcept {
  std::lock_guard lock(mutex_);
  if (retired_) return false;
  reclaim_locked();
  return header().live.load(std::memory_order_acquire) == free_blocks_ + 1;
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
  free_blocks_ += count;  // still in `live`, until retire()
}

bool segment::holds(std::uint64_t offset, std::uint64_t nbytes) const noexcept {
  return offset >= single_block && offset % alignment == 0 && offset <= size_ - sizeof(block_header) &&
         nbytes <= size_ - sizeof(block_header) - offset && block(offset).stamp == block_stamp(nonce_, offset) &&
         block(offset).capacity >= nbytes;
}

void segment::retire() noexcept {
  std::uint64_t freed = 0;
  {
    std::lock_guard lock(mutex_);
    if (retired_) return;
    retired_ = true;
    // The blocks on the free lists leave `live` now: frees from here on
    // count themselves.
    freed = std::exchange(free_blocks_, 0);
    // Blocks freed elsewhere until now are counted here; later frees find
    // the mark and count themselves.
    for (auto offset = header().remote_free.exchange(segment_header::retired, std::memory_order_acq_rel); offset != 0;
         offset = block(offset).next_free) {
      ++freed;
    }
  }
  drop_live(freed + 1);
}

void segment::note_mapper() noexcept {
  auto& h = header();
  const pid_t self = os::this_process();
  const auto start = os::own_start_time();
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
    if (pid != 0 && pid != self && os::has_ended(pid, m.start_time) &&
        m.pid.compare_exchange_strong(pid, 0, std::memory_order_acq_rel)) {
      m.start_time = start;
      m.pid.store(self, std::memory_order_release);
      return;
    }
  }
  h.unrecorded.store(1, std::memory_order_release);
}

namespace {

// Whether every process recorded as mapping the segment `h` heads has
// ended, `except` aside (counted as ended).
bool mappers_ended(const segment_header& h, pid_t except) noexcept {
  if (h.unrecorded.load(std::memory_order_acquire) != 0) return false;
  const auto used = std::min(h.mapper_count.load(std::memory_order_acquire), segment_header::max_mappers);
  for (std::uint32_t i = 0; i < used; ++i) {
    const pid_t pid = h.mappers[i].pid.load(std::memory_order_acquire);
    if (pid == 0) return false;  // being recorded: alive
    if (pid != except && !os::has_ended(pid, h.mappers[i].start_time)) return false;
  }
  return true;
}

// Whether this process maps the segment `nonce` names.
bool mapped_here(std::uint64_t nonce) {
  auto& r = segments();
  std::lock_guard lock(r.mutex);
  const auto it = r.segments.find(nonce);
  return it != r.segments.end() && !it->second.expired();
}

// Whether the named segment `name` is one of the run `run_marker` (a
// run_marker_hash) that nothing can reach any more: its header records
// the marker, says its maker, of this process's pid namespace, has ended
// (a pid in the name of another namespace's segment means nothing here),
// no message naming it is in flight and every other process that mapped it
// has ended; and this process does not map it (now).
bool unreachable_of_run(const std::string& name, pid_t maker, std::uint64_t nonce, std::uint64_t run_marker) {
  const int fd = ::shm_open(name.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0);
  if (fd < 0) return false;
  struct stat st {};
  void* base = MAP_FAILED;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == ::geteuid() &&
      static_cast<std::uint64_t>(st.st_size) >= header_size) {
    base = ::mmap(nullptr, header_size, PROT_READ, MAP_SHARED, fd, 0);
  }
  ::close(fd);
  if (base == MAP_FAILED) return false;
  const auto& h = *static_cast<const segment_header*>(base);
  const auto received = h.received.load(std::memory_order_acquire);  // first, as messages_in_flight reads
  const bool gone = h.magic == segment_magic && h.nonce == nonce && holds_run_marker(h.run_markers, run_marker) &&
                    h.maker_pid_namespace != 0 && h.maker_pid_namespace == os::pid_namespace() &&
                    os::has_ended(maker, h.maker_start_time) &&
                    h.sent.load(std::memory_order_acquire) == received && mappers_ended(h, os::this_process()) &&
                    !mapped_here(nonce);
  ::munmap(base, header_size);
  return gone;
}

}  // namespace

bool segment::others_ended() const noexcept { return mappers_ended(header(), os::this_process()); }

void segment::unlink_name() const noexcept {
  if (strategy_ == sharing_strategy::file_system) ::shm_unlink(segment_name(maker_, nonce_).c_str());
}

int sweep_segments_of_run(std::span<const pid_t> ranks, std::span<const pid_t> unreaped, std::string_view run_marker,
                          const std::function<bool(pid_t)>& made_by_run) noexcept {
  int swept = 0;
  const std::uint64_t marker = run_marker_hash(run_marker);
  try {
    for_each_named_segment([&](pid_t maker, std::uint64_t nonce) {
      const auto name = segment_name(maker, nonce);
      const bool rank = std::find(ranks.begin(), ranks.end(), maker) != ranks.end();
      // A rank's goes, unless another pid namespace's process made it (its
      // pid is no process here), or a live process did that is not a rank
      // left unreaped: a reaped rank's pid may have been taken since. A
      // file not yet stamped is judged by its pid alone. Another's goes
      // when a process of the run made it (a rank's child: its pid is one
      // allocated since the run started and its header records the run's
      // marker, which an unrelated process that ended meanwhile has not)
      // and nothing reaches it, its maker judged by the start time in its
      // header: a process that took the maker's pid since does not keep it.
      if (rank) {
        const bool ours = std::find(unreaped.begin(), unreaped.end(), maker) != unreaped.end();
        segment_stamp stamp{};
        const bool stamped =
            read_stamp(AT_FDCWD, ("/dev/shm" + name).c_str(), stamp) && stamp.magic == segment_magic;
        if (stamped && made_in_other_namespace(stamp, os::pid_namespace())) return;
        if (!ours && !os::has_ended(maker, stamped ? stamp.maker_start_time : 0)) return;
      }
      if (!rank && (!made_by_run(maker) || !unreachable_of_run(name, maker, nonce, marker))) return;
      if (::shm_unlink(name.c_str()) == 0) ++swept;
    });
  } catch (...) {
  }
  return swept;
}

bool segment::orphaned() const noexcept {
  // The maker is judged by its start time too: a process that took its pid
  // since would otherwise keep the name for good.
  return strategy_ == sharing_strategy::file_system && !made_here() &&
         os::has_ended(maker_, header().maker_start_time) && held_only_by_ended();
}

void segment::abandon() noexcept {
  retire();
  if (header().live.load(std::memory_order_acquire) > 0) unlink_name();
}

void segment::drop_live(std::uint64_t count) noexcept {
  if (header().live.fetch_sub(count, std::memory_order_acq_rel) == count) unlink_name();
}

}  // namespace cohort::shm

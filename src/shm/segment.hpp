// Shared-memory segments: made under a sharing strategy, mapped once per
// process, and carved into blocks that carry a reference count shared by
// every process holding them.
#pragma once

#include "cohort/storage.hpp"
#include "os/raw_syscall.hpp"
#include "os/spin_mutex.hpp"

#include <fcntl.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace cohort::shm {

/// Block data is aligned to this many bytes.
inline constexpr std::size_t alignment = 64;
/// Arena blocks come in classes of 64 << k bytes; larger requests get a
/// segment of their own.
inline constexpr int size_classes = 13;  // 64 B .. 256 KiB
inline constexpr std::size_t largest_class = alignment << (size_classes - 1);
/// The header page; the first block's data starts right after it.
inline constexpr std::size_t header_size = 4096;

/// The class of a request, or size_classes when it gets its own segment.
inline int size_class_of(std::size_t nbytes) noexcept {
  if (nbytes > largest_class) return size_classes;
  const auto units = std::max<std::size_t>(1, (nbytes + alignment - 1) / alignment);
  return std::bit_width(units - 1);
}

/// What a process needs to find a segment, and to check it found the right
/// one. Travels inside handles; a receiver trusts none of it until checked.
struct segment_ref {
  sharing_strategy strategy = sharing_strategy::file_descriptor;
  pid_t source = 0;           ///< the sender, when it holds `fd` (file_descriptor); else the maker
  int fd = -1;                ///< its descriptor of the memfd (file_descriptor)
  pid_t maker = 0;            ///< the process that made it (a named segment's name holds it)
  int maker_fd = -1;          ///< the maker's descriptor of the memfd, tried when the sender is gone
  /// The process the sender hands its memfds to as it ends (shm/keeper.hpp),
  /// or, of a named segment, the maker's keeper or the process keeping it;
  /// tried when the sender and the maker are gone, and then, once it has
  /// ended too, the receiver's own process and own keeper; 0 for none.
  pid_t keeper = 0;
  /// Random, in the header and in a named segment's name: what identifies
  /// it, and what tells a descriptor number since reused for another file.
  std::uint64_t nonce = 0;
};

/// A segment that cannot be opened any more: a memfd whose holders, its
/// sender and its maker, have exited (its memory went with them) or closed
/// it, or a named segment swept after its maker ended. A queue reports it
/// as the loss of the value's sender (`source`) when the sender has ended.
class segment_gone : public shm_error {
 public:
  segment_gone(const std::string& what, pid_t source) : shm_error(what), source_(source) {}
  pid_t source() const noexcept { return source_; }

 private:
  pid_t source_;
};

/// How the marker variable of every group run begins ("COHORT_GROUP_"):
/// each run sets one of its own ("COHORT_GROUP_<supervisor>_<n>_<random>=1")
/// in every rank's environment, which the ranks' children inherit.
inline constexpr std::string_view run_marker_start = "COHORT_GROUP_";

/// The run markers a segment's header records: a process in nested runs
/// (a rank of a group that a rank of another started) has one per level.
inline constexpr std::size_t max_run_markers = 4;

/// What a segment's header records of the run marker `entry`
/// ("NAME=value"): an FNV-1a hash of it, never 0 (an unused slot).
constexpr std::uint64_t run_marker_hash(std::string_view entry) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (const char c : entry) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ULL;
  }
  return h == 0 ? 1 : h;
}

/// Whether `markers`, a segment's run markers, record `marker` (a
/// run_marker_hash) as one in its maker's environment. Touches nothing but
/// its arguments: the guardian calls it.
COHORT_BARE_CODE constexpr bool holds_run_marker(const std::uint64_t (&markers)[max_run_markers],
                                                 std::uint64_t marker) noexcept {
  for (const std::uint64_t m : markers) {
    if (m == marker) return true;
  }
  return false;
}

/// What every segment's header begins with.
inline constexpr std::uint64_t segment_magic = 0x746d67737472686fULL;  // "ohrtsgmt"

/// The first fields of every segment's header, which one read of a named
/// segment's file gives: what tells whose file it is before it is removed.
struct segment_stamp {
  std::uint64_t magic;
  std::uint64_t nonce;
  std::uint64_t size;
  /// The maker's pid namespace (the inode of /proc/self/ns/pid; 0 when
  /// unknown) and start time (0 when unknown): what tells its pid in the
  /// name apart from another namespace's, on a /dev/shm that namespaces share.
  std::uint64_t maker_pid_namespace;
  std::uint64_t maker_start_time;
  std::uint64_t run_markers[max_run_markers];  ///< as segment_header has them
};

/// Whether `stamp`, read from the start of a named segment's file, says a
/// process of another pid namespace than `own` made it, so that the pid in
/// its name is no process of this one. A file not yet stamped (its maker
/// stopped before writing the header) says nothing. Touches nothing but its
/// arguments: the guardian calls it.
constexpr bool made_in_other_namespace(const segment_stamp& stamp, std::uint64_t own) noexcept {
  return stamp.magic == segment_magic && stamp.maker_pid_namespace != 0 && own != 0 &&
         stamp.maker_pid_namespace != own;
}

/// Reads the stamp at the start of the file `name` in directory `dir` (a
/// descriptor, or AT_FDCWD for a path) into `stamp`; false when it cannot be
/// read whole (a FIFO, which it does not wait for, or a file cut short).
/// Raw system calls only: the guardian calls it.
COHORT_BARE_CODE inline bool read_stamp(long dir, const char* name, segment_stamp& stamp) noexcept {
  const long fd = os::raw_syscall(SYS_openat, dir, reinterpret_cast<long>(name),
                                  O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return false;
  const long n = os::raw_syscall(SYS_pread64, fd, reinterpret_cast<long>(&stamp), sizeof stamp, 0);
  os::raw_syscall(SYS_close, fd);
  return n == static_cast<long>(sizeof stamp);
}

/// Whether the file `name` in directory `dir` (a descriptor, or AT_FDCWD
/// for a path) is stamped as a segment made in another pid namespace than
/// `own`; false when its stamp cannot be read whole (a FIFO, which it does
/// not wait for, or a file cut short). Raw system calls only: the guardian
/// calls it.
COHORT_BARE_CODE inline bool stamped_in_other_namespace(long dir, const char* name, std::uint64_t own) noexcept {
  segment_stamp stamp{};
  return read_stamp(dir, name, stamp) && made_in_other_namespace(stamp, own);
}

/// The start of every segment, in shared memory: its stamp's fields, then
/// the counts. Fields that different processes write sit on cache lines of
/// their own.
struct segment_header {
  std::uint64_t magic;
  std::uint64_t nonce;
  std::uint64_t size;
  std::uint64_t maker_pid_namespace;  ///< as segment_stamp has them
  std::uint64_t maker_start_time;
  /// run_marker_hash() of each run marker in the maker's environment as it
  /// made the segment, 0 in the slots left over: what tells a run's sweep
  /// that a process of the run made it. A maker with more than
  /// max_run_markers has the first it finds recorded, the rest not: the
  /// sweep of a run left out passes over the segment.
  std::uint64_t run_markers[max_run_markers];
  /// Blocks not yet freed (a block waiting in `remote_free` counts), plus
  /// one while the maker's arena may still carve from it. A named segment
  /// is unlinked by whoever takes it to zero. Until the arena retires it,
  /// the blocks on the maker's own free lists count too: the maker counts
  /// them apart, in its memory, so that carving and freeing there touch no
  /// shared count, and takes them off when it retires the segment.
  alignas(64) std::atomic<std::uint64_t> live;
  /// Arena blocks freed by processes other than the maker: a stack through
  /// `next_free` that the maker takes whole when its own lists run dry, so
  /// no lock is shared between processes. `retired` once the maker's arena
  /// has stopped carving: frees then give up their `live` at once.
  /// A line of its own: the maker changes `live` with every block it
  /// carves from fresh space, and receivers free onto this stack with
  /// every value.
  alignas(64) std::atomic<std::uint64_t> remote_free;
  static constexpr std::uint64_t retired = ~std::uint64_t{0};
  /// Messages that named blocks of this segment, pushed and received: a
  /// process that made it waits, before it ends, until every one sent has
  /// been received, so receivers can still open it through the maker's
  /// descriptor. Two counts, not one, so that senders and receivers write
  /// different cache lines.
  alignas(64) std::atomic<std::uint64_t> sent;
  alignas(64) std::atomic<std::uint64_t> received;
  /// The maker's own, under its segment's lock: where carving goes on.
  alignas(64) std::uint64_t bump;  ///< the first byte never carved
  std::uint64_t free_lists[size_classes];
  /// The processes other than the maker that have mapped it (opened, or
  /// inherited through fork), so the maker can tell when every other
  /// holder has ended: a process killed outright never gives its holds
  /// back. Each process once; a slot of one that has ended is taken again
  /// when all are used. An entry whose pid is 0 is being filled in.
  /// `unrecorded` is set when a process could not be recorded (no free
  /// slot, or its start time unreadable): the maker then never judges.
  static constexpr std::uint32_t max_mappers = 200;
  struct mapper {
    std::atomic<pid_t> pid;
    std::uint64_t start_time;  ///< as /proc/<pid>/stat has it, so a reused pid is not taken for it
  };
  alignas(64) std::atomic<std::uint32_t> mapper_count;  ///< slots handed out, past max_mappers once all were
  std::atomic<std::uint32_t> unrecorded;
  mapper mappers[max_mappers];
};
static_assert(offsetof(segment_header, magic) == offsetof(segment_stamp, magic) &&
              offsetof(segment_header, nonce) == offsetof(segment_stamp, nonce) &&
              offsetof(segment_header, size) == offsetof(segment_stamp, size) &&
              offsetof(segment_header, maker_pid_namespace) == offsetof(segment_stamp, maker_pid_namespace) &&
              offsetof(segment_header, maker_start_time) == offsetof(segment_stamp, maker_start_time) &&
              offsetof(segment_header, run_markers) == offsetof(segment_stamp, run_markers));

/// Precedes each block's data, in shared memory.
struct alignas(alignment) block_header {
  /// Holders: each process with a storage over the block, and each message
  /// in flight that carries it. acq_rel on both sides: the last releaser
  /// must see every holder's writes before the block is reused.
  std::atomic<std::uint32_t> refs;
  std::uint32_t size_class;   ///< its arena class; size_classes for a segment's only block
  std::uint64_t capacity;     ///< data bytes
  std::uint64_t next_free;    ///< the next free block of its class, 0 for none
  /// block_stamp(the segment's nonce, the block's offset), written as the
  /// block is made: an offset that a handle gives names a block's start
  /// only where it is found, never a place inside another block's data.
  std::uint64_t stamp;
};
static_assert(sizeof(block_header) == alignment);

/// What the header of the block at `offset` of the segment `nonce` holds
/// as its stamp; never 0, which unwritten memory holds.
constexpr std::uint64_t block_stamp(std::uint64_t nonce, std::uint64_t offset) noexcept {
  std::uint64_t x = nonce ^ (offset * 0x9e3779b97f4a7c15ULL);
  x ^= x >> 31;
  return x | 1;
}

/// One segment as mapped in this process. Made by make() or found by open();
/// unmapped when the last shared_ptr to it goes.
class segment {
 public:
  /// Makes a segment of `size` bytes (header included) under `strategy`, with
  /// the whole size reserved up front. `arena` segments are carved into many
  /// blocks; others hold one block over everything after the header.
  /// Throws shm_error.
  static std::shared_ptr<segment> make(std::size_t size, sharing_strategy strategy, bool arena);
  /// The segment `ref` names: this process's mapping when it has one, else
  /// opened, checked against `ref` and mapped. Throws shm_error when it
  /// cannot be opened (its source has exited) or is not what `ref` says.
  static std::shared_ptr<segment> open(const segment_ref& ref);

  segment(const segment&) = delete;
  segment& operator=(const segment&) = delete;
  ~segment();

  std::byte* base() const noexcept { return base_; }
  std::size_t size() const noexcept { return size_; }
  std::uint64_t nonce() const noexcept { return nonce_; }
  sharing_strategy strategy() const noexcept { return strategy_; }
  /// How another process finds this segment: through this process's own
  /// descriptor (file_descriptor: every process mapping one keeps one, so
  /// a receiver can pass on what it received), or by name.
  segment_ref ref() const noexcept;
  /// ref(), for a value written here: notes when it names this process's
  /// own descriptor, which the value's receivers may then open.
  segment_ref pass_on() noexcept;
  /// Whether this process made it.
  bool made_here() const noexcept;
  segment_header& header() const noexcept { return *reinterpret_cast<segment_header*>(base_); }
  block_header& block(std::uint64_t offset) const noexcept {
    return *reinterpret_cast<block_header*>(base_ + offset);
  }

  /// Carves a block of at least `nbytes` from an arena segment; returns its
  /// header's offset with refs = 1, or 0 when the segment is full.
  std::uint64_t carve(std::size_t nbytes);
  /// The offset of the only block of a segment made with arena = false.
  static constexpr std::uint64_t single_block = header_size - sizeof(block_header);
  /// Drops one reference to the block at `offset`; the last one frees it.
  void release(std::uint64_t offset) noexcept;
  /// Whether `offset` names the header of a block made here with at least
  /// `nbytes` of data after it inside this mapping (what a receiver checks
  /// before trusting it).
  bool holds(std::uint64_t offset, std::uint64_t nbytes) const noexcept;
  /// Whether messages naming its blocks have been sent and not received.
  bool messages_in_flight() const noexcept {
    // received first: a count of sent read after it can only be larger, so
    // equal counts mean nothing was in flight when `received` was read.
    const auto got = header().received.load(std::memory_order_acquire);
    return header().sent.load(std::memory_order_acquire) != got;
  }
  /// Takes the blocks other processes freed onto the maker's own lists,
  /// and tells whether none is in use: all that holds the segment is the
  /// arena. The maker's.
  bool unused() noexcept;
  /// Ends the maker's arena hold (the +1 in `live`): carving stops.
  void retire() noexcept;
  /// Records this process as one that maps the segment.
  void note_mapper() noexcept;
  /// Whether what is still held of it is held only by processes that have
  /// ended: none other that mapped it lives and no message naming it is in
  /// flight. The caller checks that it holds nothing of it itself.
  bool held_only_by_ended() const noexcept { return !messages_in_flight() && others_ended(); }
  /// Whether every process other than this one that mapped it has ended.
  bool others_ended() const noexcept;
  /// Removes a named (file_system) segment's name, keeping every mapping;
  /// nothing for a memfd.
  void unlink_name() const noexcept;
  /// Closes this process's descriptor of a memfd segment another process
  /// made, keeping the mapping (which needs none): values passed on from
  /// here then name the maker's. Whether there was one to close. A segment
  /// this process keeps for an ended sender keeps its descriptor.
  bool give_up_descriptor() noexcept;
  /// Whether give_up_descriptor may close a descriptor now: one of this
  /// process's own that no value in flight may need. Only a process that
  /// passed on values through its own descriptor (pass_on) looks at the
  /// shared counts of messages in flight: their lines are written with
  /// every value sent and received, and a look on every storage dropped
  /// would pull them from the senders' caches.
  bool may_give_up_descriptor() const noexcept {
    if (made_here() || kept_.load(std::memory_order_relaxed) || fd_.load(std::memory_order_relaxed) < 0) return false;
    return !passed_on_.load(std::memory_order_relaxed) || !messages_in_flight();
  }
  /// The segment a memfd that `sender` handed over as it ended holds,
  /// mapped here (or this process's mapping of it, given `fd` when it had
  /// given up its own), marked as kept: it keeps its descriptor until
  /// unkept. `nonce` is nonce_in(fd). Takes `fd` in every case. Throws
  /// shm_error when it is not a segment. The registry's lock is held.
  static std::shared_ptr<segment> keep(int fd, pid_t sender, std::uint64_t nonce);
  /// The nonce in the header of the segment `fd` holds; 0 when it holds none.
  static std::uint64_t nonce_in(int fd) noexcept;
  /// The descriptor keep() holds, -1 when it is not kept here. Stays this
  /// process's: a caller that passes it on passes a copy (SCM_RIGHTS).
  int kept_descriptor() const noexcept {
    return kept_.load(std::memory_order_relaxed) ? fd_.load(std::memory_order_relaxed) : -1;
  }
  /// Ends keep(): its descriptor may go as any received segment's.
  void unkeep() noexcept {
    kept_.store(false, std::memory_order_relaxed);
    // A named segment needs no descriptor here but for keeping.
    if (strategy_ == sharing_strategy::file_system) {
      if (const int fd = fd_.exchange(-1, std::memory_order_relaxed); fd >= 0) ::close(fd);
    }
  }
  /// Whether it is a named segment another process made that has ended,
  /// and that no process but ended ones and this one holds: its name then
  /// goes once this process unmaps it, since no live process could ever
  /// free its last block.
  bool orphaned() const noexcept;
  /// Lets go of a segment this process made whose remaining blocks only
  /// ended processes hold: its name goes from /dev/shm now, its memory once
  /// this process unmaps it.
  void abandon() noexcept;

 private:
  segment(std::byte* base, std::size_t size, sharing_strategy strategy, int fd, pid_t maker, int maker_fd,
          pid_t keeper);
  // Checks that `fd` holds the segment `ref` names (any, when its nonce is
  // 0), maps it and registers it, keeping `fd` or closing it; closes `fd`
  // and throws shm_error when it does not. The registry's lock is held.
  static std::shared_ptr<segment> map_checked(int fd, const std::string& where, const segment_ref& ref,
                                              bool keep_descriptor);
  void drop_live(std::uint64_t count) noexcept;
  void reclaim_locked() noexcept;

  os::spin_mutex mutex_;      // the maker's carving and its own frees
  bool retired_ = false;  // under mutex_
  // Blocks on the maker's free lists, all counted in the header's `live`
  // until retire(). Under mutex_.
  std::uint64_t free_blocks_ = 0;

  std::byte* base_;
  std::size_t size_;
  sharing_strategy strategy_;
  // A memfd's descriptor: the maker's, so others can open it, or a
  // receiver's, so it can pass the segment on; -1 when none (file_system,
  // or given up under descriptor pressure).
  std::atomic<int> fd_;
  pid_t maker_;
  int maker_fd_;
  pid_t keeper_;  // the sender's keeper, for values passed on without a descriptor of this process's
  std::atomic<bool> kept_{false};
  // A value written here named this process's own descriptor (pass_on).
  std::atomic<bool> passed_on_{false};
  // The header's, read once: asked for by every handle written and every
  // storage dropped, it is not worth a trip to the shared line each time.
  std::uint64_t nonce_;
};

/// Unlinks the named (file_system) segments in /dev/shm that a run left:
/// every one that one of `ranks` (processes that have ended, or that are
/// among `unreaped`: this process's children, killed but not reaped, whose
/// pids no other process can have) made (not one that a live process,
/// which took the pid of a reaped rank since, made), and every other one
/// that a process of the run made (a rank's own child, killed or exited
/// holding it) and nothing can reach any more. A process of the run is one
/// whose pid `made_by_run` names (one allocated since the run started) and
/// whose environment held the run's marker `run_marker` ("NAME=value", as
/// the ranks' environment has it) when it made the segment, as the
/// segment's header records; a process that started with an environment
/// without it, or in more than max_run_markers runs, is not one. Nothing
/// can reach a segment once its maker has ended, no live process maps it,
/// this one included, and no message naming it is in flight. Mappings of a
/// rank's stay valid; only opening them by name ends: a value still in
/// flight that names one is lost with its maker (segment_gone). Returns
/// how many went.
int sweep_segments_of_run(std::span<const pid_t> ranks, std::span<const pid_t> unreaped, std::string_view run_marker,
                          const std::function<bool(pid_t)>& made_by_run) noexcept;

}  // namespace cohort::shm

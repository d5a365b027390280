// The guardian: a process started from this one that outlives it just long
// enough to kill what its groups left behind.
//
// It is a clone that shares this process's memory where that is safe (see
// shares_memory), so its start copies no page table and no page: a fork
// made this process and the guardian fault on every page either wrote
// afterwards, which cost cohort-run -n 1 about 2 ms of its start-to-exit
// time on a virtual machine where faults are dear. Sharing memory, the
// guardian must touch nothing of this process's: it runs on a stack of its
// own, reads only what was written for it there, and makes raw system
// calls (no errno, no lock, no allocation). The same code runs as a copy
// (a clone without shared memory) where sharing is not safe.
#include "cohort/guardian.hpp"

#include "config.hpp"
#include "group/descendants.hpp"
#include "group/rank_groups.hpp"
#include "launch/rank_mark.hpp"
#include "os/descriptor_limit.hpp"
#include "os/per_process.hpp"
#include "os/process_identity.hpp"
#include "os/raw_syscall.hpp"
#include "process/launch.hpp"
#include "process/owned_pids.hpp"
#include "shm/segment.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace cohort {
namespace {

using os::raw_syscall;
using detail::start_note;

// A list of notes (rank_groups.hpp), on pages of the guardian's mapping
// that the parent writes as ranks start and end, under the registry's
// lock, and the guardian reads (shared: a copy sees them too). A value may
// be noted twice (a recycled pid, by two groups); 0 is a free slot. The
// slots are the mapping's zeroes until written (through atomic_ref):
// constructing them would touch every page at each start.
template <class T>
struct note_list {
  static constexpr std::size_t size = 16 * 1024 - 2;
  std::atomic<std::size_t> used{0};  // the slots in use are below this
  T slots[size];

  std::atomic_ref<T> slot(std::size_t i) { return std::atomic_ref<T>(slots[i]); }
  COHORT_BARE_CODE T slot(std::size_t i) const {
    return std::atomic_ref<T>(const_cast<T&>(slots[i])).load(std::memory_order_relaxed);
  }

  // False when every slot is taken.
  COHORT_BARE_CODE bool add(T value) noexcept {
    const std::size_t in_use = used.load(std::memory_order_relaxed);
    for (std::size_t i = 0; i < in_use; ++i) {
      if (slot(i).load(std::memory_order_relaxed) == 0) {
        slot(i).store(value, std::memory_order_release);
        return true;
      }
    }
    if (in_use == size) return false;
    slot(in_use).store(value, std::memory_order_relaxed);
    used.store(in_use + 1, std::memory_order_release);
    return true;
  }

  // Lets go of one note of `value`.
  COHORT_BARE_CODE void remove(T value) noexcept {
    std::size_t in_use = used.load(std::memory_order_relaxed);
    for (std::size_t i = 0; i < in_use; ++i) {
      if (slot(i).load(std::memory_order_relaxed) == value) {
        slot(i).store(0, std::memory_order_release);
        break;
      }
    }
    while (in_use > 0 && slot(in_use - 1).load(std::memory_order_relaxed) == 0) --in_use;
    used.store(in_use, std::memory_order_release);
  }

  // Takes the notes of `other` in place of its own (none: only the
  // registered table is ever written).
  void take_from(const note_list& other) noexcept {
    const std::size_t in_use = std::min(other.used.load(std::memory_order_relaxed), size);
    for (std::size_t i = 0; i < in_use; ++i) slot(i).store(other.slot(i), std::memory_order_relaxed);
    used.store(in_use, std::memory_order_release);
  }

  COHORT_BARE_CODE bool holds(T value) const noexcept {
    if (value == 0) return false;
    const std::size_t in_use = std::min(used.load(std::memory_order_acquire), size);
    for (std::size_t i = 0; i < in_use; ++i) {
      if (slot(i) == value) return true;
    }
    return false;
  }
};

// What the groups note for the guardian: the process groups the ranks
// lead, the ranks themselves as rank_record()s, kept after their end
// until their run has swept the segment files they made, and the runs'
// markers (shm::run_marker_hash), noted before their first rank starts.
// And what the guardian notes itself, read from its line: the ranks that
// announced their start (process/launch.hpp start_note) and whose
// launchers have not yet withdrawn that, having noted them here (or
// failed to start them). A rank runs nothing of its caller's before its
// note is on the line, so from its first instruction of user code on,
// the guardian knows its process group and the segments it makes.
struct rank_group_table {
  note_list<pid_t> groups;
  note_list<std::uint64_t> ranks;
  note_list<std::uint64_t> runs;
  note_list<pid_t> started;  // the guardian's own: never taken by the next one
};
static_assert(std::atomic_ref<pid_t>::is_always_lock_free && std::atomic_ref<std::uint64_t>::is_always_lock_free &&
              std::atomic<std::size_t>::is_always_lock_free);

// A rank's note: its start time (clock ticks since boot, which take 42
// bits only after a thousand years) above its pid (pid_max <= 2^22), as
// a segment it made is stamped: a process that took its pid since is not
// taken for it.
COHORT_BARE_CODE constexpr std::uint64_t rank_record(std::uint64_t pid, std::uint64_t start_time) noexcept {
  return start_time << 22 | pid;
}

// What the guardian works with, written before it starts, at the top of
// its mapping (its stack grows down from below it).
struct guardian_memory {
  int line = -1;            // its end of the socket pair
  int parent_end = -1;      // the parent's end, closed at once
  int parent = -1;          // a pidfd of the parent, or -1
  char prefix[64] = {};     // the groups' marker, "COHORT_GROUP_<pid>_"
  std::size_t prefix_size = 0;
  // The mark of the parent's forked ranks as /proc/<pid>/maps shows it,
  // "/memfd:cohort-ranks-of-<pid> " (launch/rank_mark.hpp).
  char mark[64] = {};
  std::size_t mark_size = 0;
  rank_group_table* groups = nullptr;  // on the pages above; the guardian writes `started` alone
  long parent_pid = 0;
  // The parent's start time and the guardian's, in clock ticks since boot
  // as the parent reads /proc/<pid>/stat; 0 where unknown. The second is
  // written once the guardian has started: the guardian reads its own
  // start time too, in its time namespace, which may not be the parent's
  // (a copy goes where the parent's other children go), and which gives
  // every start time it reads its offset.
  std::uint64_t parent_start_time = 0;
  std::uint64_t own_start_time = 0;  // std::atomic_ref: written by the parent after the clone
  std::uint64_t pid_namespace = 0;  // the parent's, and so its own
};

// The table that note_rank_group and note_rank write: the first guardian's
// of those this process runs, while it runs; as it ends, the next running
// one's, which takes its notes. One per process (os/per_process.hpp): a
// child forked from this process finds no registry of its own, rather than
// its parent's pointer to pages it has not (MADV_DONTFORK) and a lock that
// the fork may have copied held; a guardian it starts makes its own.
struct rank_group_registry {
  std::mutex mutex;
  rank_group_table* table = nullptr;
  int line = -1;  // the line of the guardian whose table `table` is
  std::vector<std::pair<rank_group_table*, int>> lines;  // each running guardian's
  std::vector<rank_group_table*> running;  // every running guardian's, in the order they started
};
rank_group_registry& registry() { return os::of_this_process<rank_group_registry>(); }
// This process's registry where a guardian made it; null otherwise (none is made).
rank_group_registry* made_registry() noexcept { return os::made_in_this_process<rank_group_registry>(); }

// Whether the guardian may share this process's memory. Not where the
// system calls would go through libc (errno). Nor before Linux 5.16: until
// then a crash that dumps core ended every process sharing the crashing
// one's memory, the guardian with it.
std::atomic<bool> copies_only{false};  // detail::start_guardians_as_copies

bool shares_memory() {
  if constexpr (!os::raw_syscall_is_private) return false;
  if (copies_only.load(std::memory_order_relaxed)) return false;
  utsname name{};
  if (::uname(&name) != 0) return false;
  int major = 0, minor = 0;
  if (std::sscanf(name.release, "%d.%d", &major, &minor) != 2) return false;
  return major > 5 || (major == 5 && minor >= 16);
}

// The kernel's own sigaction (x86-64 and AArch64 alike).
struct kernel_sigaction {
  void (*handler)(int);
  unsigned long flags;
  void (*restorer)();
  std::uint64_t mask;
};

COHORT_BARE_CODE void set_disposition(int signal, void (*handler)(int)) {
  if constexpr (os::raw_syscall_is_private) {
    kernel_sigaction action{handler, 0, nullptr, 0};
    raw_syscall(SYS_rt_sigaction, signal, reinterpret_cast<long>(&action), 0, sizeof action.mask);
  } else {  // a copy: libc is its own
    struct sigaction action {};
    action.sa_handler = handler;
    ::sigaction(signal, &action, nullptr);
  }
}

// Opens /proc/<pid><tail> for reading, `pid` given by its decimal digits:
// the descriptor, or -errno.
COHORT_BARE_CODE long open_proc_file(const char* pid, const char* tail) {
  char path[40] = "/proc/";
  std::size_t at = 6;
  for (; *pid != '\0' && at < 20; ++pid) path[at++] = *pid;
  for (; *tail != '\0' && at < sizeof path - 1; ++tail) path[at++] = *tail;
  path[at] = '\0';
  return raw_syscall(SYS_openat, AT_FDCWD, reinterpret_cast<long>(path), O_RDONLY | O_CLOEXEC);
}

// Feeds /proc/<pid><tail> (`pid` its decimal digits) to `found_at`, a
// character at a time, until it returns true (true) or the file ends
// (false; also where it cannot be read: gone, or not ours to read).
template <class Step>
COHORT_BARE_CODE bool scan_proc_file(const char* pid, const char* tail, Step&& found_at) {
  const long fd = open_proc_file(pid, tail);
  if (fd < 0) return false;
  bool found = false;
  COHORT_UNINITIALIZED char block[4096];
  while (!found) {
    const long n = raw_syscall(SYS_read, fd, reinterpret_cast<long>(block), sizeof block);
    if (n == -EINTR) continue;
    if (n <= 0) break;
    for (long i = 0; i < n && !found; ++i) found = found_at(block[i]);
  }
  raw_syscall(SYS_close, fd);
  return found;
}

// Matches a variable that starts with `prefix` in an environment block.
struct prefix_step {
  const char* prefix;
  std::size_t size;
  // How much of the prefix the current variable has matched; `differs`
  // once it cannot.
  static constexpr std::size_t differs = ~std::size_t{0};
  std::size_t matched = 0;
  COHORT_BARE_CODE bool operator()(char c) {
    if (c == '\0') {
      matched = 0;  // the next variable
    } else if (matched != differs) {
      matched = c == prefix[matched] ? matched + 1 : differs;
    }
    return matched == size;
  }
};

// Matches `text` anywhere, where its first character appears in it nowhere
// else: a match that fails can only begin again at that character.
struct text_step {
  const char* text;
  std::size_t size;
  std::size_t matched = 0;
  COHORT_BARE_CODE bool operator()(char c) {
    if (c == text[matched]) {
      ++matched;
    } else {
      matched = c == text[0] ? 1 : 0;
    }
    return matched == size;
  }
};

// Whether the initial environment of process `pid` (its decimal digits) has
// a variable that starts with the marker.
COHORT_BARE_CODE bool marked(const char* pid, const guardian_memory& m) {
  return scan_proc_file(pid, "/environ", prefix_step{m.prefix, m.prefix_size});
}

// Whether process `pid` (its decimal digits) maps the mark of the parent's
// forked ranks (its first character, '/', appears in it nowhere else).
COHORT_BARE_CODE bool carries_mark(const char* pid, const guardian_memory& m) {
  return scan_proc_file(pid, "/maps", text_step{m.mark, m.mark_size});
}

// Calls each(number, name, dir, context) for every entry of the directory
// at `path` that a decimal number names (the processes of /proc, the
// descriptors of /proc/self/fd), or with `numbered_only` false for every
// entry (number -1 where the name is not a number), with the entry's name
// as written and the directory's own descriptor. False when the directory
// cannot be opened.
COHORT_BARE_CODE bool for_each_entry(const char* path, bool numbered_only,
                                     void (*each)(long number, const char* name, long dir, void* context),
                                     void* context) {
  struct entry {  // linux_dirent64
    std::uint64_t inode;
    std::int64_t offset;
    unsigned short size;
    unsigned char type;
    char name[1];
  };
  const long dir = raw_syscall(SYS_openat, AT_FDCWD, reinterpret_cast<long>(path), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) return false;
  alignas(entry) COHORT_UNINITIALIZED char entries[4096];
  for (;;) {
    const long n = raw_syscall(SYS_getdents64, dir, reinterpret_cast<long>(entries), sizeof entries);
    if (n <= 0) break;
    for (long at = 0; at < n;) {
      const auto* e = reinterpret_cast<const entry*>(entries + at);
      at += e->size;
      long number = 0;
      const char* c = e->name;
      for (; *c >= '0' && *c <= '9'; ++c) number = number * 10 + (*c - '0');
      const bool numbered = c != e->name && *c == '\0';
      if (numbered || !numbered_only) each(numbered ? number : -1, e->name, dir, context);
    }
  }
  raw_syscall(SYS_close, dir);
  return true;
}

// Whether process group `pgid` is one the table notes, or one a rank that
// announced its start leads (a rank that does not lead one has no group of
// its pid's number: nothing is in it).
COHORT_BARE_CODE bool noted(const rank_group_table* table, long pgid) {
  return table != nullptr && pgid > 0 &&
         (table->groups.holds(static_cast<pid_t>(pgid)) || table->started.holds(static_cast<pid_t>(pgid)));
}

// Reads at most `size` bytes of /proc/<pid><tail> into `into`, at once:
// how many, or negative where it cannot be opened or read.
COHORT_BARE_CODE long read_proc_file(const char* pid, const char* tail, char* into, long size) {
  const long fd = open_proc_file(pid, tail);
  if (fd < 0) return fd;
  long n = 0;
  do {
    n = raw_syscall(SYS_read, fd, reinterpret_cast<long>(into), size);
  } while (n == -EINTR);
  raw_syscall(SYS_close, fd);
  return n;
}

// What /proc/<pid>/stat says of process `pid` (its decimal digits): its
// state, the letter after the name in parentheses (which may itself hold
// any character), 0 where it cannot be read (gone); and its start time,
// field 22, in clock ticks since boot.
struct stat_look {
  char state;
  std::uint64_t start_time;
};
COHORT_BARE_CODE stat_look look_at_stat(const char* pid) {
  COHORT_UNINITIALIZED char stat[512];
  const long n = read_proc_file(pid, "/stat", stat, sizeof stat);
  long close_paren = -1;
  for (long i = 0; i < n; ++i) {
    if (stat[i] == ')') close_paren = i;
  }
  if (close_paren < 0 || close_paren + 2 >= n) return {0, 0};
  stat_look look{stat[close_paren + 2], 0};
  // A space before each field after the parenthesis: past the 20th, field
  // 22 begins.
  long at = close_paren + 1;
  for (int field = 2; field < 22 && at < n; ++at) {
    if (stat[at] == ' ') ++field;
  }
  for (; at < n && stat[at] >= '0' && stat[at] <= '9'; ++at) look.start_time = look.start_time * 10 + (stat[at] - '0');
  return look;
}

// Whether process `pid` (its decimal digits) has died and waits to be
// reaped (Z), or is gone.
COHORT_BARE_CODE bool dead(const char* pid) {
  const char state = look_at_stat(pid).state;
  return state == 0 || state == 'Z' || state == 'X';
}

// The name a guardian gives itself, as its thread's name: at most 15
// characters.
constexpr char guardian_name[] = "cohort-guardian";
static_assert(sizeof guardian_name <= 16);

// What a guardian sends its parent once it has its name and its own
// process group.
constexpr char guardian_named = 'n';

// Whether process `pid` (its decimal digits) is a guardian. One that a
// rank's process started (a supervisor among the ranks) carries the rank's
// marker, and does its own work once its parent is gone: killed first,
// what it alone knows of (its own ranks' process groups) would live on.
COHORT_BARE_CODE bool a_guardian(const char* pid) {
  char name[sizeof guardian_name + 1];
  const long n = read_proc_file(pid, "/comm", name, sizeof name);
  if (n != static_cast<long>(sizeof guardian_name) || name[n - 1] != '\n') return false;  // the name, then a newline
  for (long i = 0; i + 1 < n; ++i) {
    if (name[i] != guardian_name[i]) return false;
  }
  return true;
}

// One pass over /proc: what it looks for, and how many it found.
struct kill_pass {
  const guardian_memory& m;
  bool parent_gone;  // which looks also for the mark of the parent's forked ranks
  std::uint64_t since;  // the parent's start time here: what started before is not ours
  long self;
  int found;
};

// Kills process `pid` of the pass when it is in a process group or session
// a rank led, or marked (with the pass's `parent_gone`, also by the
// mapping of the parent's forked ranks): found, unless it has died already
// (a zombie stays in its group until reaped, by another). Another guardian
// is spared, and any process that started before the parent: none of its
// descendants can have, so its marker or mapping is of an earlier process
// that had the parent's pid. The mappings are read last: a process's can
// be long.
COHORT_BARE_CODE void kill_if_ours(long pid, const char* name, long, void* context) {
  auto& p = *static_cast<kill_pass*>(context);
  if (pid == p.self) return;
  const bool in_group =
      noted(p.m.groups, raw_syscall(SYS_getpgid, pid)) || noted(p.m.groups, raw_syscall(SYS_getsid, pid));
  bool is_marked = !in_group && marked(name, p.m);
  if (!in_group && !is_marked && !p.parent_gone) return;
  const stat_look look = look_at_stat(name);
  if (look.state == 0 || look.start_time < p.since) return;
  if (!in_group && !is_marked && !(is_marked = carries_mark(name, p.m))) return;
  if (a_guardian(name)) return;
  raw_syscall(SYS_kill, pid, SIGKILL);
  if (is_marked || !dead(name)) ++p.found;
}

// The parent's start time in this guardian's time namespace, from the
// parent's reading of it and of the guardian's own: 0 (no process is
// older) where either is unknown. Read once the look begins: the parent
// has written what it will by then.
COHORT_BARE_CODE std::uint64_t parent_start_here(guardian_memory& m) {
  const std::uint64_t parent = m.parent_start_time;
  const std::uint64_t own_there = std::atomic_ref<std::uint64_t>(m.own_start_time).load(std::memory_order_acquire);
  const std::uint64_t own_here = look_at_stat("self").start_time;
  if (parent == 0 || own_there == 0 || own_here == 0 || parent + own_here < own_there) return 0;
  return parent + own_here - own_there;
}

// One pass over /proc: kills every marked process (with `parent_gone`,
// every one that carries the mark of the parent's forked ranks too) and
// every process in a rank's group that started from `since` on; the
// number found alive.
COHORT_BARE_CODE int kill_ours(const guardian_memory& m, bool parent_gone, std::uint64_t since) {
  kill_pass p{m, parent_gone, since, raw_syscall(SYS_getpid), 0};
  for_each_entry("/proc", true, kill_if_ours, &p);
  return p.found;
}

// The maker's pid in `name`, in /dev/shm, when it names a file_system
// segment: "cohort_<maker>_<16 hex digits>" (shm/segment_name.hpp); 0
// otherwise.
COHORT_BARE_CODE long segment_maker(const char* name) {
  for (const char* prefix = "cohort_"; *prefix != '\0'; ++prefix, ++name) {
    if (*name != *prefix) return 0;
  }
  long maker = 0;
  const char* digits = name;
  for (; *name >= '0' && *name <= '9'; ++name) maker = maker * 10 + (*name - '0');
  if (name == digits || *name != '_') return 0;
  int hex = 0;
  for (++name; (*name >= '0' && *name <= '9') || (*name >= 'a' && *name <= 'f'); ++name) ++hex;
  return hex == 16 && *name == '\0' ? maker : 0;
}

// Removes the file_system segment `name` when this process or one of its
// ranks made it: the maker is this process (`parent`), a rank whose
// process group is noted (a rank leads its group: the ids are its pid) or
// that announced its start, a rank noted as one of a run not yet swept,
// which may have ended (told from a process that took its pid since by the
// start time the file is stamped with), or any process whose environment
// held the marker of a run not yet swept as it made the file (a rank's
// own child), as the file's stamp records it. A file another pid
// namespace's process made is not ours, whatever pid its name holds.
COHORT_BARE_CODE void unlink_if_ours(long, const char* name, long dir, void* context) {
  const auto& m = *static_cast<const guardian_memory*>(context);
  const long maker = segment_maker(name);
  if (maker <= 0) return;
  shm::segment_stamp stamp{};
  const bool stamped = shm::read_stamp(dir, name, stamp) && stamp.magic == shm::segment_magic;
  if (stamped && shm::made_in_other_namespace(stamp, m.pid_namespace)) return;
  const bool rank = stamped && stamp.maker_start_time != 0 && m.groups != nullptr &&
                    m.groups->ranks.holds(rank_record(static_cast<std::uint64_t>(maker), stamp.maker_start_time));
  bool of_run = false;
  if (stamped && m.groups != nullptr) {
    const auto& runs = m.groups->runs;
    const std::size_t in_use = std::min(runs.used.load(std::memory_order_acquire), runs.size);
    for (std::size_t i = 0; i < in_use && !of_run; ++i) {
      const std::uint64_t run = runs.slot(i);
      of_run = run != 0 && shm::holds_run_marker(stamp.run_markers, run);
    }
  }
  if (maker == m.parent_pid || noted(m.groups, maker) || rank || of_run) {
    raw_syscall(SYS_unlinkat, dir, reinterpret_cast<long>(name), 0);
  }
}

COHORT_BARE_CODE long monotonic_ns() {
  timespec now{};
  raw_syscall(SYS_clock_gettime, CLOCK_MONOTONIC, reinterpret_cast<long>(&now));
  return now.tv_sec * 1'000'000'000L + now.tv_nsec;
}

// Closes descriptor `fd` of directory `dir`'s listing unless it is one of
// the two kept.
COHORT_BARE_CODE void close_unless_kept(long fd, const char*, long dir, void* context) {
  const int* kept = static_cast<const int*>(context);
  if (fd >= 3 && fd != kept[0] && fd != kept[1] && fd != dir) raw_syscall(SYS_close, fd);
}

// Closes every descriptor of the guardian's but `a` and `b` (-1: none):
// with close_range, or one by one from /proc/self/fd where it is refused
// (before Linux 5.9, or by a seccomp filter).
COHORT_BARE_CODE void close_all_but(int a, int b) {
  const int kept_in_order[2] = {a < b ? a : b, a < b ? b : a};
  if (os::close_all_but(kept_in_order, 2, false) == 0) return;
  int kept[2] = {a, b};
  for_each_entry("/proc/self/fd", true, close_unless_kept, kept);
}

// Puts /dev/null over the standard streams, but `a` and `b` where they are
// among them: the guardian writes nothing, and its parent's pipes and
// terminal reach their end of file as the parent lets go of them. Each is
// closed where /dev/null cannot be opened.
COHORT_BARE_CODE void stdio_to_null(int a, int b) {
  const long null = raw_syscall(SYS_openat, AT_FDCWD, reinterpret_cast<long>("/dev/null"), O_RDWR | O_CLOEXEC);
  for (long fd = 0; fd < 3; ++fd) {
    if (fd == a || fd == b || fd == null) continue;
    if (null < 0) raw_syscall(SYS_close, fd);
    else raw_syscall(SYS_dup3, null, fd, 0);
  }
  if (null > 2) raw_syscall(SYS_close, null);
}

// What the line says: start_notes, each 8 bytes, from the parent and
// from the ranks as they start ('+' and '-', see rank_group_table), and
// from the parent 'r' (released) or 'l' (look). A read may end inside a
// note; its start waits here for the rest.
struct line_reader {
  char bytes[64 * sizeof(start_note)];
  std::size_t held;  // bytes of a note begun
};

// How the guardian's wait ended: the parent let it go ('r' on the line),
// asked for a look ('l', or a wait that failed), or is gone (the line's end
// of file, or its pidfd readable, which also catches a copy of the
// parent's end held by a child it forked).
enum class ending { released, look, parent_gone };

// Reads the line once, waiting for something to read or not, and takes
// the start notes read; the parent's word, when one came ('r', 'l'), goes
// to `word`. False when nothing more can be read now: nothing is waiting,
// or the line has ended (`ended` set).
COHORT_BARE_CODE bool read_line(guardian_memory& m, line_reader& r, bool wait, char& word, bool& ended) {
  const long n = raw_syscall(SYS_recvfrom, m.line, reinterpret_cast<long>(r.bytes + r.held), sizeof r.bytes - r.held,
                             wait ? 0 : MSG_DONTWAIT, 0, 0);
  if (n == -EINTR) return true;
  if (n == 0) ended = true;
  if (n <= 0) return false;
  r.held += static_cast<std::size_t>(n);
  std::size_t at = 0;
  for (; r.held - at >= sizeof(start_note); at += sizeof(start_note)) {
    start_note note;
    __builtin_memcpy(&note, r.bytes + at, sizeof note);
    if (note.what == '+' && note.pid > 0) m.groups->started.add(note.pid);  // full: known once noted, as before
    else if (note.what == '-' && note.pid > 0) m.groups->started.remove(note.pid);
    else if (word == 0) word = note.what;
  }
  for (std::size_t i = at; i < r.held; ++i) r.bytes[i - at] = r.bytes[i];
  r.held -= at;
  return true;
}

// Takes every start note waiting on the line, without waiting for more.
COHORT_BARE_CODE void drain_line(guardian_memory& m, line_reader& r) {
  char word = 0;
  bool ended = false;
  while (read_line(m, r, false, word, ended)) {
  }
}

COHORT_BARE_CODE ending wait_for_look(guardian_memory& m, line_reader& r) {
  for (;;) {
    pollfd watched[2] = {{m.line, POLLIN, 0}, {m.parent, POLLIN, 0}};  // a negative descriptor is skipped
    const long ready = raw_syscall(SYS_ppoll, reinterpret_cast<long>(watched), 2, 0, 0);
    if (ready == -EINTR) continue;
    if (ready < 0) return ending::look;  // cannot wait: look now rather than never
    if (watched[1].revents != 0) return ending::parent_gone;
    if (watched[0].revents == 0) continue;
    char word = 0;
    bool ended = false;
    while (word == 0 && read_line(m, r, false, word, ended)) {
    }
    if (word != 0) return word == 'r' ? ending::released : ending::look;
    if (ended) return ending::parent_gone;
  }
}

// The guardian. It starts with every signal blocked (its parent blocked
// them around the clone), so no handler of the parent's ever runs here.
// It leads a process group of its own, so that a SIGKILL sent to its
// parent's group (`timeout -s KILL`, `kill -9 -PGID`) does not end it with
// the parent; and it ignores every signal but SIGKILL, SIGSTOP and the
// faults of its own code: a Ctrl-C, or any signal sent to a group, leaves
// it to do its work.
COHORT_BARE_CODE int guard(void* memory) {
  auto& m = *static_cast<guardian_memory*>(memory);
  raw_syscall(SYS_setpgid, 0, 0);
  raw_syscall(SYS_prctl, PR_SET_NAME, reinterpret_cast<long>(guardian_name));
  // Another guardian knows this one by its name from here on, and finds it
  // in no group of its parent's: the parent, told so, goes on to start
  // ranks (until then, a guardian whose pass came first took this one, not
  // yet run, for a process of its parent's rank, and killed it).
  constexpr char named = guardian_named;
  raw_syscall(SYS_sendto, m.line, reinterpret_cast<long>(&named), 1, MSG_NOSIGNAL, 0, 0);
  for (int signal = 1; signal < 65; ++signal) {
    if (signal == SIGKILL || signal == SIGSTOP) continue;
    const bool fault = signal == SIGSEGV || signal == SIGBUS || signal == SIGILL || signal == SIGFPE || signal == SIGTRAP ||
                       signal == SIGSYS;
    set_disposition(signal, fault ? SIG_DFL : SIG_IGN);
  }
  os::set_signal_mask(0);
  raw_syscall(SYS_close, m.parent_end);
  // Its streams first: once it holds nothing but them and its two, its
  // set-up is done.
  stdio_to_null(m.line, m.parent);
  close_all_but(m.line, m.parent);
  COHORT_UNINITIALIZED line_reader line;
  line.held = 0;
  if (const ending end = wait_for_look(m, line); end != ending::released) {
    // Its marked processes go too, and those in its ranks' process groups.
    // Killed ones stop showing once dead, so a pass that finds none ends
    // the work; at most 10 s, for a process stuck in the kernel. The mark
    // of the forked ranks counts only once the parent is gone: a parent
    // that asked for the look keeps its forkserver, which carries the mark
    // too (and its groups' ends sweep what their ranks left), and the
    // look reads no process's mappings.
    const bool parent_gone = end == ending::parent_gone;
    const std::uint64_t since = parent_start_here(m);
    const long until = monotonic_ns() + 10'000'000'000L;
    const timespec pause{0, 5'000'000};
    // Each pass after the notes still on the line: those sent before the
    // parent ended, and any a rank sent as it started meanwhile.
    for (;;) {
      drain_line(m, line);
      if (kill_ours(m, parent_gone, since) == 0 || monotonic_ns() >= until) break;
      raw_syscall(SYS_clock_nanosleep, CLOCK_MONOTONIC, 0, reinterpret_cast<long>(&pause), 0);
    }
    drain_line(m, line);
    // Then, once the parent is gone, the files of file_system segments
    // that it and its ranks made: their makers are gone, and nothing else
    // would remove them (a group's end removes its ranks' files, a
    // process's end its own). A parent that asked for the look lives on,
    // and may still pass its own on.
    if (end == ending::parent_gone) {
      for_each_entry("/dev/shm", false, unlink_if_ours, &m);
    }
  }
  raw_syscall(SYS_exit_group, 0);
  __builtin_unreachable();
}

// Waits on the parent's end of the line until the guardian started behind
// `pidfd` says it has its name and its own process group (until then it
// looks to other guardians like any process of this one's); throws where
// it ended first.
void wait_until_named(int line, int pidfd) {
  for (;;) {
    pollfd watched[2] = {{line, POLLIN, 0}, {pidfd, POLLIN, 0}};
    if (::poll(watched, 2, -1) < 0) {
      if (errno == EINTR) continue;
      throw std::system_error(errno, std::system_category(), "cohort::guardian: poll");
    }
    if (watched[0].revents != 0) {
      char word = 0;
      const ssize_t n = ::recv(line, &word, 1, MSG_DONTWAIT);
      if (n == 1 && word == guardian_named) return;
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    }
    if (watched[0].revents != 0 || watched[1].revents != 0) {
      throw std::runtime_error("cohort::guardian: the guardian ended as it started");
    }
  }
}

}  // namespace

guardian::guardian() {
  const std::string prefix = detail::group_marker_prefix(::getpid());
  const std::string mark = detail::rank_mark_in_maps(::getpid());
  // A socket pair, not a pipe: the word end() sends cannot raise SIGPIPE
  // here when the guardian is gone.
  int ends[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ends) != 0) {
    const int error = errno;
    throw std::system_error(error, std::system_category(),
                            "cohort::guardian: socketpair" + os::descriptor_limit_note(error));
  }
  const int parent = config::pidfd_open(::getpid());  // -1 where refused: the line alone tells
  const auto close_ours = [&] {
    ::close(ends[0]);
    if (parent >= 0) ::close(parent);
  };
  // A guard page, the stack, the guardian's memory on the page above, and
  // the table of the ranks' process groups on the pages above that (pages
  // never written take no memory). A guardian that is a copy sees what is
  // written to the table after it started only in a shared mapping, which
  // costs cohort-run -n 1 about 8% of its start-to-exit time: a guardian
  // that shares this process's memory sees it anyway.
  const bool share = shares_memory();
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const auto pages = [page](std::size_t bytes) { return (bytes + page - 1) / page * page; };
  const std::size_t stack = pages(64 * 1024);
  memory_size_ = page + stack + page + pages(sizeof(rank_group_table));
  void* mapping = ::mmap(nullptr, memory_size_, PROT_READ | PROT_WRITE,
                         (share ? MAP_PRIVATE : MAP_SHARED) | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  if (mapping == MAP_FAILED) {
    const int error = errno;
    close_ours();
    ::close(ends[1]);
    throw std::system_error(error, std::system_category(), "cohort::guardian: mmap");
  }
  memory_ = mapping;
  ::mprotect(memory_, page, PROT_NONE);
  char* top = static_cast<char*>(memory_) + page + stack;
  auto* m = new (top) guardian_memory;
  m->line = ends[0];
  m->parent_end = ends[1];
  m->parent = parent;
  m->parent_pid = ::getpid();
  m->parent_start_time = os::start_time_of(::getpid()).value_or(0);
  owner_ = static_cast<pid_t>(m->parent_pid);
  m->pid_namespace = os::pid_namespace();
  m->prefix_size = std::min(prefix.size(), sizeof m->prefix);
  std::memcpy(m->prefix, prefix.data(), m->prefix_size);
  m->mark_size = std::min(mark.size(), sizeof m->mark);
  std::memcpy(m->mark, mark.data(), m->mark_size);
  auto* table = new (top + page) rank_group_table;  // default-initialized: the slots stay unwritten
  m->groups = table;

  // The guardian starts with every signal blocked.
  const std::uint64_t mask = os::set_signal_mask(~std::uint64_t{0});
  pid_ = ::clone(guard, top, SIGCHLD | CLONE_PIDFD | (share ? CLONE_VM : 0), m, &pidfd_);
  const int error = errno;
  os::set_signal_mask(mask);
  close_ours();
  if (pid_ < 0) {
    ::close(ends[1]);
    ::munmap(memory_, memory_size_);
    memory_ = nullptr;
    // The clone makes a pidfd as well as a process.
    throw std::system_error(error, std::system_category(), "cohort::guardian: clone" +
                                                               os::descriptor_limit_note(error) +
                                                               os::process_limit_note(error));
  }
  line_ = ends[1];
  // Its start time as this process reads it, beside this process's own.
  std::atomic_ref<std::uint64_t>(m->own_start_time)
      .store(os::start_time_of_child(pid_).value_or(0), std::memory_order_release);
  // The guardian's stack is no child's business: forks of this process
  // would otherwise copy it (and write-protect it for the guardian).
  ::madvise(memory_, memory_size_, MADV_DONTFORK);
  try {
    wait_until_named(line_, pidfd_);
    detail::own_pid(pid_);
    // The groups note their ranks and their process groups in this
    // guardian's table, unless an earlier guardian of this process's still
    // takes them; then from that one's end on.
    auto& r = registry();
    std::lock_guard lock(r.mutex);
    r.running.push_back(table);
    r.lines.emplace_back(table, line_);
    if (r.table == nullptr) {
      r.table = table;
      r.line = line_;
    }
  } catch (...) {
    end(false);
    throw;
  }
}

guardian::~guardian() { end(true); }

void guardian::release() noexcept { end(false); }

void guardian::end(bool look) noexcept {
  if (line_ < 0) return;
  if (::getpid() != owner_) {
    // A forked child's copy (a plain fork that exits through destructors):
    // the guardian is its parent's, not to be told to look or to end.
    ::close(std::exchange(line_, -1));
    ::close(std::exchange(pidfd_, -1));
    return;
  }
  // No group writes to this guardian's table from here on; it still reads
  // it. The next running guardian (the earliest started) takes its notes,
  // those of the groups running now with the rest: each group lets go of
  // its notes where they are then.
  if (auto* r = made_registry()) {
    std::lock_guard lock(r->mutex);
    const auto* mapping = static_cast<const char*>(memory_);
    const auto in_mapping = [&](const rank_group_table* table) {
      const auto* at = reinterpret_cast<const char*>(table);
      return at >= mapping && at < mapping + memory_size_;
    };
    std::erase_if(r->running, in_mapping);
    std::erase_if(r->lines, [&](const auto& entry) { return in_mapping(entry.first); });
    if (r->table != nullptr && in_mapping(r->table)) {
      rank_group_table* next = r->running.empty() ? nullptr : r->running.front();
      if (next != nullptr) {
        next->groups.take_from(r->table->groups);
        next->ranks.take_from(r->table->ranks);
        next->runs.take_from(r->table->runs);
      }
      r->table = next;
      r->line = r->lines.empty() ? -1 : r->lines.front().second;
    }
  }
  detail::send_start_note(line_, detail::start_note{look ? 'l' : 'r', {}, 0});
  ::close(line_);
  line_ = -1;
  // Waited for through its pidfd: a pid reaped elsewhere could name
  // another child of this process by now.
  siginfo_t info{};
  while (::waitid(static_cast<idtype_t>(config::p_pidfd), static_cast<id_t>(pidfd_), &info, WEXITED) < 0 && errno == EINTR) {
  }
  ::close(pidfd_);
  pidfd_ = -1;
  detail::disown_pid(pid_);
  // The guardian has ended (reaped here, or by whoever reaps this
  // process's children): its stack is free.
  ::munmap(memory_, memory_size_);
  memory_ = nullptr;
}

namespace detail {

bool note_rank_group(pid_t pgid) {
  auto* r = made_registry();
  if (pgid <= 0 || r == nullptr) return false;
  std::lock_guard lock(r->mutex);
  return r->table != nullptr && r->table->groups.add(pgid);
}

void forget_rank_group(pid_t pgid) {
  auto* r = made_registry();
  if (pgid <= 0 || r == nullptr) return;
  std::lock_guard lock(r->mutex);
  if (r->table != nullptr) r->table->groups.remove(pgid);
}

std::uint64_t note_rank(pid_t pid) {
  auto* r = made_registry();
  if (pid <= 0 || r == nullptr) return 0;
  {
    std::lock_guard lock(r->mutex);
    if (r->table == nullptr) return 0;  // no guardian: spares the read of /proc
  }
  // Read from a zombie too: a function rank is noted once every rank has
  // started, and one may have ended by then.
  const std::uint64_t start_time = os::start_time_of_child(pid).value_or(0);
  if (start_time == 0) return 0;
  const std::uint64_t record = rank_record(static_cast<std::uint64_t>(pid), start_time);
  std::lock_guard lock(r->mutex);
  return r->table != nullptr && r->table->ranks.add(record) ? record : 0;
}

void forget_rank(std::uint64_t note) {
  auto* r = made_registry();
  if (note == 0 || r == nullptr) return;
  std::lock_guard lock(r->mutex);
  if (r->table != nullptr) r->table->ranks.remove(note);
}

bool note_run(std::uint64_t marker) {
  auto* r = made_registry();
  if (marker == 0 || r == nullptr) return false;
  std::lock_guard lock(r->mutex);
  return r->table != nullptr && r->table->runs.add(marker);
}

void forget_run(std::uint64_t marker) {
  auto* r = made_registry();
  if (marker == 0 || r == nullptr) return;
  std::lock_guard lock(r->mutex);
  if (r->table != nullptr) r->table->runs.remove(marker);
}

os::owned_fd start_line() {
  auto* r = made_registry();
  if (r == nullptr) return {};
  std::lock_guard lock(r->mutex);
  // A copy: the guardian may end, and its line close, while ranks start.
  return os::owned_fd(r->line >= 0 ? ::fcntl(r->line, F_DUPFD_CLOEXEC, 3) : -1);
}

void start_guardians_as_copies(bool copies) { copies_only.store(copies, std::memory_order_relaxed); }

bool rank_group_noted(pid_t pgid) {
  auto* r = made_registry();
  if (r == nullptr) return false;
  std::lock_guard lock(r->mutex);
  return r->table != nullptr && pgid > 0 && r->table->groups.holds(pgid);
}

bool rank_noted(std::uint64_t note) {
  auto* r = made_registry();
  if (r == nullptr) return false;
  std::lock_guard lock(r->mutex);
  return r->table != nullptr && r->table->ranks.holds(note);
}

}  // namespace detail
}  // namespace cohort

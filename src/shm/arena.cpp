// The arena: carving blocks by size class from segments this process made,
// growing it, trimming it, and keeping it whole across fork.
#include "shm/arena.hpp"

#include "config.hpp"
#include "os/process_identity.hpp"
#include "os/spin_mutex.hpp"
#include "os/watcher.hpp"
#include "shm/fork.hpp"
#include "shm/keeper.hpp"
#include "shm/registry.hpp"

#include <fmt/format.h>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <limits>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

namespace cohort::shm {

namespace {

constexpr std::size_t first_arena = std::size_t{4} << 20;
constexpr std::size_t largest_arena = std::size_t{64} << 20;
// The least an arena's segment is made with where a larger one finds no
// room: it holds three blocks of the largest class.
constexpr std::size_t smallest_arena = std::size_t{1} << 20;
static_assert(smallest_arena >= 3 * (largest_class + sizeof(block_header)) + header_size);

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
  os::spin_mutex mutex;
  std::mutex growth;  // held while a segment is made for the arena
  std::vector<std::shared_ptr<segment>> arenas;
  std::vector<std::shared_ptr<segment>> lingering;
  bool watching = false;  // a watcher thread lets go of lingering segments as their holders free them
  bool ended = false;     // the work at exit is done: a segment given to linger() is looked at once
};

std::atomic<void (*)() noexcept> exit_work{nullptr};  // at_exit_first

// The work at exit, as the process's statics are destroyed: the upper
// layers' first (at_exit_first), then the arena's segments are retired (or
// let go of, when only ended processes hold them), and so are the large
// ones that linger.
struct arena_exit {
  arena_state& a;
  ~arena_exit() {
    if (const auto work = exit_work.load(std::memory_order_acquire)) work();
    sweep_fork_holds();
    std::vector<std::shared_ptr<segment>> arenas, lingering;
    {
      std::lock_guard lock(a.mutex);
      arenas.swap(a.arenas);
      lingering.swap(a.lingering);
      a.ended = true;
    }
    for (auto& s : arenas) {
      if (!let_go_if_dead_weight(s)) s->retire();
    }
    for (auto& s : lingering) let_go_if_dead_weight(s);
    unname_held_segments();
  }

  // A named segment of this process's that storages it never let go of
  // still hold (exit() skips their destructors) would keep its name for
  // good: nothing would take its count of blocks in use to 0. The name
  // goes now, unless a value in flight names it or another live process
  // maps it (which removes the name as it lets go: segment::orphaned).
  static void unname_held_segments() noexcept {
    std::vector<std::shared_ptr<segment>> own;
    try {
      auto& r = segments();
      std::lock_guard lock(r.mutex);
      for (auto& [nonce, weak] : r.segments) {
        auto s = weak.lock();
        if (s && s->strategy() == sharing_strategy::file_system && s->made_here()) own.push_back(std::move(s));
      }
    } catch (...) {
      return;  // no memory to list them: left as they were
    }
    for (const auto& s : own) {
      if (s->held_only_by_ended()) s->unlink_name();
    }
  }
};

// Moves the lingering segments whose last block was freed into `freed`,
// under the arena's lock.
void take_freed_lingering(arena_state& a, std::vector<std::shared_ptr<segment>>& freed) {
  std::erase_if(a.lingering, [&](auto& s) {
    if (s->header().live.load(std::memory_order_acquire) != 0) return false;
    freed.push_back(std::move(s));
    return true;
  });
}

// Never destroyed: a storage destroyed after the work at exit (a static
// made before the arena was) still finds it, and its segment is looked at
// then.
arena_state& arena() {
  static arena_state& a = *new arena_state;
  static const arena_exit at_exit{a};
  return a;
}

}  // namespace

void at_exit_first(void (*work)() noexcept) noexcept { exit_work.store(work, std::memory_order_release); }

// A fork child makes its own arena: the parent's goes on being carved by
// the parent, which also holds the descriptors others open.
COHORT_FORKED_CHILD_PATH void arena_after_fork_in_child() {
  os::forget_process_id();
  auto& r = segments();
  for (auto& [nonce, weak] : r.segments) {
    if (auto s = weak.lock()) s->note_mapper();
  }
  r.named_by_values.store(false, std::memory_order_relaxed);  // the parent's values name the parent
  r.mutex.unlock();
  auto& a = arena();
  std::vector<std::shared_ptr<segment>>().swap(a.arenas);
  std::vector<std::shared_ptr<segment>>().swap(a.lingering);
  a.watching = false;  // the parent's watcher is not this process's
  a.mutex.unlock();
  a.growth.unlock();
}

// The locks are held across the fork, the arena's first (the order
// allocate() takes them in), so the child finds neither a lock no thread of
// its own will release nor a list in the middle of a change. The arena is
// made for this if it was not: had the fork looked whether it exists,
// another thread could make it and take its lock between that look and the
// fork, and the child would find it held.
void lock_arena_for_fork() {
  arena().growth.lock();
  arena().mutex.lock();
  auto& r = segments();
  r.mutex.lock();
  // The child may send values that name this process's segments, which it
  // inherits mapped, without this process writing a handle of them.
  if (!r.segments.empty()) note_named_by_values(r);
}

void unlock_arena_after_fork() noexcept {
  segments().mutex.unlock();
  arena().mutex.unlock();
  arena().growth.unlock();
}

std::pair<std::shared_ptr<segment>, std::uint64_t> allocate(std::size_t nbytes) {
  const auto strategy = get_sharing_strategy();
  auto& a = arena();
  if (size_class_of(nbytes) == size_classes) {
    std::vector<std::shared_ptr<segment>> freed;  // unmapped after the lock is released
    {
      std::lock_guard lock(a.mutex);
      take_freed_lingering(a, freed);
    }
    // A file's size is an off_t: past that no segment can hold it (and the
    // rounding below would wrap).
    constexpr std::size_t page = 4096, most = std::numeric_limits<off_t>::max() - header_size - page;
    if (nbytes > most) {
      throw shm_error(fmt::format("cohort: a shared storage of {} bytes: larger than a segment can be", nbytes));
    }
    const std::size_t size = header_size + (nbytes + page - 1) / page * page;
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
  // Blocks held for plain forks' children that have gone may free room.
  if (sweep_fork_holds(false)) {
    if (auto found = carve(); found.first) return found;
  }
  // One thread grows the arena at a time, and a thread that waited for it
  // carves from what the other made rather than making one of its own.
  std::lock_guard growing(a.growth);
  if (auto found = carve(); found.first) return found;
  std::shared_ptr<segment> s;
  for (;;) {
    try {
      s = segment::make(size, strategy, true);
      break;
    } catch (const shm_error& e) {
      // No room for a segment as large as the arena grows by: a smaller one
      // may still hold what is asked. Past the smallest, the error names the
      // request, not the arena's size.
      if (size > smallest_arena) {
        size = std::max(smallest_arena, size / 2);
        continue;
      }
      std::string_view what = e.what();
      if (what.starts_with("cohort: ")) what.remove_prefix(8);
      throw shm_error(fmt::format("cohort: a shared storage of {} bytes: {}", nbytes, what), nbytes, e.available());
    }
  }
  const auto offset = s->carve(nbytes);
  std::lock_guard lock(a.mutex);
  a.arenas.push_back(s);
  return {std::move(s), offset};
}

namespace {

// How often the watcher looks at the lingering segments' counts of blocks in use.
constexpr std::chrono::milliseconds linger_check{100};

// Lets go of the lingering segments whose last block was freed (by the
// processes they were sent to); whether the watcher is done: none lingers,
// or the process ends. A sender that then sends nothing more, or idles,
// does not keep its last large tensor's memory.
bool look_at_lingering() {
  auto& a = arena();
  std::vector<std::shared_ptr<segment>> freed;  // unmapped after the lock is released
  std::lock_guard lock(a.mutex);
  if (a.ended) return true;  // the work at exit looks at them
  take_freed_lingering(a, freed);
  if (!a.lingering.empty()) return false;
  a.watching = false;
  return true;
}

// Starts the watcher, for which the caller set `watching`.
void watch_lingering(arena_state& a) noexcept {
  if (!os::start_watcher(linger_check, look_at_lingering)) {  // let go of at the next large allocation, or trim()
    std::lock_guard lock(a.mutex);
    a.watching = false;
  }
}

}  // namespace

void linger(std::shared_ptr<segment> s) {
  auto& a = arena();
  {
    std::lock_guard lock(a.mutex);
    if (!a.ended) {
      // Listed once, however many storages over its block end while others
      // hold it (one this process had, then one it decoded from a value
      // left in a queue, say): an entry more would be a pointer more to
      // it, and one that only ended processes hold is let go of only once
      // nothing but its entry points at it.
      if (std::find(a.lingering.begin(), a.lingering.end(), s) == a.lingering.end()) {
        a.lingering.push_back(std::move(s));
      } else {
        s.reset();  // not the last pointer: its entry holds one
      }
      if (a.watching) return;
      a.watching = true;
    }
  }
  if (s) {  // the work at exit is done
    let_go_if_dead_weight(s);
    return;
  }
  watch_lingering(a);
}

COHORT_FORKED_CHILD_PATH void wait_for_receivers(std::chrono::steady_clock::duration limit) noexcept {
  auto* known = segments_if_made();
  if (known == nullptr) return;  // no segment was ever mapped here
  std::vector<std::shared_ptr<segment>> made;
  {
    auto& r = *known;
    std::lock_guard lock(r.mutex);
    for (auto& [nonce, weak] : r.segments) {
      // A named segment is opened by name, with or without its maker.
      if (auto s = weak.lock(); s && s->made_here() && s->strategy() == sharing_strategy::file_descriptor) {
        made.push_back(std::move(s));
      }
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
  sweep_fork_holds();
  std::vector<std::shared_ptr<segment>> unused;
  {
    auto& r = segments();
    std::lock_guard lock(r.mutex);
    r.take_deferred(unused);
    release_kept_locked(unused);
    auto forgotten = r.forget_unused();
    unused.insert(unused.end(), forgotten.begin(), forgotten.end());
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
  // Out of the arena, nothing here carves them: a segment with no block
  // in use cannot get one meanwhile.
  std::erase_if(arenas, [](const auto& s) {
    if (!s->unused()) return let_go_if_dead_weight(s);
    s->retire();
    return true;
  });
  const auto kept = arenas.size() + lingering.size();
  bool watch = false;
  {
    std::lock_guard lock(a.mutex);
    a.arenas.insert(a.arenas.begin(), arenas.begin(), arenas.end());
    a.lingering.insert(a.lingering.end(), lingering.begin(), lingering.end());
    // The watcher may have looked while the list was out here, found it
    // empty and ended: what still lingers gets one again.
    if (!a.lingering.empty() && !a.watching && !a.ended) watch = a.watching = true;
  }
  if (watch) watch_lingering(a);
  // Of those let go of here, only the ones this is the last pointer to
  // go now: a segment kept for a rank that ended may still hold storages
  // of this process, and goes with the last of them.
  const auto going = std::count_if(unused.begin(), unused.end(), [](const auto& s) { return s.use_count() == 1; });
  return static_cast<int>(static_cast<std::size_t>(going) + before - kept);
}

}  // namespace cohort::shm

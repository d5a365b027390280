// Device arenas: chunks carved by size class, blocks that come back once
// their notes say every receiver is done, and the table of chunks made here.
#include "cuda/arena.hpp"

#include "cohort/cuda/error.hpp"
#include "cuda/driver.hpp"
#include "cuda/exchange.hpp"

#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <utility>
#include <vector>

namespace cohort::cuda::detail {
namespace {

// Blocks of 512 << k bytes, 512 B .. 1 MiB; larger tensors get a chunk of
// their own. 512 bytes, as torch's allocator rounds, keeps every block
// aligned for any element type and vector load.
constexpr int size_classes = 12;
constexpr std::size_t smallest = 512;

int class_of(std::size_t nbytes) {
  const auto units = std::max<std::size_t>(1, (nbytes + smallest - 1) / smallest);
  const int k = std::bit_width(units - 1);
  return k < size_classes ? k : -1;
}

std::atomic<std::uint64_t> next_chunk_id{1};

// Every chunk made here, by id, for receiving a tensor of one's own.
struct chunk_table {
  std::mutex mutex;
  std::map<std::uint64_t, std::weak_ptr<held_chunk>> chunks;
};
chunk_table& own_chunks() {
  static auto* t = new chunk_table;
  return *t;
}

struct arena {
  std::mutex mutex;
  int device = -1;
  sharing how = sharing::file_descriptor;
  std::size_t step = 0;  // the chunks' granularity
  // Chunks carved by class, with how many blocks each has given out.
  std::vector<std::pair<std::shared_ptr<held_chunk>, std::size_t>> carved;
  std::uint64_t bump = 0;  // in carved.back()
  std::vector<block> free_lists[size_classes];
  // Blocks their maker let go of that receivers or messages still hold.
  std::vector<block> pending;
  std::size_t scan_at = 16;
};

// The arenas made so far, by device; never destroyed: blocks may come back
// as statics are destroyed at exit.
struct arenas {
  std::mutex mutex;
  std::map<int, arena*> made;
};
arenas& all_arenas() {
  static auto* a = new arenas;
  return *a;
}

arena& arena_of(int device) {
  auto& all = all_arenas();
  std::lock_guard lock(all.mutex);
  if (const auto found = all.made.find(device); found != all.made.end()) return *found->second;
  // Whole before it is kept: a driver call that fails leaves no arena
  // without its granularity (a later division by zero).
  auto made = std::make_unique<arena>();
  made->device = device;
  made->how = preferred_sharing(device);
  made->step = granularity(device, made->how);
  all.made.emplace(device, made.get());
  return *made.release();
}

std::shared_ptr<held_chunk> make_chunk(arena& a, std::size_t size, bool single) {
  auto c = std::make_shared<held_chunk>();
  c->memory = chunk::create(a.device, size, a.how);
  c->maker = ::getpid();
  c->port = own_port();
  c->id = next_chunk_id.fetch_add(1, std::memory_order_relaxed);
  c->single = single;
  if (a.how == sharing::file_descriptor) {
    c->fd = c->memory.export_fd();
    serve_chunk(c->maker, c->port, c->id, c->fd);
  }
  auto& t = own_chunks();
  std::lock_guard lock(t.mutex);
  std::erase_if(t.chunks, [](const auto& entry) { return entry.second.expired(); });
  t.chunks[c->id] = c;
  return c;
}

cohort::storage make_note(const arena& a, const held_chunk& c, std::uint64_t offset, std::size_t capacity) {
  auto note = cohort::storage::allocate_shared(note_bytes);
  std::memset(note.data(), 0, note_bytes);
  chunk_note n{};
  n.magic = chunk_note::expected_magic;
  n.maker = static_cast<std::uint32_t>(c.maker);
  n.maker_port = c.port;
  n.chunk_id = c.id;
  n.chunk_size = c.memory.size();
  n.offset = offset;
  n.capacity = capacity;
  n.device = device_uuid(a.device).bytes;
  n.kind = static_cast<std::uint8_t>(a.how);
  n.single = c.single ? 1 : 0;
  if (a.how == sharing::ipc_handle) n.ipc = c.memory.ipc_handle();
  std::memcpy(note.data(), &n, sizeof n);
  return note;
}

// A note's counter at byte `at` of the note's bytes.
std::atomic_ref<std::uint64_t> counter(std::byte* note, std::size_t at) {
  return std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(note + at));
}
std::atomic_ref<std::uint64_t> counter(const cohort::storage& note, std::size_t at) { return counter(note.data(), at); }

bool settled(const cohort::storage& note) {
  // received first: a count of sent read after it can only be larger.
  const auto got = counter(note, note_received_at).load(std::memory_order_acquire);
  return counter(note, note_sent_at).load(std::memory_order_acquire) == got;
}

// The notes this process sent messages about, kept (each a hold on its
// block) until those messages are received; let go of in batches.
struct sent_notes {
  std::mutex mutex;
  std::vector<cohort::storage> notes;
  std::size_t prune_at = 64;
};
sent_notes& watched() {
  static auto* w = new sent_notes;
  return *w;
}

void prune_watched() {
  auto& w = watched();
  std::vector<cohort::storage> gone;  // dropped after the lock
  std::lock_guard lock(w.mutex);
  auto keep = std::partition(w.notes.begin(), w.notes.end(), [](const cohort::storage& n) { return !settled(n); });
  gone.assign(std::make_move_iterator(keep), std::make_move_iterator(w.notes.end()));
  w.notes.erase(keep, w.notes.end());
  w.prune_at = std::max<std::size_t>(64, w.notes.size() * 2);
}

// Whether only the maker's own hold of the block is left: no other
// process, no message in flight, and no other storage here over its note
// (a tensor of its own sent back to it).
bool only_maker_holds(const block& b) {
  return cohort::detail::shared_holders(b.note) <= 1 && b.note.use_count() == 1;
}

void free_block(arena& a, block&& b) {
  if (b.size_class >= 0) a.free_lists[b.size_class].push_back(std::move(b));
  // A chunk of its own goes with its last block.
}

// Frees the pending blocks nothing holds any more, and those held only by
// processes that have ended (a receiver killed with tensors in hand): such
// a block gets a new note, since the old one's holds never go. Cheap when
// called often: it looks only once the list has grown by half since the
// last look, and asks once per note segment whether its other holders
// have ended.
void scan_pending(arena& a, bool always) {
  if (!always && a.pending.size() < a.scan_at) return;
  prune_watched();
  std::vector<block> still;
  std::map<std::uint64_t, bool> dead_holders;  // by note segment
  for (auto& b : a.pending) {
    if (only_maker_holds(b)) {
      free_block(a, std::move(b));
      continue;
    }
    if (b.note.use_count() == 1) {
      const auto segment = cohort::detail::segment_of(b.note);
      auto [known, added] = dead_holders.try_emplace(segment, false);
      if (added) known->second = cohort::detail::only_ended_processes_share(b.note);
      if (known->second) {
        b.note = make_note(a, *b.chunk, b.offset, b.capacity);
        free_block(a, std::move(b));
        continue;
      }
    }
    still.push_back(std::move(b));
  }
  a.pending = std::move(still);
  a.scan_at = std::max<std::size_t>(16, a.pending.size() * 3 / 2);
}

block carve(arena& a, int k) {
  const std::size_t capacity = smallest << k;
  if (a.carved.empty() || a.bump + capacity > a.carved.back().first->memory.size()) {
    a.carved.emplace_back(make_chunk(a, std::max(a.step, capacity), false), 0);
    a.bump = 0;
  }
  auto& [c, given] = a.carved.back();
  block b;
  b.chunk = c;
  b.offset = a.bump;
  b.capacity = capacity;
  b.size_class = k;
  b.note = make_note(a, *c, b.offset, capacity);
  a.bump += capacity;
  ++given;
  return b;
}

// Releases the carved chunks whose every block is free; how many went.
int release_free_chunks(arena& a) {
  int released = 0;
  for (auto it = a.carved.begin(); it != a.carved.end();) {
    const held_chunk* c = it->first.get();
    std::size_t free = 0;
    for (const auto& list : a.free_lists) {
      free += static_cast<std::size_t>(std::count_if(list.begin(), list.end(), [c](const block& b) { return b.chunk.get() == c; }));
    }
    if (free != it->second) {
      ++it;
      continue;
    }
    for (auto& list : a.free_lists) std::erase_if(list, [c](const block& b) { return b.chunk.get() == c; });
    const bool was_last = std::next(it) == a.carved.end();
    it = a.carved.erase(it);
    if (was_last) a.bump = a.carved.empty() ? 0 : a.carved.back().first->memory.size();  // carve no more there
    ++released;
  }
  return released;
}

template <class F>
auto retry_when_full(arena& a, F&& make) {
  try {
    return make();
  } catch (const error&) {
    // Out of memory, maybe for what receivers have since let go of.
    scan_pending(a, true);
    if (release_free_chunks(a) == 0) throw;
    return make();
  }
}

}  // namespace

void note_sent(const cohort::storage& note) {
  counter(note, note_sent_at).fetch_add(1, std::memory_order_release);
  auto& w = watched();
  bool prune = false;
  {
    std::lock_guard lock(w.mutex);
    // The same note twice in a row (a tensor sent again and again) once.
    if (w.notes.empty() || !w.notes.back().same(note)) w.notes.push_back(note);
    prune = w.notes.size() >= w.prune_at;
  }
  if (prune) prune_watched();
}

void note_received(std::byte* note) noexcept {
  counter(note, note_received_at).fetch_add(1, std::memory_order_release);
}

bool made_ipc_notes_settled() noexcept {
  prune_watched();  // what is left is waited for
  auto& w = watched();
  std::lock_guard lock(w.mutex);
  const auto self = static_cast<std::uint32_t>(::getpid());
  return std::none_of(w.notes.begin(), w.notes.end(), [&](const cohort::storage& note) {
    chunk_note n;
    std::memcpy(&n, note.data(), sizeof n);
    return n.maker == self && n.kind == static_cast<std::uint8_t>(sharing::ipc_handle);
  });
}

bool sent_unreceived(pid_t maker, std::uint32_t port, std::uint64_t id) {
  auto& w = watched();
  std::lock_guard lock(w.mutex);
  return std::any_of(w.notes.begin(), w.notes.end(), [&](const cohort::storage& note) {
    chunk_note n;
    std::memcpy(&n, note.data(), sizeof n);
    return static_cast<pid_t>(n.maker) == maker && n.maker_port == port && n.chunk_id == id && !settled(note);
  });
}

held_chunk::~held_chunk() {
  if (fd >= 0) {
    stop_serving_chunk(maker, port, id, fd);
    ::close(fd);
  }
}

block allocate(int device, std::size_t nbytes, const char* entry) {
  check_device(device, entry);
  auto& a = arena_of(device);
  std::lock_guard lock(a.mutex);
  const int k = class_of(nbytes);
  if (k < 0) {
    scan_pending(a, false);  // large blocks that receivers are done with go first
    const std::size_t size = (nbytes + a.step - 1) / a.step * a.step;
    return retry_when_full(a, [&] {
      block b;
      b.chunk = make_chunk(a, size, true);
      b.capacity = b.chunk->memory.size();
      b.note = make_note(a, *b.chunk, 0, b.capacity);
      return b;
    });
  }
  auto& list = a.free_lists[k];
  if (list.empty()) scan_pending(a, false);
  if (!list.empty()) {
    block b = std::move(list.back());
    list.pop_back();
    return b;
  }
  return retry_when_full(a, [&] { return carve(a, k); });
}

void give_back(int device, block b) noexcept {
  auto& a = arena_of(device);
  std::lock_guard lock(a.mutex);
  try {
    if (only_maker_holds(b)) free_block(a, std::move(b));
    else a.pending.push_back(std::move(b));
  } catch (...) {
    // No room to note it: the block is lost to reuse, not to correctness.
  }
}

std::shared_ptr<held_chunk> own_chunk(std::uint64_t id) {
  auto& t = own_chunks();
  std::lock_guard lock(t.mutex);
  const auto found = t.chunks.find(id);
  return found == t.chunks.end() ? nullptr : found->second.lock();
}

int trim_arenas() {
  int released = 0;
  std::vector<arena*> made;
  {
    auto& all = all_arenas();
    std::lock_guard lock(all.mutex);
    for (const auto& [device, a] : all.made) made.push_back(a);
  }
  for (auto* a_ptr : made) {
    auto& a = *a_ptr;
    std::lock_guard lock(a.mutex);
    scan_pending(a, true);
    released += release_free_chunks(a);
  }
  return released;
}

}  // namespace cohort::cuda::detail

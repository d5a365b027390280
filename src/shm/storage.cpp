// cohort::storage: private bytes, or a block of shared memory; how a
// storage crosses to another process and is found again there.
#include "cohort/storage.hpp"
#include "config.hpp"

#include "shm/arena.hpp"
#include "shm/fork.hpp"
#include "shm/read_progress.hpp"
#include "shm/registry.hpp"
#include "shm/segment.hpp"
#include "os/spin_mutex.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>
#include <mutex>
#include <new>
#include <cstddef>
#include <utility>
#include <vector>

namespace cohort {

namespace detail {

class storage_impl {
 public:
  std::byte* data = nullptr;
  std::size_t nbytes = 0;
  std::shared_ptr<shm::segment> segment;  // null while private
  // Set once `segment`, `block` and `data` are final (made shared, or moved
  // there): read first by whoever may race a move on another thread.
  std::atomic<bool> shared{false};
  std::shared_ptr<const device_memory> device;  // set for device memory, whose bytes `data` points at
  std::uint64_t block = 0;
  // It holds no reference of its own: given up (a forked child ending), or
  // inherited by a plain fork's child, for which the parent holds it.
  bool let_go = false;
  // Borrowers of `data` through DLPack (tensor::to_dlpack) yet to call
  // their deleters: private bytes must not move into shared memory then.
  std::atomic<std::uint32_t> lent{0};
  // What a forked rank's end does for it first (at_forked_rank_end), and
  // what its own end does before its hold goes (at_last_release); guarded
  // by the identity table's lock.
  hold_work at_rank_end;
  hold_work at_last_release;
  // Its hold went early (let_go_unless_last): its end lets go of nothing.
  std::atomic<bool> released{false};

  storage_impl() = default;
  storage_impl(const storage_impl&) = delete;
  storage_impl& operator=(const storage_impl&) = delete;
  ~storage_impl();
};

}  // namespace detail

namespace {

using detail::storage_impl;

std::atomic<sharing_strategy> strategy{sharing_strategy::file_descriptor};

// Every shared storage of this process, by (segment nonce, block offset):
// what makes a storage received twice one storage, and what a forked child
// takes holds on.
struct block_key {
  std::uint64_t nonce;
  std::uint64_t block;
  bool operator==(const block_key&) const = default;
};
// Open addressing with linear probing over a power-of-two table: a
// storage's birth and death each look it up, and std::unordered_map's
// prime-modulo buckets cost a 64-bit division every time.
class identity_table {
 public:
  // The storage, and its address: while the table is locked, an entry
  // whose storage has not expired, or whose end waits for the lock (the
  // first thing it does), names a whole object.
  struct value_type {
    std::weak_ptr<storage_impl> weak;
    storage_impl* impl = nullptr;

    value_type& operator=(const std::shared_ptr<storage_impl>& p) noexcept {
      weak = p;
      impl = p.get();
      return *this;
    }
    std::shared_ptr<storage_impl> lock() const noexcept { return weak.lock(); }
    bool expired() const noexcept { return weak.expired(); }
  };

  /// The entry for `key`, made empty when there was none.
  value_type& operator[](const block_key& key) {
    if ((count_ + 1) * 4 > slots_.size() * 3) grow();
    auto i = home(key);
    while (slots_[i].used && !(slots_[i].key == key)) i = (i + 1) & mask();
    if (!slots_[i].used) {
      slots_[i].used = true;
      slots_[i].key = key;
      ++count_;
    }
    return slots_[i].value;
  }
  /// The entry for `key`, or null.
  value_type* find(const block_key& key) {
    const auto i = index_of(key);
    return i == npos ? nullptr : &slots_[i].value;
  }
  /// Removes `key`'s entry, shifting later entries of its run back so that
  /// every lookup still finds them without tombstones.
  void erase(const block_key& key) {
    auto hole = index_of(key);
    if (hole == npos) return;
    for (auto i = (hole + 1) & mask(); slots_[i].used; i = (i + 1) & mask()) {
      // Movable into the hole when its home is not in (hole, i].
      if (((i - home(slots_[i].key)) & mask()) >= ((i - hole) & mask())) {
        slots_[hole] = std::move(slots_[i]);
        hole = i;
      }
    }
    slots_[hole] = slot{};
    --count_;
  }
  /// Entries, some of them perhaps expired.
  std::size_t size() const { return count_; }
  template <class F>
  void for_each(F&& f) {
    for (auto& s : slots_) {
      if (s.used) f(s.key, s.value);
    }
  }

 private:
  struct slot {
    block_key key{};
    bool used = false;
    value_type value;
  };
  static constexpr std::size_t npos = ~std::size_t{0};
  std::size_t index_of(const block_key& key) const {
    if (slots_.empty()) return npos;
    for (auto i = home(key); slots_[i].used; i = (i + 1) & mask()) {
      if (slots_[i].key == key) return i;
    }
    return npos;
  }
  std::size_t mask() const { return slots_.size() - 1; }
  std::size_t home(const block_key& k) const {
    const std::uint64_t h = (k.nonce ^ (k.block * 0x9e3779b97f4a7c15ULL)) * 0xff51afd7ed558ccdULL;
    return static_cast<std::size_t>(h >> 32) & mask();
  }
  void grow() {
    std::vector<slot> old(std::max<std::size_t>(64, slots_.size() * 2));
    old.swap(slots_);
    count_ = 0;
    for (auto& s : old) {
      if (s.used) (*this)[s.key] = std::move(s.value);
    }
  }
  std::vector<slot> slots_;
  std::size_t count_ = 0;
};
struct identity_map {
  os::spin_mutex mutex;
  identity_table storages;
};
// Set once identities() has made the table: a process that never held a
// shared storage has none to let go of at its end, and need not allocate it.
std::atomic<identity_map*> identities_made{nullptr};

identity_map& identities() {
  static auto* m = [] {
    auto* made = new identity_map;  // outlives every static storage
    identities_made.store(made, std::memory_order_release);
    // exit() destroys no local: a queue that main() held, and that no other
    // process can pop from, would keep the values left in it, and their
    // file_system segments their names, for good.
    shm::at_exit_first(&detail::run_rank_end_work);
    return made;
  }();
  return *m;
}

void add_identity(const std::shared_ptr<storage_impl>& impl) {
  auto& m = identities();
  std::lock_guard lock(m.mutex);
  m.storages[{impl->segment->nonce(), impl->block}] = impl;
}

// Storage objects (with their shared_ptr counts, one allocation) are made
// and dropped for every tensor sent or received: each thread keeps up to
// `kept` freed ones for its next, rather than a trip through malloc. The
// list is freed when the thread ends; a storage dropped after that (by a
// thread-local destroyed later) goes back to the heap.
//
// The list is trivially destructible and initial-exec, so that reaching it
// is a few instructions: a thread-local with a destructor would be reached
// through a guard that costs a __tls_get_addr call each time. What frees it
// is a second thread-local, made with the thread's first give().
struct impl_cache {
  static constexpr int kept = 64;
  struct node {
    node* next;
  };
  node* head;
  int count;
  bool cleanup_registered;
  bool ended;  // the thread is ending and the list was freed

  void* take() noexcept {
    if (head == nullptr) return nullptr;
    --count;
    return std::exchange(head, head->next);
  }
  bool give(void* p) noexcept;
};
[[gnu::tls_model("initial-exec")]] thread_local impl_cache cached_impls{};

struct impl_cache_cleanup {
  ~impl_cache_cleanup() {
    auto& c = cached_impls;
    c.ended = true;
    while (c.head != nullptr) ::operator delete(std::exchange(c.head, c.head->next));
    c.count = 0;
  }
};

bool impl_cache::give(void* p) noexcept {
  if (ended || count == kept) return false;
  if (!cleanup_registered) {
    thread_local impl_cache_cleanup cleanup;
    (void)cleanup;
    cleanup_registered = true;
  }
  head = new (p) node{head};
  ++count;
  return true;
}

template <class T>
struct impl_allocator {
  using value_type = T;
  impl_allocator() = default;
  template <class U>
  impl_allocator(const impl_allocator<U>&) noexcept {}
  T* allocate(std::size_t n) {
    static_assert(sizeof(T) >= sizeof(void*));
    if (n == 1) {
      if (void* p = cached_impls.take()) return static_cast<T*>(p);
    }
    return static_cast<T*>(::operator new(n * sizeof(T)));
  }
  void deallocate(T* p, std::size_t n) noexcept {
    if (n == 1 && cached_impls.give(p)) return;
    ::operator delete(p);
  }
  template <class U>
  bool operator==(const impl_allocator<U>&) const noexcept { return true; }
};

std::shared_ptr<storage_impl> make_impl() { return std::allocate_shared<storage_impl>(impl_allocator<storage_impl>{}); }

std::shared_ptr<storage_impl> shared_impl(std::shared_ptr<shm::segment> segment, std::uint64_t block,
                                          std::size_t nbytes) {
  auto impl = make_impl();
  impl->data = segment->base() + block + sizeof(shm::block_header);
  impl->nbytes = nbytes;
  impl->segment = std::move(segment);
  impl->block = block;
  impl->shared.store(true, std::memory_order_relaxed);  // not yet seen by another thread
  return impl;
}

// A shared storage's handle, as written: fixed widths in this host's byte
// order rather than varints, since a handle is written and read for every
// tensor that crosses, and one aligned copy costs less than taking varints
// apart. 48 bytes, so that a small tensor's queue record (its head, this,
// and the tensor's layout) fills one cache line. The segment's size and
// inode are not sent: a receiver that has to open it takes the size from
// the file and checks the segment's header (magic, nonce, size) before
// trusting it.
struct handle_wire {
  std::uint8_t kind;      // 1; an empty storage is the single byte 0
  std::uint8_t strategy;  // sharing_strategy
  std::uint8_t message;   // 0/1: a queue message, which holds a reference of its own
  std::uint8_t zero;
  std::uint32_t source;    // the process to open the segment through
  std::uint32_t fd;        // its descriptor there, + 1 (0: none)
  std::uint32_t maker;     // the process that made the segment
  std::uint32_t maker_fd;  // its descriptor there, + 1
  std::uint32_t keeper;    // the sender's keeper (0: none), tried when the sender and the maker have ended
  std::uint64_t nonce;
  std::uint64_t block;     // offset of the block's header in it
  std::uint64_t nbytes;
};
static_assert(sizeof(handle_wire) == detail::handle_codec<storage>::handle_size);
static_assert(std::is_trivially_copyable_v<handle_wire>);

// Throws unless each pid and descriptor + 1 fits an int; one test for all
// four on the way of every handle read.
void check_bounded(const handle_wire& w) {
  constexpr auto most = static_cast<std::uint32_t>(INT_MAX);
  if (std::max({w.source, w.fd, w.maker, w.maker_fd, w.keeper}) <= most) return;
  const std::pair<std::uint32_t, std::string_view> fields[] = {{w.source, "pid"},
                                                               {w.fd, "descriptor"},
                                                               {w.maker, "maker's pid"},
                                                               {w.maker_fd, "maker's descriptor"},
                                                               {w.keeper, "keeper's pid"}};
  for (const auto& [v, what] : fields) {
    if (v > most) throw decode_error(fmt::format("cohort::decode: a storage handle's {} is {}", what, v));
  }
}

// Checks a shared storage's handle read whole (its kind byte included)
// and gives the segment it names. `from_queue_record`: whether the bytes
// are a queue's record, where every handle carries the queue's reference.
shm::segment_ref checked_ref(const handle_wire& w, bool from_queue_record) {
  if (w.strategy > 1) throw decode_error(fmt::format("cohort::decode: a sharing strategy {}", w.strategy));
  if (w.message > 1) throw decode_error("cohort::decode: a storage handle's message flag is not 0/1");
  // Only a queue's record carries the queue's reference with each handle:
  // a handle that claims one elsewhere would drop a reference nobody gave.
  if ((w.message == 1) != from_queue_record) {
    throw decode_error(w.message == 1 ? "cohort::decode: a storage handle claims a queue's reference outside a queue"
                                      : "cohort::decode: a queue's record holds a storage handle without its reference");
  }
  if (w.zero != 0) throw decode_error("cohort::decode: a storage handle's padding is not zero");
  check_bounded(w);
  shm::segment_ref ref;
  ref.strategy = static_cast<sharing_strategy>(w.strategy);
  ref.source = static_cast<int>(w.source);
  ref.fd = static_cast<int>(w.fd) - 1;
  ref.maker = static_cast<int>(w.maker);
  ref.maker_fd = static_cast<int>(w.maker_fd) - 1;
  ref.keeper = static_cast<int>(w.keeper);
  ref.nonce = w.nonce;
  return ref;
}

}  // namespace

namespace {

// The locks of moves into shared memory (move_lock), taken by the fork
// handlers with the rest: a child forked while another thread moved a
// storage would find that stripe held for good. Never destroyed, as the
// table.
std::array<std::mutex, 64>& move_stripes() {
  static auto& stripes = *new std::array<std::mutex, 64>;
  return stripes;
}

}  // namespace

// The stripes first: a move holds one as it takes the arena's and the
// table's locks.
void shm::lock_storages_for_fork() {
  for (auto& m : move_stripes()) m.lock();
  identities().mutex.lock();
}

void shm::unlock_storages_after_fork() noexcept {
  identities().mutex.unlock();
  for (auto& m : move_stripes()) m.unlock();
}

shm::storage_list shm::live_storages_locked() {
  storage_list live;
  auto& table = identities().storages;
  live.reserve(table.size());
  // No storage is copied: a copy made here could be the last, and its end
  // takes the lock this thread holds.
  table.for_each([&live](const block_key&, const identity_table::value_type& entry) {
    if (!entry.expired()) live.push_back({entry.weak, entry.impl});
  });
  return live;
}

void shm::hold_for_child(storage_list& live) noexcept {
  for (auto& s : live) {
    s.held = !s.weak.expired();
    if (s.held) s.impl->segment->block(s.impl->block).refs.fetch_add(1, std::memory_order_relaxed);
  }
}

void shm::release_for_child(const storage_list& live) noexcept {
  // The references hold_for_child took: the block's other holders (this
  // process's own among them, given back by a storage's end only once
  // the table is unlocked) keep it.
  for (const auto& s : live) {
    if (s.held) s.impl->segment->release(s.impl->block);
  }
}

std::vector<shm::block_hold> shm::holds_of(const storage_list& live) {
  std::vector<block_hold> holds;
  holds.reserve(live.size());
  for (const auto& s : live) {
    if (!s.weak.expired() && !s.impl->let_go) holds.push_back({s.impl->segment, s.impl->block});
  }
  return holds;
}

COHORT_FORKED_CHILD_PATH void shm::borrow_in_child(const storage_list& live) noexcept {
  for (const auto& s : live) {
    if (!s.weak.expired()) s.impl->let_go = true;
  }
}

COHORT_FORKED_CHILD_PATH void shm::own_in_child(const storage_list& live) noexcept {
  for (const auto& s : live) {
    if (!s.held) continue;
    // One dropped by another thread of the parent between the reference
    // and the fork: nothing here owns it, and its end never runs here.
    if (s.weak.expired()) {
      s.impl->segment->release(s.impl->block);
    } else {
      s.impl->let_go = false;
    }
  }
}

// Each inherited storage gets a reference of the child's own, so the
// parent freeing its copy frees nothing under it from then on.
COHORT_FORKED_CHILD_PATH void shm::hold_inherited_in_child() {
  identities().storages.for_each([](const block_key&, identity_table::value_type& weak) {
    if (auto impl = weak.lock(); impl && !impl->let_go) {
      impl->segment->block(impl->block).refs.fetch_add(1, std::memory_order_relaxed);
    }
  });
}

detail::storage_impl::~storage_impl() {
  if (!segment) {
    if (!device) std::free(data);
    return;
  }
  {
    auto& m = identities();
    std::lock_guard lock(m.mutex);
    const block_key key{segment->nonce(), block};
    if (auto* weak = m.storages.find(key); weak != nullptr && weak->expired()) m.storages.erase(key);
  }
  if (let_go) return;
  if (!released.load(std::memory_order_acquire) && at_last_release.run != nullptr) {
    // Work set by at_last_release: a storage of its own takes the hold
    // over, for the work to read the block with. It is in no table: a
    // handle of the block received meanwhile is a storage of its own, with
    // a hold of its own.
    std::shared_ptr<storage_impl> heir;
    try {
      heir = shared_impl(segment, block, nbytes);
    } catch (...) {
      // No memory for it: the hold goes here, as without work.
    }
    if (heir) {
      // Nor the segment: what this end would do for it after the hold
      // goes (a descriptor given up, say) the heir's end does.
      segment.reset();
      at_last_release.run(storage(std::move(heir)), at_last_release.context);
      return;
    }
  }
  const bool own_segment = segment->block(block).size_class == shm::size_classes;
  if (!released.load(std::memory_order_acquire)) segment->release(block);
  // Others may still have to open a segment of its own that this process
  // made: it stays open here until they have freed it.
  if (own_segment && segment->made_here() &&
      segment->header().live.load(std::memory_order_acquire) > 0) {
    shm::linger(std::move(segment));
  } else if (own_segment && !segment->made_here() && segment->header().live.load(std::memory_order_acquire) == 0) {
    // A segment of its own that another process made, its block freed:
    // nothing can name it again, and its memory goes once every process
    // has unmapped it. (Not asked of an arena's blocks: the count's line
    // is the maker's, written with every block it carves.)
    shm::forget_received(*segment);
  } else if (segment.use_count() == 2 && segment->may_give_up_descriptor()) {
    // The last storage here over a segment another process made, which
    // the registry keeps mapped: no value this process passed on needs its
    // descriptor any more, and a cache holds none.
    segment->give_up_descriptor();
  }
}

void set_sharing_strategy(sharing_strategy s) noexcept { strategy.store(s, std::memory_order_relaxed); }
sharing_strategy get_sharing_strategy() noexcept { return strategy.load(std::memory_order_relaxed); }
std::string_view to_string(sharing_strategy s) noexcept {
  return s == sharing_strategy::file_system ? "file_system" : "file_descriptor";
}

int trim_shared_memory() { return shm::trim(); }

storage storage::allocate(std::size_t nbytes) {
  if (nbytes > std::numeric_limits<std::size_t>::max() - (shm::alignment - 1)) throw std::bad_alloc();  // rounded up below
  auto impl = make_impl();
  if (nbytes > 0) {
    impl->data = static_cast<std::byte*>(
        std::aligned_alloc(shm::alignment, (nbytes + shm::alignment - 1) / shm::alignment * shm::alignment));
    if (impl->data == nullptr) throw std::bad_alloc();
  }
  impl->nbytes = nbytes;
  return storage(std::move(impl));
}

storage storage::allocate_shared(std::size_t nbytes) {
  auto [segment, block] = shm::allocate(nbytes);
  auto impl = shared_impl(std::move(segment), block, nbytes);
  add_identity(impl);
  return storage(std::move(impl));
}

// A shared one of no bytes has a place in its segment all the same.
std::byte* storage::data() const noexcept { return impl_ && impl_->nbytes != 0 ? impl_->data : nullptr; }
std::size_t storage::nbytes() const noexcept { return impl_ ? impl_->nbytes : 0; }
bool storage::is_shared() const noexcept {
  return impl_ && (impl_->shared.load(std::memory_order_acquire) || impl_->device);
}

namespace {

// The segment of a storage in shared memory; null for a private storage
// (or one being moved there on another thread) and for a device's.
const shm::segment* shared_segment(const storage_impl* impl) noexcept {
  return impl && impl->shared.load(std::memory_order_acquire) ? impl->segment.get() : nullptr;
}

// A private storage moves into shared memory once, whichever thread sends
// a tensor over it first: moves, and loans of its bytes (to_dlpack), take
// the lock of its stripe. Storages apart seldom share one.
std::mutex& move_lock(const storage_impl* impl) noexcept {
  auto& stripes = move_stripes();
  return stripes[(reinterpret_cast<std::uintptr_t>(impl) / alignof(storage_impl)) % stripes.size()];
}

}  // namespace

void storage::share_memory() {
  if (!impl_ || impl_->device || impl_->nbytes == 0 || impl_->shared.load(std::memory_order_acquire)) return;
  std::lock_guard lock(move_lock(impl_.get()));
  if (impl_->shared.load(std::memory_order_relaxed)) return;  // moved by another thread meanwhile
  if (impl_->lent.load(std::memory_order_acquire) > 0) {
    throw std::logic_error(
        "cohort: a private tensor's bytes are lent through DLPack (to_dlpack) and cannot move into shared memory "
        "while the borrower holds them: share it (share_memory, or {.shared = true}) before exporting it");
  }
  auto [segment, block] = shm::allocate(impl_->nbytes);
  auto* data = segment->base() + block + sizeof(shm::block_header);
  std::memcpy(data, impl_->data, impl_->nbytes);
  std::free(std::exchange(impl_->data, data));
  impl_->segment = std::move(segment);
  impl_->block = block;
  impl_->shared.store(true, std::memory_order_release);
  add_identity(impl_);
}

namespace detail {

void lend_bytes(const storage& s) noexcept {
  if (!s.impl_) return;
  // A private storage's loan waits out a move under way: the borrower reads `data` after this.
  std::unique_lock<std::mutex> not_amid_a_move;
  if (!s.is_shared()) not_amid_a_move = std::unique_lock(move_lock(s.impl_.get()));
  s.impl_->lent.fetch_add(1, std::memory_order_acq_rel);
}

void end_loan(const storage& s) noexcept {
  if (s.impl_) s.impl_->lent.fetch_sub(1, std::memory_order_acq_rel);
}

namespace {

// The device layers' readers, by DLPack device type.
std::atomic<device_handle_reader> device_readers[device_types];
std::atomic<device_receivers_wait> device_waits[device_types];
std::atomic<device_unread_drop> device_drops[device_types];

}  // namespace

void register_device_reader(int device_type, device_handle_reader read, device_receivers_wait wait,
                            device_unread_drop drop) noexcept {
  if (!registrable_device_type(device_type)) return;
  device_readers[device_type].store(read, std::memory_order_release);
  device_waits[device_type].store(wait, std::memory_order_release);
  device_drops[device_type].store(drop, std::memory_order_release);
}

COHORT_FORKED_CHILD_PATH void wait_for_device_receivers(std::chrono::steady_clock::duration limit) noexcept {
  for (auto& slot : device_waits) {
    if (const auto wait = slot.load(std::memory_order_acquire)) wait(limit);
  }
}

storage make_device_storage(std::shared_ptr<const device_memory> memory) {
  auto impl = make_impl();
  impl->data = memory->data();
  impl->nbytes = memory->nbytes();
  impl->device = std::move(memory);
  return storage(std::move(impl));
}

bool only_ended_processes_share(const storage& s) noexcept {
  const auto* segment = shared_segment(s.impl_.get());
  return segment && segment->made_here() && segment->held_only_by_ended();
}

std::uint64_t segment_of(const storage& s) noexcept {
  const auto* segment = shared_segment(s.impl_.get());
  return segment ? segment->nonce() : 0;
}

const device_memory* device_memory_of(const storage& s) noexcept { return s.impl_ ? s.impl_->device.get() : nullptr; }

std::size_t handle_codec<storage>::size_bound(const storage& s) noexcept {
  if (const auto* device = device_memory_of(s)) return 2 + device->handle_bound();
  return handle_size;
}

void handle_codec<storage>::write(std::vector<std::byte>& out, const storage& value) {
  if (const auto* device = device_memory_of(value)) {
    out.push_back(std::byte{2});
    out.push_back(static_cast<std::byte>(device->device_type()));
    const auto start = out.size();
    const auto places = current_handles != nullptr ? current_handles->handle_at.size() : 0;
    device->write(out);
    // Its first handle's place marked: a receiver that never reaches it
    // hands the whole of it to the device layer's drop.
    if (current_handles != nullptr && current_handles->handle_at.size() > places &&
        current_handles->handle_at[places] == start) {
      current_handles->handle_at[places] |= device_record_place;
    }
    return;
  }
  // An empty storage not in shared memory crosses as nothing but its kind;
  // a shared one, which a receiver may hold twice, as itself.
  if (value.nbytes() == 0 && !value.is_shared()) {
    out.push_back(std::byte{0});
    return;
  }
  auto impl = value.impl_;
  // A private one's bytes move (once, whichever thread sends first).
  if (!shared_segment(impl.get())) storage(impl).share_memory();
  shm::note_named_by_values(shm::segments());  // this process's end may have descriptors to hand over
  const auto ref = impl->segment->pass_on();
  const bool message = current_handles != nullptr && current_handles->message;
  if (message) {
    // A place needs 31 bits: the top one marks a device storage's handle.
    if (out.size() >= device_record_place) {
      throw std::length_error(fmt::format(
          "cohort: a storage handle {} bytes into a value's encoding, past the 2 GiB a queue's record can name",
          out.size()));
    }
    current_handles->handle_at.push_back(static_cast<std::uint32_t>(out.size()));
  }
  const handle_wire w{1, static_cast<std::uint8_t>(ref.strategy), message, 0,
                      static_cast<std::uint32_t>(ref.source), static_cast<std::uint32_t>(ref.fd + 1),
                      static_cast<std::uint32_t>(ref.maker), static_cast<std::uint32_t>(ref.maker_fd + 1),
                      static_cast<std::uint32_t>(ref.keeper), ref.nonce, impl->block, impl->nbytes};
  const auto* bytes = reinterpret_cast<const std::byte*>(&w);
  out.insert(out.end(), bytes, bytes + sizeof w);  // not resize: it would zero the room first
  if (current_handles != nullptr) current_handles->held.push_back(std::move(impl));
}

storage handle_codec<storage>::read(reader& in) {
  const auto kind = std::to_integer<unsigned>(in.next());
  if (kind == 0) return storage();
  if (kind == 2) {
    const auto type = std::to_integer<int>(in.next());
    const auto read = type < device_types ? device_readers[type].load(std::memory_order_acquire) : nullptr;
    if (read == nullptr) {
      throw decode_error(fmt::format(
          "cohort::decode: a storage on a device of DLPack type {}, and no device layer for it is loaded in this "
          "process (link libcohort-cuda)",
          type));
    }
    shm::note_read_progress(in.data(), shm::progress_unknown);
    storage device = read(in);
    shm::note_read_progress(in.data(), static_cast<std::uint32_t>(in.position()));
    return device;
  }
  if (kind != 1) throw decode_error(fmt::format("cohort::decode: a storage handle of kind {}", kind));
  const auto place = in.position() - 1;
  if (in.left() < sizeof(handle_wire) - 1) throw decode_error("cohort::decode: the input ends early");
  handle_wire w;
  w.kind = 1;
  std::memcpy(reinterpret_cast<std::byte*>(&w) + 1, in.take(sizeof w - 1).data(), sizeof w - 1);
  const auto ref = checked_ref(w, in.from_queue_record());
  const auto block = w.block;
  const auto nbytes = w.nbytes;
  const unsigned message = w.message;
  auto segment = shm::segment::open(ref);
  // Taken from here on (its place is below the note): killed while it
  // opened the segment, whoever lets go for this process's claim lets go
  // of it too.
  shm::note_read_progress(in.data(), static_cast<std::uint32_t>(place + 1));
  if (message == 1) segment->header().received.fetch_add(1, std::memory_order_release);
  if (!segment->holds(block, nbytes)) {
    throw decode_error(fmt::format(
        "cohort::decode: a storage of {} bytes at {} is no block of its {}-byte segment that holds as many",
        nbytes, block, segment->size()));
  }
  auto& refs = segment->block(block).refs;
  // A message holds the block until it is received: none is left on one freed.
  if (message == 1 && refs.load(std::memory_order_acquire) == 0) {
    throw decode_error(fmt::format("cohort::decode: a message names the block at {}, already freed", block));
  }
  auto& m = identities();
  std::unique_lock lock(m.mutex);
  const block_key key{ref.nonce, block};
  auto& slot = m.storages[key];
  if (auto impl = slot.lock()) {
    lock.unlock();
    // This process holds it already: the message's reference goes, whether
    // the handle is taken or refused (past it, nothing else lets go of it).
    if (message == 1) segment->release(block);
    if (impl->nbytes != nbytes) {
      throw decode_error(fmt::format("cohort::decode: a storage of {} bytes names one of {} bytes", nbytes, impl->nbytes));
    }
    return storage(std::move(impl));
  }
  try {
    if (message == 0) {
      // An argument: the sender holds the block while receivers take theirs.
      auto n = refs.load(std::memory_order_relaxed);
      do {
        if (n == 0) throw shm_error("cohort: a storage handle names a block already freed");
      } while (!refs.compare_exchange_weak(n, n + 1, std::memory_order_relaxed));
    }
    auto impl = shared_impl(std::move(segment), block, nbytes);
    slot = impl;
    return storage(std::move(impl));
  } catch (...) {
    m.storages.erase(key);  // a handle refused leaves no empty entry behind
    throw;
  }
}

}  // namespace detail

[[gnu::tls_model("initial-exec")]] thread_local shm::read_progress shm::current_read_progress{};

namespace detail {

std::size_t storage_identities() {
  auto& m = identities();
  std::lock_guard lock(m.mutex);
  return m.storages.size();
}

void hold_for_message(handle_context& context) noexcept {
  for (const auto& impl : context.held) {
    impl->segment->block(impl->block).refs.fetch_add(1, std::memory_order_relaxed);
    impl->segment->header().sent.fetch_add(1, std::memory_order_relaxed);
  }
  context.if_unsent.clear();  // sent: what the writers counted stands
}

void drop_unread_handle(std::span<const std::byte> handle) noexcept {
  if (handle.size() < sizeof(handle_wire) || handle[0] != std::byte{1}) return;
  try {
    handle_wire w;
    std::memcpy(&w, handle.data(), sizeof w);
    const auto ref = checked_ref(w, true);
    const auto segment = shm::segment::open(ref);
    segment->header().received.fetch_add(1, std::memory_order_release);
    if (segment->holds(w.block, w.nbytes)) segment->release(w.block);
  } catch (...) {
    // Its segment is gone (with the reference), or the handle is not one.
  }
}

void end_handle_record(std::vector<std::byte>& bytes, const std::vector<std::uint32_t>& handle_at) {
  const auto count = static_cast<std::uint32_t>(handle_at.size());
  const auto* places = reinterpret_cast<const std::byte*>(handle_at.data());
  bytes.insert(bytes.end(), places, places + handle_at.size() * sizeof(std::uint32_t));
  const auto* n = reinterpret_cast<const std::byte*>(&count);
  bytes.insert(bytes.end(), n, n + sizeof count);
}

namespace {

// The `i`th place of a record's end, as written (device_record_place may
// be set).
std::uint32_t place_at(std::span<const std::byte> places, std::size_t i) noexcept {
  std::uint32_t at = 0;
  std::memcpy(&at, places.data() + i * sizeof at, sizeof at);
  return at;
}

// The places a record's end names, checked: each handle whole inside the
// value, in order.
std::span<const std::byte> handle_places(std::span<const std::byte> record, std::span<const std::byte>& value) {
  std::uint32_t count = 0;
  if (record.size() < sizeof count) throw decode_error("cohort::decode: a record too short for its end");
  std::memcpy(&count, record.data() + record.size() - sizeof count, sizeof count);
  const std::size_t end = std::size_t{count} * sizeof(std::uint32_t) + sizeof count;
  if (count > record.size() / sizeof(std::uint32_t) || end > record.size()) {
    throw decode_error(fmt::format("cohort::decode: a record of {} bytes names {} handles", record.size(), count));
  }
  value = record.first(record.size() - end);
  const auto places = record.subspan(value.size(), end - sizeof count);
  std::uint64_t next = 0;  // where the next handle may start
  for (std::size_t i = 0; i < count; ++i) {
    const auto at = place_at(places, i) & ~device_record_place;
    if (at < next || at + std::uint64_t{handle_codec<storage>::handle_size} > value.size()) {
      throw decode_error(fmt::format("cohort::decode: a record names a handle at {} of a {}-byte value", at, value.size()));
    }
    next = at + std::uint64_t{handle_codec<storage>::handle_size};
  }
  return places;
}

}  // namespace

std::span<const std::byte> record_value(std::span<const std::byte> record) {
  std::span<const std::byte> value;
  handle_places(record, value);
  return value;
}

void drop_unread_handles(std::span<const std::byte> record, std::size_t read) noexcept {
  // A claimed record's decode that failed: killed in here, nothing is let
  // go of twice.
  shm::note_read_progress(record.data(), shm::progress_unknown);
  try {
    std::span<const std::byte> value;
    const auto places = handle_places(record, value);
    for (std::size_t i = 0; i < places.size() / sizeof(std::uint32_t); ++i) {
      const auto place = place_at(places, i);
      const auto at = place & ~device_record_place;
      if (at < read) continue;
      if (place & device_record_place && at >= 2 && value[at - 2] == std::byte{2} && value[at] == std::byte{1}) {
        const auto type = std::to_integer<int>(value[at - 1]);
        if (const auto drop = type < device_types ? device_drops[type].load(std::memory_order_acquire) : nullptr) {
          drop(value.subspan(at));
          continue;
        }
      }
      drop_unread_handle(value.subspan(at, handle_codec<storage>::handle_size));
    }
  } catch (...) {
    // A record whose end was already refused: nothing named to let go of.
  }
}

void drop_unread_in_block(std::span<const std::byte> record, std::size_t read, bool taken) noexcept {
  try {
    std::span<const std::byte> value;
    const auto places = handle_places(record, value);
    if (places.size() != sizeof(std::uint32_t) || (place_at(places, 0) & device_record_place) != 0) return;
    const auto handle = value.subspan(place_at(places, 0));
    if (handle.size() < sizeof(handle_wire) || handle[0] != std::byte{1}) return;
    handle_wire w;
    std::memcpy(&w, handle.data(), sizeof w);
    const auto segment = shm::segment::open(checked_ref(w, true));
    if (!taken) segment->header().received.fetch_add(1, std::memory_order_release);
    if (!segment->holds(w.block, w.nbytes)) return;
    drop_unread_handles({segment->base() + w.block + sizeof(shm::block_header), w.nbytes}, read);
    segment->release(w.block);
  } catch (...) {
    // Its segment is gone (with the references), or the record is not one.
  }
}

std::vector<storage> held_storages(const encoded& value) {
  const auto& held = encoded_holds::of(value);
  if (!held) return {};
  // encode() made it: the storages its handles named.
  const auto& impls = *static_cast<const std::vector<std::shared_ptr<storage_impl>>*>(held.get());
  std::vector<storage> storages;
  storages.reserve(impls.size());
  for (const auto& impl : impls) storages.push_back(storage(impl));
  return storages;
}

std::vector<std::byte> hold_for_receiver(const encoded& value) {
  const auto storages = held_storages(value);
  if (storages.empty()) return {};
  handle_context holds{true, {}, {}, {}};
  std::vector<std::byte> record;
  try {
    {
      handle_scope scope(holds);
      write(record, storages);
    }
    end_handle_record(record, holds.handle_at);
  } catch (...) {
    undo_unsent(holds);
    throw;
  }
  hold_for_message(holds);
  return record;
}

void take_holds(encoded& value, std::span<const std::byte> record) {
  auto storages =
      read_handle_record<std::vector<storage>>(record, "cohort::decode: bytes follow the storages a value holds");
  encoded_holds::set(value, std::make_shared<const std::vector<storage>>(std::move(storages)));
}

std::uint32_t shared_holders(const storage& s) noexcept {
  const auto* segment = shared_segment(s.impl_.get());
  if (segment == nullptr) return 0;  // private, or a device's
  return segment->block(s.impl_->block).refs.load(std::memory_order_acquire);
}

namespace {

// Sets `work` as the `which` work of `impl`, a shared storage's, unless
// some is set already.
void set_hold_work(storage_impl* impl, hold_work storage_impl::*which, hold_work work) noexcept {
  if (shared_segment(impl) == nullptr) return;
  auto& m = identities();
  std::lock_guard lock(m.mutex);
  if ((impl->*which).run == nullptr) impl->*which = work;
}

}  // namespace

void at_forked_rank_end(const storage& s, hold_work work) noexcept {
  set_hold_work(s.impl_.get(), &storage_impl::at_rank_end, work);
}

void at_last_release(const storage& s, hold_work work) noexcept {
  set_hold_work(s.impl_.get(), &storage_impl::at_last_release, work);
}

bool let_go_unless_last(const storage& s) noexcept {
  auto* impl = s.impl_.get();
  const auto* segment = shared_segment(impl);
  if (segment == nullptr) return false;
  if (impl->let_go || impl->released.load(std::memory_order_acquire)) return true;  // none held here
  auto& refs = impl->segment->block(impl->block).refs;
  auto n = refs.load(std::memory_order_acquire);
  do {
    if (n <= 1) return false;
  } while (!refs.compare_exchange_weak(n, n - 1, std::memory_order_acq_rel, std::memory_order_acquire));
  impl->released.store(true, std::memory_order_release);
  return true;
}

// Outside the table's lock: the work may receive and drop values (a
// queue's last holder drains it), which takes the lock.
COHORT_FORKED_CHILD_PATH void run_rank_end_work() noexcept {
  auto* known = identities_made.load(std::memory_order_acquire);
  if (known == nullptr) return;  // no shared storage was ever held here
  auto& m = *known;
  std::vector<std::pair<std::shared_ptr<storage_impl>, hold_work>> work;
  try {
    std::lock_guard lock(m.mutex);
    m.storages.for_each([&work](const block_key&, identity_table::value_type& weak) {
      if (auto impl = weak.lock(); impl && !impl->let_go && impl->at_rank_end.run != nullptr) {
        const auto w = impl->at_rank_end;
        work.emplace_back(std::move(impl), w);
      }
    });
  } catch (...) {
    // No memory for the list: the work is left undone, as a killed rank leaves it.
  }
  for (const auto& [impl, w] : work) w.run(storage(impl), w.context);
}

COHORT_FORKED_CHILD_PATH void release_shared_memory_holds() noexcept {
  shm::sweep_fork_holds();
  run_rank_end_work();
  auto* known = identities_made.load(std::memory_order_acquire);
  if (known == nullptr) return;
  auto& m = *known;
  // Dropped after the lock: another thread may let go of a storage
  // meanwhile, leaving the copy here the last, whose end takes the lock.
  std::vector<std::shared_ptr<storage_impl>> seen;
  std::lock_guard lock(m.mutex);
  m.storages.for_each([&seen](const block_key&, identity_table::value_type& weak) {
    if (auto impl = weak.lock(); impl && !impl->let_go) {
      impl->let_go = true;
      if (!impl->released.load(std::memory_order_acquire)) impl->segment->release(impl->block);
      seen.push_back(std::move(impl));
    }
  });
}

}  // namespace detail

}  // namespace cohort

// The untyped queue behind cohort::queue<T>: a ring of records in shared
// memory, with a process-shared lock for pushes and another for pops that
// outlive a holder killed in them, futex words that a side sleeps on only
// when it has to, and a waker that enters the kernel only when the other
// side sleeps.
#include "cohort/queue.hpp"

#include "cohort/when_any.hpp"
#include "queue/peers.hpp"
#include "queue/strand_race.hpp"
#include "queue/spin_budget.hpp"
#include "os/deadline.hpp"
#include "os/fence.hpp"
#include "os/futex.hpp"
#include "os/process_identity.hpp"
#include "os/spin_mutex.hpp"
#include "shm/fork.hpp"
#include "shm/keeper.hpp"
#include "shm/read_progress.hpp"
#include "shm/registry.hpp"
#include "shm/segment.hpp"
#include "shm/shared_lock.hpp"
#include "uring/futex.hpp"

#include <asio/experimental/awaitable_operators.hpp>
#include <asio/steady_timer.hpp>
#include <asio/multiple_exceptions.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <fmt/format.h>

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <climits>
#include <cstring>
#include <exception>
#include <new>
#include <optional>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

namespace cohort::detail {

namespace {

// "chtqueu5": the layout with a lock for each side, a peer table of 256,
// the pops' claims, the counts of records of more than two lines and a
// line past the ring; a queue of a layout before ("chtqueue" to
// "chtqueu4") is refused rather than misread.
constexpr std::uint64_t magic = 0x3575657571746863ULL;
constexpr std::uint32_t skip = 0xffffffffU;             // the rest of the ring is unused: wrap
constexpr std::uint32_t overflowed = 1;                 // the record is a storage holding the value
// How long a wait sleeps before it looks at whether the other side is
// still there.
constexpr auto watch_interval = std::chrono::milliseconds(100);
// A pop wakes the producers asleep on a full queue only once it has drained
// to half: one wake for half a ring of pushes, not one for each. They look
// again this often while asleep, so that room left by consumers that stop
// above half is found that late at worst.
constexpr auto room_check = std::chrono::milliseconds(1);
// Spins until `ready()` or `until`; whether ready.
template <class Ready>
bool spin_until(std::chrono::steady_clock::time_point until, Ready ready) {
  for (unsigned i = 0;; ++i) {
    if (ready()) return true;
    os::cpu_relax();
    if (i % 16 == 15 && std::chrono::steady_clock::now() >= until) return false;
  }
}

std::uint64_t hash_of(std::string_view s) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ULL;
  return h;
}

// Records take whole cache lines: a producer writing one record and a
// consumer reading the one before it then never share a line.
constexpr std::uint64_t line = 64;
constexpr std::uint64_t record_bytes(std::uint64_t len) { return (8 + len + line - 1) / line * line; }

// Where one side of the ring has got to, in one word that the side stores
// once per push (or pop), so that a process killed between two stores
// cannot leave a count and a place that disagree: how many values the side
// has moved (mod 2^32), and how many lines it has moved past (mod 2^32;
// the ring holds a power of two of lines, so that still names the line).
struct position {
  std::uint32_t values;
  std::uint32_t lines;

  static position of(std::uint64_t word) noexcept {
    return {static_cast<std::uint32_t>(word >> 32), static_cast<std::uint32_t>(word)};
  }
  std::uint64_t word() const noexcept { return std::uint64_t{values} << 32 | lines; }
};

// The processes holding a queue (a queue_core over it), each once with how
// many it holds, so that the last to let go can tell that nobody can pop
// what is left. Guarded by the queue's table lock. A slot whose process
// ended without letting go (killed outright) is taken again once all are
// used; `ended_unrecorded` counts those processes, whose holds on the
// queue's memory stay. `unrecorded` counts the queue_cores that no slot
// records (every slot's process alive, or a start time unreadable): while
// any is held, nothing is drained, and one whose process was killed keeps
// it so.
struct holder {
  pid_t pid;
  std::uint32_t count;       // its queue_cores over the queue; 0: the slot is free
  std::uint64_t start_time;  // as /proc/<pid>/stat has it, so a reused pid is not taken for it
};
constexpr std::uint32_t max_holders = 128;
struct holder_table {
  std::uint32_t unrecorded;
  std::uint32_t used;  // slots ever filled
  std::uint32_t ended_unrecorded;
  std::uint32_t reserved;
  holder holders[max_holders];
};

// A record a pop took and has not finished decoding (record_claim). Its
// lines stay out of the pushes' reach until the claim ends, so that when
// the claimant is killed meanwhile, the references of the handles its
// decode had not reached can still be let go of: by a push that finds no
// room but what claims keep (one about to sleep, or a try_push at most
// once a millisecond), or by the queue's last holder.
struct claim_slot {
  // The claimant, as claim_owner() packs it; 0: free. Taken under the
  // pops' lock; handed back by the claimant, or taken over (a
  // compare-exchange) from an ended one by whoever lets go for it.
  std::atomic<std::uint64_t> owner;
  std::atomic<std::uint32_t> lines;  // the head's lines where the record begins
  // Places in the value below this are taken (shm/read_progress.hpp);
  // claim_in_block marks a value read from a block of its own that the
  // claimant holds until the claim ends.
  std::atomic<std::uint32_t> progress;
  // The claimant's pid namespace (os::pid_namespace): only a process of
  // the same one can tell whether the claimant has ended.
  std::atomic<std::uint64_t> pid_namespace;
  std::uint64_t reserved;
};
constexpr std::uint32_t max_claims = 64;
constexpr std::uint32_t claim_in_block = std::uint32_t{1} << 31;
struct claim_table {
  std::atomic<std::uint64_t> used;  // bit i: slot i was ever taken (set under the pops' lock)
  std::uint64_t reserved[7];
  claim_slot slots[max_claims];
};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free && sizeof(claim_slot) == 32);

// A claimant's pid and start time in one word, so that one
// compare-exchange tells it apart from a process that reused its pid; 0
// when they do not fit (pids are below 2^22; start times in clock ticks
// below 2^42), and the pop then claims nothing.
std::uint64_t claim_owner() noexcept {
  const auto start = os::own_start_time();
  const auto pid = static_cast<std::uint64_t>(os::this_process());
  if (start == 0 || start >= (std::uint64_t{1} << 42) || pid >= (std::uint64_t{1} << 22)) return 0;
  return start << 22 | pid;
}
pid_t pid_of_owner(std::uint64_t owner) noexcept { return static_cast<pid_t>(owner & ((1U << 22) - 1)); }
std::uint64_t start_of_owner(std::uint64_t owner) noexcept { return owner >> 22; }

// While it lasts, the reads of the record at `value` note how far they got
// in `slot` (nothing without a slot).
class progress_scope {
 public:
  progress_scope(claim_slot* slot, const std::byte* value, std::uint32_t keep) noexcept
      : noting_(slot != nullptr), before_(shm::current_read_progress) {
    if (noting_) shm::current_read_progress = {value, &slot->progress, keep};
  }
  progress_scope(const progress_scope&) = delete;
  progress_scope& operator=(const progress_scope&) = delete;
  // What a decode around this one notes comes back (a codec may pop).
  ~progress_scope() {
    if (noting_) shm::current_read_progress = before_;
  }

 private:
  bool noting_;
  shm::read_progress before_;
};

// Pushes and pops take locks of their own, each on a line of its own with
// what only its side writes: a producer and a consumer never wait for each
// other, and in a queue with one of each, each lock stays in its own CPU's
// cache. A side reads the other's position only when its own copy says the
// ring is full (or empty). What each side reads on every push and pop
// without writing sits apart from what it writes: a line that another
// process changed and that is read before it is written costs two trips
// between caches, not one.
struct queue_header {
  std::uint64_t magic;
  std::uint64_t signature;  // hash of the value type's signature
  std::uint64_t capacity;   // values
  std::uint64_t ring_bytes; // a power of two of lines
  std::atomic<std::uint32_t> closed;  // set once, with push_lock held
  // The producers' side. The positions sit on lines of their own, apart
  // from the locks: the other side reads them, and a lock's line that it
  // had read would have to come back before each take.
  alignas(line) shm::shared_lock push_lock;  // guards the free part of the ring and head_seen
  std::uint64_t head_seen;                   // head as a push last read it
  alignas(line) std::atomic<std::uint64_t> tail;  // a position: where the next record goes; stored under push_lock
  std::atomic<std::int32_t> tail_cpu{-1};         // the CPU the last push ran on (-1: none yet), for the pops' waits
  // A position: the values and lines (those skipped before them included)
  // of the records of more than two lines pushed so far; stored under
  // push_lock.
  std::atomic<std::uint64_t> big_pushed;
  // The consumers' side.
  alignas(line) shm::shared_lock pop_lock;  // guards the records in the ring and tail_seen
  std::uint64_t tail_seen;                  // tail as a pop last read it
  alignas(line) std::atomic<std::uint64_t> head;  // a position: the oldest record; stored under pop_lock
  std::atomic<std::int32_t> head_cpu{-1};         // the CPU the last pop ran on (-1: none yet), for the pushes' waits
  // The same of those popped so far: stored under pop_lock after `head`,
  // so never ahead of it.
  std::atomic<std::uint64_t> big_popped;
  // What changes when a wait sleeps or a process comes or goes.
  alignas(line) shm::shared_lock table_lock;  // guards everything below
  // Waits that may be asleep on `items` and on `space`; read without the
  // lock by the side that would wake them (through atomic_ref).
  std::uint32_t pop_sleepers, push_sleepers;
  // When the last wake of each side's sleepers (push, pop) was sent, on
  // CLOCK_MONOTONIC (the same in every process), in ns: how long a sleeper
  // would have had to spin instead.
  std::uint64_t woke_at[2];
  // Bumped under the table lock whenever a value arrives (or space frees)
  // while someone sleeps; the sleeper read it under the same lock, so no
  // wake is lost between its look and its sleep. The bump wakes every
  // sleeper and counts none asleep any more: one that went on sleeping
  // would make each value pushed until it woke a system call.
  alignas(line) std::atomic<std::uint32_t> items;
  alignas(line) std::atomic<std::uint32_t> space;
  alignas(line) peer_table peers;
  alignas(line) holder_table holders;
  alignas(line) claim_table claims;
};
static_assert(sizeof(queue_header) % line == 0, "the ring starts on a line of its own");

class locked {
 public:
  // A holder that died cannot have left a half-made record: records are
  // written before `tail` moves and read before `head` does, and each
  // moves in one store.
  explicit locked(shm::shared_lock& lock) noexcept : lock_(lock) { lock_.lock(); }
  locked(const locked&) = delete;
  locked& operator=(const locked&) = delete;
  ~locked() { lock_.unlock(); }

 private:
  shm::shared_lock& lock_;
};

enum class side { push, pop };
constexpr int index(side s) noexcept { return s == side::push ? 0 : 1; }
// How long one sleep of a wait on side `s` lasts before it looks again.
constexpr std::chrono::milliseconds sleep_slice(side s) noexcept { return s == side::push ? room_check : watch_interval; }

}  // namespace

class queue_core {
  friend class record_claim;

 public:
  // Over `state`, whose bytes begin with `header`.
  queue_core(storage state, record_drop drop, queue_header* header)
      : state_(std::move(state)), drop_(drop), header_(header) {
    shm::note_queue_objects(1);
  }
  queue_core(const queue_core&) = delete;
  queue_core& operator=(const queue_core&) = delete;
  ~queue_core() {
    leave();
    shm::note_queue_objects(-1);
  }

  static std::shared_ptr<queue_core> make(std::size_t capacity, std::string_view signature, record_drop drop) {
    if (capacity == 0) {
      throw std::invalid_argument("cohort::queue: the capacity must be at least 1 (every queue is bounded)");
    }
    if (capacity > (std::size_t{1} << 24)) throw std::invalid_argument("cohort::queue: a capacity over 2^24 values");
    const std::size_t ring = std::bit_ceil(std::max<std::size_t>(std::size_t{64} << 10, capacity * 2 * line));
    // And one line past the ring, where a record of two lines that starts
    // on the ring's last line ends.
    storage state = storage::allocate_shared(sizeof(queue_header) + ring + line);
    auto* h = new (state.data()) queue_header{};
    h->magic = magic;
    h->signature = hash_of(signature);
    h->capacity = capacity;
    h->ring_bytes = ring;
    auto q = std::make_shared<queue_core>(std::move(state), drop, h);
    q->enter();
    return q;
  }

  static std::shared_ptr<queue_core> attach(storage s, std::string_view signature, record_drop drop) {
    if (s.nbytes() < sizeof(queue_header)) throw decode_error("cohort::queue: a queue handle names too few bytes");
    auto* h = reinterpret_cast<queue_header*>(s.data());
    if (h->magic != magic) throw decode_error("cohort::queue: a queue handle names something else");
    if (h->signature != hash_of(signature)) {
      throw decode_error(fmt::format("cohort::queue: the queue does not hold values of type {}", signature));
    }
    if (!std::has_single_bit(h->ring_bytes) || h->ring_bytes < line || h->ring_bytes / line > (std::uint64_t{1} << 31) ||
        h->ring_bytes + line > s.nbytes() - sizeof(queue_header) || h->capacity == 0 || h->capacity > (std::uint64_t{1} << 24)) {
      throw decode_error("cohort::queue: a queue's shared state is malformed");
    }
    auto q = std::make_shared<queue_core>(std::move(s), drop, h);
    q->enter();
    return q;
  }

  queue_header& h() const noexcept { return *header_; }
  const storage& state() const noexcept { return state_; }
  std::byte* ring() const noexcept { return state_.data() + sizeof(queue_header); }
  std::uint32_t ring_lines() const noexcept { return static_cast<std::uint32_t>(h().ring_bytes / line); }
  // The line of the ring `p` names.
  std::uint32_t line_of(position p) const noexcept { return p.lines & (ring_lines() - 1); }

  // Pushes `r` unless full. When full and `sleep` is set, counts this caller
  // as a sleeper and sets `seq` to the word to sleep on.
  bool push(queue_record& r, bool sleep, std::uint32_t& seq) {
    join(peer_producer);
    for (;;) {
      // A value too large for the ring goes out of line once the count has
      // room for it: a refused try copies nothing.
      if (too_large(r)) {
        if (h().closed.load(std::memory_order_relaxed) != 0) {
          throw queue_closed("cohort::queue: push into a closed queue");
        }
        if (count_has_room()) overflow(r);
      }
      if (!too_large(r) && put_record(r)) {
        r.handles.held.clear();
        wake_after(side::pop);
        return true;
      }
      // Refused for the ring's bytes while the count has room: the value
      // goes out of line, in a record of two lines at most (a storage's
      // handle), for which fits() keeps room while the count has it.
      if (!r.overflowed && record_bytes(r.bytes.size()) > 2 * line && count_has_room()) {
        overflow(r);
        continue;
      }
      // Room that claims keep: room a killed claimant kept comes back.
      // Each look reads /proc/<pid>/stat for every live claimant: a push
      // about to sleep looks every time, a refused try at most every
      // room_check.
      if (kept_by_claims(r.bytes.size()) && (sleep || claims_look_due()) && let_go_for_ended_claimants()) continue;
      if (!sleep) return false;
      seq = count_asleep(side::push);
      // Room made (or the queue closed) after the look above and before
      // the count woke nobody: seen here.
      const bool room = too_large(r) ? count_has_room() : has_room(r.bytes.size());
      if (!room && h().closed.load(std::memory_order_relaxed) == 0) return false;
      unsleep(side::push, seq);
    }
  }

  // Pops into `out` unless empty; as push() for `sleep` and `seq`.
  bool pop(std::vector<std::byte>& out, bool sleep, std::uint32_t& seq, record_claim* claim) {
    join(peer_consumer);
    for (;;) {
      if (const auto flags = take_record(out, claim)) {
        wake_after(side::push);
        try {
          unwrap(out, *flags, claim);
        } catch (const shm_error&) {  // a block of its own, gone with a sender killed since
          rethrow_receive_failure(*this);
        }
        return true;
      }
      // Closed with nothing in it: every push that went through before the
      // close (under the same lock) is seen after the flag.
      if (h().closed.load(std::memory_order_acquire) != 0) {
        if (values() == 0) throw queue_closed("cohort::queue: pop from a closed, empty queue");
        continue;
      }
      if (!sleep) return false;
      seq = count_asleep(side::pop);
      if (values() == 0 && h().closed.load(std::memory_order_relaxed) == 0) return false;
      unsleep(side::pop, seq);
    }
  }

  // Ends a wait on `s` that counted itself asleep when its word held `seq`:
  // a wait no wake has ended since still counts, and stops counting.
  void unsleep(side s, std::uint32_t seq) noexcept {
    const locked lock(h().table_lock);
    const std::atomic_ref sleepers(sleepers_of(s));
    const auto n = sleepers.load(std::memory_order_relaxed);
    if (word(s).load(std::memory_order_relaxed) == seq && n > 0) sleepers.store(n - 1, std::memory_order_relaxed);
  }

  // Copies the peer table out, under the lock; returns how many it holds.
  // `complete` (when given) tells whether it names every process that used
  // the queue (see peer_table::incomplete).
  std::uint32_t copy_peers(peer (&copy)[max_peers], bool* complete = nullptr) {
    const locked lock(h().table_lock);
    const auto count = std::min<std::uint32_t>(h().peers.count, max_peers);
    std::copy_n(h().peers.peers, count, copy);
    if (complete != nullptr) *complete = h().peers.incomplete == 0;
    return count;
  }

  // Throws peer_lost when every process that could end a wait on `s` is
  // gone, unless `last_try` (one more push or pop, without sleeping) then
  // goes through: the last peer may have left a value or room on its way.
  template <class Try>
  void check_peers(side s, Try last_try) {
    peer copy[max_peers];
    bool complete = false;
    const std::uint32_t count = copy_peers(copy, &complete);
    if (!complete) return;  // a peer the table does not name may be there
    const auto role = s == side::pop ? peer_producer : peer_consumer;
    if (auto gone = watch_.all_gone(copy, count, role, nullptr, has_role(role))) {
      if (last_try()) return;
      // A peer without the role: this process had it alone, and every
      // other one is gone (peer_watch::all_gone).
      const bool alone = (gone->roles & role) == 0;
      throw peer_lost(fmt::format("cohort::queue: every {} of the queue has exited (the last seen: pid {}{})",
                                  alone ? "other process" : s == side::pop ? "producer" : "consumer", gone->pid,
                                  gone->rank >= 0 ? fmt::format(", rank {}", gone->rank) : ""),
                      gone->pid, gone->rank);
    }
  }

  // Arms this process's death notice with the live peers whose end would
  // end a wait on `s`; false when they have all gone, and the wait must not
  // sleep.
  bool arm_peers(side s) {
    peer copy[max_peers];
    bool complete = false;
    const std::uint32_t count = copy_peers(copy, &complete);
    const auto role = s == side::pop ? peer_producer : peer_consumer;
    return !watch_.all_gone(copy, count, role, &death_notice::of_this_process(), has_role(role)) || !complete;
  }

  // Whether this process joined the queue as `role`: pushed, or popped.
  bool has_role(std::uint32_t role) const noexcept {
    const auto& joined = role == peer_producer ? producer_of_ : consumer_of_;
    return joined.load(std::memory_order_relaxed) == os::this_process();
  }

  std::atomic<std::uint32_t>& word(side s) const noexcept { return s == side::push ? h().space : h().items; }

  // How many values the ring holds now, read without a lock. Head is read
  // first: the tail read after it is never behind it.
  std::uint32_t values() const noexcept {
    const auto head = position::of(h().head.load(std::memory_order_acquire));
    const auto tail = position::of(h().tail.load(std::memory_order_acquire));
    return tail.values - head.values;
  }

  // Read without the locks, so that a spinning wait leaves them to the
  // side that will end it: whether a push (or pop) may go through now.
  bool may_go(side s) const noexcept {
    const auto count = values();
    return s == side::push ? count < h().capacity : count > 0;
  }

  spin_budget& spin(side s) noexcept { return spin_[index(s)]; }

  // Whether the other side last went through on the CPU this thread runs
  // on now. Unless it has moved since, it could not run while this thread
  // spun: the spin held it off for the whole budget, and its answer came
  // just after, which would teach the budget to stay. Two processes that
  // the scheduler kept on one CPU so took about twice the budget for each
  // round trip (100 us against 1), until it moved one of them.
  bool other_side_on_this_cpu(side s) const noexcept {
    const int cpu = ::sched_getcpu();
    const auto& other = s == side::pop ? h().tail_cpu : h().head_cpu;
    return cpu >= 0 && other.load(std::memory_order_relaxed) == cpu;
  }

  // After a wait on `s` that began at `started` had to sleep, however it
  // ended: teaches the budget when the last wake came, and whether the
  // spin ran out beside the other side (`shared_cpu`).
  void slept(side s, std::chrono::steady_clock::time_point started, bool shared_cpu) noexcept {
    const auto woke = std::atomic_ref(h().woke_at[index(s)]).load(std::memory_order_relaxed);
    spin(s).slept(std::chrono::nanoseconds(woke) - started.time_since_epoch(), shared_cpu);
  }

  void close() {
    {
      // Under the pushes' lock: a push either went through before the
      // flag, or sees it.
      const locked lock(h().push_lock);
      h().closed.store(1, std::memory_order_release);
    }
    {
      const locked lock(h().table_lock);
      h().items.fetch_add(1, std::memory_order_relaxed);
      h().space.fetch_add(1, std::memory_order_relaxed);
      std::atomic_ref(h().pop_sleepers).store(0, std::memory_order_relaxed);
      std::atomic_ref(h().push_sleepers).store(0, std::memory_order_relaxed);
    }
    os::futex_wake(h().items, INT_MAX);
    os::futex_wake(h().space, INT_MAX);
  }

  void skip_ahead(std::uint32_t values, std::uint32_t lines) {
    const locked push(h().push_lock);
    const locked pop(h().pop_lock);
    if (this->values() != 0) throw std::logic_error("cohort::queue: skip_ahead on a queue that holds values");
    const auto at = position{values, lines}.word();
    h().tail.store(at, std::memory_order_release);
    h().head.store(at, std::memory_order_release);
    h().head_seen = h().tail_seen = at;
  }

  void join_as_producer() noexcept { join(peer_producer); }

  void mark_peers_incomplete() {
    const locked lock(h().table_lock);
    h().peers.incomplete = 1;
  }

  std::pair<std::uint32_t, std::uint32_t> sleepers() const {
    const locked lock(h().table_lock);
    return {std::atomic_ref(h().pop_sleepers).load(std::memory_order_relaxed),
            std::atomic_ref(h().push_sleepers).load(std::memory_order_relaxed)};
  }

 private:
  // Whether the ring has room for a record of `len` bytes to take `lines`
  // at the tail's position `tail` (those it skips at the ring's end
  // included) while the head is at `head`. A record of more than two lines
  // must leave two lines for each value the queue may still take after it
  // over the lines of the records of more than two lines held (the ring
  // has two per value of capacity, and a record of two lines or fewer
  // never skips any): a value refused so goes out of line, in a record of
  // two lines at most (push), so that `capacity` values fit whatever their
  // sizes and whichever records were popped before.
  bool fits(position head, position tail, std::size_t len, std::uint32_t lines) const noexcept {
    const std::uint64_t held = static_cast<std::uint32_t>(tail.values - head.values);
    const std::uint32_t free = ring_lines() - (tail.lines - head.lines);
    if (held >= h().capacity || free < lines) return false;
    if (record_bytes(len) <= 2 * line) return true;
    // The counts are written apart from the tail and the head: a process
    // killed between the two stores leaves them one record off for good,
    // which the ring's own counts bound.
    const auto pushed = position::of(h().big_pushed.load(std::memory_order_relaxed));
    const auto popped = position::of(h().big_popped.load(std::memory_order_acquire));
    const std::uint64_t used = ring_lines() - free;
    const std::uint64_t big_lines = std::min<std::uint64_t>(std::uint32_t{pushed.lines - popped.lines}, used) + lines;
    const std::uint64_t big_values = std::min<std::uint64_t>(std::uint32_t{pushed.values - popped.values}, held) + 1;
    return big_values <= h().capacity && big_lines + 2 * (h().capacity - big_values) <= ring_lines();
  }
  // Whether `r` must go out of line before it is pushed.
  bool too_large(const queue_record& r) const noexcept { return !r.overflowed && r.bytes.size() > h().ring_bytes / 4; }

  // Whether the queue holds fewer than `capacity` values, by count alone.
  bool count_has_room() const noexcept {
    const auto head = kept_from(position::of(h().head.load(std::memory_order_acquire)));
    const auto tail = position::of(h().tail.load(std::memory_order_acquire));
    return static_cast<std::uint32_t>(tail.values - head.values) < h().capacity;
  }

  // The lines a record of `len` bytes takes at the tail `tail`, with those
  // it skips at the ring's end when it does not fit there; and the line it
  // starts on. A record of two lines on the ring's last line ends on the
  // line past the ring instead, standing for the ring's first, which no
  // record uses in that lap.
  std::pair<std::uint32_t, std::uint32_t> placement(position tail, std::size_t len) const noexcept {
    const std::uint32_t at = line_of(tail);
    const auto lines = static_cast<std::uint32_t>(record_bytes(len) / line);
    if (at + lines > ring_lines() && lines > 2) return {ring_lines() - at + lines, 0};
    return {lines, at};
  }

  // Without the locks: whether a record of `len` bytes fits now.
  bool has_room(std::size_t len) const noexcept {
    const auto head = kept_from(position::of(h().head.load(std::memory_order_acquire)));
    const auto tail = position::of(h().tail.load(std::memory_order_acquire));
    return fits(head, tail, len, placement(tail, len).first);
  }

  // Whether a refused try's look for ended claimants is due: one per
  // room_check in this process.
  bool claims_look_due() noexcept {
    const std::int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
    auto next = next_claims_look_.load(std::memory_order_relaxed);
    return now >= next &&
           next_claims_look_.compare_exchange_strong(
               next, now + std::chrono::nanoseconds(room_check).count(), std::memory_order_relaxed);
  }

  // Without the locks: whether a record of `len` bytes would fit now but
  // for the records pops have claimed.
  bool kept_by_claims(std::size_t len) const noexcept {
    const auto head = position::of(h().head.load(std::memory_order_acquire));
    const auto tail = position::of(h().tail.load(std::memory_order_acquire));
    const auto lines = placement(tail, len).first;
    return fits(head, tail, len, lines) && !fits(kept_from(head), tail, len, lines);
  }

  // The head's position, its lines moved back to where the oldest record
  // a pop claimed begins: the pushes write no line from there on.
  position kept_from(position head) const noexcept {
    const auto& t = h().claims;
    const auto used = t.used.load(std::memory_order_acquire);
    std::uint32_t back = 0;
    for (auto bits = used; bits != 0; bits &= bits - 1) {
      const auto i = std::countr_zero(bits);
      if (t.slots[i].owner.load(std::memory_order_acquire) == 0) continue;
      // A claim made after `head` was read is past it: the difference wraps.
      const std::uint32_t behind = head.lines - t.slots[i].lines.load(std::memory_order_relaxed);
      if (behind <= ring_lines()) back = std::max(back, behind);
    }
    return {head.values, head.lines - back};
  }

  // Writes `r` at the tail unless the ring has no room for it; throws when
  // the queue is closed.
  bool put_record(queue_record& r) {
    const locked lock(h().push_lock);
    if (h().closed.load(std::memory_order_relaxed) != 0) throw queue_closed("cohort::queue: push into a closed queue");
    const auto tail = position::of(h().tail.load(std::memory_order_relaxed));
    const auto [lines, at] = placement(tail, r.bytes.size());
    if (!fits(position::of(h().head_seen), tail, r.bytes.size(), lines)) {
      h().head_seen = kept_from(position::of(h().head.load(std::memory_order_acquire))).word();
      if (!fits(position::of(h().head_seen), tail, r.bytes.size(), lines)) return false;
    }
    if (at != line_of(tail)) std::memcpy(ring() + std::uint64_t{line_of(tail)} * line, &skip, 4);  // wraps
    std::byte* const record = ring() + std::uint64_t{at} * line;
    const std::uint32_t head_words[2] = {static_cast<std::uint32_t>(r.bytes.size()), r.overflowed ? overflowed : 0};
    std::memcpy(record, head_words, 8);
    std::memcpy(record + 8, r.bytes.data(), r.bytes.size());
    // Held for the message before a pop can take it.
    hold_for_message(r.handles);
    if (record_bytes(r.bytes.size()) > 2 * line) {
      const auto big = position::of(h().big_pushed.load(std::memory_order_relaxed));
      h().big_pushed.store(position{big.values + 1, big.lines + lines}.word(), std::memory_order_relaxed);
    }
    h().tail_cpu.store(::sched_getcpu(), std::memory_order_relaxed);
    h().tail.store(position{tail.values + 1, tail.lines + lines}.word(), std::memory_order_release);
    return true;
  }

  // Takes the record at the head into `out` unless the ring is empty;
  // its flags.
  // `claim`, when given, claims the record taken.
  std::optional<std::uint32_t> take_record(std::vector<std::byte>& out, record_claim* claim = nullptr) {
    const locked lock(h().pop_lock);
    const auto head = position::of(h().head.load(std::memory_order_relaxed));
    if (position::of(h().tail_seen).values == head.values) {
      h().tail_seen = h().tail.load(std::memory_order_acquire);
      if (position::of(h().tail_seen).values == head.values) return std::nullopt;
    }
    return take_locked(out, head, claim);
  }

  // With the pops' lock held and a record at `head`: moves its bytes into
  // `out` and the head past it, claimed for `claim` when given; returns
  // its flags.
  std::uint32_t take_locked(std::vector<std::byte>& out, position head, record_claim* claim) {
    std::uint32_t moved = 0;
    const auto flags = read_at(head.lines, out, moved);
    free_claims_at_locked(head.lines);
    if (claim != nullptr) claim_locked(*claim, head.lines, out);
    h().head_cpu.store(::sched_getcpu(), std::memory_order_relaxed);
    h().head.store(position{head.values + 1, head.lines + moved}.word(), std::memory_order_release);
    if (record_bytes(out.size()) > 2 * line) {
      const auto big = position::of(h().big_popped.load(std::memory_order_relaxed));
      h().big_popped.store(position{big.values + 1, big.lines + moved}.word(), std::memory_order_release);
    }
    return flags;
  }

  // The record whose place begins at the head's `lines`: its bytes into
  // `out`; `moved`, the lines it takes (with those it skipped at the
  // ring's end); returns its flags.
  std::uint32_t read_at(std::uint32_t lines, std::vector<std::byte>& out, std::uint32_t& moved) const {
    std::uint32_t at = lines & (ring_lines() - 1);
    moved = 0;
    std::uint32_t head_words[2];
    std::memcpy(head_words, ring() + std::uint64_t{at} * line, 4);
    if (head_words[0] == skip) {
      moved = ring_lines() - at;
      at = 0;
    }
    const std::byte* const record = ring() + std::uint64_t{at} * line;
    std::memcpy(head_words, record, 8);
    const std::uint64_t len = head_words[0];
    if (len > h().ring_bytes + line - 8 - std::uint64_t{at} * line) {
      throw decode_error(fmt::format("cohort::queue: a record of {} bytes overruns the ring", len));
    }
    out.assign(record + 8, record + 8 + len);
    moved += static_cast<std::uint32_t>(record_bytes(len) / line);
    return head_words[1];
  }

  // With the pops' lock held: claims the record at the head's `lines`,
  // read into `out`, for `c`; nothing when every claim is in use, or this
  // process cannot be told apart from a later one with its pid.
  void claim_locked(record_claim& c, std::uint32_t lines, const std::vector<std::byte>& out) noexcept {
    const auto owner = claim_owner();
    if (owner == 0) return;
    auto& t = h().claims;
    const auto used = t.used.load(std::memory_order_relaxed);
    std::uint32_t i = 0;
    for (; i < max_claims; ++i) {
      if ((used >> i & 1) == 0) {
        t.used.store(used | std::uint64_t{1} << i, std::memory_order_relaxed);
        break;
      }
      if (t.slots[i].owner.load(std::memory_order_relaxed) == 0) break;
    }
    if (i == max_claims) return;
    auto& slot = t.slots[i];
    slot.lines.store(lines, std::memory_order_relaxed);
    slot.progress.store(0, std::memory_order_relaxed);
    slot.pid_namespace.store(os::pid_namespace(), std::memory_order_relaxed);
    // Seen by a push that reads the head stored after it.
    slot.owner.store(owner, std::memory_order_release);
    c.core_ = this;
    c.slot_ = i;
    c.record_ = out;
  }

  // With the pops' lock held: frees the claims on the record at the
  // head's `lines`. Only a pop killed between its claim and its move of
  // the head leaves one (the lock, taken over from it, holds no live
  // one there): the record was never taken, and the next pop takes it.
  void free_claims_at_locked(std::uint32_t lines) noexcept {
    auto& t = h().claims;
    for (auto bits = t.used.load(std::memory_order_relaxed); bits != 0; bits &= bits - 1) {
      auto& slot = t.slots[std::countr_zero(bits)];
      if (slot.owner.load(std::memory_order_relaxed) != 0 && slot.lines.load(std::memory_order_relaxed) == lines) {
        slot.owner.store(0, std::memory_order_release);
      }
    }
  }

  // After a push (`s` = pop) or a pop (`s` = push), right after its side's
  // lock was let go of: wakes the waits on `s` that sleep, if any. Pops
  // wake pushes only once the ring has drained to half. The fence pairs
  // with the one in count_asleep: a wait that counted itself after this
  // looked either sees the value (or room), or is seen here. The unlock's
  // exchange is the read-modify-write it follows.
  void wake_after(side s) {
    os::fence_after_rmw();
    if (std::atomic_ref(sleepers_of(s)).load(std::memory_order_relaxed) == 0) return;
    if (s == side::push && values() > h().capacity / 2) return;
    int woken = 0;
    {
      const locked lock(h().table_lock);
      woken = wake_sleepers(s);
    }
    if (woken > 0) os::futex_wake(word(s), woken);
  }

  // Counts a wait on `s` asleep; the word's value to sleep on. The caller
  // looks once more before it sleeps (see wake_after).
  std::uint32_t count_asleep(side s) {
    std::uint32_t seq = 0;
    {
      const locked lock(h().table_lock);
      std::atomic_ref(sleepers_of(s)).fetch_add(1, std::memory_order_relaxed);
      seq = word(s).load(std::memory_order_relaxed);
    }
    std::atomic_thread_fence(std::memory_order_seq_cst);
    return seq;
  }

  // A record taken out of the ring: the value's own bytes in `out`. A
  // claim keeps a value's block of its own until it ends.
  void unwrap(std::vector<std::byte>& out, std::uint32_t flags, record_claim* claim = nullptr) {
    if (flags != overflowed) return;
    claim_slot* const slot = claimed(claim);
    storage s;
    {
      const progress_scope scope(slot, out.data(), 0);
      s = read_record<storage>(out);
    }
    if (slot != nullptr) {
      claim->block_ = s;
      claim->record_ = {};  // not the outer record any more: never let go of again
      slot->progress.store(claim_in_block, std::memory_order_release);
    }
    out.assign(s.data(), s.data() + s.nbytes());
    if (slot != nullptr) claim->record_ = out;
  }

  // The slot of `claim` in this queue; null when it claimed none.
  claim_slot* claimed(const record_claim* claim) const noexcept {
    return claim != nullptr && claim->core_ == this ? &h().claims.slots[claim->slot_] : nullptr;
  }

  // Ends `c`, taken from this queue: a record never decoded lets go of
  // the handles not reached, and the lines it kept go back to the pushes.
  void end_claim(record_claim& c) noexcept {
    auto& slot = h().claims.slots[c.slot_];
    if (!c.decoded_) {
      // Noted first: killed in here, nothing is let go of twice.
      const auto progress = slot.progress.exchange(shm::progress_unknown, std::memory_order_acq_rel);
      drop_unread_handles(c.record_, progress & ~claim_in_block);
    }
    // The block goes after the claim: whoever took over a claim in it
    // would let go of the block again.
    slot.owner.store(0, std::memory_order_release);
    c.block_ = storage();
    // No fence before the look at the sleepers: a push that looked at the
    // claim just before this and sleeps is missed, and finds the room at
    // its next look (room_check), as one behind a pop that leaves the
    // ring above half full does.
    wake_after(side::push);
  }

  // For each claimant that has ended: lets go of what its claimed record
  // names beyond where its decode got, and frees its claim. Whether any
  // was freed.
  bool let_go_for_ended_claimants() noexcept {
    auto& t = h().claims;
    const auto used = t.used.load(std::memory_order_acquire);
    const std::uint64_t self = claim_owner();
    const std::uint64_t own_namespace = os::pid_namespace();
    if (self == 0 || own_namespace == 0) return false;
    bool freed = false;
    for (auto bits = used; bits != 0; bits &= bits - 1) {
      auto& slot = t.slots[std::countr_zero(bits)];
      auto owner = slot.owner.load(std::memory_order_acquire);
      if (owner == 0 || owner == self || slot.pid_namespace.load(std::memory_order_relaxed) != own_namespace ||
          !os::has_ended(pid_of_owner(owner), start_of_owner(owner))) {
        continue;
      }
      bool taken = false;
      {
        // Under the pops' lock, as a take: a claim on the record still at
        // the head (its pop killed before it moved the head) names
        // nothing taken, and goes as it is.
        const locked lock(h().pop_lock);
        const auto head = position::of(h().head.load(std::memory_order_relaxed));
        if (slot.lines.load(std::memory_order_relaxed) == head.lines) {
          freed |= slot.owner.compare_exchange_strong(owner, 0, std::memory_order_acq_rel);
          continue;
        }
        taken = slot.owner.compare_exchange_strong(owner, self, std::memory_order_acq_rel);
      }
      if (!taken) continue;
      drop_claimed(slot);
      slot.owner.store(0, std::memory_order_release);
      freed = true;
    }
    return freed;
  }

  // What an ended claimant's record names beyond its progress, let go of.
  void drop_claimed(claim_slot& slot) noexcept {
    // Noted first: one killed in here leaves the rest held, never let go of twice.
    const auto progress = slot.progress.exchange(shm::progress_unknown, std::memory_order_acq_rel);
    try {
      std::vector<std::byte> record;
      std::uint32_t moved = 0;
      const auto flags = read_at(slot.lines.load(std::memory_order_relaxed), record, moved);
      if (flags != overflowed) {
        drop_unread_handles(record, progress);
      } else if ((progress & claim_in_block) != 0) {
        drop_unread_in_block(record, progress & ~claim_in_block, true);
      } else if (progress == 0) {  // the block's handle not reached
        drop_unread_in_block(record, 0, false);
      } else if (progress == 1) {
        // Its handle taken, the block not yet marked: nothing in the
        // block was read.
        drop_unread_in_block(record, 0, true);
      }
    } catch (...) {
      // A record that overruns the ring names nothing to let go of.
    }
  }

  // Records this process as a holder of the queue.
  void enter() noexcept {
    const pid_t self = os::this_process();
    // Whoever lets go of this process's last hold on the state decides,
    // under the table lock, whether anyone can pop any more: the end of
    // the last storage over it here, or a forked rank's end, which runs
    // no destructors.
    const auto context = reinterpret_cast<void (*)()>(drop_);
    detail::at_last_release(state_, {&last_hold_here_goes, context});
    detail::at_forked_rank_end(state_, {&leave_at_rank_end, context});
    const locked lock(h().table_lock);
    if (os::own_start_time() != 0) {
      if (auto* own = own_slot_locked()) {
        ++own->count;
        holder_ = self;
        return;
      }
      if (auto* free = free_slot_locked()) {
        *free = {self, 1, os::own_start_time()};
        holder_ = self;
        return;
      }
    }
    ++h().holders.unrecorded;
    unrecorded_by_ = self;
  }

  // With the table lock held: the slot recording this process; null when none does.
  holder* own_slot_locked() const noexcept {
    const pid_t self = os::this_process();
    const std::uint64_t started = os::own_start_time();
    auto& t = h().holders;
    for (std::uint32_t i = 0; i < std::min(t.used, max_holders); ++i) {
      auto& e = t.holders[i];
      if (e.count > 0 && e.pid == self && e.start_time == started) return &e;
    }
    return nullptr;
  }

  // With the table lock held: a slot to record a process in: a free one, one
  // never used, or else the slot of a process that ended holding the queue,
  // its hold counted in `ended_unrecorded`; null when every slot's process
  // lives.
  holder* free_slot_locked() const noexcept {
    auto& t = h().holders;
    const auto used = std::min(t.used, max_holders);
    for (std::uint32_t i = 0; i < used; ++i) {
      if (t.holders[i].count == 0) return &t.holders[i];
    }
    if (used < max_holders) return &t.holders[t.used++];
    for (auto& e : t.holders) {
      if (e.count > 0 && os::has_ended(e.pid, e.start_time)) {
        ++t.ended_unrecorded;
        return &e;
      }
    }
    return nullptr;
  }

  // Ends this queue_core's hold: its place in the table of holders. What
  // is left in the ring is dropped, when nobody can pop it any more, as
  // this process's last storage over the state ends (last_hold_here_goes):
  // another storage here (a handle waiting to be sent as an argument) may
  // still pass the queue on.
  void leave() noexcept {
    const pid_t self = os::this_process();
    if (holder_ != self && unrecorded_by_ != self) return;  // inherited over fork
    const locked lock(h().table_lock);
    if (unrecorded_by_ == self) {
      --h().holders.unrecorded;
    } else if (auto* own = own_slot_locked()) {
      --own->count;
    }
  }

  // Who can still pop from the queue once this process's last hold went.
  enum class left_to { others, children, nobody };

  // The end of this process's last storage over the queue's `state` (a
  // storage that took its hold over): what is left is dropped when nobody
  // else can pop any more.
  static void last_hold_here_goes(const storage& state, void (*drop)()) noexcept {
    // A plain fork's child that has exec'd or ended can pop no more.
    shm::sweep_fork_holds();
    // Holds no place in the table.
    queue_core core(state, reinterpret_cast<record_drop>(drop), reinterpret_cast<queue_header*>(state.data()));
    const auto left = core.let_go_of_hold();
    if (left == left_to::nobody) core.drain();
    if (left == left_to::children) core.drain_once_children_gone();
  }

  // A forked rank's end (detail::at_forked_rank_end), for the queue over
  // `state`: this process's holds go at once, as its queue_cores' and its
  // other storages' ends would have let go of them, and when nobody else
  // can pop any more, what is left is dropped.
  static void leave_at_rank_end(const storage& state, void (*drop)()) noexcept {
    // Holds no place in the table.
    queue_core core(state, reinterpret_cast<record_drop>(drop), reinterpret_cast<queue_header*>(state.data()));
    {
      const locked lock(core.h().table_lock);
      if (auto* own = core.own_slot_locked()) own->count = 0;
    }
    if (core.let_go_of_hold() == left_to::nobody) core.drain();
  }

  // Once this process holds the queue through no queue_core: who else can
  // pop from it. Where others can, this process's hold on the state goes
  // under the table lock, so that the last of several holders letting go
  // at once finds the others' holds gone and drains.
  left_to let_go_of_hold() noexcept {
    const locked lock(h().table_lock);
    auto left = holders_left_locked();
    if (left == left_to::others && !detail::let_go_unless_last(state_)) left = holders_left_locked();
    return left;
  }

  // Takes every record left and drops its value. The caller found that
  // nobody else can pop or push any more.
  void drain() noexcept {
    (void)let_go_for_ended_claimants();
    std::vector<std::pair<std::vector<std::byte>, std::uint32_t>> left;
    try {
      std::vector<std::byte> out;
      while (const auto flags = take_record(out)) left.emplace_back(std::move(out), *flags);
    } catch (...) {
      // A record that overruns the ring: what came before it is dropped.
    }
    // Outside the lock: a value may hold queues whose own drain this starts.
    for (auto& [bytes, flags] : left) {
      try {
        unwrap(bytes, flags);
        if (drop_ != nullptr) drop_(bytes);
      } catch (...) {
        // A record that cannot be received (its memory gone with its
        // maker) holds nothing here to let go of.
      }
    }
    // The segments those values were in, mapped only to let go of them.
    if (!left.empty()) shm::forget_dead_segments();
  }

  // Keeps the shared state, over a queue_core of its own that holds no
  // place in the table, until the sweep that finds the children gone; then
  // drains it if nobody else can pop by then. Without the memory for that,
  // the values stay, as they did.
  void drain_once_children_gone() noexcept {
    try {
      // The state moves: a retry run on another thread meanwhile must not
      // find a second owner of it here.
      auto later = std::make_shared<queue_core>(std::move(state_), drop_, header_);
      shm::retry_after_fork_holds([later] {
        const auto left = later->let_go_of_hold();
        if (left == left_to::children) return false;
        if (left == left_to::nobody) later->drain();
        return true;
      });
    } catch (...) {
    }
  }

  // With the table lock held, once this process holds the state through
  // nothing but its last storage: whether any process can pop from the
  // queue any more. Nobody can when every other holder recorded has ended
  // and no hold in shared memory is left beyond this process's and those
  // of holders that ended without letting go (killed outright): a handle
  // in a message in flight, or a process that has the state but no queue
  // over it yet, is one more. Children of plain forks that have not exec'd
  // yet could pop from what they inherited: the holds this process keeps
  // for them are told apart.
  left_to holders_left_locked() const noexcept {
    const auto& t = h().holders;
    if (t.unrecorded != 0) return left_to::others;
    std::uint32_t ended_holding = 0;
    for (std::uint32_t i = 0; i < std::min(t.used, max_holders); ++i) {
      const auto& e = t.holders[i];
      if (e.count == 0) continue;
      if (!os::has_ended(e.pid, e.start_time)) return left_to::others;
      ++ended_holding;
    }
    ended_holding += t.ended_unrecorded;
    const auto holds = shm::holds_for_children(state_);
    if (holds.refs == 1 + ended_holding) return left_to::nobody;
    return holds.for_children > 0 && holds.refs == 1 + ended_holding + holds.for_children ? left_to::children
                                                                                          : left_to::others;
  }

  std::uint32_t& sleepers_of(side s) const noexcept { return s == side::push ? h().push_sleepers : h().pop_sleepers; }

  // With the table lock held, after a value or room was added for the
  // waits on `s`: how many of them sleep (0 for none), all to be woken and
  // no longer counted.
  int wake_sleepers(side s) noexcept {
    const std::atomic_ref sleepers(sleepers_of(s));
    if (sleepers.load(std::memory_order_relaxed) == 0) return 0;
    word(s).fetch_add(1, std::memory_order_relaxed);
    const auto now = std::chrono::steady_clock::now().time_since_epoch();
    std::atomic_ref(h().woke_at[index(s)]).store(std::chrono::nanoseconds(now).count(), std::memory_order_relaxed);
    return static_cast<int>(std::min<std::uint32_t>(sleepers.exchange(0, std::memory_order_relaxed), INT_MAX));
  }

  void join(std::uint32_t role) noexcept {
    const pid_t self = os::this_process();
    auto& joined = role == peer_producer ? producer_of_ : consumer_of_;
    if (joined.load(std::memory_order_relaxed) == self) return;
    const locked lock(h().table_lock);
    h().peers.join(role);
    joined.store(self, std::memory_order_relaxed);
  }

  // Moves a value too large for the ring into a block of its own.
  static void overflow(queue_record& r) {
    storage s = storage::allocate_shared(r.bytes.size());
    std::memcpy(s.data(), r.bytes.data(), r.bytes.size());
    auto inner = std::move(r.handles.held);  // the value's own storages travel too
    fill_record(r, s);
    r.handles.held.insert(r.handles.held.end(), inner.begin(), inner.end());
    r.overflowed = true;
  }

  storage state_;
  record_drop drop_;
  queue_header* header_;
  pid_t holder_ = 0;  // the process recorded as holding it through this object; 0: none
  pid_t unrecorded_by_ = 0;  // the process holding it through this object that no slot records; 0: none
  std::atomic<pid_t> producer_of_{0}, consumer_of_{0};  // the process that joined as each
  peer_watch watch_;
  spin_budget spin_[2];  // push, pop
  std::atomic<std::int64_t> next_claims_look_{0};  // steady_clock's count, per claims_look_due
};

namespace {

// After a wait: one more try, and when the other side has all gone, one
// last try before peer_lost. True when the push or pop went through.
template <class Attempt>
bool retry_after_wait(queue_core& q, side s, Attempt& attempt) {
  std::uint32_t seq = 0;
  if (attempt(false, seq)) return true;
  bool done = false;
  q.check_peers(s, [&] { return done = attempt(false, seq); });
  return done;
}

// After a try that did not go through: spins within the side's budget from
// `started`, and not past `latest`, while a push or pop cannot go through;
// whether it went through, and then teaches the budget how long that took.
template <class Attempt>
bool spin_for(queue_core& q, side s, std::chrono::steady_clock::time_point started, Attempt& attempt,
              std::chrono::steady_clock::time_point latest = std::chrono::steady_clock::time_point::max()) {
  auto& budget = q.spin(s);
  const auto until = std::min(started + budget.get(), latest);
  for (std::uint32_t seq = 0;;) {
    if (!spin_until(until, [&] { return q.may_go(s); })) return false;
    if (attempt(false, seq)) {
      budget.spun(std::chrono::steady_clock::now() - started);
      return true;
    }
    // may_go() counts values, not bytes: a ring without the bytes for this
    // value looks ready to a push all along, and only the clock ends it.
    if (std::chrono::steady_clock::now() >= until) return false;
  }
}

// The first try of a push or pop, which reads no clock: most find room or
// a value at once. One that goes through teaches the budget as a wait of
// no time.
template <class Attempt>
bool at_once(queue_core& q, side s, Attempt& attempt) {
  std::uint32_t seq = 0;
  if (!attempt(false, seq)) return false;
  q.spin(s).spun(std::chrono::nanoseconds::zero());
  return true;
}

// A wait past its spin: teaches the budget when it ends, however it ends;
// `shared_cpu`: the other side was last seen on this thread's CPU when the
// spin ran out.
struct budget_lesson {
  queue_core& q;
  side s;
  std::chrono::steady_clock::time_point started;
  bool shared_cpu;
  ~budget_lesson() { q.slept(s, started, shared_cpu); }
};

// Blocks until a push or pop goes through, `deadline` passes (false), or
// the other side is gone (peer_lost).
template <class Attempt>
bool wait_for(queue_core& q, side s, std::optional<std::chrono::nanoseconds> timeout, Attempt attempt) {
  // A timed wait counts from the call, the first try included (it may copy
  // a large value into a block of its own); an untimed one reads no clock
  // before its first try.
  const auto called = timeout ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
  if (at_once(q, s, attempt)) return true;
  // Time this process would spend waiting; not a timed wait's, whose
  // caller asked for no more than its timeout.
  if (!timeout) shm::dispose_deferred();
  const auto started = timeout ? called : std::chrono::steady_clock::now();
  const auto deadline = timeout ? os::deadline_after(started, *timeout) : std::chrono::steady_clock::time_point::max();
  if (spin_for(q, s, started, attempt, deadline)) return true;
  const budget_lesson lesson{q, s, started, q.other_side_on_this_cpu(s)};
  for (std::uint32_t seq = 0;;) {
    if (attempt(true, seq)) return true;
    const auto left = std::max(std::chrono::nanoseconds(0), deadline - std::chrono::steady_clock::now());
    const auto slice = std::min<std::chrono::nanoseconds>(sleep_slice(s), left);
    // The death notice's epoch is read before the peers are armed: an end
    // after the read changes it, and the wait below does not sleep then.
    auto& epoch = death_notice::of_this_process().epoch();
    const auto seen = epoch.load(std::memory_order_acquire);
    std::error_code ec;
    // When every peer has gone: no sleep, but peer_lost after one more try.
    if (q.arm_peers(s)) os::futex_wait_two(q.word(s), seq, epoch, seen, slice, ec);
    q.unsleep(s, seq);
    if (ec) throw std::system_error(ec, "cohort::queue: futex wait");
    if (std::chrono::steady_clock::now() >= deadline) return attempt(false, seq);
    if (retry_after_wait(q, s, attempt)) return true;
  }
}

// Counts as a sleeper from the failed attempt until the wait ends, however
// it ends (cancellation included).
struct sleeping {
  queue_core& q;
  side s;
  std::uint32_t seq;
  ~sleeping() { q.unsleep(s, seq); }
};

// Ends at the first of: a wake on the side's word, a change of the death
// notice's epoch, the end of the side's sleep slice. A branch that fails
// ends nothing; `||` throws multiple_exceptions once all three have
// failed, as a cancellation from outside makes them.
asio::awaitable<void> first_wake(queue_core& q, side s, std::uint32_t seq, std::atomic<std::uint32_t>& epoch,
                                 std::uint32_t seen) {
  using namespace asio::experimental::awaitable_operators;
  // when_any's strand, where `||` starts its branches: there no two of
  // them complete at once, as on an io_context run by several threads,
  // where the one that won cancelled another while that one was being
  // freed.
  auto strand = co_await asio::this_coro::executor;
  asio::steady_timer timer(strand, sleep_slice(s));
  co_await (uring::async_futex_wait(strand, q.word(s), seq, asio::use_awaitable) ||
            uring::async_futex_wait(strand, epoch, seen, asio::use_awaitable) ||
            timer.async_wait(asio::use_awaitable));
}

}  // namespace

asio::awaitable<void> race_on_own_strand(asio::awaitable<void> race, const char* what) {
  std::vector<asio::awaitable<void>> ops;
  ops.push_back(std::move(race));
  std::exception_ptr failure;
  try {
    co_await when_any(std::move(ops));
  } catch (const asio::multiple_exceptions& e) {
    failure = e.first_exception();
  } catch (const std::system_error& e) {
    // when_any's own, when cancelled before the race ended.
    if (e.code() != asio::error::operation_aborted) throw;
    failure = std::current_exception();
  }
  if (!failure) co_return;
  const asio::cancellation_state state = co_await asio::this_coro::cancellation_state;
  if (state.cancelled() != asio::cancellation_type::none) throw std::system_error(asio::error::operation_aborted, what);
  std::rethrow_exception(failure);
}

namespace {

asio::awaitable<void> sleep_async(queue_core& q, side s, std::uint32_t seq) {
  auto executor = co_await asio::this_coro::executor;
  // Before the timer, which would bring up asio's reactor with asio's bare
  // message where no descriptor is left.
  (void)uring::service_for(executor, s == side::push ? "cohort::queue::push" : "cohort::queue::pop");
  // As wait_for: the epoch is read before the peers are armed.
  auto& epoch = death_notice::of_this_process().epoch();
  const auto seen = epoch.load(std::memory_order_acquire);
  if (!q.arm_peers(s)) co_return;  // every peer gone: peer_lost, after one more try
  // One op, not three: a helper thread's futex wait that a fork cancelled
  // ends the race (race_on_own_strand), and the caller tries again.
  co_await race_on_own_strand(first_wake(q, s, seq, epoch, seen), "cohort::queue");
}

// Suspends until a push or pop goes through, or the other side is gone
// (peer_lost).
template <class Attempt>
asio::awaitable<void> wait_async(std::shared_ptr<queue_core> q, side s, Attempt attempt) {
  // Refused here, every time, not inside the first sleep, where the throw
  // would find no coroutine to reach (std::terminate).
  (void)uring::io_context_of(co_await asio::this_coro::executor,
                             s == side::push ? "cohort::queue::push" : "cohort::queue::pop");
  if (at_once(*q, s, attempt)) co_return;
  shm::dispose_deferred();  // time this coroutine would spend waiting
  // A spin first, as a blocking wait's: it holds this thread for at most
  // spin_budget::longest.
  const auto started = std::chrono::steady_clock::now();
  if (spin_for(*q, s, started, attempt)) co_return;
  const budget_lesson lesson{*q, s, started, q->other_side_on_this_cpu(s)};
  for (;;) {
    std::uint32_t seq = 0;
    if (attempt(true, seq)) co_return;
    {
      // Here, not in sleep_async: an awaitable cancelled before it starts
      // throws without running its body, and the count would stay.
      const sleeping guard{*q, s, seq};
      co_await sleep_async(*q, s, seq);
    }
    // Cancelled while it slept: a value taken now would be lost with the
    // result nobody awaits any more (a pop raced against a timer).
    const asio::cancellation_state state = co_await asio::this_coro::cancellation_state;
    if (state.cancelled() != asio::cancellation_type::none) throw asio::system_error(asio::error::operation_aborted);
    if (retry_after_wait(*q, s, attempt)) co_return;
  }
}

}  // namespace

std::shared_ptr<queue_core> make_queue_core(std::size_t capacity, std::string_view signature, record_drop drop) {
  return queue_core::make(capacity, signature, drop);
}

bool queue_try_push(queue_core& q, queue_record& r) {
  std::uint32_t seq = 0;
  return q.push(r, false, seq);
}

bool queue_put(queue_core& q, queue_record& r, std::optional<std::chrono::nanoseconds> timeout) {
  return wait_for(q, side::push, timeout, [&](bool sleep, std::uint32_t& seq) { return q.push(r, sleep, seq); });
}

asio::awaitable<void> queue_push(std::shared_ptr<queue_core> q, queue_record& r) {
  auto* core = q.get();
  return wait_async(std::move(q), side::push,
                    [core, &r](bool sleep, std::uint32_t& seq) { return core->push(r, sleep, seq); });
}

bool queue_try_pop(queue_core& q, std::vector<std::byte>& out, record_claim* claim) {
  std::uint32_t seq = 0;
  return q.pop(out, false, seq, claim);
}

bool queue_get(queue_core& q, std::vector<std::byte>& out, std::optional<std::chrono::nanoseconds> timeout,
               record_claim* claim) {
  return wait_for(q, side::pop, timeout,
                  [&](bool sleep, std::uint32_t& seq) { return q.pop(out, sleep, seq, claim); });
}

asio::awaitable<void> queue_pop(std::shared_ptr<queue_core> q, std::vector<std::byte>& out, record_claim* claim) {
  auto* core = q.get();
  return wait_async(std::move(q), side::pop, [core, &out, claim](bool sleep, std::uint32_t& seq) {
    return core->pop(out, sleep, seq, claim);
  });
}

void record_claim::end() noexcept { std::exchange(core_, nullptr)->end_claim(*this); }

claim_decoding::claim_decoding(record_claim& claim, std::span<const std::byte> record) noexcept {
  claim.decoded_ = true;
  if (claim.core_ == nullptr) return;
  auto& slot = claim.core_->h().claims.slots[claim.slot_];
  static_assert(sizeof(before_) == sizeof(shm::read_progress) && alignof(shm::read_progress) <= alignof(void*));
  new (before_) shm::read_progress(shm::current_read_progress);
  // The block bit stays in every note.
  shm::current_read_progress = {record.data(), &slot.progress,
                                slot.progress.load(std::memory_order_relaxed) & claim_in_block};
  noting_ = true;
}

// What a decode around this one notes comes back (a codec may pop).
claim_decoding::~claim_decoding() {
  if (noting_) shm::current_read_progress = *std::launder(reinterpret_cast<shm::read_progress*>(before_));
}

void end_record(queue_record& r) { end_handle_record(r.bytes, r.handles.handle_at); }

void rethrow_receive_failure(queue_core& q) {
  try {
    throw;
  } catch (const shm::segment_gone& e) {
    peer copy[max_peers];
    const std::uint32_t count = q.copy_peers(copy);
    peer* const end = copy + count;
    const peer* sender = std::find_if(copy, end, [&](const peer& p) { return p.pid == e.source(); });
    // The start time in the table tells a pid recycled since; a sender the
    // table never named (a value passed on by a process gone from it) is
    // judged by its pid. A sender that is ending counts as gone already: a
    // killed process closes its descriptors, or its leader turns a zombie
    // whose /proc/<pid>/fd shows none, before it shows as ended. One of its
    // threads may also be between taking its SIGKILL off and marking itself
    // exiting (cancelling its io_uring requests, say), where neither tells:
    // the sender is looked at again for a few milliseconds before the
    // failure counts as the segment's own. A live sender keeps open what
    // its values in flight name, so the wait is, as a rule, spent only on
    // what fails anyway.
    const std::uint64_t start_time = sender != end ? sender->start_time : 0;
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(20);
    while (!os::has_ended_or_is_ending(e.source(), start_time)) {
      if (std::chrono::steady_clock::now() >= until) throw;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    const int rank = sender != end ? sender->rank : -1;
    throw peer_lost(fmt::format("cohort::queue: the sender of a value (pid {}{}) exited before it was received, "
                                "and the shared memory holding the value went with it",
                                e.source(), rank >= 0 ? fmt::format(", rank {}", rank) : ""),
                    e.source(), rank);
  }
}

void queue_close(queue_core& q) { q.close(); }
bool queue_closed_now(const queue_core& q) { return q.h().closed.load(std::memory_order_acquire) != 0; }
// values() may count pops that went on between its two reads as still in
// the ring: never more than the capacity, though.
std::size_t queue_size(const queue_core& q) { return std::min<std::size_t>(q.values(), q.h().capacity); }
std::size_t queue_capacity(const queue_core& q) { return q.h().capacity; }
std::pair<std::uint32_t, std::uint32_t> queue_sleepers(const queue_core& q) { return q.sleepers(); }
void queue_skip_ahead(queue_core& q, std::uint32_t values, std::uint32_t lines) { q.skip_ahead(values, lines); }
void queue_join_as_producer(queue_core& q) { q.join_as_producer(); }

void queue_mark_peers_incomplete(queue_core& q) { q.mark_peers_incomplete(); }
const storage& queue_storage(const queue_core& q) { return q.state(); }
std::shared_ptr<queue_core> queue_from_storage(storage s, std::string_view signature, record_drop drop) {
  return queue_core::attach(std::move(s), signature, drop);
}

}  // namespace cohort::detail

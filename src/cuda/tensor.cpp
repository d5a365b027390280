// Device tensors: their storages (a block of this process's arena, or one
// received from another process), how those cross, and the copies and
// fills that need no kernel of cohort's own.
#include "cohort/cuda/tensor.hpp"

#include "cohort/cuda/device.hpp"
#include "cohort/cuda/error.hpp"
#include "cohort/cuda/event.hpp"
#include "cuda/arena.hpp"
#include "cuda/driver.hpp"
#include "cuda/exchange.hpp"
#include "cuda/poller.hpp"

#include <fmt/format.h>

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <set>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace cohort::cuda {
namespace {

thread_local CUstream_st* current = nullptr;

// What follows a device tensor's note in its record: 24 bytes.
struct record_wire {
  std::uint64_t nbytes;
  std::uint32_t sender;  // the process that sent it, which answers for its chunk too
  std::uint32_t port;    // the sender's socket
  std::uint32_t event;   // the sender's event slot, recorded after its work on the tensor
  std::uint32_t zero;
};
static_assert(std::is_trivially_copyable_v<record_wire> && sizeof(record_wire) == 24);

// The events this process records as it sends device tensors, each in a
// slot of its own, and a table in shared memory of how many receivers'
// waits each slot's records asked for (sends, counted here) and how many
// no longer depend on the record (acks, counted by each receiver: the
// event was done when it looked, its poller later saw it done, or its
// cudaStreamWaitEvent returned, after which later records do not touch the
// wait). A slot is recorded again only once all of its waits are counted,
// so that each takes the record it was sent for, not a later one.
using detail::max_slots;
using detail::slot_counts;
using detail::table_bytes;

slot_counts* map_table(int fd, const std::string& whose) {
  void* at = ::mmap(nullptr, table_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (at == MAP_FAILED) {
    throw std::system_error(errno, std::generic_category(), fmt::format("cohort::cuda: mapping the event table of {}", whose));
  }
  return static_cast<slot_counts*>(at);
}

bool acked(const slot_counts& c) {
  const auto sends = c.sends.load(std::memory_order_relaxed);
  return c.acks.load(std::memory_order_acquire) >= sends;
}

void acknowledge(slot_counts& counts) { counts.acks.fetch_add(1, std::memory_order_release); }

// A queue's slot is recorded again once acknowledged; an argument's (read
// by every rank it was given to) never is.
struct pooled_event {
  int device;
  event recorded;
};
struct event_pool {
  std::mutex mutex;
  slot_counts* table = nullptr;  // made with the first send, never unmapped
  std::vector<std::unique_ptr<pooled_event>> slots;
  std::map<int, std::deque<std::uint32_t>> in_use;  // per device, oldest first
};
event_pool& send_events() {
  static auto* p = new event_pool;
  return *p;
}

// Records an event for a device tensor sent from `device` on the current
// stream; returns its slot. `message`: sent through a queue, received once.
std::uint32_t record_send_event(int device, bool message) {
  auto& pool = send_events();
  std::lock_guard lock(pool.mutex);
  if (pool.table == nullptr) {
    const int fd = ::memfd_create("cohort-cuda-events", MFD_CLOEXEC);
    if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(table_bytes)) != 0) {
      const int e = errno;
      if (fd >= 0) ::close(fd);
      throw std::system_error(e, std::generic_category(), "cohort::cuda: the event table");
    }
    try {
      pool.table = map_table(fd, "this process");
      detail::serve_event_table(fd);
    } catch (...) {
      ::close(fd);
      throw;
    }
    ::close(fd);
  }
  auto& order = pool.in_use[device];
  // The oldest slot, or the next: one still waited for goes to the back,
  // so that a slot never acknowledged (its receiver killed between its pop
  // and its decode) does not keep the others from being recorded again.
  if (order.size() > 1 && !acked(pool.table[order.front()])) {
    order.push_back(order.front());
    order.pop_front();
  }
  std::uint32_t slot;
  const bool reused = !order.empty() && acked(pool.table[order.front()]);
  if (reused) {
    slot = order.front();  // taken from the order only once recorded
  } else {
    if (pool.slots.size() >= max_slots) {
      throw std::runtime_error(fmt::format(
          "cohort::cuda: {} device tensors sent and not yet received: the most this process may have in flight",
          max_slots));
    }
    slot = static_cast<std::uint32_t>(pool.slots.size());
    auto made = std::make_unique<pooled_event>(pooled_event{device, event(device)});
    detail::serve_event(slot, made->recorded.ipc_handle());
    pool.slots.push_back(std::move(made));
  }
  // Counted last, once nothing more can throw: a failure before leaves the
  // slot where it was and nothing counted for a send that never was.
  pool.slots[slot]->recorded.record(current);
  if (message) order.push_back(slot);
  if (reused) order.pop_front();
  pool.table[slot].sends.fetch_add(1, std::memory_order_relaxed);
  return slot;
}

// Whether every wait that the records of this process's queue messages
// asked for has passed.
bool all_acknowledged() {
  auto& pool = send_events();
  std::lock_guard lock(pool.mutex);
  for (const auto& [device, order] : pool.in_use) {
    for (auto slot : order) {
      if (!acked(pool.table[slot])) return false;
    }
  }
  return true;
}

bool ended(pid_t pid) { return ::kill(pid, 0) != 0 && errno == ESRCH; }

// What a received tensor's release lets go of once the stream it was
// received on has done the work queued before the release.
struct release_parcel {
  cohort::storage note;
  std::shared_ptr<detail::held_chunk> chunk;
};

// Set on the poller's own thread (start_polling).
thread_local bool on_poller_thread = false;
void keep_for_another_thread(std::shared_ptr<detail::held_chunk> chunk) noexcept;
void close_on_another_thread(release_parcel* r) noexcept;
bool last_user_of_opened(detail::held_chunk& chunk) noexcept;

// Closes an opened chunk that no tensor here uses any more (its
// cudaIpcCloseMemHandle waits for the device first, as chunk's release
// does), then lets go of the parcel's note: the maker frees the chunk once
// every receiver has let go of its notes.
void close_then_release(release_parcel* r) noexcept {
  { const chunk closed = std::move(r->chunk->memory); }
  delete r;
}

// Takes one user off `c`, received here, outside a release (a receipt that
// failed after the chunk was had): an opened chunk left with none is closed
// at once, before the caller lets go of the note.
void drop_user(detail::held_chunk& c) noexcept {
  if (!c.opened) {
    c.users.fetch_sub(1, std::memory_order_release);
    return;
  }
  if (last_user_of_opened(c)) {
    const chunk closed = std::move(c.memory);
  }
}

// The note's holds go first: the maker may reuse the block then. The
// chunk's count is taken down after, through the parcel's own hold on the
// chunk, let go of last: once the note is gone, the arena may free a chunk
// of this process's own, and once the count is 0, sweep_imports may drop an
// imported one from its cache; either may be the last other hold. An
// opened chunk's last user closes it before the note goes (on another
// thread than the poller's, which never ends a chunk).
void release_now(release_parcel* r) noexcept {
  if (r->chunk->opened && last_user_of_opened(*r->chunk)) {
    if (on_poller_thread) close_on_another_thread(r);
    else close_then_release(r);
    return;
  }
  auto chunk = std::move(r->chunk);
  const bool counted = chunk->opened;  // by last_user_of_opened
  delete r;
  if (!counted) chunk->users.fetch_sub(1, std::memory_order_release);
  // Handed on whatever its count now says: another thread may drop its own
  // hold (the import cache, the arena) at any moment after.
  if (on_poller_thread) keep_for_another_thread(std::move(chunk));
}

// Releases waiting for their streams: an event recorded after the last use
// (no host function, which would hold the stream up until a host thread has
// run it), polled as tensors are received and released, and by a thread of
// its own while any is left.
struct pending_release {
  int device;
  cudaEvent_t done;
  release_parcel* parcel;
};
// Waits on other processes' events that were not done at receipt. The
// receiving stream waits on a word of pinned host memory
// (cuStreamWaitValue32), which the poller raises once the event is done or
// its sender has ended: a sender killed before its work ran would hold a
// stream waiting on its event itself up for good.
struct gated_wait {
  cudaEvent_t event;  // opened here; the cache of opened events keeps it
  pid_t sender;
  slot_counts* counts;  // acknowledged once the wait is over
  std::uint32_t seq;
};
struct stream_gate {
  std::uint32_t* word = nullptr;  // pinned, mapped for the device; never freed
  std::uint32_t issued = 0;
  std::deque<gated_wait> waiting;  // in the order of their seq
};
// An asynchronous wait on an event (event::async_wait, async_synchronize).
struct watched_event {
  int device;
  cudaEvent_t event;
  std::shared_ptr<CUevent_st> keep;  // holds `event` for the wait
  std::unique_ptr<detail::event_waiter> waiter;
};
struct device_poller {
  std::mutex mutex;
  std::condition_variable wake;
  std::deque<pending_release> entries;  // oldest first
  std::vector<watched_event> watched;
  std::map<int, std::vector<cudaEvent_t>> spare;  // per device
  std::map<std::pair<int, CUstream_st*>, stream_gate> gates;
  std::size_t gated = 0;  // waits not yet over, on every gate
  bool polling = false;
  // The holds of releases run on the poller's thread, which never ends a
  // chunk: a chunk's end waits for its device (cudaDeviceSynchronize),
  // whose streams may wait on gates only that thread raises. Let go of by
  // the next poll on another thread (a receipt or release of a device
  // tensor), or empty_cache().
  std::vector<std::shared_ptr<detail::held_chunk>> unheld;
  // Releases whose opened chunk the poller's thread left to close, their
  // notes held until it is: closed by the next poll on another thread.
  std::vector<release_parcel*> unclosed;
};
device_poller& poller() {
  static auto* q = new device_poller;
  return *q;
}

void keep_for_another_thread(std::shared_ptr<detail::held_chunk> chunk) noexcept {
  auto& q = poller();
  std::lock_guard lock(q.mutex);
  try {
    q.unheld.push_back(std::move(chunk));
  } catch (...) {
    // Out of memory: kept for good where it can be, rather than ended here.
    std::ignore = new (std::nothrow) std::shared_ptr<detail::held_chunk>(std::move(chunk));
  }
}

void close_on_another_thread(release_parcel* r) noexcept {
  auto& q = poller();
  std::lock_guard lock(q.mutex);
  try {
    q.unclosed.push_back(r);
  } catch (...) {
    // Out of memory: left open for good, its note held, so that the maker
    // never frees it.
  }
}

// Tells a watch's waiter how its event ended, after letting go of the
// watch's hold on the event (the last hold destroys it).
void end_watch(watched_event& w, cudaError_t state) noexcept {
  std::exception_ptr error;
  if (state != cudaSuccess) {
    try {
      detail::check(state, "cudaEventQuery", fmt::format("cohort::cuda::event::async_wait: device {}", w.device));
    } catch (...) {
      error = std::current_exception();
    }
  }
  w.keep.reset();
  w.waiter->done(error);
}

// Takes the releases at the front whose streams have done their work (and
// runs their parcels after the lock), ends the gated waits whose events are
// done or whose senders have ended, and tells the asynchronous waits whose
// events are done. Whether any of these is left. Each event is asked with
// its own device's context current: on a thread with none (the poller's,
// a decoding one) the runtime would make device 0's.
bool poll_device(device_poller& q) {
  std::vector<std::shared_ptr<detail::held_chunk>> unheld;  // let go of last, after the lock
  std::vector<release_parcel*> unclosed;
  std::vector<release_parcel*> done;
  std::vector<std::pair<watched_event, cudaError_t>> finished;
  bool left = false;
  {
    std::lock_guard lock(q.mutex);
    if (!on_poller_thread) {
      unheld.swap(q.unheld);
      unclosed.swap(q.unclosed);
    }
    while (!q.entries.empty()) {
      auto& front = q.entries.front();
      const detail::device_guard on(front.device);
      const cudaError_t state = cudaEventQuery(front.done);
      if (state == cudaErrorNotReady) break;
      if (state != cudaSuccess) std::ignore = cudaGetLastError();  // a failed device runs nothing more
      done.push_back(front.parcel);
      q.spare[front.device].push_back(front.done);
      q.entries.pop_front();
    }
    for (auto& [where, gate] : q.gates) {
      while (!gate.waiting.empty()) {
        auto& front = gate.waiting.front();
        // A sender that has ended is not asked about its event: once its
        // maker destroyed it, an opened event's use is undefined.
        if (!ended(front.sender)) {
          const detail::device_guard on(where.first);
          const cudaError_t state = cudaEventQuery(front.event);
          if (state == cudaErrorNotReady) break;
          if (state != cudaSuccess) std::ignore = cudaGetLastError();
        }
        __atomic_store_n(gate.word, front.seq, __ATOMIC_RELEASE);
        acknowledge(*front.counts);
        gate.waiting.pop_front();
        --q.gated;
      }
    }
    for (auto it = q.watched.begin(); it != q.watched.end();) {
      const detail::device_guard on(it->device);
      const cudaError_t state = cudaEventQuery(it->event);
      if (state == cudaErrorNotReady) {
        ++it;
        continue;
      }
      if (state != cudaSuccess) std::ignore = cudaGetLastError();
      finished.push_back({std::move(*it), state});
      it = q.watched.erase(it);
    }
    left = !q.entries.empty() || q.gated > 0 || !q.watched.empty();
  }
  for (auto* parcel : done) release_now(parcel);
  for (auto* parcel : unclosed) close_then_release(parcel);
  for (auto& [w, state] : finished) end_watch(w, state);
  return left;
}

void start_polling(device_poller& q) {
  std::thread([&q] {
    on_poller_thread = true;
    for (;;) {
      {
        std::unique_lock lock(q.mutex);
        q.wake.wait(lock, [&q] { return !q.entries.empty() || q.gated > 0 || !q.watched.empty(); });
      }
      if (poll_device(q)) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }).detach();
}

// Wakes the poller's thread for what was just added, starting it first
// when there is none yet.
void wake_poller(device_poller& q) {
  bool start = false;
  {
    std::lock_guard lock(q.mutex);
    start = !std::exchange(q.polling, true);
  }
  q.wake.notify_one();
  if (!start) return;
  try {
    start_polling(q);
  } catch (...) {
    std::lock_guard lock(q.mutex);
    q.polling = false;  // polled as tensors come and go, and tried again
  }
}

// Lets `parcel` go once the work queued so far on `stream` is done.
void release_after(int device, CUstream_st* stream, release_parcel* parcel) noexcept {
  auto& q = poller();
  cudaEvent_t done = nullptr;
  {
    std::lock_guard lock(q.mutex);
    auto& spare = q.spare[device];
    if (!spare.empty()) {
      done = spare.back();
      spare.pop_back();
    }
  }
  const detail::device_guard on(device);
  if (done == nullptr && cudaEventCreateWithFlags(&done, cudaEventDisableTiming) != cudaSuccess) done = nullptr;
  if (done == nullptr || cudaEventRecord(done, stream) != cudaSuccess) {
    // The stream cannot take it (the process is ending, or the device
    // failed): wait for it here instead.
    std::ignore = cudaGetLastError();
    std::ignore = cudaStreamSynchronize(stream);
    if (done != nullptr) std::ignore = cudaEventDestroy(done);
    release_now(parcel);
    return;
  }
  try {
    std::lock_guard lock(q.mutex);
    q.entries.push_back({device, done, parcel});
  } catch (...) {
    std::ignore = cudaEventSynchronize(done);
    std::ignore = cudaEventDestroy(done);
    release_now(parcel);
    return;
  }
  wake_poller(q);
  poll_device(q);
}

// Makes the current stream wait for `e`, another process's event for which
// `counts` counts the waits: not at all when it is done already; on a gate
// where the driver has stream memory operations; else on the event itself.
void wait_on_sender_event(int device, const event& e, pid_t sender, slot_counts& counts) {
  const auto& api = detail::driver("cohort::decode");
  const detail::device_guard on(device, fmt::format("cohort::decode: a device tensor from process {}", sender));
  const cudaError_t state = cudaEventQuery(e.native_handle());
  if (state == cudaSuccess) {
    acknowledge(counts);
    return;
  }
  if (state != cudaErrorNotReady) {
    std::ignore = cudaGetLastError();
    throw decode_error(fmt::format("cohort::decode: the event of a device tensor from process {} cannot be waited on: {}",
                                   sender, cudaGetErrorName(state)));
  }
  if (api.stream_wait_value32 != nullptr) {
    auto& q = poller();
    bool gated = false;
    {
      std::lock_guard lock(q.mutex);
      auto& gate = q.gates[{device, current}];
      if (gate.word == nullptr) {
        void* word = nullptr;
        if (cudaHostAlloc(&word, sizeof(std::uint32_t), cudaHostAllocMapped | cudaHostAllocPortable) == cudaSuccess) {
          gate.word = static_cast<std::uint32_t*>(word);
          *gate.word = 0;
        }
      }
      void* address = nullptr;
      const std::uint32_t seq = gate.issued + 1;
      if (gate.word != nullptr && cudaHostGetDevicePointer(&address, gate.word, 0) == cudaSuccess &&
          api.stream_wait_value32(reinterpret_cast<CUstream>(current), reinterpret_cast<CUdeviceptr>(address), seq,
                                  CU_STREAM_WAIT_VALUE_GEQ) == CUDA_SUCCESS) {
        gate.issued = seq;
        gate.waiting.push_back({e.native_handle(), sender, &counts, seq});
        ++q.gated;
        gated = true;
      }
      std::ignore = cudaGetLastError();
    }
    if (gated) {
      wake_poller(q);
      return;
    }
  }
  e.wait(current);
  acknowledge(counts);
}

// Other processes' events, opened here once each, and their tables, kept
// until their sender has ended (forget_ended_senders).
struct opened_events {
  std::mutex mutex;
  std::map<std::tuple<pid_t, std::uint32_t, std::uint32_t>, event> events;
  std::map<std::pair<pid_t, std::uint32_t>, slot_counts*> tables;
};
opened_events& received_events() {
  static auto* o = new opened_events;
  return *o;
}

// Closes the events and unmaps the tables of senders that have ended, but
// those a gated wait still names (the poller ends such a wait once it sees
// the sender gone, and they go with a later sender's first message). A
// process fed by many senders over its life (workers started anew) keeps
// only the live ones'. Under o's lock.
void forget_ended_senders(opened_events& o) {
  std::set<pid_t> gated;
  {
    auto& q = poller();
    std::lock_guard lock(q.mutex);
    for (const auto& [where, gate] : q.gates) {
      for (const auto& w : gate.waiting) gated.insert(w.sender);
    }
  }
  for (auto it = o.tables.begin(); it != o.tables.end();) {
    const auto [pid, port] = it->first;
    if (gated.contains(pid) || !ended(pid)) {
      ++it;
      continue;
    }
    std::erase_if(o.events, [&](const auto& e) { return std::get<0>(e.first) == pid && std::get<1>(e.first) == port; });
    ::munmap(it->second, table_bytes);
    it = o.tables.erase(it);
  }
  detail::forget_ended_peers();
}

// The event table of `sender` (its socket `port`), mapped here once; null,
// with `why`, when it cannot be had. Under o's lock.
slot_counts* table_of(opened_events& o, pid_t sender, std::uint32_t port, std::string& why) {
  if (const auto found = o.tables.find({sender, port}); found != o.tables.end()) return found->second;
  forget_ended_senders(o);
  auto& table = o.tables[{sender, port}];
  const int fd = detail::fetch_event_table(sender, port, why);
  if (fd < 0) {
    o.tables.erase({sender, port});
    return nullptr;
  }
  try {
    table = map_table(fd, fmt::format("process {}", sender));
  } catch (...) {
    ::close(fd);
    o.tables.erase({sender, port});
    throw;
  }
  ::close(fd);
  return table;
}

// A queue message's device tensor refused here (a device not seen, a
// chunk that cannot be had...): its event's wait counts as passed, since
// no other process will receive it, so that its sender neither keeps the
// slot from being recorded again nor waits for it as its rank ends.
void acknowledge_refused(pid_t sender, std::uint32_t port, std::uint32_t slot) noexcept {
  if (slot >= max_slots) return;
  try {
    // As chunk_for: this pid on another port was an earlier process.
    if (sender == ::getpid() && port == detail::own_port()) {
      auto& pool = send_events();
      std::lock_guard lock(pool.mutex);
      if (slot < pool.slots.size()) acknowledge(pool.table[slot]);
      return;
    }
    auto& o = received_events();
    std::lock_guard lock(o.mutex);
    std::string why;
    if (auto* table = table_of(o, sender, port, why)) acknowledge(table[slot]);
  } catch (...) {
    // Its table cannot be mapped here: nothing to count in.
  }
}

// Makes the current stream wait for the sender's work on the tensor.
void wait_for_sender(int device, pid_t sender, std::uint32_t port, std::uint32_t slot) {
  if (slot >= max_slots) throw decode_error(fmt::format("cohort::decode: a device tensor names event slot {}", slot));
  // As chunk_for: this pid on another port was an earlier process.
  if (sender == ::getpid() && port == detail::own_port()) {
    auto& pool = send_events();
    std::lock_guard lock(pool.mutex);
    if (slot >= pool.slots.size()) {
      throw decode_error(fmt::format("cohort::decode: a device tensor names event {} of this process, which has {}", slot,
                                     pool.slots.size()));
    }
    pool.slots[slot]->recorded.wait(current);
    acknowledge(pool.table[slot]);
    return;
  }
  auto& o = received_events();
  std::lock_guard lock(o.mutex);
  const auto from = [&](const std::string& what, const std::string& why) {
    return decode_error(fmt::format("cohort::decode: the {} of a device tensor from process {}: {}", what, sender, why));
  };
  std::string why;
  slot_counts* const table = table_of(o, sender, port, why);
  if (table == nullptr) throw from("event table", why);
  auto found = o.events.find({sender, port, slot});
  if (found == o.events.end()) {
    ipc_event_handle handle;
    std::string why;
    if (!detail::fetch_event(sender, port, slot, handle, why)) throw from("event", why);
    found = o.events.emplace(std::tuple{sender, port, slot}, event::from_ipc_handle(device, handle)).first;
  }
  wait_on_sender_event(device, found->second, sender, table[slot]);
}

// Other processes' chunks mapped here, each once, by maker: its pid and
// its port, random in each process (chunk ids start again in each, and a
// pid may be another process's by the time a chunk of a dead maker is let
// go of here), and the chunk's id.
struct import_cache {
  std::mutex mutex;
  std::map<std::tuple<pid_t, std::uint32_t, std::uint64_t>, std::shared_ptr<detail::held_chunk>> chunks;
};
import_cache& imports() {
  static auto* c = new import_cache;
  return *c;
}

// Unmaps the chunks no tensor here uses that will not be used again: a
// large tensor's own chunk (its maker frees it once every receiver is done),
// or any chunk of a maker that has ended; every unused one when `all`. A
// chunk named by a message this process sent on stays until that message
// is received: its receiver may ask here for it once the maker has ended.
// (An opened chunk leaves as its last user goes: last_user_of_opened.)
int sweep_imports(import_cache& c, bool all) {
  int gone = 0;
  for (auto it = c.chunks.begin(); it != c.chunks.end();) {
    const auto& h = *it->second;
    const auto& [maker, port, id] = it->first;
    if (h.users.load(std::memory_order_acquire) == 0 && (all || h.single || ended(h.maker)) &&
        !detail::sent_unreceived(maker, port, id)) {
      it = c.chunks.erase(it);
      ++gone;
    } else {
      ++it;
    }
  }
  return gone;
}

// Takes one user off `c`, an ipc_handle chunk opened here; true when it was
// the last, the chunk then out of the cache, so that no receipt takes it up
// again before the caller closes it (a later one opens the handle anew).
bool last_user_of_opened(detail::held_chunk& c) noexcept {
  auto& cache = imports();
  std::lock_guard lock(cache.mutex);
  if (c.users.fetch_sub(1, std::memory_order_acq_rel) != 1) return false;
  const auto found = cache.chunks.find(std::tuple{c.maker, c.port, c.id});
  if (found != cache.chunks.end() && found->second.get() == &c) cache.chunks.erase(found);
  return true;
}

// The chunk `note` names, mapped here on `device`, with one more user.
std::shared_ptr<detail::held_chunk> chunk_for(const detail::chunk_note& note, int device, pid_t sender,
                                              std::uint32_t port) {
  const auto maker = static_cast<pid_t>(note.maker);
  // A maker of this pid answering on another port was an earlier process
  // that had it: its chunks are asked for as any other maker's.
  if (maker == ::getpid() && note.maker_port == detail::own_port()) {
    auto own = detail::own_chunk(note.chunk_id);
    if (!own) throw decode_error(fmt::format("cohort::decode: a device tensor names chunk {} of this process, which it has freed", note.chunk_id));
    if (own->memory.size() != note.chunk_size) {
      throw decode_error(fmt::format("cohort::decode: a device tensor names chunk {} of this process as {} bytes; "
                                     "it has {}",
                                     note.chunk_id, note.chunk_size, own->memory.size()));
    }
    own->users.fetch_add(1, std::memory_order_relaxed);
    return own;
  }
  auto& c = imports();
  std::lock_guard lock(c.mutex);
  const auto key = std::tuple{maker, note.maker_port, note.chunk_id};
  if (auto found = c.chunks.find(key); found != c.chunks.end()) {
    found->second->users.fetch_add(1, std::memory_order_relaxed);
    return found->second;
  }
  sweep_imports(c, false);
  detail::forget_ended_peers();
  auto held = std::make_shared<detail::held_chunk>();
  held->maker = maker;
  held->port = note.maker_port;
  held->id = note.chunk_id;
  held->single = note.single != 0;
  if (note.kind == static_cast<std::uint8_t>(sharing::ipc_handle)) {
    held->memory = chunk::open(device, note.ipc, note.chunk_size);
    held->opened = true;
  } else {
    // From its maker, or, once the maker has ended, from the sender, which
    // holds it mapped.
    std::string why_maker, why_sender;
    int fd = detail::fetch_chunk(maker, note.maker_port, maker, note.maker_port, note.chunk_id, why_maker);
    if (fd < 0 && sender != maker) {
      fd = detail::fetch_chunk(sender, port, maker, note.maker_port, note.chunk_id, why_sender);
    }
    if (fd < 0) {
      throw decode_error(fmt::format("cohort::decode: chunk {} of process {} cannot be had: from its maker: {}{}",
                                     note.chunk_id, maker, why_maker,
                                     sender != maker ? fmt::format("; from its sender {}: {}", sender, why_sender) : ""));
    }
    held->fd = fd;
    held->memory = chunk::import(device, fd, note.chunk_size);
    // Whoever this process sends it on to may ask here.
    detail::serve_chunk(maker, note.maker_port, note.chunk_id, fd);
  }
  held->users.store(1, std::memory_order_relaxed);
  c.chunks.emplace(key, held);
  return held;
}

// What undoes a message's counts when it is not sent after all (a push that
// failed): its note's send counted as received, its event's as acknowledged,
// so that neither waits for a receiver that will never come (the note's
// block kept from reuse, the slot never recorded again, a rank's end
// waiting its full limit).
void append_record(std::vector<std::byte>& out, const cohort::storage& note, std::size_t nbytes, int device) {
  cohort::detail::handle_codec<cohort::storage>::write(out, note);
  // Through a queue (received once, by one process), not an argument.
  auto* const context = cohort::detail::current_handles;
  const bool message = context != nullptr && context->message;
  if (message) {
    // Kept before the count it undoes is taken (note_sent counts first, and
    // may throw after): a push that fails then undoes it whatever happened.
    context->if_unsent.reserve(context->if_unsent.size() + 2);
    context->if_unsent.emplace_back([note] { detail::note_received(note.data()); });
    detail::note_sent(note);
  }
  const auto slot = record_send_event(device, message);
  if (message) context->if_unsent.emplace_back([slot] { acknowledge(send_events().table[slot]); });
  const record_wire w{nbytes, static_cast<std::uint32_t>(::getpid()), detail::own_port(), slot, 0};
  const auto* bytes = reinterpret_cast<const std::byte*>(&w);
  out.insert(out.end(), bytes, bytes + sizeof w);
}

std::size_t record_bound(const cohort::storage& note) {
  return cohort::detail::handle_codec<cohort::storage>::size_bound(note) + sizeof(record_wire);
}

// A block of this process's arena.
class owned_memory final : public cohort::detail::device_memory {
 public:
  owned_memory(int device, detail::block b, std::size_t nbytes) : block_(std::move(b)), nbytes_(nbytes), device_(device) {}
  ~owned_memory() override { detail::give_back(device_, std::move(block_)); }
  std::byte* data() const noexcept override { return block_.data(); }
  std::size_t nbytes() const noexcept override { return nbytes_; }
  int device_type() const noexcept override { return kDLCUDA; }
  int device_index() const noexcept override { return device_; }
  std::size_t handle_bound() const noexcept override { return record_bound(block_.note); }
  void write(std::vector<std::byte>& out) const override { append_record(out, block_.note, nbytes_, device_); }

 private:
  detail::block block_;
  std::size_t nbytes_;
  int device_;
};

// A block of another process's chunk (or of one's own, sent back).
class received_memory final : public cohort::detail::device_memory {
 public:
  received_memory(cohort::storage note, std::shared_ptr<detail::held_chunk> chunk, std::uint64_t offset,
                  std::size_t nbytes, int device)
      : note_(std::move(note)),
        chunk_(std::move(chunk)),
        data_(static_cast<std::byte*>(chunk_->memory.data()) + offset),
        nbytes_(nbytes),
        device_(device),
        stream_(current) {}
  // Stream-ordered: the note goes, and the maker may reuse the block, once
  // the work queued so far on the stream it was received on is done; the
  // host is not blocked.
  ~received_memory() override {
    auto* parcel = new (std::nothrow) release_parcel{std::move(note_), chunk_};
    if (parcel == nullptr) {
      const detail::device_guard on(device_);
      std::ignore = cudaStreamSynchronize(stream_);
      drop_user(*chunk_);  // before note_ goes, after this body
      return;
    }
    release_after(device_, stream_, parcel);
  }
  std::byte* data() const noexcept override { return data_; }
  std::size_t nbytes() const noexcept override { return nbytes_; }
  int device_type() const noexcept override { return kDLCUDA; }
  int device_index() const noexcept override { return device_; }
  std::size_t handle_bound() const noexcept override { return record_bound(note_); }
  void write(std::vector<std::byte>& out) const override { append_record(out, note_, nbytes_, device_); }

 private:
  cohort::storage note_;
  std::shared_ptr<detail::held_chunk> chunk_;
  std::byte* data_;
  std::size_t nbytes_;
  int device_;
  CUstream_st* stream_;
};

// The sender, port and event slot of a queue message's device tensor,
// read ahead of its note (a shared storage's handle); a sender of 0 where
// the record does not hold together that far.
record_wire sender_ahead(const cohort::detail::reader& in) {
  record_wire w{};
  constexpr auto note_handle = cohort::detail::handle_codec<cohort::storage>::handle_size;
  cohort::detail::reader ahead = in;
  if (!in.from_queue_record() || ahead.left() < note_handle + sizeof w || ahead.next() != std::byte{1}) return w;
  (void)ahead.take(note_handle - 1);
  std::memcpy(&w, ahead.take(sizeof w).data(), sizeof w);
  if (w.zero != 0 || w.sender > INT_MAX) w.sender = 0;
  return w;
}

cohort::storage read_device_storage(cohort::detail::reader& in) {
  poll_device(poller());
  // A queue's message refused from here on, its note's handle included, is
  // acknowledged to its sender.
  const auto ahead = sender_ahead(in);
  struct acknowledge_if_refused {
    pid_t sender;
    std::uint32_t port, slot;
    ~acknowledge_if_refused() {
      if (sender != 0) acknowledge_refused(sender, port, slot);
    }
  } refusal{static_cast<pid_t>(ahead.sender), ahead.port, ahead.event};
  auto note = cohort::detail::handle_codec<cohort::storage>::read(in);
  if (in.left() < sizeof(record_wire)) throw decode_error("cohort::decode: the input ends early");
  record_wire w;
  std::memcpy(&w, in.take(sizeof w).data(), sizeof w);
  if (w.zero != 0) throw decode_error("cohort::decode: a device tensor's padding is not zero");
  if (w.sender == 0 || w.sender > INT_MAX) throw decode_error(fmt::format("cohort::decode: a device tensor from pid {}", w.sender));
  const auto sender = static_cast<pid_t>(w.sender);
  if (in.from_queue_record()) {
    // As read now, whatever the note was (an empty one has no handle to
    // read ahead past).
    refusal.sender = sender;
    refusal.port = w.port;
    refusal.slot = w.event;
  }
  if (note.nbytes() != detail::note_bytes) {
    throw decode_error(fmt::format("cohort::decode: a device tensor's note of {} bytes", note.nbytes()));
  }
  // Received once the chunk is mapped and the wait on the sender's event
  // is queued, or has failed: the sender's rank may end then.
  // The note's bytes stay mapped while the storage returned, or `note`
  // itself, holds them.
  struct count_receipt {
    std::byte* note;
    ~count_receipt() {
      if (note != nullptr) detail::note_received(note);
    }
  } receipt{in.from_queue_record() ? note.data() : nullptr};
  detail::chunk_note n;
  std::memcpy(&n, note.data(), sizeof n);
  if (n.magic != detail::chunk_note::expected_magic || n.kind > 1 || n.single > 1 || n.maker == 0 ||
      n.maker > INT_MAX || n.chunk_size == 0 || n.capacity > n.chunk_size || n.offset > n.chunk_size - n.capacity ||
      w.nbytes > n.capacity) {
    throw decode_error(fmt::format(
        "cohort::decode: a device tensor of {} bytes at {} of chunk {} ({} bytes, block of {}) of process {}: not a "
        "block of that chunk",
        w.nbytes, n.offset, n.chunk_id, n.chunk_size, n.capacity, n.maker));
  }
  uuid id;
  id.bytes = n.device;
  const auto device = find_device(id);
  if (!device) {
    throw decode_error(fmt::format("cohort::decode: a tensor on device {}, which this process does not see (see CUDA_VISIBLE_DEVICES)",
                                   to_string(id)));
  }
  auto chunk = chunk_for(n, *device, sender, w.port);
  std::shared_ptr<received_memory> memory;
  try {
    wait_for_sender(*device, sender, w.port, w.event);
    refusal.sender = 0;  // waited for, or waiting: its wait acknowledges
    // A note received twice in this process is one storage here; each
    // received tensor still gets a storage of its own over the block.
    memory = std::make_shared<received_memory>(std::move(note), chunk, n.offset, w.nbytes, *device);
  } catch (...) {
    drop_user(*chunk);  // before the note goes, as this call ends
    throw;
  }
  return cohort::detail::make_device_storage(std::move(memory));
}

// A device tensor's record in a queue's value that failed before it: its
// note's hold let go of, its receipt counted and its event's wait
// acknowledged, as a refusal of it would.
void drop_unread_record(std::span<const std::byte> bytes) noexcept {
  try {
    cohort::detail::reader in(bytes, cohort::detail::reader::source::queue_record);
    const auto w = sender_ahead(in);
    const auto note = cohort::detail::handle_codec<cohort::storage>::read(in);
    if (note.nbytes() == detail::note_bytes) detail::note_received(note.data());
    if (w.sender != 0) acknowledge_refused(static_cast<pid_t>(w.sender), w.port, w.event);
  } catch (...) {
    // Its note's segment cannot be opened: nothing here to let go of.
  }
}

// As a rank ends: its device work done first, so that every event it
// recorded fires (work still queued when a process ends never runs), then
// every receiver of its queue messages past its wait on the message's event
// (an event outlives its maker in no process). A receiver waits only once
// it has mapped the chunk, so it no longer asks here for it then. Messages
// others sent on about this process's blocks are not waited for (their
// senders keep the chunks mapped, and serve them, until those are
// received), but for blocks shared by CUDA IPC handle, which a receiver
// opens from this process's allocation alone.
void wait_for_receivers(std::chrono::steady_clock::duration limit) noexcept {
  const auto until = std::chrono::steady_clock::now() + limit;
  std::vector<int> devices;
  {
    auto& pool = send_events();
    std::lock_guard lock(pool.mutex);
    for (const auto& e : pool.slots) {
      if (std::find(devices.begin(), devices.end(), e->device) == devices.end()) devices.push_back(e->device);
    }
  }
  for (int device : devices) {
    const detail::device_guard on(device);
    std::ignore = cudaDeviceSynchronize();
  }
  while (!(all_acknowledged() && detail::made_ipc_notes_settled()) && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Makes the work queued next on the current stream of device `from` wait
// for the copy just queued on that of device `to`, which reads from
// `from`: a block the source lets go of is reused at once by work on its
// device's stream, which must not overwrite it under the copy.
void order_after_copy(int from, int to) {
  constexpr const char* entry = "cohort::tensor::to";
  const auto context = fmt::format("{}: from device {} to device {}", entry, from, to);
  cudaEvent_t copied = nullptr;
  {
    const detail::device_guard on(to, context);
    detail::check(cudaEventCreateWithFlags(&copied, cudaEventDisableTiming), "cudaEventCreateWithFlags", context);
  }
  // Destroyed at once: the driver keeps what the queued wait needs.
  const auto destroy = [to](CUevent_st* e) {
    const detail::device_guard on(to);
    std::ignore = cudaEventDestroy(e);
  };
  const std::unique_ptr<CUevent_st, decltype(destroy)> keep(copied, destroy);
  {
    const detail::device_guard on(to, context);
    detail::check(cudaEventRecord(copied, current), "cudaEventRecord", context);
  }
  const detail::device_guard on(from, context);
  detail::check(cudaStreamWaitEvent(current, copied, 0), "cudaStreamWaitEvent", context);
}

// Copies a whole storage's bytes, on the current stream of `device`, a
// device checked by check_device.
void copy_bytes(void* to, const void* from, std::size_t n, int device, const char* entry) {
  if (n == 0) return;
  const auto context = fmt::format("{}: {} on device {}", entry, detail::describe_bytes(n), device);
  const detail::device_guard on(device, context);
  detail::check(cudaMemcpyAsync(to, from, n, cudaMemcpyDefault, current), "cudaMemcpyAsync", context);
}

// Copies `n` bytes of device `from_device`'s memory to device `to_device`'s,
// on the current stream of `to_device`. A peer copy, not cudaMemcpyAsync:
// this layer's chunks are mapped for their own device alone
// (cuMemSetAccess), and a plain copy queued on another device would read
// memory that device has no access to.
void copy_between_devices(void* to, int to_device, const void* from, int from_device, std::size_t n,
                          const char* entry) {
  if (n == 0) return;
  const auto context =
      fmt::format("{}: {} from device {} to device {}", entry, detail::describe_bytes(n), from_device, to_device);
  const detail::device_guard on(to_device, context);
  detail::check(cudaMemcpyPeerAsync(to, to_device, from, from_device, n, current), "cudaMemcpyPeerAsync", context);
}

// Device storage of `nbytes` on `device`, for the call `entry`.
cohort::storage device_storage(int device, std::size_t nbytes, const char* entry) {
  return cohort::detail::make_device_storage(
      std::make_shared<owned_memory>(device, detail::allocate(device, nbytes, entry), nbytes));
}

// A copy of `t` on `device`, for the call `entry`.
tensor copy_to_device(const tensor& t, int device, const char* entry) {
  auto bytes = device_storage(device, t.storage().nbytes(), entry);
  copy_bytes(bytes.data(), t.storage().data(), bytes.nbytes(), device, entry);
  return tensor(std::move(bytes), t.dtype(), t.shape(), t.strides(), t.storage_offset(),
                cohort::device{kDLCUDA, device});
}

void require_device(const tensor& t, const char* entry) {
  if (t.device().type != kDLCUDA) {
    throw std::logic_error(fmt::format("{}: the tensor is not on a CUDA device", entry));
  }
}

// A CPU copy of the device tensor `t`, complete when it returns, for the
// call `entry`. The tensor's device is checked first: a device tensor may
// be made over any memory (cohort::detail::make_device_storage), on a
// device this process cannot use.
tensor copy_to_cpu(const tensor& t, const char* entry) {
  require_device(t, entry);
  const int device = t.device().id;
  detail::check_device(device, entry);
  auto bytes = cohort::storage::allocate(t.storage().nbytes());
  copy_bytes(bytes.data(), t.storage().data(), bytes.nbytes(), device, entry);
  synchronize(device);
  return tensor(std::move(bytes), t.dtype(), t.shape(), t.strides(), t.storage_offset());
}

// tensor::to and a device tensor's tensor::clone. From one device to
// another, the source's work so far is waited for first: the copy is
// queued on the destination's stream, and the source's stream then waits
// for it.
tensor copy_tensor(const tensor& t, cohort::device to) {
  constexpr const char* entry = "cohort::tensor::to";
  if (to.type == kDLCPU) return copy_to_cpu(t, entry);
  if (t.device() == to) return cuda::clone(t);
  if (t.device().type != kDLCUDA) return copy_to_device(t, to.id, entry);
  // Both devices before any work, so that what is refused names this call.
  detail::check_device(t.device().id, entry);
  detail::check_device(to.id, entry);
  cuda::synchronize(t.device().id);
  auto bytes = device_storage(to.id, t.storage().nbytes(), entry);
  copy_between_devices(bytes.data(), to.id, t.storage().data(), t.device().id, bytes.nbytes(), entry);
  order_after_copy(t.device().id, to.id);
  return tensor(std::move(bytes), t.dtype(), t.shape(), t.strides(), t.storage_offset(), to);
}

[[maybe_unused]] const bool reader_registered = [] {
  cohort::detail::register_device_reader(kDLCUDA, &read_device_storage, &wait_for_receivers, &drop_unread_record);
  cohort::detail::register_device_copy(kDLCUDA, &copy_tensor);
  return true;
}();

}  // namespace

CUstream_st* current_stream() noexcept { return current; }
void set_current_stream(CUstream_st* stream) noexcept { current = stream; }

namespace {

// A tensor made on `device`, its failures named after `entry`: the call the
// program made.
tensor empty_for(int_list sizes, dtype type, int device, const char* entry) {
  const auto shape = sizes.view();
  const auto nbytes =
      static_cast<std::size_t>(cohort::detail::checked_numel(shape, type, entry)) * element_size(type);
  if (nbytes > (std::size_t{1} << 62)) throw std::invalid_argument(fmt::format("{}: the size overflows", entry));
  const auto strides = cohort::detail::contiguous_strides(shape);
  return tensor(device_storage(device, nbytes, entry), type, shape, strides.view(), 0, cohort::device{kDLCUDA, device});
}

tensor full_for(int_list shape, scalar value, dtype type, int device, const char* entry) {
  tensor out = empty_for(shape, type, device, entry);
  fill_(out, value);
  return out;
}

}  // namespace

tensor empty(int_list sizes, dtype type, int device) { return empty_for(sizes, type, device, "cohort::cuda::empty"); }

tensor full(int_list shape, scalar value, dtype type, int device) {
  return full_for(shape, value, type, device, "cohort::cuda::full");
}

tensor zeros(int_list shape, dtype type, int device) {
  return full_for(shape, 0.0, type, device, "cohort::cuda::zeros");
}

void fill_(const tensor& t, scalar value) {
  constexpr const char* entry = "cohort::cuda::fill_";
  require_device(t, entry);
  if (!t.is_contiguous()) throw std::logic_error(fmt::format("{}: the tensor is not contiguous", entry));
  const auto n = static_cast<std::size_t>(t.numel());
  if (n == 0) return;
  // The element as tensor::fill_ converts it, in this process's memory.
  const tensor one = tensor::full({1}, value, t.dtype());
  const auto size = element_size(t.dtype());
  std::uint64_t pattern = 0;
  std::memcpy(&pattern, one.raw_data(), size);
  const int device = t.device().id;
  detail::check_device(device, entry);
  const auto context = fmt::format("{}: {} elements on device {}", entry, n, device);
  const auto& api = detail::driver(entry);
  const detail::device_guard on(device, context);
  const auto at = reinterpret_cast<CUdeviceptr>(t.raw_data());
  auto* stream = reinterpret_cast<CUstream>(current);
  switch (size) {
    case 1:
      detail::check(cudaMemsetAsync(t.raw_data(), static_cast<int>(pattern), n, current), "cudaMemsetAsync", context);
      break;
    case 2:
      detail::check(api.memset_d16_async(at, static_cast<unsigned short>(pattern), n, stream), "cuMemsetD16Async", context);
      break;
    case 4:
      detail::check(api.memset_d32_async(at, static_cast<unsigned>(pattern), n, stream), "cuMemsetD32Async", context);
      break;
    default:  // 8: each half of every element as a column 8 bytes apart
      detail::check(api.memset_d2d32_async(at, 8, static_cast<unsigned>(pattern), 1, n, stream), "cuMemsetD2D32Async",
                    context);
      detail::check(api.memset_d2d32_async(at + 4, 8, static_cast<unsigned>(pattern >> 32), 1, n, stream),
                    "cuMemsetD2D32Async", context);
      break;
  }
}

tensor to_device(const tensor& t, int device) { return copy_to_device(t, device, "cohort::cuda::to_device"); }

tensor to_cpu(const tensor& t) {
  if (t.device().type == kDLCPU) return t;
  return copy_to_cpu(t, "cohort::cuda::to_cpu");
}

tensor clone(const tensor& t) {
  constexpr const char* entry = "cohort::cuda::clone";
  require_device(t, entry);
  const int device = t.device().id;
  auto bytes = device_storage(device, t.storage().nbytes(), entry);
  copy_bytes(bytes.data(), t.storage().data(), bytes.nbytes(), device, entry);
  return tensor(std::move(bytes), t.dtype(), t.shape(), t.strides(), t.storage_offset(), t.device());
}

void synchronize(int device) {
  constexpr const char* entry = "cohort::cuda::synchronize";
  detail::check_device(device, entry);
  const auto context = fmt::format("{}: device {}", entry, device);
  const detail::device_guard on(device, context);
  detail::check(cudaStreamSynchronize(current), "cudaStreamSynchronize", context);
}

namespace detail {

void watch_event(int device, CUevent_st* e, std::shared_ptr<CUevent_st> keep, std::unique_ptr<event_waiter> waiter) {
  watched_event w{device, e, std::move(keep), std::move(waiter)};
  cudaError_t state = cudaSuccess;
  {
    const device_guard on(device);
    state = cudaEventQuery(e);
    if (state != cudaSuccess && state != cudaErrorNotReady) std::ignore = cudaGetLastError();
  }
  if (state != cudaErrorNotReady) {
    end_watch(w, state);
    return;
  }
  auto& q = poller();
  {
    std::lock_guard lock(q.mutex);
    q.watched.push_back(std::move(w));
  }
  wake_poller(q);
}

void check_stream_device(int device) { check_device(device, "cohort::cuda::async_synchronize"); }

void when_stream_done(int device, std::unique_ptr<event_waiter>& waiter) {
  constexpr const char* entry = "cohort::cuda::async_synchronize";
  check_device(device, entry);
  const auto context = fmt::format("{}: device {}", entry, device);
  const device_guard on(device, context);
  cudaEvent_t marker = nullptr;
  check(cudaEventCreateWithFlags(&marker, cudaEventDisableTiming), "cudaEventCreateWithFlags", context);
  // Destroyed where the wait ends, maybe on the poller's thread.
  std::shared_ptr<CUevent_st> keep(marker, [device](CUevent_st* e) {
    const device_guard on(device);
    std::ignore = cudaEventDestroy(e);
  });
  check(cudaEventRecord(marker, current), "cudaEventRecord", context);
  watch_event(device, marker, std::move(keep), std::move(waiter));
}

}  // namespace detail

int empty_cache() {
  detail::driver("cohort::cuda::empty_cache");
  poll_device(poller());  // chunks the poller's thread could not end, too
  int gone = detail::trim_arenas();
  auto& c = imports();
  std::lock_guard lock(c.mutex);
  return gone + sweep_imports(c, true);
}

}  // namespace cohort::cuda

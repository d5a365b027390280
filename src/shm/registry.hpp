// The segments mapped in this process: each one once, found by its nonce,
// and the ones other processes made kept mapped while values from them may
// still come.
#pragma once

#include "shm/segment.hpp"

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace cohort::shm {

/// Every segment mapped in this process, by nonce; and the ones other
/// processes made, kept mapped while they live so that a stream of values
/// from one segment maps it once, not once per value. Of those, at most
/// `unused_limit` that no storage here uses are kept, and under descriptor
/// pressure none, nor any descriptor of the others: a cache never makes
/// this process run out of descriptors.
struct registry {
  static constexpr std::size_t unused_limit = 16;

  std::mutex mutex;
  /// Set once a value that names shared memory is written here (a handle,
  /// in a message, a result or an argument) or a segment is kept here for
  /// an ended sender; cleared in a fork child. While it is clear, no value
  /// can need this process's descriptors or name a segment it made, and
  /// its end has nothing to hand its keeper. Beside the lock, whose line a
  /// fork child writes anyway.
  std::atomic<bool> named_by_values{false};
  std::unordered_map<std::uint64_t, std::weak_ptr<segment>> segments;
  std::vector<std::shared_ptr<segment>> received;  // oldest first
  /// What the last open of a segment found no longer needed here
  /// (forget_dead), left to be unmapped by this process's next untimed wait
  /// on a queue that does not go through at once (dispose_deferred), or else by
  /// the next open, shed, trim or forget_dead_segments: the last close of a
  /// segment frees its memory, about 150 ms a GiB, which a receive would
  /// otherwise pay before it can hand its value over.
  std::vector<std::shared_ptr<segment>> deferred;
  /// Whether `deferred` may hold any: read without the lock by each wait.
  std::atomic<bool> has_deferred{false};

  // With the lock held, each of these moves out received segments that no
  // storage here uses; the caller destroys them after unlocking (which
  // unmaps them, and takes the lock). None that a message in flight may
  // name through this process's descriptor (a value it passed on) goes
  // while the message is unread.
  // All of them.
  std::vector<std::shared_ptr<segment>> forget_unused();
  // Those no live process can use any more: no block of them is in use
  // anywhere (their memory goes once every process has unmapped them), or
  // they are orphaned (their name goes as they are unmapped); then the
  // oldest of the rest, down to unused_limit. Those kept give up their
  // descriptors unless a message in flight may name them through it.
  std::vector<std::shared_ptr<segment>> forget_dead();
  // When this process is short of descriptors: every unused one, and the
  // descriptors of all of them and of every other segment of another
  // process's mapped here but those kept for ended ranks (a mapping needs
  // none). Returns how many descriptors that closed at once.
  std::size_t shed(std::vector<std::shared_ptr<segment>>& gone);
  // Moves what `deferred` holds to the end of `gone`; into an empty
  // `gone` without allocating. On bad_alloc nothing has moved.
  void take_deferred(std::vector<std::shared_ptr<segment>>& gone);
  // Leaves `found` in `deferred`, which must be empty (take_deferred
  // first): what it held would be destroyed here, under the lock.
  void defer(std::vector<std::shared_ptr<segment>> found) noexcept;
};
/// This process's registry, made on first use; it is never destroyed, so
/// it outlives every static storage that unmaps at exit.
registry& segments();
/// Unmaps the segments of other processes that no storage here uses and
/// no live process can use any more (registry::forget_dead), and lets go
/// of those kept for ended ranks that no value names any more.
void forget_dead_segments() noexcept;
/// Gives up what this process's caches of segments hold in descriptors
/// (registry::shed); how many descriptors that closed. Called when making
/// or opening a segment ran out of descriptors, before trying again.
std::size_t shed_descriptors() noexcept;
/// Unmaps what the last open of a segment left in registry::deferred; a
/// relaxed load when it left nothing. Called by an untimed wait on a queue
/// that did not go through at once, before it spins or sleeps: time the
/// process would otherwise spend waiting.
void dispose_deferred() noexcept;
/// Stops keeping `dead`, a received segment none of whose blocks is in use
/// anywhere (its last storage here is going): its mapping goes with that
/// storage, not at this process's next open or wait. Left for those when
/// another thread holds the registry's lock.
void forget_received(const segment& dead) noexcept;
/// The registry if segments() has made it, else null: a process that never
/// mapped a segment has nothing to look through at its end.
registry* segments_if_made() noexcept;
/// For a rank that let_values_go_at_exit armed: makes exit() let its
/// values go (keeper.hpp), once per process. Registered as values first
/// name its segments, after the objects behind them were made: the
/// handlers of exit() run in the reverse order of their registration, so
/// it runs before those objects' destructors.
void on_first_values_named() noexcept;
/// Sets registry::named_by_values (the registry exists: a segment is mapped).
inline void note_named_by_values(registry& r) noexcept {
  // Read first: a line that every sending thread writes would bounce between them.
  if (!r.named_by_values.load(std::memory_order_relaxed)) {
    r.named_by_values.store(true, std::memory_order_release);
    on_first_values_named();
  }
}

}  // namespace cohort::shm

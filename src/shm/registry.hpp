// The segments mapped in this process: each one once, found by its nonce,
// and the ones other processes made kept mapped while values from them may
// still come.
#pragma once

#include "shm/segment.hpp"

#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace cohort::shm {

/// Every segment mapped in this process, by nonce; and the ones other
/// processes made, kept mapped while they live so that a stream of values
/// from one segment maps it once, not once per value.
struct registry {
  std::mutex mutex;
  std::unordered_map<std::uint64_t, std::weak_ptr<segment>> segments;
  std::vector<std::shared_ptr<segment>> received;
  // Moves out the received segments no storage here uses, all of them or
  // only those no live process can use any more: no block of them is in
  // use anywhere (their memory goes once every process has unmapped them),
  // or they are orphaned (their name goes as they are unmapped); with the
  // lock held. The caller destroys them after unlocking.
  std::vector<std::shared_ptr<segment>> forget(bool only_dead) {
    std::vector<std::shared_ptr<segment>> gone;
    std::erase_if(received, [&](auto& s) {
      if (s.use_count() != 1) return false;
      if (only_dead && s->header().live.load(std::memory_order_acquire) != 0 && !s->orphaned()) return false;
      gone.push_back(std::move(s));
      return true;
    });
    return gone;
  }
};
/// This process's registry, made on first use; it is never destroyed, so
/// it outlives every static storage that unmaps at exit.
registry& segments();
/// Unmaps the segments of other processes that no storage here uses and
/// no live process can use any more (registry::forget(true)).
void forget_dead_segments() noexcept;
/// The registry if segments() has made it, else null: a process that never
/// mapped a segment has nothing to look through at its end.
registry* segments_if_made() noexcept;


}  // namespace cohort::shm

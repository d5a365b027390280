// The per-process registry of mapped segments.
#include "shm/registry.hpp"

#include "shm/keeper.hpp"

#include <algorithm>
#include <atomic>
#include <new>
#include <utility>

namespace cohort::shm {

namespace {

// Set once segments() has made the registry.
std::atomic<registry*> registry_made{nullptr};

}  // namespace

registry& segments() {
  static auto* r = [] {
    auto* made = new registry;
    registry_made.store(made, std::memory_order_release);
    return made;
  }();
  return *r;
}

std::vector<std::shared_ptr<segment>> registry::forget_unused() {
  std::vector<std::shared_ptr<segment>> gone;
  std::erase_if(received, [&](auto& s) {
    // One a message in flight may name through this process's descriptor
    // (a value passed on) stays, or its receiver could not open it.
    if (s.use_count() != 1 || s->messages_in_flight()) return false;
    gone.push_back(std::move(s));
    return true;
  });
  return gone;
}

std::vector<std::shared_ptr<segment>> registry::forget_dead() {
  std::vector<std::shared_ptr<segment>> gone;
  std::size_t unused = 0;
  std::erase_if(received, [&](auto& s) {
    if (s.use_count() != 1) return false;
    if (s->header().live.load(std::memory_order_acquire) != 0 && !s->orphaned()) {
      ++unused;
      if (!s->messages_in_flight()) s->give_up_descriptor();
      return false;
    }
    gone.push_back(std::move(s));
    return true;
  });
  std::erase_if(received, [&](auto& s) {
    if (unused <= unused_limit || s.use_count() != 1 || s->messages_in_flight()) return false;
    --unused;
    gone.push_back(std::move(s));
    return true;
  });
  return gone;
}

void registry::take_deferred(std::vector<std::shared_ptr<segment>>& gone) {
  if (gone.empty()) {
    gone = std::exchange(deferred, {});
  } else {
    gone.reserve(gone.size() + deferred.size());  // what may throw, before anything moves
    for (auto& s : deferred) gone.push_back(std::move(s));
    deferred.clear();
  }
  has_deferred.store(false, std::memory_order_relaxed);
}

void registry::defer(std::vector<std::shared_ptr<segment>> found) noexcept {
  deferred = std::move(found);
  has_deferred.store(!deferred.empty(), std::memory_order_relaxed);
}

std::size_t registry::shed(std::vector<std::shared_ptr<segment>>& gone) {
  take_deferred(gone);  // each may still hold a descriptor
  std::size_t closed = 0;
  // Every segment of another process's mapped here, not only those
  // received: one kept for an ended rank and let go of since may still be
  // used by storages here. Moved to `gone`, as the last pointer to one
  // would unmap it here, under the lock.
  for (const auto& [nonce, weak] : segments) {
    auto s = weak.lock();
    if (!s || !s->give_up_descriptor()) continue;
    ++closed;
    gone.push_back(std::move(s));
  }
  auto unused = forget_unused();
  gone.insert(gone.end(), unused.begin(), unused.end());
  return closed;
}

void forget_dead_segments() noexcept {
  auto* r = segments_if_made();
  if (r == nullptr) return;
  std::vector<std::shared_ptr<segment>> dead;  // unmapped after the lock is released
  std::lock_guard lock(r->mutex);
  try {
    r->take_deferred(dead);
    release_kept_locked(dead);
    auto forgotten = r->forget_dead();
    dead.insert(dead.end(), forgotten.begin(), forgotten.end());
  } catch (const std::bad_alloc&) {
    // Kept for a later look.
  }
}

void forget_received(const segment& dead) noexcept {
  auto* r = segments_if_made();
  if (r == nullptr) return;
  std::shared_ptr<segment> kept;  // let go of after the lock is released
  std::unique_lock lock(r->mutex, std::try_to_lock);
  if (!lock.owns_lock()) return;  // the next open or wait finds it (forget_dead)
  const auto it =
      std::find_if(r->received.begin(), r->received.end(), [&dead](const auto& s) { return s.get() == &dead; });
  if (it == r->received.end()) return;
  kept = std::move(*it);
  r->received.erase(it);
}

std::size_t shed_descriptors() noexcept {
  auto* r = segments_if_made();
  if (r == nullptr) return 0;
  std::vector<std::shared_ptr<segment>> gone;  // unmapped after the lock is released
  std::lock_guard lock(r->mutex);
  try {
    return r->shed(gone);
  } catch (const std::bad_alloc&) {
    return 0;
  }
}

void dispose_deferred() noexcept {
  auto* r = segments_if_made();
  if (r == nullptr || !r->has_deferred.load(std::memory_order_relaxed)) return;
  std::vector<std::shared_ptr<segment>> gone;  // unmapped after the lock is released
  std::lock_guard lock(r->mutex);
  r->take_deferred(gone);  // into an empty vector: moves the list whole, allocating nothing
}

registry* segments_if_made() noexcept { return registry_made.load(std::memory_order_acquire); }

}  // namespace cohort::shm

// The per-process registry of mapped segments.
#include "shm/registry.hpp"

#include <atomic>

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

void forget_dead_segments() noexcept {
  auto* r = segments_if_made();
  if (r == nullptr) return;
  std::vector<std::shared_ptr<segment>> dead;  // unmapped after the lock is released
  std::lock_guard lock(r->mutex);
  dead = r->forget(true);
}

registry* segments_if_made() noexcept { return registry_made.load(std::memory_order_acquire); }

}  // namespace cohort::shm

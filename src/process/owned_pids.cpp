// The registry of owned children, one per process: a forked child starts
// with none (os::of_this_process), as its parent's children are not its own.
#include "process/owned_pids.hpp"

#include "os/per_process.hpp"

#include <mutex>

namespace cohort::detail {
namespace {

struct registry {
  std::mutex mutex;
  std::set<pid_t> owned;
  int launching = 0;
};

registry& this_process() { return os::of_this_process<registry>(); }

}  // namespace

void own_pid(pid_t pid) {
  auto& r = this_process();
  std::lock_guard lock(r.mutex);
  r.owned.insert(pid);
}

void disown_pid(pid_t pid) {
  auto& r = this_process();
  std::lock_guard lock(r.mutex);
  r.owned.erase(pid);
}

launch_guard::launch_guard() {
  auto& r = this_process();
  std::lock_guard lock(r.mutex);
  ++r.launching;
}

launch_guard::~launch_guard() {
  auto& r = this_process();
  std::lock_guard lock(r.mutex);
  --r.launching;
}

bool with_owned_pids(const std::function<void(const std::set<pid_t>&)>& fn) {
  auto& r = this_process();
  std::lock_guard lock(r.mutex);
  if (r.launching > 0) return false;
  fn(r.owned);
  return true;
}

}  // namespace cohort::detail

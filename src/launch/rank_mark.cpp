#include "launch/rank_mark.hpp"

#include "os/per_process.hpp"

#include <fmt/format.h>

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <mutex>

namespace cohort::detail {
namespace {

// The memfd's name: what its mapping shows after "/memfd:".
std::string mark_name(pid_t owner) { return fmt::format("cohort-ranks-of-{}", owner); }

std::size_t page_size() { return static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)); }

// The mark's page, or null where it could not be made.
void* map_mark(pid_t owner) noexcept {
  try {
    const int fd = ::memfd_create(mark_name(owner).c_str(), MFD_CLOEXEC);
    if (fd < 0) return nullptr;
    // Past the memfd's end (it is empty), which is no matter for a page
    // nothing touches; the mapping holds the file once its descriptor is
    // closed.
    void* at = ::mmap(nullptr, page_size(), PROT_NONE, MAP_SHARED, fd, 0);
    ::close(fd);
    return at == MAP_FAILED ? nullptr : at;
  } catch (...) {  // the name's allocation
    return nullptr;
  }
}

// This process's mark of its ranks, and how many starts fork with it.
struct rank_mark_state {
  std::mutex mutex;
  bool tried = false;
  void* at = nullptr;
  int forking = 0;
};

}  // namespace

std::string rank_mark_in_maps(pid_t owner) { return fmt::format("/memfd:{} ", mark_name(owner)); }

bool map_rank_mark(pid_t owner) noexcept { return map_mark(owner) != nullptr; }

ranks_marked::ranks_marked() noexcept {
  try {
    auto& s = os::of_this_process<rank_mark_state>();
    std::lock_guard lock(s.mutex);
    if (!s.tried) {
      s.tried = true;
      s.at = map_mark(::getpid());
      if (s.at != nullptr) ::madvise(s.at, page_size(), MADV_DONTFORK);
    }
    if (s.at == nullptr) return;
    if (s.forking++ == 0) ::madvise(s.at, page_size(), MADV_DOFORK);
    counted_ = true;
  } catch (...) {  // no memory for the state: the forks go unmarked
  }
}

ranks_marked::~ranks_marked() {
  if (!counted_) return;
  auto& s = *os::made_in_this_process<rank_mark_state>();  // made by the constructor, in this process
  std::lock_guard lock(s.mutex);
  if (--s.forking == 0) ::madvise(s.at, page_size(), MADV_DONTFORK);
}

}  // namespace cohort::detail

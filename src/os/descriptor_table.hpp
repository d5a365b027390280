// Growing this process's descriptor table ahead of the descriptors that
// will fill it.
#pragma once

#include <cstddef>

namespace cohort::os {

/// Grows this process's descriptor table now, in one step, so that it has
/// room for `more` descriptors above the lowest free one (as far as
/// RLIMIT_NOFILE allows). The kernel grows the table as descriptors are
/// allocated, by doubling; while the table is shared by more than one
/// thread, each growth first waits for an RCU grace period, and the thread
/// that allocates the descriptor (a pidfd_open, a clone's pidfd) stalls for
/// it: 11-16 ms on the 2-CPU machine of bench/launcher_exit. Growing it
/// before the threads that fill it exist costs no wait at all, and growing
/// it once to the size needed costs one wait where doubling would cost
/// several. Best effort: where the table cannot grow, nothing changes and
/// the allocations later fail or wait as they would have.
void reserve_descriptors(std::size_t more) noexcept;

}  // namespace cohort::os

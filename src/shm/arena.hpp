// This process's arena: small blocks carved by size class out of a few
// segments that grow as needed, large ones a segment each, and what keeps
// segments others still hold mapped once this process no longer uses them.
#pragma once

#include "shm/segment.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

namespace cohort::shm {

/// Carves `nbytes` from this process's arena (made on first use, grown by
/// whole segments), or makes a segment for it when it is too large for a
/// class. Returns the segment and the block's offset, refs = 1.
std::pair<std::shared_ptr<segment>, std::uint64_t> allocate(std::size_t nbytes);
/// Keeps a segment this process made, and no longer uses itself, open and
/// mapped until its last block is freed, so others can still open it. A
/// segment given again while it lingers is kept once. A thread of its
/// own, made while any segment lingers, lets go of each within about
/// 100 ms of that free.
void linger(std::shared_ptr<segment> s);
/// Waits, for at most `limit`, for the messages in flight that name memfd
/// segments this process made to be received: receivers may have to open
/// them through it. A message left in a queue that no process holds any
/// more has been dropped (and counts as received) by the queue's last
/// holder. Called when an entry point returns.
void wait_for_receivers(std::chrono::steady_clock::duration limit) noexcept;
/// Retires arena segments with no block in use, lets go of lingering
/// segments that others have freed, and unmaps segments of other processes
/// that no storage here uses; returns how many segments went.
int trim();
/// Sets the work the process's exit does first, before the arena retires
/// its segments and unnames those still held: the table of storages sets
/// it as it is made, to run the upper layers' work for the holds left
/// (a queue that no other process can pop from is drained).
void at_exit_first(void (*work)() noexcept) noexcept;

}  // namespace cohort::shm

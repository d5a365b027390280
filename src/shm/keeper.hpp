// A rank's keeper: the process that started it. Under file_descriptor a
// value's memory is a memfd that receivers open through its sender; as a
// rank's function returns, the memfds that values it sent still name (in
// queues, or in its own result) go to its keeper over a socket, and the
// rank ends at once. Receivers then open them through the keeper, which
// holds each until every value naming it has been received or dropped.
#pragma once

#include <chrono>

#include "shm/segment.hpp"

#include <sys/types.h>
#include <sys/un.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace cohort::shm {

/// How a rank finds its keeper: "<pid>,<name of its socket>".
inline constexpr const char* keeper_env = "COHORT_SEGMENT_KEEPER";

/// This process as the keeper of the ranks it starts: the value of
/// keeper_env to give them. Its socket is made on the first call; empty
/// when it cannot be made (those ranks then wait for their receivers).
std::string keeper_for_ranks() noexcept;
/// A keeper as a keeper_for_ranks() value names it, taken apart. Its name
/// is held in place: a forked rank sets its keeper first thing, and an
/// allocation there would write pages of the heap that its parent shares,
/// each a page copied.
struct keeper_address {
  pid_t of = 0;  ///< the process it was set for: a fork child of a rank has none
  pid_t pid = 0;  ///< 0: none
  char name[sizeof(sockaddr_un::sun_path) - 1] = {};  ///< what an abstract socket's address holds
  std::size_t name_size = 0;
};
/// The keeper a keeper_for_ranks() value names (none when it is malformed).
keeper_address parse_keeper(std::string_view value) noexcept;
/// Makes `keeper` this process's keeper. Reads no text: a forked rank sets
/// what its parent parsed before the fork, and runs no string code of the
/// C library for it (each page of code it runs first is a page fault).
void set_keeper(const keeper_address& keeper) noexcept;
/// Takes this process's keeper from keeper_env, when set there, and
/// removes it (what the rank starts has a keeper of its own, or none).
/// Called as a rank starts.
void find_keeper_in_environment() noexcept;
/// This process's keeper, or 0.
pid_t own_keeper() noexcept;
/// Hands the keeper the descriptors of the segments held here that values
/// in flight name: memfds opened through this process, named files it
/// made, and what it keeps for its own ranks (a named file's through the
/// kept descriptor: its group swept the name). Returns whether no value
/// needs this process any more: false when some do and there is no keeper
/// or the handing failed (the caller then waits for their receivers).
bool hand_over_to_keeper() noexcept;
/// What a rank does with the values it sent as it ends, once per process:
/// hands them over (hand_over_to_keeper), or else, with `wait`, waits up to
/// `limit` for their receivers, a device's too. A second call does nothing.
void let_values_go(std::chrono::steady_clock::duration limit, bool wait) noexcept;
/// Makes an exit() of this process (a rank ending inside its function)
/// call let_values_go(limit, true) first, as a return would have.
void let_values_go_at_exit(std::chrono::steady_clock::duration limit) noexcept;
/// Counts the function ranks this process has started and not yet seen
/// end, and the queue objects it holds. While either is above 0, a kept
/// segment goes only once no value names it; when both are 0, every other
/// process that mapped it has ended and this process has no keeper (which
/// would be handed it), it goes too: a value popped by a process killed
/// before it was decoded would otherwise keep it for good.
void note_ranks_running(int change) noexcept;
void note_queue_objects(int change) noexcept;
/// Takes what ranks have handed over, and lets go of what is kept and no
/// value names any more. Called as a rank's end is recorded. A message
/// whose descriptors find no room here, once the registry's caches gave up
/// theirs, is left queued, and taken as room is made (a watcher looks
/// every 100 ms), or after a second as far as room goes: those behind it
/// wait for it.
void take_handed_over() noexcept;
/// The same, with the registry's lock held; what goes is moved to `gone`.
void take_handed_over_locked(std::vector<std::shared_ptr<segment>>& gone) noexcept;
/// How long a hand-over waits at the head of the keeper's socket for room
/// for all its descriptors: those behind it wait too (a datagram socket
/// hands them over in order), their senders' sends block once the socket's
/// queue is full, and its segments stay allocated.
inline constexpr std::chrono::seconds room_patience{1};
/// Whether a hand-over waits on this keeper's socket for room for its
/// descriptors (room_patience at most). The registry's lock is held.
bool waiting_for_room_locked() noexcept;
/// Why this process, a keeper, holds no segment `nonce` (0: unknown) that
/// `source` handed over: what was lost taking it (its descriptor dropped
/// for want of room, or no room to map it), or that what was handed over
/// waits for descriptors to take it. Empty when it knows no reason. The
/// registry's lock is held.
std::string why_not_kept(pid_t source, std::uint64_t nonce);
/// Lets go of kept segments that no value names any more, with the
/// registry's lock held; they are moved to `gone`.
void release_kept_locked(std::vector<std::shared_ptr<segment>>& gone) noexcept;
/// A descriptor of the segment whose /proc link reads `link` (a memfd's, or
/// a swept file's) that `keeper` keeps for `source`, opened here; -1 with
/// errno ENOENT when it keeps none, ESRCH
/// when the keeper has ended. Once `source` has ended, waits for a little
/// while after it is reaped: the keeper takes what it handed over as it
/// records that end. A `source` that seems to run gets that while too (an
/// ending process closes its descriptors before it shows as ended), and no
/// more.
int open_kept(pid_t keeper, pid_t source, const std::string& link);

}  // namespace cohort::shm

// Running the launches of many processes on a few threads at once.
#pragma once

#include <cstddef>
#include <functional>

namespace cohort::detail {

/// How many threads start `count` processes by vfork and exec, for a
/// request of `threads` (0: one per CPU, at most 8). The calling thread
/// sleeps while each child of its executes, so on more than one CPU several
/// launches overlap.
unsigned start_threads(unsigned threads, std::size_t count);

/// Calls fn(i) for every i in [0, count) on `threads` threads: the calling
/// one and threads of a pool that live as long as the process (a child's
/// parent-death signal follows the thread that made it, so a thread that
/// made children must not end). Each takes the next index in turn. Once a
/// call throws, no index is taken any more (a launch that fails ends the
/// start: the rest would be started only to be killed); the calls under
/// way finish, and the exception of the lowest index is rethrown.
void for_each_parallel(std::size_t count, unsigned threads, const std::function<void(std::size_t)>& fn);

/// Calls fn() on a thread of that pool and waits for it: for a child whose
/// parent-death signal must follow the process, not the calling thread.
/// Rethrows what fn throws; std::system_error when no thread can be made.
void run_on_lasting_thread(const std::function<void()>& fn);

}  // namespace cohort::detail

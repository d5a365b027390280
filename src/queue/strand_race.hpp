// A sleeping wait's race of wakes, run on a strand of its own.
#pragma once

#include <asio/awaitable.hpp>

namespace cohort::detail {

/// Awaits `race` (an `||` of wakes and a timer) on a strand of its own,
/// whatever executor the caller has: there no two branches complete at
/// once, as on an io_context run by several threads, where the one that
/// won cancelled another while that one was being freed. A cancellation
/// from outside is handed to that strand, and the wait then throws
/// operation_aborted naming `what`; a race whose branches all failed on
/// their own rethrows the first failure. when_any ends at the first op that
/// ends, also one that failed, where `||` waits for one that succeeds:
/// hence one op, the whole race.
asio::awaitable<void> race_on_own_strand(asio::awaitable<void> race, const char* what);

}  // namespace cohort::detail

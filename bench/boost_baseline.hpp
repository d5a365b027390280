// The Boost.Process v2 baseline, kept in its own file so Boost's Asio and
// standalone Asio never meet in one translation unit.
#pragma once

namespace cohort::bench {

/// Starts `n` children of `program` and waits for each.
void boost_spawn_reap(const char* program, int n);

}  // namespace cohort::bench

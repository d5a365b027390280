// Running a group from start to end, as most group tests do.
#pragma once

#include "cohort/group.hpp"

#include "support/harness.hpp"

namespace cohort::test {

/// Starts `spec` on a fresh io_context, run on `threads` threads, and
/// waits for the run to end.
inline run_result run_group(const group_spec& spec, int threads = 1) {
  asio::io_context io;
  return run(io, [&]() -> asio::awaitable<run_result> {
    group g = co_await start_processes(spec);
    co_return co_await g.wait();
  }(), threads);
}

}  // namespace cohort::test

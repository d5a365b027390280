// Running a function's ranks to the end on an io_context of their own.
#include "cohort/spawn_and_join.hpp"

#include "process/launch.hpp"

#include <asio/io_context.hpp>

namespace cohort::detail {

run_result run_to_end(const function_call& call, int nprocs, const join_options& options) {
  refuse_piped_streams(options.spawn, "cohort::spawn_and_join: join_options::spawn");
  group_spec spec;
  spec.name = call.name;
  spec.entry = call;
  spec.nprocs = nprocs;
  spec.options = options.spawn;
  spec.shutdown = options.shutdown;
  spec.error_dir = options.error_dir;
  spec.start_threads = options.start_threads;
  // A loop for this one run: its few exits wait on asio's reactor, as fast
  // as on the ring (bench/exit_latency), without a ring's set-up and
  // teardown (bench/start_join: fork ranks 1.40-1.43x raw fork so, against
  // 1.46-1.51x with a ring).
  asio::io_context io;
  ready_to_wait_on_reactor_only(io, "cohort::spawn_and_join");
  group g = start_processes(io.get_executor(), spec);
  io.run();
  run_result result = g.result().value();
  throw_first_failure(result);
  return result;
}

}  // namespace cohort::detail

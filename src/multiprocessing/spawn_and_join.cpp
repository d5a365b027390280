// Running a function's ranks to the end on an io_context of their own.
#include "cohort/spawn_and_join.hpp"

#include <asio/io_context.hpp>

namespace cohort::detail {

run_result run_to_end(const function_call& call, int nprocs, const join_options& options) {
  group_spec spec;
  spec.name = call.name;
  spec.entry = call;
  spec.nprocs = nprocs;
  spec.options = options.spawn;
  spec.shutdown = options.shutdown;
  spec.error_dir = options.error_dir;
  spec.start_threads = options.start_threads;
  asio::io_context io;
  group g = start_processes(io.get_executor(), spec);
  io.run();
  run_result result = g.result().value();
  throw_first_failure(result);
  return result;
}

}  // namespace cohort::detail

// A supervisor for tests to kill: starts a group of N ranks running
// `target sleep 60`, prints their pids on one line, then supervises them.
//   supervisor TARGET N
#include <cohort/group.hpp>

#include <asio/io_context.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>

int main(int argc, char** argv) {
  if (argc < 3) return 100;
  asio::io_context io;
  cohort::group_spec spec;
  spec.entry = cohort::command(argv[1], {"sleep", "60"});
  spec.nprocs = std::atoi(argv[2]);
  cohort::group g = cohort::start_processes(io.get_executor(), spec);
  for (pid_t pid : g.pids()) std::printf("%d ", pid);
  std::printf("\n");
  std::fflush(stdout);
  io.run();
}

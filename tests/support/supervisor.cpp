// A supervisor for tests to kill: starts a group of N ranks running
// `target sleep 60`, prints their pids on one line, then supervises them.
//   supervisor TARGET N
// Or, with a guardian, one rank running `/bin/sh -c SCRIPT DIR`:
//   supervisor --guarded DIR SCRIPT
#include <cohort/group.hpp>
#include <cohort/guardian.hpp>

#include <asio/io_context.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>

int main(int argc, char** argv) {
  if (argc < 3) return 100;
  asio::io_context io;
  cohort::group_spec spec;
  if (std::string(argv[1]) == "--guarded") {
    if (argc < 4) return 100;
    cohort::guardian guard;
    spec.entry = cohort::command("/bin/sh", {"-c", argv[3], argv[2]});
    cohort::group g = cohort::start_processes(io.get_executor(), spec);
    io.run();
    return 0;
  }
  spec.entry = cohort::command(argv[1], {"sleep", "60"});
  spec.nprocs = std::atoi(argv[2]);
  cohort::group g = cohort::start_processes(io.get_executor(), spec);
  for (pid_t pid : g.pids()) std::printf("%d ", pid);
  std::printf("\n");
  std::fflush(stdout);
  io.run();
}

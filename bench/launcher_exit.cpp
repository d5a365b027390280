// Start to exit of a launcher running 8 ranks of /bin/true: cohort-run
// against torchrun (Debian's torch 1.13) in the same run, where
// /usr/bin/python3 (or $COHORT_BENCH_PYTHON) imports torch. torch 1.13's
// torchrun fails on Python 3.11 as shipped (Std.from_str iterates an
// IntFlag, which no longer yields NONE and ALL): the wrapper of torchrun.hpp mends
// that before calling torch.distributed.run.main().
//
//   launcher_exit [rounds]     (default 50; torchrun runs a tenth of them, at least 3)
#include "stats.hpp"
#include "torchrun.hpp"

#include <fmt/format.h>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

extern char** environ;

namespace {

const char* const cohort_run = COHORT_BENCH_COHORT_RUN;


// Runs argv with stdout and stderr on /dev/null; its exit code.
int run_quietly(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  ::posix_spawn_file_actions_init(&actions);
  ::posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  ::posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid;
  const int error = ::posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  ::posix_spawn_file_actions_destroy(&actions);
  if (error != 0) return -1;
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

double median_seconds(int rounds, const std::vector<std::string>& args) {
  std::vector<double> samples;
  for (int i = 0; i < rounds; ++i) {
    const auto start = cohort::bench::clock::now();
    if (const int rc = run_quietly(args); rc != 0) throw std::runtime_error(fmt::format("{} exited with {}", args[0], rc));
    samples.push_back(cohort::bench::seconds_since(start));
  }
  return cohort::bench::median(std::move(samples));
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 50;
  const double ours = median_seconds(rounds, {cohort_run, "-n", "8", "--", "/bin/true"});
  fmt::print("start to exit of 8 ranks of /bin/true, median of {} rounds\n", rounds);
  fmt::print("  {:<44} {:>10.3f} ms\n", "cohort-run -n 8 -- /bin/true", ours * 1e3);

  const char* python = std::getenv("COHORT_BENCH_PYTHON");
  if (python == nullptr) python = ::access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
  if (run_quietly({python, "-c", "import torch.distributed.run"}) != 0) {
    fmt::print("  torchrun: torch is not importable by {}\n", python);
    return 0;
  }
  const std::string wrapper = "/tmp/cohort-bench-torchrun.py";
  cohort::bench::write_torchrun_wrapper(wrapper);
  const int torch_rounds = std::max(3, rounds / 10);
  const double torch = median_seconds(torch_rounds, {python, wrapper, "--nproc_per_node", "8", "--no_python", "/bin/true"});
  std::remove(wrapper.c_str());
  fmt::print("  {:<44} {:>10.3f} ms  (median of {}; cohort-run is {:.0f}x faster)\n",
             "torchrun --nproc_per_node 8 --no_python /bin/true", torch * 1e3, torch_rounds, torch / ours);
}

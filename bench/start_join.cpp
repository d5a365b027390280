// Start and join of 8 function ranks per start method, against the same
// work done by hand in the same run: posix_spawn of this binary (exiting at
// once) and raw fork + _exit, each with waitpid; and against Python's
// multiprocessing and torch.multiprocessing where python3 (and torch) are
// installed (/usr/bin/python3 when there is one, else python3 on PATH, or
// $COHORT_BENCH_PYTHON). Prints the median of each and its ratio to the hand-made
// baseline of the same kind.
//
// Each cohort method is timed in a fresh process of its own, as the
// baselines are (they run first, in this one): a process where threads once
// ran, such as the spawn method's starting threads, forks more slowly ever
// after, and one method's would weigh on the next. One more line times fork
// in a process that made a spawn start first.
//
//   start_join [rounds]     (default 50)
#include <cohort/entry_point.hpp>
#include <cohort/spawn_and_join.hpp>

#include "python.hpp"
#include "stats.hpp"

#include <fmt/format.h>

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace bench_ranks {
void noop(int) {}
COHORT_ENTRYPOINT(noop);
}  // namespace bench_ranks

namespace {

constexpr int ranks = 8;
constexpr const char* exit_at_once = "COHORT_BENCH_EXIT_AT_ONCE";

template <class F>
double median_of(int rounds, F&& once) {
  std::vector<double> samples;
  for (int i = 0; i < rounds; ++i) {
    auto start = cohort::bench::clock::now();
    once();
    samples.push_back(cohort::bench::seconds_since(start));
  }
  return cohort::bench::median(std::move(samples));
}

void raw_spawn() {
  std::vector<pid_t> pids;
  std::string variable = std::string(exit_at_once) + "=1";
  std::vector<char*> env{variable.data()};
  for (char** e = environ; *e != nullptr; ++e) env.push_back(*e);
  env.push_back(nullptr);
  char self[] = "/proc/self/exe";
  char* const argv[] = {self, nullptr};
  for (int r = 0; r < ranks; ++r) {
    pid_t pid;
    if (::posix_spawn(&pid, self, nullptr, nullptr, argv, env.data()) != 0) throw std::runtime_error("posix_spawn");
    pids.push_back(pid);
  }
  for (pid_t pid : pids) ::waitpid(pid, nullptr, 0);
}

void raw_fork() {
  std::vector<pid_t> pids;
  for (int r = 0; r < ranks; ++r) {
    pid_t pid = ::fork();
    if (pid == 0) ::_exit(0);
    if (pid < 0) throw std::runtime_error("fork");
    pids.push_back(pid);
  }
  for (pid_t pid : pids) ::waitpid(pid, nullptr, 0);
}

// Python's multiprocessing (and torch's, when importable), timed in Python;
// prints "<name> <median seconds>" lines.
const char* python_script = R"(
import multiprocessing as mp, statistics, sys, time
def noop(*args): pass
def median(run, rounds):
    samples = []
    for _ in range(rounds):
        t = time.perf_counter(); run(); samples.append(time.perf_counter() - t)
    return statistics.median(samples)
def plain(method):
    ctx = mp.get_context(method)
    def run():
        ps = [ctx.Process(target=noop, args=(r,)) for r in range(8)]
        for p in ps: p.start()
        for p in ps: p.join()
    return run
if __name__ == '__main__':
    rounds = int(sys.argv[1])
    for method in ('spawn', 'forkserver', 'fork'):
        print('python', method, median(plain(method), rounds), flush=True)
    try:
        import torch.multiprocessing as tmp
    except ImportError:
        sys.exit(0)
    for method in ('spawn', 'fork'):
        r = 3 if method == 'spawn' else rounds
        print('torch', method, median(lambda: tmp.start_processes(noop, nprocs=8, start_method=method), r), flush=True)
)";


// What a process of its own times (start_join --alone WHAT ROUNDS): one of
// the start methods, spawn with one starting thread, or fork after a spawn.
struct timing {
  cohort::join_options options;
  bool spawn_first = false;
};

std::map<std::string, timing> timings() {
  using cohort::start_method;
  return {{"spawn", {{.method = start_method::spawn}}},
          {"fork", {{.method = start_method::fork}}},
          {"forkserver", {{.method = start_method::forkserver}}},
          {"spawn-one-by-one", {{.method = start_method::spawn, .start_threads = 1}}},
          {"fork-after-spawn", {{.method = start_method::fork}, true}}};
}

// Prints "<median seconds> <first run's seconds>".
int time_alone(const std::string& what, int rounds) {
  const auto all = timings();
  const auto it = all.find(what);
  if (it == all.end()) return 2;
  const timing& t = it->second;
  if (t.spawn_first) cohort::spawn_and_join(bench_ranks::noop, std::tuple{}, ranks, {});
  auto once = [&] { cohort::spawn_and_join(bench_ranks::noop, std::tuple{}, ranks, t.options); };
  const auto first = median_of(1, once);  // the forkserver starts here
  const auto typical = median_of(rounds, once);
  fmt::print("{} {}\n", typical, first);
  return 0;
}

// Runs time_alone in a fresh process; returns {median, first run} in
// seconds, or zeros when it could not.
std::pair<double, double> timed_alone(const std::string& what, int rounds) {
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return {0, 0};
  self[n] = '\0';
  std::pair<double, double> result{0, 0};
  if (FILE* out = ::popen(fmt::format("'{}' --alone {} {}", self, what, rounds).c_str(), "r")) {
    if (std::fscanf(out, "%lf %lf", &result.first, &result.second) != 2) result = {0, 0};
    ::pclose(out);
  }
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  if (auto rc = cohort::child_main(argc, argv)) return *rc;
  if (std::getenv(exit_at_once) != nullptr) return 0;
  if (argc > 3 && std::string(argv[1]) == "--alone") return time_alone(argv[2], std::atoi(argv[3]));
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 50;

  const auto spawn_raw = median_of(rounds, raw_spawn);
  const auto fork_raw = median_of(rounds, raw_fork);
  fmt::print("start+join of {} ranks, median of {} rounds\n", ranks, rounds);
  fmt::print("  {:<28} {:>9.3f} ms\n", "posix_spawn + waitpid", spawn_raw * 1e3);
  fmt::print("  {:<28} {:>9.3f} ms\n", "fork + waitpid", fork_raw * 1e3);

  std::map<std::string, double> ours;
  for (auto method : {cohort::start_method::spawn, cohort::start_method::fork, cohort::start_method::forkserver}) {
    const std::string name(cohort::to_string(method));
    const auto [typical, first] = timed_alone(name, rounds);
    ours[name] = typical;
    const double baseline = method == cohort::start_method::spawn ? spawn_raw : fork_raw;
    fmt::print("  {:<28} {:>9.3f} ms  ({:.2f}x {}; first run {:.3f} ms)\n", "cohort " + name, typical * 1e3,
               typical / baseline, method == cohort::start_method::spawn ? "posix_spawn" : "fork", first * 1e3);
  }
  {  // spawn ranks one after another, against the parallel start above
    const auto one_by_one = timed_alone("spawn-one-by-one", rounds).first;
    fmt::print("  {:<28} {:>9.3f} ms  (the parallel start above, {} threads, takes {:.2f}x this)\n",
               "cohort spawn, one by one", one_by_one * 1e3, std::min(8u, std::max(1u, std::thread::hardware_concurrency())),
               ours["spawn"] / one_by_one);
  }
  {  // fork where the spawn method's starting threads have run
    const auto after = timed_alone("fork-after-spawn", rounds).first;
    fmt::print("  {:<28} {:>9.3f} ms  ({:.2f}x fork; {:.2f}x cohort fork in a fresh process)\n",
               "cohort fork after a spawn", after * 1e3, after / fork_raw, after / ours["fork"]);
  }
  for (const auto& line : cohort::bench::python_lines(python_script, std::to_string(std::max(3, rounds / 5)))) {
    char who[16], method[16];
    double seconds = 0;
    if (std::sscanf(line.c_str(), "%15s %15s %lf", who, method, &seconds) == 3) {
      const double mine = ours.count(method) != 0 ? ours[method] : 0;
      fmt::print("  {:<28} {:>9.3f} ms  (cohort {} is {:.1f}x faster)\n", fmt::format("{} {}", who, method),
                 seconds * 1e3, method, mine > 0 ? seconds / mine : 0.0);
    }
  }
}

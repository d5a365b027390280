// Start and join of 8 function ranks per start method, against the same
// work done by hand in the same run: posix_spawn of this binary (exiting at
// once) and raw fork + _exit, each with waitpid; and against Python's
// multiprocessing and torch.multiprocessing where python3 (and torch) are
// installed (/usr/bin/python3 when there is one, else python3 on PATH, or
// $COHORT_BENCH_PYTHON).
//
// Each cohort method runs in a process of its own, started once before the
// first round: a process where threads once ran, such as the spawn method's
// starting threads, forks more slowly ever after, and one method's would
// weigh on the next. That process times its first run (the forkserver
// starts there) apart from the rounds. One more method times fork in a
// process that made a spawn start first.
//
// Rounds are interleaved, so that drift weighs on both sides alike: in each
// round, each method's process times its baseline of the same kind (raw
// fork for fork and forkserver, posix_spawn for spawn) and the method once
// (and for a fork method the asio supervisor below), in an order that
// changes round by round (round_order: turned by one every two rounds,
// reversed in odd ones): the same process forks each, so the memory a fork
// copies is the same, and none always goes first or always follows the
// same other one. It prints every round's ratio of each method to its baseline, then
// per method the median time, its baseline's, and the median ratio over
// rounds with its spread (min-max). Then where the time goes: per method
// the CPU its process used in a round, the CPU of each rank it reaped, and
// its process's minor page faults (each page it writes while a child still
// shares it is one), beside its baseline's (from getrusage).
//
// Python's and torch's start methods take turns with cohort's too: a Python
// process for each (python_peer) lasts the run and times one start and join
// when asked, in turn with the same method's round in cohort's process,
// before it and after it in alternate turns; each prints its median time and
// the median (min-max) of its rounds' ratios to cohort's. They are slow, so
// each takes part in as many rounds as it ran before the turns (a fifth of
// them, at least 3; torch's spawn, whose 8 fresh interpreters each import
// torch, 3), spread evenly over the run.
//
//   start_join [rounds]     (default 50)
//   start_join --alone METHOD     (internal: the process of one method; per
//                                  byte read on stdin, times its baseline and
//                                  one run, and writes their seconds and CPU
//                                  as a line on stdout)
#include <cohort/entry_point.hpp>
#include <cohort/spawn_and_join.hpp>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/use_awaitable.hpp>

#include "arguments.hpp"
#include "config.hpp"
#include "python.hpp"
#include "stats.hpp"

#include <fmt/format.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
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
double seconds_of(F&& once) {
  const auto start = cohort::bench::clock::now();
  once();
  return cohort::bench::seconds_since(start);
}

// CPU seconds, user and system, of this process (all its threads) and of
// its children reaped so far; and this process's minor page faults, where
// a page written while a child still shares it is copied.
struct cpu_times {
  double self = 0, children = 0, faults = 0;
};
cpu_times cpu_now() {
  rusage self{}, children{};
  ::getrusage(RUSAGE_SELF, &self);
  ::getrusage(RUSAGE_CHILDREN, &children);
  return {cohort::bench::cpu_seconds(self), cohort::bench::cpu_seconds(children), static_cast<double>(self.ru_minflt)};
}

// One start and join timed: wall seconds, and the CPU seconds this process
// and the children it reaped used meanwhile.
struct timed {
  double seconds = 0;
  cpu_times cpu;
};
template <class F>
timed timed_run(F&& once) {
  const auto before = cpu_now();
  const double seconds = seconds_of(std::forward<F>(once));
  const auto after = cpu_now();
  return {seconds, {after.self - before.self, after.children - before.children, after.faults - before.faults}};
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

// The bare supervisor's wait for one child: its pidfd's readiness, then
// the reap through it with its resource usage (as cohort reaps); counts
// the child in `reaped`.
asio::awaitable<void> reap_when_exited(asio::posix::stream_descriptor child, int& reaped) {
  co_await child.async_wait(asio::posix::stream_descriptor::wait_read, asio::use_awaitable);
  siginfo_t info{};
  rusage usage{};
  if (::syscall(SYS_waitid, cohort::config::p_pidfd, child.native_handle(), &info, WEXITED, &usage) == 0) ++reaped;
}

// Raw fork under a bare supervisor on asio: each child's pidfd awaited by a
// coroutine of its own on an io_context (reap_when_exited).
void asio_fork() {
  asio::io_context io;
  int reaped = 0;
  for (int r = 0; r < ranks; ++r) {
    pid_t pid = ::fork();
    if (pid == 0) ::_exit(0);
    if (pid < 0) throw std::runtime_error("fork");
    const int pidfd = cohort::config::pidfd_open(pid);
    if (pidfd < 0) throw std::runtime_error("pidfd_open");
    asio::co_spawn(io, reap_when_exited(asio::posix::stream_descriptor(io, pidfd), reaped), asio::detached);
  }
  io.run();
  if (reaped != ranks) throw std::runtime_error("the asio supervisor reaped too few children");
}

// Python's multiprocessing and torch's, timed in Python, as a python_peer:
// "python" for multiprocessing's spawn, forkserver and fork, "torch" for
// torch.multiprocessing.start_processes' spawn and fork. Each request is a
// method's name; the answer is the seconds one start and join of 8 ranks
// took, or "failed <why>" (torch not importable). Each method runs once
// untimed before the process is ready, as cohort's processes time their
// first run apart (forkserver's starts its server there); torch's spawn
// does not, as it keeps nothing from one run to the next.
const char* python_script = R"(
import multiprocessing as mp, sys, time
def noop(*args): pass
def plain(method):
    ctx = mp.get_context(method)
    def run():
        ps = [ctx.Process(target=noop, args=(r,)) for r in range(8)]
        for p in ps: p.start()
        for p in ps: p.join()
    return run
def torch_run(method):
    return lambda: tmp.start_processes(noop, nprocs=8, start_method=method)
if __name__ == '__main__':
    failure = None
    if sys.argv[1] == 'python':
        runs = {method: plain(method) for method in ('spawn', 'forkserver', 'fork')}
        untimed = list(runs)
    else:
        try:
            import torch.multiprocessing as tmp
        except Exception as e:
            failure = 'import torch: ' + type(e).__name__ + (': ' + str(e).splitlines()[0] if str(e) else '')
        runs = {method: torch_run(method) for method in ('spawn', 'fork')}
        untimed = [] if failure else ['fork']
    for method in untimed: runs[method]()
    print('ready', flush=True)
    for line in iter(sys.stdin.readline, ''):
        method = line.strip()
        if failure:
            print('failed', failure, flush=True); continue
        try:
            t = time.perf_counter(); runs[method](); print(time.perf_counter() - t, flush=True)
        except Exception as e:
            print('failed', type(e).__name__, str(e).splitlines()[0] if str(e) else '', flush=True)
)";

// A Python or torch start method, timed in turns with cohort's `method` in
// `turns` of the rounds: its seconds and their ratio to cohort's, turn by
// turn, or why it failed (a peer that failed in any turn prints as failed).
struct peer {
  peer(std::string name_, std::string method_, cohort::bench::python_peer* process_, int turns_)
      : name(std::move(name_)), method(std::move(method_)), process(process_), turns(turns_) {}

  std::string name, method;
  cohort::bench::python_peer* process;
  int turns;
  std::vector<double> seconds, ratios;
  std::string failure;

  // One start and join of its method, timed; 0 where it failed.
  double once() {
    if (!failure.empty()) return 0;
    const auto line = process->ask(method);
    double s = 0;
    if (!line) failure = process->failure();
    else if (line->starts_with("failed ")) failure = line->substr(7);
    else if (std::sscanf(line->c_str(), "%lf", &s) != 1 || s <= 0) failure = fmt::format("it answered \"{}\"", *line);
    if (!failure.empty()) return 0;
    seconds.push_back(s);
    return s;
  }
};

// What a method's process times: one of the start methods, spawn with one
// starting thread, or fork after a spawn; its baseline is raw fork when
// `against_fork`, else posix_spawn.
struct timing {
  std::string name;
  cohort::join_options options;
  bool against_fork = false;
  bool spawn_first = false;
};

std::vector<timing> timings() {
  using cohort::start_method;
  return {{"spawn", {.method = start_method::spawn}},
          {"fork", {.method = start_method::fork}, true},
          {"forkserver", {.method = start_method::forkserver}, true},
          {"spawn-one-by-one", {.method = start_method::spawn, .start_threads = 1}},
          {"fork-after-spawn", {.method = start_method::fork}, true, true}};
}

// start_join --alone METHOD: per byte read on stdin, one run of its
// baseline (raw fork or posix_spawn), one of the method, and for a fork
// method one of the asio supervisor, from this same process (its memory,
// its threads: what a fork copies), in round_order's order of the round (the
// first byte's round 0: the first run, timed apart); their seconds written
// as a line on stdout (the supervisor's 0 where it did not run); ends at
// end of input.
int serve_rounds(const std::string& what) {
  const auto all = timings();
  const auto it = std::find_if(all.begin(), all.end(), [&](const timing& t) { return t.name == what; });
  if (it == all.end()) return 2;
  if (it->spawn_first) cohort::spawn_and_join(bench_ranks::noop, std::tuple{}, ranks);
  char go;
  for (int round = 0; ::read(0, &go, 1) == 1; ++round) {
    timed baseline, ours, supervisor;
    const std::function<void()> runs[] = {
        [&] { baseline = timed_run(it->against_fork ? raw_fork : raw_spawn); },
        [&] {
          ours = timed_run([&] { cohort::spawn_and_join(bench_ranks::noop, std::tuple{}, ranks, it->options); });
        },
        [&] { supervisor = timed_run(asio_fork); },
    };
    for (std::size_t r : cohort::bench::round_order(round, it->against_fork ? 3 : 2)) runs[r]();
    const std::string line =
        fmt::format("{} {} {} {} {} {} {} {} {}\n", ours.seconds, baseline.seconds, ours.cpu.self, ours.cpu.children,
                    baseline.cpu.self, baseline.cpu.children, supervisor.seconds, ours.cpu.faults, baseline.cpu.faults);
    if (::write(1, line.data(), line.size()) != static_cast<ssize_t>(line.size())) return 1;
  }
  return 0;
}

// The process of one method (serve_rounds), started at construction, where
// it times its first run; round() has it time one more. Ends it at
// destruction. Throws std::runtime_error when the process cannot start or
// answers no time.
class method_process {
 public:
  explicit method_process(const std::string& what) : what_(what) {
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) != 0) throw std::runtime_error("pipe2");
    if (::pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error("pipe2");
    posix_spawn_file_actions_t actions;
    ::posix_spawn_file_actions_init(&actions);
    ::posix_spawn_file_actions_adddup2(&actions, in[0], 0);
    ::posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    char self[] = "/proc/self/exe", alone[] = "--alone";
    char* const argv[] = {self, alone, what_.data(), nullptr};
    const int error = ::posix_spawn(&pid_, self, &actions, nullptr, argv, environ);
    ::posix_spawn_file_actions_destroy(&actions);
    ::close(in[0]);
    ::close(out[1]);
    if (error != 0) {
      ::close(in[1]);
      ::close(out[0]);
      throw std::runtime_error(fmt::format("cohort {}: posix_spawn of its process failed", what_));
    }
    to_ = in[1];
    from_ = ::fdopen(out[0], "r");
    first_ = round().ours.seconds;
  }
  method_process(const method_process&) = delete;
  method_process& operator=(const method_process&) = delete;
  ~method_process() {
    ::close(to_);
    std::fclose(from_);
    ::waitpid(pid_, nullptr, 0);
  }

  /// One start and join, and its baseline beside it in the same process.
  struct result {
    timed ours, baseline;
    double supervisor = 0;  // the asio supervisor's seconds; 0 where it did not run
  };
  result round() {
    result r;
    if (::write(to_, "g", 1) != 1 ||
        std::fscanf(from_, "%lf %lf %lf %lf %lf %lf %lf %lf %lf", &r.ours.seconds, &r.baseline.seconds,
                    &r.ours.cpu.self, &r.ours.cpu.children, &r.baseline.cpu.self, &r.baseline.cpu.children,
                    &r.supervisor, &r.ours.cpu.faults, &r.baseline.cpu.faults) != 9)
      throw std::runtime_error(fmt::format("cohort {}: its process answered no time", what_));
    return r;
  }
  /// Seconds of the first start and join, made at construction.
  double first() const { return first_; }

 private:
  std::string what_;
  pid_t pid_ = -1;
  int to_ = -1;
  FILE* from_ = nullptr;
  double first_ = 0;
};

using cohort::bench::spread_of;

int run(int argc, char** argv);

}  // namespace

int main(int argc, char** argv) {
  if (auto rc = cohort::child_main(argc, argv)) return *rc;
  cohort::bench::line_buffered_stdout();
  if (std::getenv(exit_at_once) != nullptr) return 0;
  // A method's process that died makes the next write to it fail with
  // EPIPE, which round() reports, and not kill this process silently.
  std::signal(SIGPIPE, SIG_IGN);
  if (argc > 2 && std::string(argv[1]) == "--alone") return serve_rounds(argv[2]);
  return cohort::bench::run_reporting("start_join", [&] { return run(argc, argv); });
}

namespace {

int run(int argc, char** argv) {
  std::vector<int> counts{50};
  if (const auto rc = cohort::bench::read_counts(argc, argv, "start_join [rounds = 50]", counts)) return *rc;
  int rounds = counts[0];

  // The peers' processes first: each is ready (its imports done, its
  // untimed runs made) before cohort's first run.
  cohort::bench::python_peer python(python_script, {"python"}), torch(python_script, {"torch"});
  // An interpreter that could not start at all: one line for them all.
  const bool no_python = !python.failure().empty() && !torch.failure().empty();
  const int turns = std::min(rounds, std::max(3, rounds / 5));
  std::vector<peer> peers{{"python spawn", "spawn", &python, turns},
                          {"python forkserver", "forkserver", &python, turns},
                          {"python fork", "fork", &python, turns},
                          {"torch spawn", "spawn", &torch, std::min(rounds, 3)},
                          {"torch fork", "fork", &torch, turns}};
  if (no_python) peers.clear();

  const auto methods = timings();
  std::vector<std::unique_ptr<method_process>> processes;
  for (const auto& t : methods) processes.push_back(std::make_unique<method_process>(t.name));

  // Per round: each method's time and its ratio to its baseline, timed
  // beside it in the method's own process.
  std::vector<std::vector<double>> ours(methods.size()), theirs(methods.size()), ratios(methods.size());
  // CPU per round, in ms: the method's process, and per rank its children
  // (in µs); the same for its baseline. And the method's process's minor
  // page faults per round, beside its baseline's.
  std::vector<std::vector<double>> own_cpu(methods.size()), rank_cpu(methods.size()), base_own_cpu(methods.size()),
      base_rank_cpu(methods.size()), own_faults(methods.size()), base_faults(methods.size());
  // The fork methods' asio supervisor: its seconds, round by round.
  std::vector<std::vector<double>> supervisor(methods.size());
  fmt::print("start+join of {} ranks, {} rounds; each round, in each method's process: its baseline and the "
             "method once, in an order that changes round by round\n",
             ranks, rounds);
  fmt::print("  {:>5}  cohort/baseline:", "round");
  for (const auto& t : methods) fmt::print(" {}", t.name);
  fmt::print("\n");
  // Where a method's process fails, the rounds before it are summed up,
  // and why it failed is printed on stderr.
  std::string failure;
  for (int round = 1; round <= rounds && failure.empty(); ++round) {
    fmt::print("  {:>5}  {:16}", round, "");
    // The peers' figures of this round, left out with it where it fails.
    std::vector<std::pair<peer*, bool>> peers_timed;  // and whether a ratio came with the time
    for (std::size_t m = 0; m < methods.size() && failure.empty(); ++m) {
      // The peers of this method whose turn it is: each runs before
      // cohort in its even turns and after it in its odd ones.
      std::vector<peer*> before, after;
      for (auto& p : peers) {
        if (p.method != methods[m].name || !cohort::bench::one_of_spread(round - 1, p.turns, rounds)) continue;
        (p.seconds.size() % 2 == 0 ? before : after).push_back(&p);
      }
      std::vector<std::pair<peer*, double>> taken;
      for (peer* p : before) taken.emplace_back(p, p->once());
      method_process::result r;
      try {
        r = processes[m]->round();
      } catch (const std::exception& e) {
        failure = fmt::format("round {}: {}", round, e.what());
        // The round is left out: every method's figures keep the rounds
        // all of them made, aligned.
        rounds = round - 1;
        for (auto* figures :
             {&ours, &theirs, &ratios, &own_cpu, &rank_cpu, &base_own_cpu, &base_rank_cpu, &own_faults, &base_faults}) {
          for (auto& f : *figures) f.resize(std::min(f.size(), static_cast<std::size_t>(rounds)));
        }
        for (auto& s : supervisor) s.resize(std::min(s.size(), static_cast<std::size_t>(rounds)));
        for (const auto& [p, seconds] : taken) {
          if (seconds > 0) p->seconds.pop_back();
        }
        for (const auto& [p, with_ratio] : peers_timed) {
          p->seconds.pop_back();
          if (with_ratio) p->ratios.pop_back();
        }
        break;
      }
      for (peer* p : after) taken.emplace_back(p, p->once());
      for (const auto& [p, seconds] : taken) {
        if (seconds > 0) p->ratios.push_back(seconds / r.ours.seconds);
        if (seconds > 0) peers_timed.emplace_back(p, true);
      }
      ours[m].push_back(r.ours.seconds);
      theirs[m].push_back(r.baseline.seconds);
      ratios[m].push_back(r.ours.seconds / r.baseline.seconds);
      own_cpu[m].push_back(r.ours.cpu.self * 1e3);
      rank_cpu[m].push_back(r.ours.cpu.children * 1e6 / ranks);
      base_own_cpu[m].push_back(r.baseline.cpu.self * 1e3);
      base_rank_cpu[m].push_back(r.baseline.cpu.children * 1e6 / ranks);
      own_faults[m].push_back(r.ours.cpu.faults);
      base_faults[m].push_back(r.baseline.cpu.faults);
      if (r.supervisor > 0) supervisor[m].push_back(r.supervisor);
      fmt::print(" {:>{}.2f}x", ratios[m].back(), methods[m].name.size() - 1);
    }
    fmt::print("\n");
    std::fflush(stdout);
  }

  if (!failure.empty() && rounds == 0) throw std::runtime_error(failure);

  fmt::print("median over {} rounds; cohort/baseline as median (min-max) of the rounds' ratios\n", rounds);
  for (std::size_t m = 0; m < methods.size(); ++m) {
    const auto ratio = spread_of(ratios[m]);
    fmt::print("  {:<28} {:>9.3f} ms  {:.2f}x {} of {:.3f} ms ({:.2f}-{:.2f}x; first run {:.3f} ms)\n",
               "cohort " + methods[m].name, cohort::bench::median(ours[m]) * 1e3, ratio.median,
               methods[m].against_fork ? "raw fork" : "posix_spawn", cohort::bench::median(theirs[m]) * 1e3,
               ratio.min, ratio.max, processes[m]->first() * 1e3);
  }
  // The bare asio supervisor of raw forks, in each fork method's process
  // (named after it), against raw fork and against the method.
  for (std::size_t m = 0; m < methods.size(); ++m) {
    if (supervisor[m].empty()) continue;
    // Every round of a fork method has one: aligned with its rounds.
    const auto floor = spread_of(cohort::bench::per_round(supervisor[m], theirs[m]));
    const auto above = spread_of(cohort::bench::per_round(ours[m], supervisor[m]));
    fmt::print("  {:<44} {:>9.3f} ms  {:.2f}x raw fork ({:.2f}-{:.2f}x); cohort {} takes {:.2f}x ({:.2f}-{:.2f}x) "
               "its time\n",
               "asio supervisor in " + methods[m].name + "'s process", cohort::bench::median(supervisor[m]) * 1e3,
               floor.median, floor.min, floor.max, methods[m].name, above.median, above.min, above.max);
  }
  processes.clear();
  // Where each method's time goes: the CPU its process used per round, and
  // each rank's, against its baseline's. The forkserver's ranks are this
  // process's children (made with CLONE_PARENT) and counted; the
  // forkserver's own work of making them is not, as it is never reaped.
  fmt::print("CPU per round, medians: the method's process (ms), each rank it reaped (us), and the method's "
             "process's minor page faults; its baseline's beside\n");
  for (std::size_t m = 0; m < methods.size(); ++m) {
    const bool server = methods[m].options.method == cohort::start_method::forkserver;
    fmt::print("  {:<28} {:>7.3f} ms ({:<11} {:.3f} ms)   per rank {:>6.0f} us ({:.0f} us)   faults {:>4.0f} ({:.0f}){}\n",
               "cohort " + methods[m].name, cohort::bench::median(own_cpu[m]),
               methods[m].against_fork ? "raw fork" : "posix_spawn", cohort::bench::median(base_own_cpu[m]),
               cohort::bench::median(rank_cpu[m]), cohort::bench::median(base_rank_cpu[m]),
               cohort::bench::median(own_faults[m]), cohort::bench::median(base_faults[m]),
               server ? "   (the forkserver's own CPU not counted)" : "");
  }
  // Two methods against each other, round by round as above.
  const auto against = [&](const char* over, const char* under) {
    const auto at = [&](const char* name) {
      return std::find_if(methods.begin(), methods.end(), [&](const timing& t) { return t.name == name; }) -
             methods.begin();
    };
    return spread_of(cohort::bench::per_round(ours[at(over)], ours[at(under)]));
  };
  const auto parallel = against("spawn", "spawn-one-by-one");
  fmt::print("  cohort spawn, {} starting threads, takes {:.2f}x ({:.2f}-{:.2f}x) its time one by one\n",
             std::min(8u, std::max(1u, std::thread::hardware_concurrency())), parallel.median, parallel.min,
             parallel.max);
  const auto after = against("fork-after-spawn", "fork");
  fmt::print("  cohort fork after a spawn takes {:.2f}x ({:.2f}-{:.2f}x) cohort fork in a fresh process\n",
             after.median, after.min, after.max);
  // Every baseline prints a line: its median time and its ratios to
  // cohort's, or failed and why (the script's own word, else why the
  // interpreter failed); an interpreter that could not start at all, one
  // line for them all.
  if (no_python) fmt::print("  {:<28} failed: {}\n", "python and torch", python.failure());
  for (const auto& p : peers) {
    if (p.failure.empty() && !p.ratios.empty()) {
      const auto ratio = spread_of(p.ratios);
      // "python/cohort", "torch/cohort": the ratios' names.
      const std::string ratio_name = p.name.substr(0, p.name.find(' ')) + "/cohort";
      fmt::print("  {:<28} {:>9.3f} ms  ({} over the {} rounds it ran in)\n", p.name,
                 cohort::bench::median(p.seconds) * 1e3,
                 cohort::bench::faster_text(ratio, "cohort " + p.method, ratio_name), p.ratios.size());
    } else {
      fmt::print("  {:<28} failed: {}\n", p.name, p.failure.empty() ? "no result" : p.failure);
    }
  }
  if (failure.empty()) return 0;
  fmt::print(stderr, "start_join: {}; the figures above are of the {} rounds before it\n", failure, rounds);
  return 1;
}

}  // namespace

// Fail-fast teardown: 4 ranks, rank 0 fails at once, the others sleep; the
// time from start_processes to the run's result, with no grace period
// before SIGTERM. The baseline does the same by hand in the same run:
// posix_spawn 4, waitid for rank 0, SIGTERM the rest, waitid each. Each
// round runs both, the one or the other first in alternate rounds, and
// their ratio is taken per round: its median and range print. Then the
// same with function ranks started by fork (rank 0 throws), against
// torch.multiprocessing.start_processes(start_method="fork") where
// /usr/bin/python3 (or $COHORT_BENCH_PYTHON) imports torch. torch takes
// turns with cohort's fork rounds: a Python process (python_peer) lasts the
// run and times one teardown when asked, in a twentieth of the rounds (at
// least 5) spread over the run, before or after cohort's run of the round
// in alternate turns; its ratio to cohort's is taken per round.
//
//   group_teardown [rounds]     (default 200)
#include <cohort/entry_point.hpp>
#include <cohort/group.hpp>

#include "arguments.hpp"
#include "config.hpp"
#include "python.hpp"
#include "stats.hpp"

#include <asio/co_spawn.hpp>
#include <asio/use_future.hpp>

#include <fmt/format.h>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace bench_ranks {
// Rank 0 fails at once; the others would sleep for a minute.
void fail_or_sleep(int rank) {
  if (rank == 0) throw std::runtime_error("rank 0 fails");
  std::this_thread::sleep_for(std::chrono::minutes(1));
}
COHORT_ENTRYPOINT(fail_or_sleep);
}  // namespace bench_ranks

namespace {

const char* const rank_program = COHORT_BENCH_RANK;

// torch's fail-fast teardown, timed in Python, as a python_peer: each
// request line asks for one teardown, answered with its seconds. One
// untimed first, as cohort's first is.
const char* torch_script = R"(
import sys, time
import torch.multiprocessing as mp
def fail_or_sleep(rank):
    if rank == 0:
        raise RuntimeError('rank 0 fails')
    time.sleep(60)
def teardown():
    t = time.perf_counter()
    try:
        mp.start_processes(fail_or_sleep, nprocs=4, start_method='fork')
    except Exception:
        pass
    return time.perf_counter() - t
if __name__ == '__main__':
    teardown()
    print('ready', flush=True)
    for _ in iter(sys.stdin.readline, ''):
        print(teardown(), flush=True)
)";

constexpr int ranks = 4;

double raw_teardown() {
  auto start = cohort::bench::clock::now();
  std::vector<int> pidfds;
  for (int r = 0; r < ranks; ++r) {
    char* const argv[] = {const_cast<char*>(rank_program), const_cast<char*>(r == 0 ? "fail" : "sleep"), nullptr};
    pid_t pid;
    if (::posix_spawn(&pid, rank_program, nullptr, nullptr, argv, environ) != 0) throw std::runtime_error("posix_spawn");
    pidfds.push_back(cohort::config::pidfd_open(pid));
  }
  siginfo_t info;
  const auto p_pidfd = static_cast<idtype_t>(cohort::config::p_pidfd);
  ::waitid(p_pidfd, static_cast<id_t>(pidfds[0]), &info, WEXITED);
  for (int r = 1; r < ranks; ++r) cohort::config::pidfd_send_signal(pidfds[static_cast<std::size_t>(r)], SIGTERM);
  for (int r = 1; r < ranks; ++r) ::waitid(p_pidfd, static_cast<id_t>(pidfds[static_cast<std::size_t>(r)]), &info, WEXITED);
  for (int fd : pidfds) ::close(fd);
  return cohort::bench::seconds_since(start);
}

double cohort_teardown(asio::io_context& io, const cohort::group_spec& spec) {
  auto start = cohort::bench::clock::now();
  auto result = asio::co_spawn(io, [&]() -> asio::awaitable<cohort::run_result> {
    cohort::group g = co_await cohort::start_processes(spec);
    co_return co_await g.wait();
  }(), asio::use_future);
  io.run();
  io.restart();
  auto r = result.get();
  if (r.first_failure() == nullptr || r.first_failure()->rank != 0) throw std::runtime_error("rank 0 did not fail first");
  return cohort::bench::seconds_since(start);
}

int run(int argc, char** argv);

}  // namespace

// A failure is printed on stderr after what was measured before it; the
// torch peer's process is ended and its files removed on the way out.
int main(int argc, char** argv) {
  if (auto rc = cohort::child_main(argc, argv)) return *rc;
  // A peer that died fails its next request with EPIPE, not this process.
  std::signal(SIGPIPE, SIG_IGN);
  return cohort::bench::run_reporting("group_teardown", [&] { return run(argc, argv); });
}

namespace {

int run(int argc, char** argv) {
  std::vector<int> counts{200};
  if (const auto rc = cohort::bench::read_counts(argc, argv, "group_teardown [rounds = 200]", counts)) return *rc;
  const int rounds = counts[0];
  cohort::group_spec spec;
  spec.entry = cohort::command(rank_program);
  spec.nprocs = ranks;
  spec.args = {{0, {"fail"}}, {1, {"sleep"}}, {2, {"sleep"}}, {3, {"sleep"}}};
  spec.shutdown.grace = std::chrono::milliseconds(0);
  asio::io_context io;
  std::vector<double> raw, ours;
  raw_teardown();
  cohort_teardown(io, spec);  // warm-up
  for (int i = 0; i < rounds; ++i) {
    cohort::bench::in_turns(
        i, [&] { raw.push_back(raw_teardown()); }, [&] { ours.push_back(cohort_teardown(io, spec)); });
  }
  fmt::print("fail-fast teardown of {} ranks (rank 0 fails at once, grace 0), {} rounds, ms\n", ranks, rounds);
  fmt::print("{:<34} {:>8} {:>8}\n", "variant", "p50", "p90");
  fmt::print("{:<34} {:>8.2f} {:>8.2f}\n", "raw posix_spawn + waitid + SIGTERM", cohort::bench::median(raw) * 1e3,
             cohort::bench::percentile(raw, 90) * 1e3);
  fmt::print("{:<34} {:>8.2f} {:>8.2f}\n", "cohort start_processes + wait", cohort::bench::median(ours) * 1e3,
             cohort::bench::percentile(ours, 90) * 1e3);
  const auto against_raw = cohort::bench::spread_of(cohort::bench::per_round(ours, raw));
  fmt::print("cohort / raw, median of the rounds' ratios: {:.2f}x (spread {:.2f}-{:.2f}x)\n", against_raw.median,
             against_raw.min, against_raw.max);

  // Function ranks by fork; a failing rank prints its error on stderr,
  // which this benchmark sends to /dev/null.
  cohort::group_spec forked;
  forked.entry = cohort::call(cohort::start_method::fork, bench_ranks::fail_or_sleep);
  forked.nprocs = ranks;
  forked.shutdown.grace = std::chrono::milliseconds(0);
  forked.options.err = cohort::stdio::null();
  std::vector<double> by_fork, by_torch, ratios;
  std::string torch_failure;
  // torch's process is ready (imported, its first teardown made) before
  // cohort's first fork round.
  cohort::bench::python_peer torch(torch_script, {});
  const int turns = std::min(rounds, std::max(5, rounds / 20));
  // One teardown of torch's; 0 where it failed, and why noted.
  const auto torch_once = [&] {
    if (!torch_failure.empty()) return 0.0;
    const auto line = torch.ask("teardown");
    double seconds = 0;
    if (!line) torch_failure = torch.failure();
    else if (std::sscanf(line->c_str(), "%lf", &seconds) != 1 || seconds <= 0) {
      torch_failure = fmt::format("it answered \"{}\"", *line);
    }
    if (!torch_failure.empty()) return 0.0;
    by_torch.push_back(seconds);
    return seconds;
  };
  cohort_teardown(io, forked);
  for (int i = 0; i < rounds; ++i) {
    if (!cohort::bench::one_of_spread(i, turns, rounds)) {
      by_fork.push_back(cohort_teardown(io, forked));
      continue;
    }
    double theirs = 0;
    cohort::bench::in_turns(
        static_cast<int>(by_torch.size()), [&] { by_fork.push_back(cohort_teardown(io, forked)); },
        [&] { theirs = torch_once(); });
    if (theirs > 0) ratios.push_back(theirs / by_fork.back());
  }
  fmt::print("{:<34} {:>8.2f} {:>8.2f}\n", "cohort fork functions", cohort::bench::median(by_fork) * 1e3,
             cohort::bench::percentile(by_fork, 90) * 1e3);
  if (torch_failure.empty() && !ratios.empty()) {
    const auto ratio = cohort::bench::spread_of(ratios);
    fmt::print("{:<34} {:>8.2f} {:>8}  ({} over the {} rounds it ran in)\n", "torch start_processes fork",
               cohort::bench::median(by_torch) * 1e3, "",
               cohort::bench::faster_text(ratio, "cohort fork", "torch/cohort"), ratios.size());
  } else {
    fmt::print("{:<34} failed: {}\n", "torch start_processes fork",
               torch_failure.empty() ? "no result" : torch_failure);
  }
  return 0;
}

}  // namespace

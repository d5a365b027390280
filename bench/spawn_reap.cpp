// spawn+reap of N children of /bin/true: cohort (spawn, then co_await wait()
// on an io_context) against a raw posix_spawn + pidfd_open + waitid loop and
// Boost.Process v2 (when built with it), in one run. "cohort, blocking
// join()" reaps with join() instead, to tell launch cost from wait cost. Each
// round runs every variant once, in an order that changes round by round
// (round_order: turned by one every two rounds, reversed in odd ones), so
// that no variant always goes first or always runs right after the same
// other one; the report gives each variant's median over the rounds and the
// median of its per-round ratios to the raw loop, with their range. A
// variant that throws at some N runs no more at that N and prints as failed
// with why; the others' rows print all the same, and the exit status is 1.
// Then how long one launch holds the thread that makes it (both return once
// the child has exec'd): cohort::spawn against posix_spawn, the one or the
// other first in alternate launches, each child reaped before the next
// launch.
//
//   spawn_reap [rounds]     (default 15)
#include <cohort/cohort.hpp>

#include "arguments.hpp"
#include "config.hpp"
#include "stats.hpp"
#ifdef COHORT_BENCH_BOOST
#include "boost_baseline.hpp"
#endif

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/use_awaitable.hpp>

#include <fmt/format.h>

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <utility>
#include <stdexcept>
#include <string>
#include <vector>

extern char** environ;

namespace {

const char* const program = "/bin/true";

// Starts `n` children, then reaps each through its pidfd. Throws where a
// launch, a pidfd or a reap fails or a child does not exit 0, once every
// child it started is reaped.
void raw_spawn_reap(int n) {
  std::vector<int> pidfds;
  pidfds.reserve(static_cast<std::size_t>(n));
  char* const argv[] = {const_cast<char*>(program), nullptr};
  std::string failure;
  for (int i = 0; i < n && failure.empty(); ++i) {
    pid_t pid;
    if (const int error = ::posix_spawn(&pid, program, nullptr, nullptr, argv, environ); error != 0) {
      failure = fmt::format("posix_spawn: {}", std::strerror(error));
    } else if (const int fd = cohort::config::pidfd_open(pid); fd < 0) {
      failure = fmt::format("pidfd_open: {}", std::strerror(errno));
      ::waitpid(pid, nullptr, 0);
    } else {
      pidfds.push_back(fd);
    }
  }
  for (int fd : pidfds) {
    siginfo_t info{};
    if (::waitid(static_cast<idtype_t>(cohort::config::p_pidfd), static_cast<id_t>(fd), &info, WEXITED) != 0) {
      if (failure.empty()) failure = fmt::format("waitid: {}", std::strerror(errno));
    } else if ((info.si_code != CLD_EXITED || info.si_status != 0) && failure.empty()) {
      failure = "a child failed";
    }
    ::close(fd);
  }
  if (!failure.empty()) throw std::runtime_error(failure);
}

std::vector<cohort::child> cohort_launch(asio::io_context& io, int n) {
  std::vector<cohort::child> children;
  children.reserve(static_cast<std::size_t>(n));
  const cohort::command cmd(program);
  const cohort::spawn_options options;
  for (int i = 0; i < n; ++i) children.push_back(cohort::spawn(io.get_executor(), cmd, options));
  return children;
}

void cohort_spawn_reap(asio::io_context& io, int n) {
  auto children = cohort_launch(io, n);
  int failed = 0;
  for (auto& c : children) {
    asio::co_spawn(io, c.wait(), [&failed](std::exception_ptr e, cohort::exit_status s) {
      if (e || !s.success()) ++failed;
    });
  }
  io.run();
  io.restart();
  if (failed != 0) throw std::runtime_error("a child failed");
}

// The same launches, reaped with the blocking join(): separates the cost of
// cohort's launch from that of its asynchronous wait.
void cohort_spawn_join(asio::io_context& io, int n) {
  for (auto& c : cohort_launch(io, n)) {
    if (!c.join().success()) throw std::runtime_error("a child failed");
  }
}

// Microseconds each call held its thread, `launches` times each, the one
// or the other first in alternate launches: posix_spawn's and
// cohort::spawn's, each child reaped after.
std::pair<std::vector<double>, std::vector<double>> thread_held(asio::io_context& io, int launches) {
  std::vector<double> raw, cohort_held;
  char* const argv[] = {const_cast<char*>(program), nullptr};
  const cohort::command cmd(program);
  const cohort::spawn_options options;
  for (int i = 0; i < launches; ++i) {
    cohort::bench::in_turns(
        i,
        [&] {
          pid_t pid;
          const auto start = cohort::bench::clock::now();
          if (::posix_spawn(&pid, program, nullptr, nullptr, argv, environ) != 0) throw std::runtime_error("posix_spawn");
          raw.push_back(cohort::bench::seconds_since(start) * 1e6);
          ::waitpid(pid, nullptr, 0);
        },
        [&] {
          const auto start = cohort::bench::clock::now();
          cohort::child c = cohort::spawn(io.get_executor(), cmd, options);
          cohort_held.push_back(cohort::bench::seconds_since(start) * 1e6);
          if (!c.join().success()) throw std::runtime_error("a child failed");
        });
  }
  return {raw, cohort_held};
}

int run(int argc, char** argv);

}  // namespace

int main(int argc, char** argv) {
  return cohort::bench::run_reporting("spawn_reap", [&] { return run(argc, argv); });
}

namespace {

int run(int argc, char** argv) {
  std::vector<int> counts{15};
  if (const auto rc = cohort::bench::read_counts(argc, argv, "spawn_reap [rounds = 15]", counts)) return *rc;
  const int rounds = counts[0];
  asio::io_context ring_io;
  asio::io_context* io = &ring_io;
  const auto info = cohort::io_uring_support(ring_io);

  // The raw loop first: the ratios are to it.
  const std::vector<std::pair<std::string, std::function<void(int)>>> variants{
      {"raw posix_spawn+pidfd", raw_spawn_reap},
      {"cohort", [io](int n) { cohort_spawn_reap(*io, n); }},
      {"cohort, blocking join()", [io](int n) { cohort_spawn_join(*io, n); }},
#ifdef COHORT_BENCH_BOOST
      {"Boost.Process v2", [](int n) { cohort::bench::boost_spawn_reap(program, n); }},
#endif
  };
  fmt::print("spawn+reap of N x {}; {} rounds; cohort waits through {}\n", program, rounds,
             info.waitid ? "io_uring waitid" : "the reactor");
  fmt::print("{:>4}  {:<24} {:>10} {:>13} {:>22}\n", "N", "variant", "median ms", "us per child",
             "vs raw, by round");
  const std::size_t count = variants.size();
  bool any_failed = false;
  for (int n : {1, 8, 64, 512}) {
    std::vector<std::vector<double>> samples(count);
    // Why each variant failed at this N; empty while it has not.
    std::vector<std::string> failures(count);
    // One run of variant `v`, its seconds kept where `timed`.
    const auto attempt = [&](std::size_t v, bool timed) {
      if (!failures[v].empty()) return;
      try {
        const auto start = cohort::bench::clock::now();
        variants[v].second(n);
        if (timed) samples[v].push_back(cohort::bench::seconds_since(start));
      } catch (const std::exception& e) {
        failures[v] = e.what();
      }
    };
    for (std::size_t v = 0; v < count; ++v) attempt(v, false);  // warm-up
    for (int r = 0; r < rounds; ++r) {
      for (std::size_t v : cohort::bench::round_order(r, count)) attempt(v, true);
    }
    // A variant that failed in any round prints as failed: the rounds it
    // made before are not its figure.
    for (std::size_t v = 0; v < count; ++v) {
      if (!failures[v].empty()) {
        any_failed = true;
        fmt::print("{:>4}  {:<24} failed: {}\n", n, variants[v].first, failures[v]);
        continue;
      }
      const double m = cohort::bench::median(samples[v]);
      std::string versus = "1.00x";
      if (v != 0 && !failures[0].empty()) {
        versus = "raw failed";
      } else if (v != 0) {
        const auto ratio = cohort::bench::spread_of(cohort::bench::per_round(samples[v], samples[0]));
        versus = fmt::format("{:.2f}x ({:.2f}-{:.2f})", ratio.median, ratio.min, ratio.max);
      }
      fmt::print("{:>4}  {:<24} {:>10.3f} {:>13.1f} {:>22}\n", n, variants[v].first, m * 1e3, m * 1e6 / n, versus);
    }
  }
  const int launches = 20 * rounds;
  const auto [raw, held] = thread_held(*io, launches);
  fmt::print("the thread held by one launch of {}, until the child has exec'd ({} each, taking turns), us\n", program,
             launches);
  fmt::print("  {:<22} {:>8} {:>8} {:>8}\n", "", "p10", "p50", "p90");
  for (const auto& [name, samples] : {std::pair{"posix_spawn", &raw}, std::pair{"cohort::spawn", &held}}) {
    fmt::print("  {:<22} {:>8.0f} {:>8.0f} {:>8.0f}\n", name, cohort::bench::percentile(*samples, 10),
               cohort::bench::percentile(*samples, 50), cohort::bench::percentile(*samples, 90));
  }
  fmt::print("  cohort::spawn / posix_spawn, p50: {:.2f}x\n",
             cohort::bench::median(held) / cohort::bench::median(raw));
  if (any_failed) {
    fmt::print(stderr, "spawn_reap: a variant failed; its row says why\n");
    return 1;
  }
  return 0;
}

}  // namespace

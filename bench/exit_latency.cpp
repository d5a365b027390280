// Exit-notification latency: from a child's last instruction (it writes
// CLOCK_MONOTONIC to its stdout just before _exit) to the resumption of the
// coroutine awaiting child.wait(). io_uring waitid against the reactor
// fallback (pidfd readiness on epoll, then waitid), with three rows that
// take cohort's layers away one by one:
//  - the floor: a thread blocked in waitid(P_PIDFD) on a posix_spawned
//    child, which pays the child's exit and the wake-up and nothing else;
//  - a bare event loop: the same child's pidfd on an epoll set, epoll_wait,
//    then the reaping waitid with rusage (as cohort reaps): what any loop
//    that sleeps in epoll pays, with no executor, handler or coroutine;
//  - asio alone: the pidfd as an asio stream_descriptor, a coroutine
//    awaiting its readiness, then the same waitid: asio's reactor, its
//    scheduler and a coroutine's resumption, with none of cohort.
// The modes take turns in 5 rounds, so that drift weighs on all alike,
// in an order that changes round by round (round_order: turned by one every
// two rounds, reversed in odd ones), so that no mode always goes first or
// always runs right after the same other one; every row prints its p50 over
// the floor's.
// The stamp goes to a file, read after the wait: on a pipe, which a loop
// watches, its write woke the loop just before the exit and delayed the
// notification by that wake-up (about 6 us here for a bare epoll loop
// watching both), which the floor, blocked in waitid, never paid.
//
//   exit_latency [samples]     (default 500 per mode)
#include <cohort/cohort.hpp>

#include "arguments.hpp"
#include "stats.hpp"

#include <asio/co_spawn.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>

#include <fmt/format.h>

#include "config.hpp"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <spawn.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iterator>
#include <string>
#include <stdexcept>
#include <vector>

extern char** environ;

namespace {

std::int64_t now_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1'000'000'000LL + ts.tv_nsec;
}

// The stamp the child left in `path`.
std::int64_t stamp_in(const std::string& path) {
  std::int64_t stamped = 0;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  const bool read = fd >= 0 && ::pread(fd, &stamped, sizeof stamped, 0) == sizeof stamped;
  if (fd >= 0) ::close(fd);
  if (!read) throw std::runtime_error("stamp_exit left no stamp in " + path);
  return stamped;
}

// Microseconds from the stamp in `path` to `resumed`.
double us_since_stamp(std::int64_t resumed, const std::string& path) {
  return static_cast<double>(resumed - stamp_in(path)) / 1e3;
}

// Reaps the exited child behind `pidfd` with its resource usage, as
// cohort's reap does (glibc's waitid has no rusage argument).
void reap_with_usage(int pidfd) {
  siginfo_t info{};
  rusage usage{};
  ::syscall(SYS_waitid, cohort::config::p_pidfd, pidfd, &info, WEXITED | WNOHANG, &usage);
}

asio::awaitable<std::vector<double>> measure(std::string stamper, std::string stamp_path, int samples) {
  std::vector<double> latencies_us;
  const cohort::command cmd(stamper);
  const cohort::spawn_options options{.out = cohort::stdio::file(stamp_path)};
  for (int i = 0; i < samples; ++i) {
    cohort::child c = co_await cohort::spawn(cmd, options);
    auto status = co_await c.wait();
    const std::int64_t resumed = now_ns();
    if (!status.success()) throw std::runtime_error(fmt::format("stamp_exit {}", status));
    latencies_us.push_back(us_since_stamp(resumed, stamp_path));
  }
  co_return latencies_us;
}

// A child of `stamper` writing its stamp to `stamp_path`; its pid.
pid_t spawn_stamper(const std::string& stamper, const std::string& stamp_path) {
  char* const argv[] = {const_cast<char*>(stamper.c_str()), nullptr};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, stamp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid;
  const int error = ::posix_spawn(&pid, stamper.c_str(), &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  if (error != 0) throw std::runtime_error("posix_spawn");
  return pid;
}

std::vector<double> measure_blocking_waitid(const std::string& stamper, const std::string& stamp_path, int samples) {
  std::vector<double> latencies_us;
  for (int i = 0; i < samples; ++i) {
    const int pidfd = cohort::config::pidfd_open(spawn_stamper(stamper, stamp_path));
    siginfo_t info;
    ::waitid(static_cast<idtype_t>(cohort::config::p_pidfd), static_cast<id_t>(pidfd), &info, WEXITED);
    const std::int64_t resumed = now_ns();
    ::close(pidfd);
    latencies_us.push_back(us_since_stamp(resumed, stamp_path));
  }
  return latencies_us;
}

std::vector<double> measure_bare_epoll(const std::string& stamper, const std::string& stamp_path, int samples) {
  std::vector<double> latencies_us;
  const int epoll = ::epoll_create1(EPOLL_CLOEXEC);
  if (epoll < 0) throw std::runtime_error("epoll_create1");
  for (int i = 0; i < samples; ++i) {
    const int pidfd = cohort::config::pidfd_open(spawn_stamper(stamper, stamp_path));
    epoll_event watch{};
    watch.events = EPOLLIN;
    if (::epoll_ctl(epoll, EPOLL_CTL_ADD, pidfd, &watch) != 0) throw std::runtime_error("epoll_ctl");
    epoll_event ready{};
    while (::epoll_wait(epoll, &ready, 1, -1) != 1) {
    }
    reap_with_usage(pidfd);
    const std::int64_t resumed = now_ns();
    ::close(pidfd);  // leaves the epoll set with it
    latencies_us.push_back(us_since_stamp(resumed, stamp_path));
  }
  ::close(epoll);
  return latencies_us;
}

// The same through asio alone: the pidfd as a stream_descriptor, a
// coroutine awaiting its readiness, then the reaping waitid: what asio's
// reactor, its scheduler and a coroutine's resumption add to the bare loop,
// with none of cohort.
asio::awaitable<std::vector<double>> measure_asio(std::string stamper, std::string stamp_path, int samples) {
  std::vector<double> latencies_us;
  const auto executor = co_await asio::this_coro::executor;
  for (int i = 0; i < samples; ++i) {
    asio::posix::stream_descriptor pidfd(executor, cohort::config::pidfd_open(spawn_stamper(stamper, stamp_path)));
    co_await pidfd.async_wait(asio::posix::stream_descriptor::wait_read, asio::use_awaitable);
    reap_with_usage(pidfd.native_handle());
    const std::int64_t resumed = now_ns();
    latencies_us.push_back(us_since_stamp(resumed, stamp_path));
  }
  co_return latencies_us;
}

// One row; `floor_p50` is the floor's p50 (0 for the floor itself).
double report(const char* name, const std::vector<double>& l, double floor_p50) {
  const double p50 = cohort::bench::percentile(l, 50);
  fmt::print("{:<36} {:>8.1f} {:>8.1f} {:>8.1f} {:>8.1f} {:>9.2f}x\n", name, p50, cohort::bench::percentile(l, 90),
             cohort::bench::percentile(l, 99), cohort::bench::percentile(l, 100), floor_p50 > 0 ? p50 / floor_p50 : 1.0);
  return p50;
}

// The stamp file, removed however the run ends.
struct stamp_file {
  std::string path;
  ~stamp_file() {
    std::error_code ignored;
    std::filesystem::remove(path, ignored);
  }
};

// Runs `coroutine` to its end on `io`, which may have run before; its
// samples.
std::vector<double> run_on(asio::io_context& io, asio::awaitable<std::vector<double>> coroutine) {
  auto result = asio::co_spawn(io, std::move(coroutine), asio::use_future);
  io.restart();
  io.run();
  return result.get();
}

void add(std::vector<double>& to, const std::vector<double>& more) { to.insert(to.end(), more.begin(), more.end()); }

void run(int samples) {
  const std::string stamper = COHORT_BENCH_STAMP_EXIT;
  constexpr int rounds = 5;
  const int per_round = std::max(1, samples / rounds);
  fmt::print("exit notification latency, {} samples per mode in {} interleaved rounds (us)\n", per_round * rounds,
             rounds);
  fmt::print("{:<36} {:>8} {:>8} {:>8} {:>8} {:>10}\n", "mode", "p50", "p90", "p99", "max", "p50/floor");
  // On tmpfs: closing a truncated and rewritten file on ext4 (the child's
  // exit does) flushes it, which would be timed as the exit.
  const stamp_file stamp{fmt::format("/dev/shm/cohort-exit-latency-{}", ::getpid())};
  asio::io_context plain, ring, reactor;
  ::setenv("COHORT_IO_URING", "1", 1);  // read when an io_context's ring service starts
  const bool ring_waitid = cohort::io_uring_support(ring).waitid;
  ::setenv("COHORT_IO_URING", "0", 1);
  cohort::io_uring_support(reactor);
  std::vector<double> floor, bare, alone, on_ring, on_reactor;
  const std::function<void()> modes[] = {
      [&] { add(floor, measure_blocking_waitid(stamper, stamp.path, per_round)); },
      [&] { add(bare, measure_bare_epoll(stamper, stamp.path, per_round)); },
      [&] { add(alone, run_on(plain, measure_asio(stamper, stamp.path, per_round))); },
      [&] { add(on_ring, run_on(ring, measure(stamper, stamp.path, per_round))); },
      [&] { add(on_reactor, run_on(reactor, measure(stamper, stamp.path, per_round))); },
  };
  for (int round = 0; round < rounds; ++round) {
    for (std::size_t mode : cohort::bench::round_order(round, std::size(modes))) modes[mode]();
  }
  const double floor_p50 = report("floor: blocking waitid(P_PIDFD)", floor, 0);
  report("bare loop: epoll on the pidfd, waitid", bare, floor_p50);
  report("asio alone: co_await pidfd, waitid", alone, floor_p50);
  report(ring_waitid ? "cohort, io_uring waitid" : "cohort, (no io_uring waitid: reactor)", on_ring, floor_p50);
  report("cohort, reactor (pidfd + waitid)", on_reactor, floor_p50);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> counts{500};
  const char* const usage = "exit_latency [samples per mode = 500]";
  if (const auto rc = cohort::bench::read_counts(argc, argv, usage, counts)) return *rc;
  return cohort::bench::run_reporting("exit_latency", [&] {
    run(counts[0]);
    return 0;
  });
}

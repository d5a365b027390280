// Exit-notification latency: from a child's last instruction (it writes
// CLOCK_MONOTONIC to a pipe just before _exit) to the resumption of the
// coroutine awaiting child.wait(). io_uring waitid against the reactor
// fallback (pidfd readiness on epoll, then waitid), in one run, with the
// floor below both: a thread blocked in waitid(P_PIDFD) on a posix_spawned
// child, which pays the child's exit and the wake-up and nothing else.
//
//   exit_latency [samples]     (default 500 per mode)
#include <cohort/cohort.hpp>

#include "stats.hpp"

#include <asio/co_spawn.hpp>
#include <asio/read.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>

#include <fmt/format.h>

#include "config.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
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

asio::awaitable<std::vector<double>> measure(std::string stamper, int samples) {
  std::vector<double> latencies_us;
  const cohort::command cmd(stamper);
  const cohort::spawn_options options{.out = cohort::stdio::pipe()};
  for (int i = 0; i < samples; ++i) {
    cohort::child c = co_await cohort::spawn(cmd, options);
    auto status = co_await c.wait();
    const std::int64_t resumed = now_ns();
    std::int64_t stamped = 0;
    co_await asio::async_read(c.out(), asio::buffer(&stamped, sizeof stamped), asio::use_awaitable);
    if (!status.success()) throw std::runtime_error(fmt::format("stamp_exit {}", status));
    latencies_us.push_back(static_cast<double>(resumed - stamped) / 1e3);
  }
  co_return latencies_us;
}

std::vector<double> measure_blocking_waitid(const std::string& stamper, int samples) {
  std::vector<double> latencies_us;
  char* const argv[] = {const_cast<char*>(stamper.c_str()), nullptr};
  for (int i = 0; i < samples; ++i) {
    int out[2];
    if (::pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error("pipe2");
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    pid_t pid;
    if (::posix_spawn(&pid, stamper.c_str(), &actions, nullptr, argv, environ) != 0) throw std::runtime_error("posix_spawn");
    posix_spawn_file_actions_destroy(&actions);
    ::close(out[1]);
    const int pidfd = cohort::config::pidfd_open(pid);
    siginfo_t info;
    ::waitid(static_cast<idtype_t>(cohort::config::p_pidfd), static_cast<id_t>(pidfd), &info, WEXITED);
    const std::int64_t resumed = now_ns();
    std::int64_t stamped = 0;
    if (::read(out[0], &stamped, sizeof stamped) != sizeof stamped) throw std::runtime_error("read");
    ::close(out[0]);
    ::close(pidfd);
    latencies_us.push_back(static_cast<double>(resumed - stamped) / 1e3);
  }
  return latencies_us;
}

void report(const char* name, const std::vector<double>& l) {
  fmt::print("{:<34} {:>8.1f} {:>8.1f} {:>8.1f} {:>8.1f}\n", name, cohort::bench::percentile(l, 50),
             cohort::bench::percentile(l, 90), cohort::bench::percentile(l, 99), cohort::bench::percentile(l, 100));
}

}  // namespace

int main(int argc, char** argv) {
  const int samples = argc > 1 ? std::atoi(argv[1]) : 500;
  const std::string stamper = COHORT_BENCH_STAMP_EXIT;
  fmt::print("exit notification latency, {} samples per mode (us)\n", samples);
  fmt::print("{:<34} {:>8} {:>8} {:>8} {:>8}\n", "mode", "p50", "p90", "p99", "max");
  report("floor: blocking waitid(P_PIDFD)", measure_blocking_waitid(stamper, samples));
  for (const char* mode : {"1", "0"}) {
    ::setenv("COHORT_IO_URING", mode, 1);  // read when the io_context's ring service starts
    asio::io_context io;
    const auto info = cohort::io_uring_support(io);
    auto result = asio::co_spawn(io, measure(stamper, samples), asio::use_future);
    io.run();
    report(info.waitid ? "cohort, io_uring waitid" : "cohort, reactor (pidfd + waitid)", result.get());
  }
}

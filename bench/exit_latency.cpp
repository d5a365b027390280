// Exit-notification latency: from a child's last instruction (it writes
// CLOCK_MONOTONIC to its stdout just before _exit) to the resumption of the
// coroutine awaiting child.wait(). io_uring waitid against the reactor
// fallback (pidfd readiness on epoll, then waitid), in one run, with the
// floor below both: a thread blocked in waitid(P_PIDFD) on a posix_spawned
// child, which pays the child's exit and the wake-up and nothing else.
// The stamp goes to a file, read after the wait: on a pipe, which a loop
// watches, its write woke the loop just before the exit and delayed the
// notification by that wake-up (about 6 us here for a bare epoll loop
// watching both), which the floor, blocked in waitid, never paid.
//
//   exit_latency [samples]     (default 500 per mode)
#include <cohort/cohort.hpp>

#include "stats.hpp"

#include <asio/co_spawn.hpp>
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
#include <filesystem>
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

asio::awaitable<std::vector<double>> measure(std::string stamper, std::string stamp_path, int samples) {
  std::vector<double> latencies_us;
  const cohort::command cmd(stamper);
  const cohort::spawn_options options{.out = cohort::stdio::file(stamp_path)};
  for (int i = 0; i < samples; ++i) {
    cohort::child c = co_await cohort::spawn(cmd, options);
    auto status = co_await c.wait();
    const std::int64_t resumed = now_ns();
    if (!status.success()) throw std::runtime_error(fmt::format("stamp_exit {}", status));
    latencies_us.push_back(static_cast<double>(resumed - stamp_in(stamp_path)) / 1e3);
  }
  co_return latencies_us;
}

std::vector<double> measure_blocking_waitid(const std::string& stamper, const std::string& stamp_path, int samples) {
  std::vector<double> latencies_us;
  char* const argv[] = {const_cast<char*>(stamper.c_str()), nullptr};
  for (int i = 0; i < samples; ++i) {
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, stamp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    pid_t pid;
    if (::posix_spawn(&pid, stamper.c_str(), &actions, nullptr, argv, environ) != 0) throw std::runtime_error("posix_spawn");
    posix_spawn_file_actions_destroy(&actions);
    const int pidfd = cohort::config::pidfd_open(pid);
    siginfo_t info;
    ::waitid(static_cast<idtype_t>(cohort::config::p_pidfd), static_cast<id_t>(pidfd), &info, WEXITED);
    const std::int64_t resumed = now_ns();
    ::close(pidfd);
    latencies_us.push_back(static_cast<double>(resumed - stamp_in(stamp_path)) / 1e3);
  }
  return latencies_us;
}

void report(const char* name, const std::vector<double>& l) {
  fmt::print("{:<34} {:>8.1f} {:>8.1f} {:>8.1f} {:>8.1f}\n", name, cohort::bench::percentile(l, 50),
             cohort::bench::percentile(l, 90), cohort::bench::percentile(l, 99), cohort::bench::percentile(l, 100));
}

// The stamp file, removed however the run ends.
struct stamp_file {
  std::string path;
  ~stamp_file() {
    std::error_code ignored;
    std::filesystem::remove(path, ignored);
  }
};

void run(int samples) {
  const std::string stamper = COHORT_BENCH_STAMP_EXIT;
  fmt::print("exit notification latency, {} samples per mode (us)\n", samples);
  fmt::print("{:<34} {:>8} {:>8} {:>8} {:>8}\n", "mode", "p50", "p90", "p99", "max");
  // On tmpfs: closing a truncated and rewritten file on ext4 (the child's
  // exit does) flushes it, which would be timed as the exit.
  const stamp_file stamp{fmt::format("/dev/shm/cohort-exit-latency-{}", ::getpid())};
  report("floor: blocking waitid(P_PIDFD)", measure_blocking_waitid(stamper, stamp.path, samples));
  for (const char* mode : {"1", "0"}) {
    ::setenv("COHORT_IO_URING", mode, 1);  // read when the io_context's ring service starts
    asio::io_context io;
    const auto info = cohort::io_uring_support(io);
    auto result = asio::co_spawn(io, measure(stamper, stamp.path, samples), asio::use_future);
    io.run();
    report(info.waitid ? "cohort, io_uring waitid" : "cohort, reactor (pidfd + waitid)", result.get());
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    run(argc > 1 ? std::atoi(argv[1]) : 500);
  } catch (const std::exception& e) {
    fmt::print(stderr, "exit_latency: {}\n", e.what());
    return 1;
  }
}

// The parent's side of a function entry point: starting a rank by
// re-execution, by fork or through the forkserver, and reading back what the
// function returned.
#include "entry/entry.hpp"

#include "config.hpp"
#include "entry/forkserver.hpp"
#include "process/launch.hpp"

#include <fmt/format.h>

#include <stdio_ext.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <iostream>
#include <mutex>
#include <new>
#include <stdexcept>

extern char** environ;

namespace cohort::detail {
namespace {

class memfd {
 public:
  explicit memfd(const char* name) : fd_(::memfd_create(name, MFD_CLOEXEC)) {
    if (fd_ < 0) throw std::system_error(errno, std::system_category(), fmt::format("cohort: memfd_create({})", name));
  }
  memfd(const memfd&) = delete;
  memfd& operator=(const memfd&) = delete;
  ~memfd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const noexcept { return fd_; }
  int release() noexcept { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

// A true fork of this process (glibc's fork: its malloc and stdio locks are
// taken across it). The child sets itself up, reports on a pipe and calls
// the function.
int start_fork(launch_plan& p, pid_t& pid, const function_call& call, int rank, int result_fd) {
  int report[2];
  if (::pipe2(report, O_CLOEXEC) != 0) {
    p.failed_at = stage::pipe;
    p.error = errno;
    return -1;
  }
  std::vector<int> keep(p.keep, p.keep + p.keep_count);
  keep.push_back(report[1]);
  std::sort(keep.begin(), keep.end());
  p.keep = keep.data();
  p.keep_count = keep.size();
  p.close_now = true;

  pid = ::fork();
  if (pid == 0) {
    set_up_or_report(p, report[1]);
    // Output the parent had buffered but not written is the parent's to
    // write: dropped here, or it would appear twice.
    ::__fpurge(stdout);
    ::__fpurge(stderr);
    environ = const_cast<char**>(p.envp);
    const int code = run_entry(call.name, rank, call.args, result_fd);
    std::cout.flush();
    std::fflush(stdout);
    std::fflush(stderr);
    ::_exit(code);
  }
  const int fork_error = errno;
  ::close(report[1]);
  if (pid < 0) {
    ::close(report[0]);
    p.failed_at = stage::clone;
    p.error = fork_error;
    return -1;
  }
  return adopt_after_set_up(p, pid, report[0]);
}

// What a forked child reports once its set-up is done: stage::none, or where
// and why it failed.
struct setup_report {
  stage where;
  int error;
};

}  // namespace

// Success is reported too, rather than told by the pipe's end of file: a
// thread of the parent forking meanwhile would hold a copy of the write end.
void set_up_or_report(launch_plan& p, int report_fd) noexcept {
  const bool ready = set_up_child(p);
  const setup_report r{ready ? stage::none : p.failed_at, ready ? 0 : p.error};
  [[maybe_unused]] auto n = ::write(report_fd, &r, sizeof r);
  if (!ready) ::_exit(127);
  ::close(report_fd);
}

bool await_set_up(int report_fd, stage& where, int& error) noexcept {
  setup_report r{};
  ssize_t n;
  do {
    n = ::read(report_fd, &r, sizeof r);
  } while (n < 0 && errno == EINTR);
  ::close(report_fd);
  if (n == static_cast<ssize_t>(sizeof r) && r.where == stage::none) return true;
  if (n == static_cast<ssize_t>(sizeof r)) {
    where = r.where;
    error = r.error;
  } else {  // it died before it could say
    where = stage::start;
    error = n < 0 ? errno : ECHILD;
  }
  return false;
}

int adopt_after_set_up(launch_plan& p, pid_t pid, int report_fd) noexcept {
  // Ours until reaped, so its pid cannot be recycled before this.
  const int pidfd = config::pidfd_open(pid);
  if (pidfd < 0) {
    p.failed_at = stage::start;
    p.error = errno;
    ::close(report_fd);
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    return -1;
  }
  if (p.deferred_report != nullptr) {
    *p.deferred_report = report_fd;
    return pidfd;
  }
  if (!await_set_up(report_fd, p.failed_at, p.error)) {
    ::waitpid(pid, nullptr, 0);
    ::close(pidfd);
    return -1;
  }
  return pidfd;
}

namespace {

// spawn and forkserver re-execute this program: its main must pass control
// to child_main, or the child would run the parent's main.
void check_reexecutable(const function_call& call, const std::string& what) {
  if (!child_main_called()) {
    throw std::logic_error(fmt::format(
        "{}: the {} start method re-executes this program, whose main must call cohort::child_main(argc, argv) first",
        what, to_string(call.method)));
  }
}

child start_spawned(const asio::any_io_executor& executor, const function_call& call, int rank,
                    const spawn_options& options, int result_fd, const std::string& what) {
  check_reexecutable(call, what);
  memfd args("cohort-args");
  if (!write_whole(args.get(), call.args.bytes())) {
    throw std::system_error(errno, std::system_category(), what + ": writing the arguments");
  }
  spawn_options opts = options;
  opts.env.set(entry_env, fmt::format("{},{},{},{}", args.get(), result_fd, rank, call.name));
  opts.keep_fds.push_back(args.get());
  opts.keep_fds.push_back(result_fd);
  const command cmd("/proc/self/exe", {"--cohort-entry", call.name, std::to_string(rank)});
  std::error_code ec;
  child started = spawn(executor, cmd, opts, ec);
  if (ec) throw std::system_error(ec, what + ": re-executing /proc/self/exe");
  return started;
}

}  // namespace

namespace {

std::string describe_rank(const function_call& call, int rank) {
  return fmt::format("cohort: rank {} of '{}' ({})", rank, call.name, to_string(call.method));
}

}  // namespace

void confirm_set_up(int report_fd, const function_call& call, int rank) {
  launch_failure f;
  if (!await_set_up(report_fd, f.where, f.error)) {
    throw std::system_error(f.error, std::system_category(), describe_failure(describe_rank(call, rank), f));
  }
}

child start_function(const asio::any_io_executor& executor, const function_call& call, int rank,
                     const spawn_options& options, int& result_fd, int* set_up_report) {
  const std::string what = describe_rank(call, rank);
  if (set_up_report != nullptr) *set_up_report = -1;
  memfd result("cohort-result");
  child started;
  if (call.method == start_method::spawn) {
    started = start_spawned(executor, call, rank, options, result.get(), what);
  } else {
    if (call.method == start_method::forkserver) {
      check_reexecutable(call, what);
      if (!options.keep_fds.empty()) throw std::invalid_argument(what + ": keep_fds cannot pass through the forkserver");
    }
    launch_failure f;
    process_starter start = [&](launch_plan& p, pid_t& pid) {
      p.deferred_report = set_up_report;
      if (call.method == start_method::fork) return start_fork(p, pid, call, rank, result.get());
      return start_from_server(p, pid, call, rank, result.get());
    };
    auto state = launch(executor, options, start, f, {result.get()});
    if (!state) throw std::system_error(f.error, std::system_category(), describe_failure(what, f));
    started = child(std::move(state));
  }
  result_fd = result.release();
  return started;
}

std::optional<encoded> read_result(int result_fd) {
  std::vector<std::byte> bytes;
  if (!read_whole(result_fd, bytes)) {
    throw std::system_error(errno, std::system_category(), "cohort: reading a rank's result");
  }
  if (bytes.empty()) return std::nullopt;
  return encoded::from_bytes(std::move(bytes));
}

}  // namespace cohort::detail

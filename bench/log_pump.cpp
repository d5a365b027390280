// The ranks' logs through the launcher: throughput of 4 ranks writing to
// teed and redirected stdout, and how long a line takes from a rank's write
// to the launcher's stdout. Each round runs the same writers
// - with their stdout on files (no launcher: the bound);
// - on files, each followed by a minimal follower in this process (a
//   thread per file: inotify, pread, prefixed lines to /dev/null): the
//   bound for a teeing launcher whose ranks write their own files, as
//   cohort-run's do;
// - on pipes to a minimal pump (a thread per pipe: read, prefixed lines
//   to /dev/null, the whole read to a file): the bound for a tee whose
//   bytes pass through a pipe;
// - on pipes spliced to the files in the kernel (no console at all: the
//   floor of any pump, which shows what the pipe's second copy costs);
// - under cohort-run with the streams teed (the ranks write the files, it
//   follows them to the console, on /dev/null), teed through pipes
//   (--tee-through-pipes: it reads the pipes and writes the files and the
//   console), and redirected (the ranks write the files: the launcher only
//   starts and reaps them);
// - under torchrun --standalone teed (Debian's torch 1.13, with the same
//   mend as launcher_exit) where /usr/bin/python3 (or $COHORT_BENCH_PYTHON)
//   imports torch.
// Each round runs every one of them once, in an order that changes from
// round to round (in_rotation). A launcher's rate counts from its start
// to its exit; ratios to the writers on files are taken per round.
// The console latency of cohort-run's teed lines, followed and through
// pipes, is measured in rounds that take turns with the same ranks on
// pipes to the minimal pump, whose console is a pipe read the same way
// (the floor this machine gives any teeing launcher at the time), and
// with torchrun, whose p99 is held to cohort-run's of the same round.
//
//   log_pump [megabytes per rank] [rounds] [bytes per write]
//                                              (default 256, 3 and 1 MiB; files in $TMPDIR;
//                                               4096 writes as stdio does to a file)
//   log_pump --write <megabytes> <bytes>       (a writer rank: 100-byte lines)
//   log_pump --stamp <lines>                   (a rank writing its clock, a line every 2 ms)
#include "arguments.hpp"
#include "stats.hpp"
#include "torchrun.hpp"

#include <fmt/format.h>

#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <spawn.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

extern char** environ;

namespace {

namespace fs = std::filesystem;
using cohort::bench::clock;

const char* const cohort_run = COHORT_BENCH_COHORT_RUN;
constexpr int ranks = 4;


std::int64_t now_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

bool write_all(int fd, const char* data, std::size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

// A writer rank: `megabytes` MB of 100-byte lines on stdout, `piece` bytes
// (at most 1 MiB) a write.
int write_lines(long megabytes, std::size_t piece) {
  std::string block;
  const char* rank = std::getenv("LOCAL_RANK");
  while (block.size() < (1u << 20)) {
    std::string line = fmt::format("rank {} line {:08} ", rank != nullptr ? rank : "?", block.size() / 100);
    line.resize(99, '.');
    block += line + '\n';
  }
  std::size_t left = static_cast<std::size_t>(megabytes) * 1'000'000;
  while (left > 0) {
    const std::size_t n = std::min({left, piece, block.size()});
    if (!write_all(1, block.data(), n)) return 1;
    left -= n;
  }
  return 0;
}

// A stamping rank: `lines` lines holding the monotonic clock, 2 ms apart.
int write_stamps(int lines) {
  for (int i = 0; i < lines; ++i) {
    const std::string line = fmt::format("stamp {}\n", now_ns());
    if (!write_all(1, line.data(), line.size())) return 1;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return 0;
}

struct spawned {
  pid_t pid = -1;
  int out = -1;  // the read end of its stdout, when asked for
};

// Starts argv with stdout on `out_path` (or a pipe when empty, or
// /dev/null for "-") and stderr on `err_path`.
spawned start(const std::vector<std::string>& args, const std::string& out_path,
              const std::string& err_path = "/dev/null") {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  ::posix_spawn_file_actions_init(&actions);
  spawned s;
  int p[2] = {-1, -1};
  if (out_path.empty()) {
    if (::pipe2(p, O_CLOEXEC) != 0) throw std::runtime_error("pipe2");
    ::posix_spawn_file_actions_adddup2(&actions, p[1], 1);
    s.out = p[0];
  } else {
    ::posix_spawn_file_actions_addopen(&actions, 1, out_path == "-" ? "/dev/null" : out_path.c_str(),
                                       O_WRONLY | O_CREAT | O_TRUNC, 0644);
  }
  ::posix_spawn_file_actions_addopen(&actions, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  const int error = ::posix_spawn(&s.pid, argv[0], &actions, nullptr, argv.data(), environ);
  ::posix_spawn_file_actions_destroy(&actions);
  if (p[1] >= 0) ::close(p[1]);
  if (error != 0) throw std::runtime_error(fmt::format("posix_spawn {}: {}", args[0], std::strerror(error)));
  return s;
}

int finish(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

void require_ok(const std::string& what, int rc) {
  if (rc != 0) throw std::runtime_error(fmt::format("{} exited with {}", what, rc));
}

// What a writer rank writes at once: the third argument.
std::size_t bytes_per_write = 1u << 20;

// The command of a writer rank.
std::vector<std::string> writer_args(const std::string& self, long megabytes) {
  return {self, "--write", std::to_string(megabytes), std::to_string(bytes_per_write)};
}

double mb_per_second(long megabytes, double seconds) { return static_cast<double>(ranks * megabytes) / seconds; }

// MB/s of one launcher run, from its start to its exit, console on
// /dev/null; its log folder is removed after, outside the time. Throws
// std::runtime_error when it fails.
double launcher_throughput(const std::vector<std::string>& launcher, const fs::path& log_dir, long megabytes,
                           const std::string& err_path = "/dev/null") {
  const auto began = clock::now();
  require_ok(launcher[0], finish(start(launcher, "-", err_path).pid));
  const double seconds = cohort::bench::seconds_since(began);
  fs::remove_all(log_dir);
  return mb_per_second(megabytes, seconds);
}

// The last line of `path` with a letter in it, or "" (a failed peer's
// stderr: what says why).
std::string last_words(const fs::path& path) {
  std::string last;
  if (FILE* f = std::fopen(path.c_str(), "r")) {
    char line[1024];
    while (std::fgets(line, sizeof line, f) != nullptr) {
      std::string text(line);
      while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' ')) text.pop_back();
      if (std::any_of(text.begin(), text.end(), [](unsigned char c) { return std::isalpha(c); })) last = text;
    }
    std::fclose(f);
  }
  return last;
}

// A peer launcher (torchrun): its runs, and why the first that failed did.
// Its stderr goes to `err_path`, read back only to say why; after a failure
// it runs no more, and cohort's figures print all the same.
struct peer {
  fs::path err_path;
  std::string failure{};

  // Runs `once` unless an earlier run failed; false when this one failed.
  template <class F>
  bool run(F&& once) {
    if (!failure.empty()) return false;
    try {
      once();
      return true;
    } catch (const std::exception& e) {
      failure = e.what();
      if (const auto why = last_words(err_path); !why.empty()) failure += ": " + why;
      return false;
    }
  }
};

// MB/s of the writers alone, each with stdout on its own file.
double bare_throughput(const std::string& self, const fs::path& dir, long megabytes) {
  const auto began = clock::now();
  std::vector<pid_t> pids;
  for (int r = 0; r < ranks; ++r) {
    ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
    pids.push_back(start(writer_args(self, megabytes), (dir / fmt::format("bare-{}.log", r)).string()).pid);
  }
  for (pid_t pid : pids) require_ok("writer", finish(pid));
  const double seconds = cohort::bench::seconds_since(began);
  for (int r = 0; r < ranks; ++r) fs::remove(dir / fmt::format("bare-{}.log", r));  // as the launchers' folders are
  return mb_per_second(megabytes, seconds);
}

// The minimal pump of one pipe: 256 KiB reads, each read's whole lines to
// /dev/null behind a prefix (one writev per 1024 parts), the read whole to
// the file. Partial lines are not carried over: the console's bytes are not
// checked, only written.
void minimal_pump(int pipe, int file, int console) {
  constexpr std::size_t size = 256 * 1024;
  auto buffer = std::make_unique_for_overwrite<char[]>(size);
  const std::string prefix = "[worker0]:";
  std::vector<iovec> parts;
  for (;;) {
    const ssize_t n = ::read(pipe, buffer.get(), size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    parts.clear();
    const char* at = buffer.get();
    const char* end = at + n;
    while (const char* newline = static_cast<const char*>(std::memchr(at, '\n', static_cast<std::size_t>(end - at)))) {
      parts.push_back({const_cast<char*>(prefix.data()), prefix.size()});
      parts.push_back({const_cast<char*>(at), static_cast<std::size_t>(newline + 1 - at)});
      at = newline + 1;
    }
    for (std::size_t first = 0; first < parts.size(); first += IOV_MAX) {
      if (::writev(console, &parts[first], static_cast<int>(std::min<std::size_t>(IOV_MAX, parts.size() - first))) < 0) {
        throw std::runtime_error("minimal pump: writev to its console");
      }
    }
    if (!write_all(file, buffer.get(), static_cast<std::size_t>(n))) throw std::runtime_error("minimal pump: write to its file");
  }
}

// The floor of any pump: the pipe's bytes moved to the file inside the
// kernel (splice), nothing to the console.
void splice_pump(int pipe, int file, int) {
  for (;;) {
    const ssize_t n = ::splice(pipe, nullptr, file, nullptr, 1 << 20, SPLICE_F_MOVE);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw std::runtime_error(fmt::format("splice pump: {}", std::strerror(errno)));
    if (n == 0) break;
  }
}

// The rate of a bound's run, or why it failed.
struct pump_outcome {
  double rate = 0;
  std::string failure;
};

// The minimal follower of one log file that a writer writes itself: reads
// what the file gains (pread, 256 KiB at a time) whenever inotify says it
// was written, its whole lines behind a prefix copied into one buffer and
// written to `console` (partial lines are not carried over); once `done`
// is readable, reads the file to its end. The bound for a teeing launcher
// whose ranks write their own log files.
void minimal_follower(const std::string& path, int done, int console) {
  const int file = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  const int watch = ::inotify_init1(IN_CLOEXEC);
  struct closer {
    int a, b;
    ~closer() {
      if (a >= 0) ::close(a);
      if (b >= 0) ::close(b);
    }
  } close_both{file, watch};
  if (file < 0 || watch < 0 || ::inotify_add_watch(watch, path.c_str(), IN_MODIFY) < 0) {
    throw std::runtime_error(fmt::format("minimal follower: {}", std::strerror(errno)));
  }
  constexpr std::size_t size = 256 * 1024;
  auto buffer = std::make_unique_for_overwrite<char[]>(size);
  const std::string prefix = "[worker0]:";
  std::string lines;
  off_t at = 0;
  for (bool last = false;;) {
    for (;;) {
      const ssize_t n = ::pread(file, buffer.get(), size, at);
      if (n < 0) throw std::runtime_error(fmt::format("minimal follower: pread: {}", std::strerror(errno)));
      if (n == 0) break;
      at += n;
      lines.clear();
      const char* from = buffer.get();
      const char* end = from + n;
      while (const char* newline = static_cast<const char*>(std::memchr(from, '\n', static_cast<std::size_t>(end - from)))) {
        lines += prefix;
        lines.append(from, newline + 1);
        from = newline + 1;
      }
      if (!write_all(console, lines.data(), lines.size())) throw std::runtime_error("minimal follower: write to its console");
    }
    if (last) return;
    pollfd waits[2] = {{watch, POLLIN, 0}, {done, POLLIN, 0}};
    if (::poll(waits, 2, -1) < 0 && errno != EINTR) throw std::runtime_error("minimal follower: poll");
    if ((waits[0].revents & POLLIN) != 0) {
      char events[4096];
      [[maybe_unused]] const auto taken = ::read(watch, events, sizeof events);
    }
    last = (waits[1].revents & POLLIN) != 0;
  }
}

// MB/s of the writers with stdout on their files, each followed by a
// minimal follower, from the first start until the last writer is reaped
// and its file read to the end; or why it failed. Its writers are reaped
// and its files removed either way.
pump_outcome follower_throughput(const std::string& self, const fs::path& dir, long megabytes) {
  const int console = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  const int done = ::eventfd(0, EFD_CLOEXEC);
  const auto began = clock::now();
  std::vector<pid_t> pids;
  std::vector<std::string> failed(ranks);
  pump_outcome outcome;
  {
    std::vector<std::jthread> followers;
    // Tells the followers to read to the end and stop, before they are
    // joined, also when a writer cannot be started.
    struct end_followers {
      int done;
      ~end_followers() {
        const std::uint64_t one = 1;
        [[maybe_unused]] const auto told = ::write(done, &one, sizeof one);
      }
    } end{done};
    for (int r = 0; r < ranks; ++r) {
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      const std::string path = (dir / fmt::format("followed-{}.log", r)).string();
      pids.push_back(start(writer_args(self, megabytes), path).pid);
      followers.emplace_back([&, path, r] {
        try {
          minimal_follower(path, done, console);
        } catch (const std::exception& e) {
          failed[r] = e.what();
        }
      });
    }
    for (pid_t pid : pids) {
      const int rc = finish(pid);
      if (rc != 0 && outcome.failure.empty()) outcome.failure = fmt::format("a writer exited with {}", rc);
    }
  }
  const double seconds = cohort::bench::seconds_since(began);
  for (int r = 0; r < ranks; ++r) {
    if (!failed[r].empty()) outcome.failure = failed[r];
    fs::remove(dir / fmt::format("followed-{}.log", r));
  }
  ::close(done);
  ::close(console);
  if (outcome.failure.empty()) outcome.rate = mb_per_second(megabytes, seconds);
  return outcome;
}

// MB/s of the writers with stdout on pipes, pumped by `pump`, from
// the first start until the last writer is reaped; or why it failed. Its writers
// are reaped and its files removed either way.
pump_outcome pump_throughput(void (*pump)(int, int, int), const std::string& self, const fs::path& dir, long megabytes) {
  const int console = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  const auto began = clock::now();
  std::vector<spawned> writers;
  std::vector<int> files;
  std::vector<std::string> failed(ranks);
  for (int r = 0; r < ranks; ++r) {
    ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
    writers.push_back(start(writer_args(self, megabytes), ""));
    ::fcntl(writers.back().out, F_SETPIPE_SZ, 1024 * 1024);  // as cohort-run's pipes
    files.push_back(::open((dir / fmt::format("pumped-{}.log", r)).c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (files.back() < 0) failed[r] = fmt::format("pump: its file: {}", std::strerror(errno));
  }
  {
    std::vector<std::jthread> pumps;
    for (int r = 0; r < ranks; ++r) {
      pumps.emplace_back([&, r] {
        try {
          if (files[r] >= 0) pump(writers[r].out, files[r], console);
        } catch (const std::exception& e) {
          failed[r] = e.what();
        }
        ::close(writers[r].out);  // a writer left with bytes to write dies of SIGPIPE
      });
    }
  }
  pump_outcome outcome;
  for (const auto& w : writers) {
    const int rc = finish(w.pid);
    if (rc != 0 && outcome.failure.empty()) outcome.failure = fmt::format("a writer exited with {}", rc);
  }
  const double seconds = cohort::bench::seconds_since(began);
  for (int r = 0; r < ranks; ++r) {
    if (!failed[r].empty()) outcome.failure = failed[r];
    if (files[r] >= 0) ::close(files[r]);
    fs::remove(dir / fmt::format("pumped-{}.log", r));
  }
  ::close(console);
  if (outcome.failure.empty()) outcome.rate = mb_per_second(megabytes, seconds);
  return outcome;
}

// Each of `variants` once, in an order that changes round by round: from
// the round's own first (the round's number, modulo their count) on, the
// list's order in even rounds and the reverse in odd ones. None always
// runs first, or always right after the same other (and what that one
// leaves behind, such as writeback).
void in_rotation(int round, const std::vector<std::function<void()>>& variants) {
  const int n = static_cast<int>(variants.size());
  for (int k = 0; k < n; ++k) {
    const int step = round % 2 == 0 ? k : -k;
    variants[static_cast<std::size_t>(((round + step) % n + n) % n)]();
  }
}

// "median (min-max)" of the rounds.
std::string spread(const std::vector<double>& rounds, const char* format) {
  const auto s = cohort::bench::spread_of(rounds);
  return fmt::format("{} ({}-{})", fmt::format(fmt::runtime(format), s.median), fmt::format(fmt::runtime(format), s.min),
                     fmt::format(fmt::runtime(format), s.max));
}

// A row of MB/s, and its ratio to `bound` round by round unless null.
void print_throughput(const std::string& name, const std::vector<double>& rate, const std::vector<double>* bound) {
  fmt::print("  {:<58} {:>20} MB/s", name, spread(rate, "{:.0f}"));
  if (bound != nullptr) fmt::print("  {:>24}x", spread(cohort::bench::per_round(rate, *bound), "{:.3g}"));
  fmt::print("\n");
}

// ms from each stamped line's write to its arrival on `fd`, read until its
// end, over every line of every rank.
std::vector<double> stamp_latencies(int fd) {
  std::vector<double> ms;
  std::string pending;
  char buffer[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    const std::int64_t arrived = now_ns();
    pending.append(buffer, static_cast<std::size_t>(n));
    std::size_t at;
    while ((at = pending.find('\n')) != std::string::npos) {
      const auto stamp = pending.find("stamp ");
      if (stamp != std::string::npos && stamp < at) {
        ms.push_back(static_cast<double>(arrived - std::stoll(pending.substr(stamp + 6, at - stamp - 6))) / 1e6);
      }
      pending.erase(0, at + 1);
    }
  }
  return ms;
}

// Console latency through a launcher: its stdout read as it comes, its
// stderr on `err_path`. Throws std::runtime_error when it fails.
std::vector<double> launcher_latency(const std::vector<std::string>& launcher,
                                     const std::string& err_path = "/dev/null") {
  auto s = start(launcher, "", err_path);
  auto ms = stamp_latencies(s.out);
  ::close(s.out);
  require_ok(launcher[0], finish(s.pid));
  return ms;
}

// Console latency through the minimal pump: the same stamping ranks on
// pipes, a thread per pipe (minimal_pump, its console a pipe this process
// reads as it reads a launcher's stdout): what this machine gives any
// teeing launcher, in the same rounds. Throws std::runtime_error when a
// pump or a rank fails; however it ends, its ranks are reaped, its
// descriptors closed and its files removed.
std::vector<double> minimal_pump_latency(const std::string& self, const fs::path& dir, int lines) {
  struct round_state {
    const fs::path& dir;
    int console[2] = {-1, -1};
    std::vector<spawned> stampers{};
    std::vector<int> files{};
    std::vector<int> codes{};  // the stampers' exit codes, once reaped

    static void close_fd(int& fd) {
      if (fd >= 0) ::close(fd);
      fd = -1;
    }
    // Lets go of everything; again is a no-op.
    void end() {
      for (auto& s : stampers) {
        close_fd(s.out);
        if (s.pid > 0) codes.push_back(finish(std::exchange(s.pid, -1)));
      }
      for (std::size_t r = 0; r < files.size(); ++r) {
        close_fd(files[r]);
        std::error_code ec;
        fs::remove(dir / fmt::format("stamped-{}.log", r), ec);
      }
      close_fd(console[0]);
      close_fd(console[1]);
    }
    ~round_state() { end(); }
  } st{dir};
  if (::pipe2(st.console, O_CLOEXEC) != 0) throw std::runtime_error("pipe2");
  std::vector<std::string> failed(ranks);
  for (int r = 0; r < ranks; ++r) {
    st.stampers.push_back(start({self, "--stamp", std::to_string(lines)}, ""));
    st.files.push_back(::open((dir / fmt::format("stamped-{}.log", r)).c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (st.files.back() < 0) failed[r] = fmt::format("its file: {}", std::strerror(errno));
  }
  std::vector<double> ms;
  std::jthread reader([&] { ms = stamp_latencies(st.console[0]); });
  // Destroyed before the reader, which ends once the console's write end
  // is closed, also when a pump's thread cannot start.
  struct write_end_closer {
    int& fd;
    ~write_end_closer() { round_state::close_fd(fd); }
  } closer{st.console[1]};
  {
    std::vector<std::jthread> pumps;
    for (int r = 0; r < ranks; ++r) {
      pumps.emplace_back([&, r] {
        try {
          if (st.files[r] >= 0) minimal_pump(st.stampers[r].out, st.files[r], st.console[1]);
        } catch (const std::exception& e) {
          failed[r] = e.what();
        }
        round_state::close_fd(st.stampers[r].out);  // a rank left with lines to write dies of SIGPIPE
      });
    }
  }
  round_state::close_fd(st.console[1]);
  reader.join();
  st.end();
  for (int code : st.codes) {
    if (code != 0) throw std::runtime_error(fmt::format("a stamping rank exited with {}", code));
  }
  for (const auto& f : failed) {
    if (!f.empty()) throw std::runtime_error(f);
  }
  return ms;
}

std::optional<std::string> torch_python() {
  const char* python = std::getenv("COHORT_BENCH_PYTHON");
  const std::string chosen = python != nullptr ? python : ::access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
  if (finish(start({chosen, "-c", "import torch.distributed.run"}, "-").pid) != 0) return std::nullopt;
  return chosen;
}

// The temporary folder, removed however the run ends.
struct temp_folder {
  fs::path path;
  temp_folder() {
    std::string pattern = (fs::temp_directory_path() / "cohort-bench-logs-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      throw std::runtime_error(fmt::format("mkdtemp: {}", std::strerror(errno)));
    }
    path = pattern;
  }
  temp_folder(const temp_folder&) = delete;
  temp_folder& operator=(const temp_folder&) = delete;
  ~temp_folder() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

int run(int argc, char** argv);

}  // namespace

int main(int argc, char** argv) {
  return cohort::bench::run_reporting("log_pump", [&] { return run(argc, argv); });
}

namespace {

int run(int argc, char** argv) {
  if (argc > 3 && std::strcmp(argv[1], "--write") == 0) return write_lines(std::atol(argv[2]), std::stoul(argv[3]));
  if (argc > 2 && std::strcmp(argv[1], "--stamp") == 0) return write_stamps(std::atoi(argv[2]));
  std::vector<int> counts{256, 3, static_cast<int>(bytes_per_write)};
  const char* const usage = "log_pump [megabytes per rank = 256] [rounds = 3] [bytes per write = 1048576]";
  if (const auto rc = cohort::bench::read_counts(argc, argv, usage, counts)) return *rc;
  const long megabytes = counts[0];
  const int rounds = counts[1];
  bytes_per_write = static_cast<std::size_t>(counts[2]);
  if (bytes_per_write > (1u << 20)) {
    fmt::print(stderr, "log_pump: bytes per write are 1 to 1048576\n");
    return 2;
  }
  const std::string self = fs::canonical("/proc/self/exe").string();

  const temp_folder folder;
  const fs::path& dir = folder.path;
  const auto python = torch_python();
  const std::string wrapper = (dir / "torchrun.py").string();
  // torchrun's runs; a failed one is printed as failed, and it runs no more.
  peer torch{dir / "torchrun.err"};
  if (!python) {
    torch.failure = "torch is not importable";
  } else if (!cohort::bench::write_torchrun_wrapper(wrapper)) {
    torch.failure = fmt::format("cannot write {}", wrapper);
  }
  const auto cohort_args = [&](std::vector<std::string> flags, std::vector<std::string> worker) {
    std::vector<std::string> args{cohort_run, "-n", std::to_string(ranks), "--log-dir", (dir / "cohort").string()};
    args.insert(args.end(), flags.begin(), flags.end());
    args.push_back("--");
    args.insert(args.end(), worker.begin(), worker.end());
    return args;
  };
  const auto torch_args = [&](std::vector<std::string> flags, std::vector<std::string> worker) {
    // --standalone: a rendezvous of its own on a free port, as
    // launcher_exit's torchrun has; without it torchrun takes port 29500,
    // which another job on the machine may hold.
    std::vector<std::string> args{*python, wrapper, "--standalone", "--nproc_per_node", std::to_string(ranks),
                                  "--log_dir", (dir / "torch").string()};
    args.insert(args.end(), flags.begin(), flags.end());
    args.push_back("--no_python");
    args.insert(args.end(), worker.begin(), worker.end());
    return args;
  };
  const std::vector<std::string> writer = writer_args(self, megabytes);

  fmt::print("throughput: {} ranks x {} MB of 100-byte lines, {} bytes a write, {} rounds, median (min-max); console on "
             "/dev/null\n",
             ranks, megabytes, bytes_per_write, rounds);
  fmt::print("  {:<58} {:>25}  {:>25}\n", "", "", "vs writers on files");
  const std::vector<std::string> teed_flags{"-r", "3", "-t", "3"};
  const std::vector<std::string> piped_flags{"-r", "3", "-t", "3", "--tee-through-pipes"};
  std::vector<double> bare, followed, minimal, spliced, teed, piped, redirected, torch_teed;
  std::string follower_failure, minimal_failure, splice_failure;
  // A failed bound runs no more rounds.
  const auto bound = [&](void (*pump)(int, int, int), std::vector<double>& rates, std::string& failure) {
    if (!failure.empty()) return;
    const auto outcome = pump_throughput(pump, self, dir, megabytes);
    if (outcome.failure.empty()) rates.push_back(outcome.rate);
    else failure = outcome.failure;
  };
  const std::vector<std::function<void()>> variants{
      [&] { bare.push_back(bare_throughput(self, dir, megabytes)); },
      [&] { teed.push_back(launcher_throughput(cohort_args(teed_flags, writer), dir / "cohort", megabytes)); },
      [&] {
        if (!follower_failure.empty()) return;
        const auto outcome = follower_throughput(self, dir, megabytes);
        if (outcome.failure.empty()) followed.push_back(outcome.rate);
        else follower_failure = outcome.failure;
      },
      [&] { bound(minimal_pump, minimal, minimal_failure); },
      [&] { bound(splice_pump, spliced, splice_failure); },
      [&] { piped.push_back(launcher_throughput(cohort_args(piped_flags, writer), dir / "cohort", megabytes)); },
      [&] { redirected.push_back(launcher_throughput(cohort_args({"-r", "3"}, writer), dir / "cohort", megabytes)); },
      [&] {
        torch.run([&] {
          torch_teed.push_back(
              launcher_throughput(torch_args(teed_flags, writer), dir / "torch", megabytes, torch.err_path.string()));
        });
      },
  };
  for (int i = 0; i < rounds; ++i) in_rotation(i, variants);
  print_throughput("4 writers, stdout on files, no launcher", bare, nullptr);
  print_throughput("cohort-run -r 3 -t 3 (ranks write files, it follows them)", teed, &bare);
  if (follower_failure.empty()) {
    print_throughput("4 writers on files, a minimal follower each (the bound)", followed, &bare);
    fmt::print("  cohort-run -r 3 -t 3 moves {}x what the minimal followers do, round by round\n",
               spread(cohort::bench::per_round(teed, followed), "{:.2f}"));
  } else {
    fmt::print("  4 writers on files, a minimal follower each: failed: {}\n", follower_failure);
  }
  print_throughput("cohort-run -r 3 -t 3 --tee-through-pipes (it pumps pipes)", piped, &bare);
  if (minimal_failure.empty()) {
    print_throughput("4 writers on pipes to a minimal pump (a tee through pipes)", minimal, &bare);
    fmt::print("  cohort-run -r 3 -t 3 --tee-through-pipes moves {}x what the minimal pump does, round by round\n",
               spread(cohort::bench::per_round(piped, minimal), "{:.2f}"));
  } else {
    fmt::print("  4 writers on pipes to a minimal pump: failed: {}\n", minimal_failure);
  }
  if (splice_failure.empty()) {
    print_throughput("4 writers on pipes spliced to files, no console (any pump)", spliced, &bare);
  } else {
    fmt::print("  4 writers on pipes spliced to files: failed: {}\n", splice_failure);
  }
  print_throughput("cohort-run -r 3 (ranks write their files: no pump)", redirected, &bare);
  if (torch.failure.empty()) {
    print_throughput("torchrun -r 3 -t 3 (start to exit: includes its start)", torch_teed, &bare);
    fmt::print("  cohort-run -r 3 -t 3 moves {}x what torchrun -r 3 -t 3 does, round by round\n",
               spread(cohort::bench::per_round(teed, torch_teed), "{:.1f}"));
  } else {
    fmt::print("  torchrun -r 3 -t 3: failed: {}\n", torch.failure);
  }

  const int lines = 250;
  const std::vector<std::string> stamper{self, "--stamp", std::to_string(lines)};
  fmt::print("console latency: {} ranks x {} lines, 2 ms apart, teed (-t 3)\n", ranks, lines);
  // Each round runs cohort-run (followed, then through pipes), the
  // minimal pump and torchrun, in an order that changes from round to
  // round; torchrun's p99 is held to cohort-run's of the same round.
  std::vector<double> ours, ours_piped, floor, theirs, ours_p99, theirs_p99;
  std::string floor_failure;
  const std::vector<std::function<void()>> latency_variants{
      [&] {
        for (const bool through_pipes : {false, true}) {
          std::vector<std::string> flags{"-t", "3"};
          if (through_pipes) flags.push_back("--tee-through-pipes");
          auto ms = launcher_latency(cohort_args(flags, stamper));
          if (ms.size() != static_cast<std::size_t>(ranks * lines)) {
            throw std::runtime_error(fmt::format("cohort-run delivered {} of {} lines", ms.size(), ranks * lines));
          }
          if (!through_pipes) ours_p99.push_back(cohort::bench::percentile(ms, 99));
          auto& into = through_pipes ? ours_piped : ours;
          into.insert(into.end(), ms.begin(), ms.end());
        }
      },
      [&] {
        if (!floor_failure.empty()) return;
        try {
          auto ms = minimal_pump_latency(self, dir, lines);
          if (ms.size() != static_cast<std::size_t>(ranks * lines)) {
            floor_failure = fmt::format("it delivered {} of {} lines", ms.size(), ranks * lines);
          }
          floor.insert(floor.end(), ms.begin(), ms.end());
        } catch (const std::exception& e) {
          floor_failure = e.what();
        }
      },
      [&] {
        torch.run([&] {
          auto ms = launcher_latency(torch_args({"-t", "3"}, stamper), torch.err_path.string());
          if (ms.empty()) throw std::runtime_error("torchrun delivered no lines");
          theirs_p99.push_back(cohort::bench::percentile(ms, 99));
          theirs.insert(theirs.end(), ms.begin(), ms.end());
        });
      },
  };
  for (int i = 0; i < rounds; ++i) in_rotation(i, latency_variants);
  const auto latency_row = [](const std::string& name, const std::vector<double>& ms) {
    fmt::print("  {:<48} p50 {:>7.3f} ms  p99 {:>7.3f} ms  max {:>7.3f} ms\n", name, cohort::bench::percentile(ms, 50),
               cohort::bench::percentile(ms, 99), cohort::bench::percentile(ms, 100));
  };
  latency_row("cohort-run", ours);
  latency_row("cohort-run --tee-through-pipes", ours_piped);
  if (floor_failure.empty()) latency_row("4 ranks on pipes to the minimal pump (the floor)", floor);
  else fmt::print("  4 ranks on pipes to the minimal pump: failed: {}\n", floor_failure);
  if (torch.failure.empty()) {
    fmt::print("  {:<48} p50 {:>7.3f} ms  p99 {:>7.3f} ms  max {:>7.3f} ms  ({} lines)\n", "torchrun",
               cohort::bench::percentile(theirs, 50), cohort::bench::percentile(theirs, 99),
               cohort::bench::percentile(theirs, 100), theirs.size());
    fmt::print("  cohort-run's p99 is {}x lower, round by round\n",
               spread(cohort::bench::per_round(theirs_p99, ours_p99), "{:.0f}"));
  } else {
    fmt::print("  {:<48} failed: {}\n", "torchrun", torch.failure);
  }
  return 0;
}

}  // namespace

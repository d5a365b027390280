// Start to exit of a launcher running 8 ranks of /bin/true: cohort-run
// against torchrun --standalone (Debian's torch 1.13) in the same run, where
// /usr/bin/python3 (or $COHORT_BENCH_PYTHON) imports torch. torch 1.13's
// torchrun fails on Python 3.11 as shipped (Std.from_str iterates an
// IntFlag, which no longer yields NONE and ALL): the wrapper of torchrun.hpp mends
// that before calling torch.distributed.run.main().
//
// The two launchers' rounds are interleaved, so that drift weighs on both:
// torchrun's fewer rounds are spread evenly among cohort-run's, each beside
// one of cohort-run's, the one or the other first in alternate turns, and
// torchrun's time over cohort-run's is taken per round: its median and
// range print, worded as cohort-run being faster or taking longer. A launcher
// that fails (exits non-zero, is killed, takes over two minutes, or cannot
// start, torch missing included) runs no more rounds, and its line reads
// "failed: <why>" after the other's figures.
//
// Then cohort-run with K = 1, 8, 32 and 128 ranks against a minimal
// posix_spawn launcher, rounds interleaved, with cohort-run's peak RSS and
// the CPU each used (its own and that of the processes it reaped: its
// ranks, and cohort-run's guardian; from wait4): what of the time to exit
// is work, and what is waiting. cohort-run and the minimal launcher run from
// copies made together at the start (see `programs`).
//
//   launcher_exit [rounds]     (default 50; torchrun runs a tenth of them, at least 3;
//                               K = 32 and 128 a fifth, at least 3, and K = 1
//                               and 8 32 / K times that)
#include "arguments.hpp"
#include "stats.hpp"
#include "torchrun.hpp"

#include <fmt/format.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

extern char** environ;

namespace {

constexpr int round_limit_ms = 120'000;

// The two programs timed, each run from a copy made at the start in a
// folder of its own beside the built cohort-run, removed at the end. A
// program the linker has just written starts and ends slower than a copy
// of it, as an installed one is (meson install copies): its pages sit
// differently in the page cache. Here cohort-run's copy ran 6.5% faster at
// K = 1 than the linker's file, the minimal launcher's 1.8%. Copied
// together, both are timed alike. Where a copy cannot be made, the built
// program itself is timed, and it says so.
struct programs {
  std::string cohort_run = COHORT_BENCH_COHORT_RUN;
  std::string machine_limits = COHORT_BENCH_MACHINE_LIMITS;
  std::filesystem::path folder;

  programs() {
    // Beside the built cohort-run: where that runs, its copies run too (a
    // noexec /tmp would refuse them).
    std::string pattern = (std::filesystem::path(cohort_run).parent_path() / "launcher-copies-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      fmt::print("(the built programs are timed: no folder for their copies: {})\n", std::strerror(errno));
      return;
    }
    folder = pattern;
    const auto run = folder / std::filesystem::path(cohort_run).filename();
    const auto limits = folder / std::filesystem::path(machine_limits).filename();
    std::error_code ec;
    if (!std::filesystem::copy_file(cohort_run, run, ec) || !std::filesystem::copy_file(machine_limits, limits, ec)) {
      fmt::print("(the built programs are timed: copying them failed: {})\n", ec.message());
      return;
    }
    cohort_run = run.string();
    machine_limits = limits.string();
  }
  programs(const programs&) = delete;
  programs& operator=(const programs&) = delete;
  ~programs() {
    std::error_code ec;
    if (!folder.empty()) std::filesystem::remove_all(folder, ec);
  }
};

// The line of `text` that best says why a run failed: the last that raises
// or logs an error, else the last with a letter or digit in it.
std::string why_line(const std::string& text) {
  std::string last_error, last_words;
  std::size_t begin = 0;
  while (begin < text.size()) {
    std::size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(begin, end - begin);
    begin = end + 1;
    while (!line.empty() && (line.back() == ' ' || line.back() == ':' || line.back() == '\r')) line.pop_back();
    if (std::none_of(line.begin(), line.end(), [](unsigned char c) { return std::isalnum(c); })) continue;
    last_words = line;
    if (line[0] != ' ' && (line.find("Error") != std::string::npos || line.find("ERROR") != std::string::npos ||
                           line.find("Exception") != std::string::npos))
      last_error = line;
  }
  return last_error.empty() ? last_words : last_error;
}

// One launcher's rounds: each runs `args` with stdin and stdout on /dev/null
// and stderr kept aside, in this process's environment, timed from before
// posix_spawn to its reaping. The first failure ends its rounds and is kept
// as `failure`.
struct launcher {
  std::string label;
  std::vector<std::string> args;
  std::vector<double> samples{};
  std::vector<double> rss_mib{};  // the largest peak RSS of it and its ranks, each round
  std::vector<double> cpu_ms{};   // the CPU it and the processes it reaped used, each round
  std::string failure{};

  void round() {
    if (!failure.empty()) return;
    try {
      failure = timed_run();
    } catch (const std::exception& e) {
      failure = e.what();
    }
  }

 private:
  // Empty when the run exited 0 (and its time is kept), else why not.
  std::string timed_run() {
    char err_path[] = "/tmp/cohort-bench-stderr-XXXXXX";
    const int err = ::mkstemp(err_path);
    if (err < 0) return fmt::format("mkstemp: {}", std::strerror(errno));
    ::unlink(err_path);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    ::posix_spawn_file_actions_init(&actions);
    ::posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    ::posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    ::posix_spawn_file_actions_adddup2(&actions, err, 2);
    // A group of its own, so that a timeout kills it and what shares its group
    // (torchrun's workers); cohort-run's ranks lead groups of their own and
    // die with it by their parent-death signal.
    posix_spawnattr_t attributes;
    ::posix_spawnattr_init(&attributes);
    ::posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);

    const auto start = cohort::bench::clock::now();
    pid_t pid;
    const int error = ::posix_spawn(&pid, argv[0], &actions, &attributes, argv.data(), environ);
    ::posix_spawn_file_actions_destroy(&actions);
    ::posix_spawnattr_destroy(&attributes);
    if (error != 0) {
      ::close(err);
      return fmt::format("posix_spawn {}: {}", args[0], std::strerror(error));
    }
    const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
    pollfd ended{pidfd, POLLIN, 0};
    const bool timed_out = pidfd >= 0 && ::poll(&ended, 1, round_limit_ms) == 0;
    if (timed_out) ::kill(-pid, SIGKILL);
    int status = 0;
    rusage usage{};
    ::wait4(pid, &status, 0, &usage);
    const double seconds = cohort::bench::seconds_since(start);
    if (pidfd >= 0) ::close(pidfd);

    std::string why;
    if (timed_out)
      why = fmt::format("took over {} s", round_limit_ms / 1000);
    else if (WIFSIGNALED(status))
      why = fmt::format("killed by signal {}", WTERMSIG(status));
    else if (WEXITSTATUS(status) != 0)
      why = fmt::format("exited with {}", WEXITSTATUS(status));
    if (why.empty()) {
      samples.push_back(seconds);
      rss_mib.push_back(static_cast<double>(usage.ru_maxrss) / 1024);
      cpu_ms.push_back(cohort::bench::cpu_seconds(usage) * 1e3);
    } else {
      std::string text;
      char buffer[4096];
      ssize_t n;
      for (off_t at = 0; (n = ::pread(err, buffer, sizeof buffer, at)) > 0; at += n) text.append(buffer, n);
      if (const auto line = why_line(text); !line.empty()) why += ": " + line;
    }
    ::close(err);
    return why;
  }
};

void print_line(const launcher& l) {
  if (!l.failure.empty())
    fmt::print("  {:<64} failed: {}\n", l.label, l.failure);
  else
    fmt::print("  {:<64} {:>10.3f} ms  (median of {})\n", l.label, cohort::bench::median(l.samples) * 1e3,
               l.samples.size());
}

}  // namespace

int main(int argc, char** argv) {
  cohort::bench::line_buffered_stdout();
  std::vector<int> counts{50};
  if (const auto rc = cohort::bench::read_counts(argc, argv, "launcher_exit [rounds = 50]", counts)) return *rc;
  const int rounds = counts[0];
  const int torch_rounds = std::max(3, rounds / 10);
  const programs timed;
  const char* const cohort_run = timed.cohort_run.c_str();
  const char* const machine_limits = timed.machine_limits.c_str();

  launcher ours{"cohort-run -n 8 -- /bin/true", {cohort_run, "-n", "8", "--", "/bin/true"}};
  const char* python = std::getenv("COHORT_BENCH_PYTHON");
  if (python == nullptr) python = ::access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
  char wrapper[] = "/tmp/cohort-bench-torchrun-XXXXXX.py";
  const int wrapper_fd = ::mkstemps(wrapper, 3);
  if (wrapper_fd >= 0) ::close(wrapper_fd);
  launcher torch{"torchrun --standalone --nproc_per_node 8 --no_python /bin/true",
                 {python, wrapper, "--standalone", "--nproc_per_node", "8", "--no_python", "/bin/true"}};
  launcher importing{"", {python, "-c", "import torch.distributed.run"}};
  importing.round();
  if (!importing.failure.empty())
    torch.failure = fmt::format("torch is not importable by {} ({})", python, importing.failure);
  else if (wrapper_fd < 0 || !cohort::bench::write_torchrun_wrapper(wrapper))
    torch.failure = fmt::format("cannot write {}", wrapper);

  fmt::print("start to exit of 8 ranks of /bin/true: medians of {} rounds of cohort-run and {} of torchrun, "
             "interleaved\n",
             rounds, torch_rounds);
  // torchrun's seconds over cohort-run's of the same round, turn by turn.
  std::vector<double> torch_ratios;
  for (int round = 0, torch_done = 0; round < rounds; ++round) {
    const int torch_until = (round + 1) * torch_rounds / rounds;
    if (torch_done == torch_until) {
      ours.round();
      continue;
    }
    // torchrun's turn beside this round's run of cohort-run; where torchrun
    // has more rounds than cohort-run, its other turns of the round follow,
    // each against the same run.
    cohort::bench::in_turns(torch_done, [&] { ours.round(); }, [&] { torch.round(); });
    for (;;) {
      if (ours.failure.empty() && torch.failure.empty())
        torch_ratios.push_back(torch.samples.back() / ours.samples.back());
      if (++torch_done == torch_until) break;
      torch.round();
    }
  }
  if (wrapper_fd >= 0) std::remove(wrapper);

  print_line(ours);
  print_line(torch);
  if (ours.failure.empty() && torch.failure.empty() && !torch_ratios.empty()) {
    fmt::print("  {} (over the {} rounds torchrun ran in)\n",
               cohort::bench::faster_text(cohort::bench::spread_of(torch_ratios), "cohort-run", "torchrun/cohort-run"),
               torch_ratios.size());
  }

  // Against the machine: a minimal launcher (posix_spawn K /bin/true, then
  // wait for them) at K = 1 to 128, rounds interleaved.
  // A fifth of the rounds at K = 32 and 128, at least 3; more where a round
  // is cheap (32 / K times as many), so that the few milliseconds of a
  // small K are not judged on a handful of samples of a noisy machine.
  const int scaling_rounds = std::max(3, rounds / 5);
  const auto rounds_at = [scaling_rounds](int k) { return scaling_rounds * std::max(1, 32 / k); };
  fmt::print("start to exit of K ranks of /bin/true, cohort-run against a minimal posix_spawn launcher "
             "(machine_limits --launch K), medians of {} interleaved rounds at K = 1, {} at 8, {} at 32 and 128, "
             "each launcher first in every other round\n",
             rounds_at(1), rounds_at(8), rounds_at(32));
  fmt::print("  {:>4} {:>14} {:>14} {:>12} {:>16} {:>20} {:>22}\n", "K", "cohort-run ms", "minimal ms", "ratio",
             "cohort us/rank", "cohort-run peak RSS", "CPU ms cohort/minimal");
  // cohort-run's peak RSS at 128 ranks, or that it failed there.
  std::string rss_at_128 = "failed";
  // Both launchers' figures; a launcher that failed in any round reads
  // "failed" in each of its columns, the ratio "-", and the other's
  // figures print all the same.
  const auto row = [](int k, const launcher& cohort, const launcher& minimal, const std::vector<double>& ratios) {
    using cohort::bench::median;
    const bool ours = cohort.failure.empty(), theirs = minimal.failure.empty();
    const auto figure = [](bool ran, const char* format, double value) {
      return ran ? fmt::format(fmt::runtime(format), value) : std::string("failed");
    };
    const double ms = median(cohort.samples) * 1e3;
    const auto ratio = cohort::bench::spread_of(ratios);
    const std::string ratio_text =
        ours && theirs ? fmt::format("{:>5.2f}x ({:.2f}-{:.2f})", ratio.median, ratio.min, ratio.max) : "-";
    return fmt::format("  {:>4} {:>14} {:>14} {:>18} {:>10} {:>20} {:>14} / {}\n", k, figure(ours, "{:.2f}", ms),
                       figure(theirs, "{:.2f}", median(minimal.samples) * 1e3), ratio_text,
                       figure(ours, "{:.0f}", ms * 1e3 / k), figure(ours, "{:.1f} MiB", median(cohort.rss_mib)),
                       figure(ours, "{:.2f}", median(cohort.cpu_ms)), figure(theirs, "{:.2f}", median(minimal.cpu_ms)));
  };
  for (int k : {1, 8, 32, 128}) {
    const auto ranks = std::to_string(k);
    launcher cohort{fmt::format("cohort-run -n {} -- /bin/true", k), {cohort_run, "-n", ranks, "--", "/bin/true"}};
    launcher minimal{fmt::format("machine_limits --launch {}", k), {machine_limits, "--launch", ranks}};
    std::vector<double> ratios;
    for (int round = 0; round < rounds_at(k); ++round) {
      // Each goes first in every other round.
      const bool cohort_first = round % 2 == 0;
      (cohort_first ? cohort : minimal).round();
      (cohort_first ? minimal : cohort).round();
      if (minimal.failure.empty() && cohort.failure.empty()) {
        ratios.push_back(cohort.samples.back() / minimal.samples.back());
      }
    }
    // A failed launcher says why below the row.
    fmt::print("{}", row(k, cohort, minimal, ratios));
    if (!cohort.failure.empty()) print_line(cohort);
    if (!minimal.failure.empty()) print_line(minimal);
    if (k == 128 && cohort.failure.empty())
      rss_at_128 = fmt::format("{:.1f} MiB", cohort::bench::median(cohort.rss_mib));
  }
  // A launcher that failed in any round prints as failed: the rounds it
  // made before are not its figure.
  const std::string torch_rss = torch.failure.empty() && !torch.rss_mib.empty()
                                    ? fmt::format("{:.1f} MiB", cohort::bench::median(torch.rss_mib))
                                    : "failed";
  fmt::print("peak RSS (the largest of the launcher and its ranks): cohort-run at 128 ranks {}, torchrun at 8 ranks "
             "{}\n",
             rss_at_128, torch_rss);
}

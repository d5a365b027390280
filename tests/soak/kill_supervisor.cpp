// The supervisor's random-kill soak: a supervisor with a cohort::guardian
// starts three ranks, and is killed with SIGKILL at a random moment of their
// start or of their run, RUNS times. Each rank keeps a file_system segment
// and leaves behind each kind of process the guardian must reach: a fork
// that leaves for a session of its own and executes nothing (which makes a
// segment of its own too), a double fork's grandchild that does the same,
// and a program with an environment of its own in the rank's process group.
// The runs take turns over the start methods, a shell rank that does the
// same with programs, and ranks that supervise two such ranks each, with a
// guardian of their own. This process is a subreaper: whatever the
// supervisor leaves is handed to it, and must be gone within 20 s of the
// kill, with every segment file the run's processes made.
// Exits 1 on any process or file left.
//
//   kill_supervisor [RUNS [SEED]]     (default 30 runs)
#include <cohort/cohort.hpp>

#include "support/process_probe.hpp"

#include <asio/io_context.hpp>

#include <fmt/format.h>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

// Appends this process's pid and what it is ("rank", "child") to
// `dir`/pids in one write: the makers of the segment files a run may leave.
void note_pid(const std::string& dir, const char* what) {
  const int fd = ::open((dir + "/pids").c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return;
  const std::string line = fmt::format("{} {}\n", ::getpid(), what);
  [[maybe_unused]] const auto n = ::write(fd, line.data(), line.size());
  ::close(fd);
}

// Standard streams on /dev/null: what the rank leaves holds no pipe of the
// test harness's open.
void quiet() {
  const int null = ::open("/dev/null", O_RDWR);
  for (int fd : {0, 1, 2}) ::dup2(null, fd);
  if (null > 2) ::close(null);
}

// A forked process that leaves for a session of its own, keeps a segment,
// and sleeps, executing nothing.
[[noreturn]] void detached(const std::string& dir) {
  ::setsid();
  quiet();
  note_pid(dir, "child");
  const cohort::tensor kept = cohort::tensor::full({16}, 2.0, cohort::dtype::float32, {.shared = true});
  ::sleep(60);
  ::_exit(0);
}

void rank_main(int, std::string dir) {
  cohort::set_sharing_strategy(cohort::sharing_strategy::file_system);
  note_pid(dir, "rank");
  const cohort::tensor kept = cohort::tensor::full({16}, 1.0, cohort::dtype::float32, {.shared = true});
  std::fflush(nullptr);
  if (::fork() == 0) detached(dir);
  if (const pid_t middle = ::fork(); middle == 0) {
    if (::fork() == 0) detached(dir);
    ::_exit(0);
  } else if (middle > 0) {
    ::waitpid(middle, nullptr, 0);
  }
  char sleep_name[] = "sleep", sixty[] = "60";
  char* const argv[] = {sleep_name, sixty, nullptr};
  char* const envp[] = {nullptr};
  pid_t fresh = -1;
  ::posix_spawn(&fresh, "/bin/sleep", nullptr, nullptr, argv, envp);
  for (;;) ::pause();
}
COHORT_ENTRYPOINT(rank_main);

// A rank that supervises a group of its own, with a guardian of its own:
// two forkserver ranks that do what rank_main does.
void supervising_rank(int, std::string dir) {
  note_pid(dir, "rank");
  cohort::guardian guard;
  cohort::group_spec spec;
  spec.nprocs = 2;
  spec.entry = cohort::call(cohort::start_method::forkserver, rank_main, dir);
  asio::io_context io;
  cohort::group g = cohort::start_processes(io.get_executor(), spec);
  io.run_for(60s);
}
COHORT_ENTRYPOINT(supervising_rank);

// The shell rank's script ($0: the run's folder).
constexpr const char* shell_rank =
    "echo $$ rank >> \"$0/pids\"; setsid sleep 60 < /dev/null > /dev/null 2>&1 & "
    "( setsid sleep 60 < /dev/null > /dev/null 2>&1 & ) ; env -i /bin/sleep 60 & wait";

// The kinds of run, taken in turn: fork, forkserver and spawn ranks running
// rank_main, shell ranks, and fork ranks that supervise a group of their own.
constexpr int kinds = 5;

// Forks the supervisor: a guardian, then the group of run `run`, run for a
// minute at most.
pid_t start_supervisor(int run, const fs::path& dir) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  cohort::set_sharing_strategy(cohort::sharing_strategy::file_system);
  cohort::guardian guard;
  cohort::group_spec spec;
  spec.nprocs = 3;
  switch (run % kinds) {
    case 0: spec.entry = cohort::call(cohort::start_method::fork, rank_main, dir.string()); break;
    case 1: spec.entry = cohort::call(cohort::start_method::forkserver, rank_main, dir.string()); break;
    case 2: spec.entry = cohort::call(cohort::start_method::spawn, rank_main, dir.string()); break;
    case 3: spec.entry = cohort::command("/bin/sh", {"-c", shell_rank, dir.string()}); break;
    default: spec.entry = cohort::call(cohort::start_method::fork, supervising_rank, dir.string()); break;
  }
  try {
    asio::io_context io;
    cohort::group g = cohort::start_processes(io.get_executor(), spec);
    io.run_for(60s);
  } catch (...) {
  }
  ::_exit(1);
}

// Reaps every child that has ended, until none is left (true) or `limit`
// has passed (false).
bool all_gone_within(std::chrono::steady_clock::duration limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  for (;;) {
    while (::waitpid(-1, nullptr, WNOHANG) > 0) {
    }
    if (::waitpid(-1, nullptr, WNOHANG) < 0 && errno == ECHILD) return true;
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(5ms);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (auto rc = cohort::child_main(argc, argv)) return *rc;
  const int runs = argc > 1 ? std::atoi(argv[1]) : 30;
  const unsigned seed = argc > 2 ? static_cast<unsigned>(std::atoll(argv[2])) : std::random_device{}();
  std::mt19937 random(seed);
  fmt::print("kill_supervisor: {} runs, seed {}\n", runs, seed);
  if (::prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
    fmt::print("kill_supervisor: PR_SET_CHILD_SUBREAPER: {}\n", std::strerror(errno));
    return 1;
  }
  if (!all_gone_within(0s)) {
    fmt::print("kill_supervisor: started with children of its own\n");
    return 1;
  }
  const fs::path base = fs::temp_directory_path() / fmt::format("kill_supervisor_{}", ::getpid());
  fs::create_directories(base);
  int processes_left = 0, files_left = 0;
  for (int run = 0; run < runs; ++run) {
    const fs::path dir = base / std::to_string(run);
    fs::create_directories(dir);
    const auto delay = std::chrono::microseconds(std::uniform_int_distribution<int>(0, 60'000)(random));
    const pid_t supervisor = start_supervisor(run, dir);
    if (supervisor < 0) {
      fmt::print("kill_supervisor: fork: {}\n", std::strerror(errno));
      return 1;
    }
    std::this_thread::sleep_for(delay);
    ::kill(supervisor, SIGKILL);
    ::waitpid(supervisor, nullptr, 0);
    if (!all_gone_within(20s)) {
      for (const pid_t pid : cohort::test::children_of_self(true)) {
        fmt::print("run {} (kind {}, kill after {} us): left {} {}\n", run, run % kinds, delay.count(), pid,
                   cohort::test::command_line(pid));
        ::kill(pid, SIGKILL);
        ++processes_left;
      }
      all_gone_within(20s);
    }
    std::map<std::string, std::string> makers{{std::to_string(supervisor), "supervisor"}};
    std::ifstream pids(dir / "pids");
    for (std::string pid, what; pids >> pid >> what;) makers[pid] = what;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator("/dev/shm", ec)) {
      const std::string name = entry.path().filename().string();
      for (const auto& [maker, what] : makers) {
        if (name.starts_with("cohort_" + maker + "_")) {
          fmt::print("run {} (kind {}, kill after {} us): left /dev/shm/{} ({} bytes), made by a {}\n", run, run % kinds,
                     delay.count(), name, fs::file_size(entry.path(), ec), what);
          fs::remove(entry.path(), ec);
          ++files_left;
        }
      }
    }
    fs::remove_all(dir, ec);
  }
  std::error_code ec;
  fs::remove_all(base, ec);
  fmt::print("kill_supervisor: {} processes and {} segment files left over {} runs\n", processes_left, files_left,
             runs);
  return processes_left == 0 && files_left == 0 ? 0 : 1;
}

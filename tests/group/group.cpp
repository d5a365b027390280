#include "cohort/group.hpp"

#include "cohort/entry_point.hpp"
#include "cohort/error_file.hpp"
#include "cohort/guardian.hpp"
#include "cohort/process_error.hpp"
#include "cohort/spawn.hpp"
#include "cohort/tensor.hpp"
#include "group/descendants.hpp"
#include "group/rank_groups.hpp"
#include "os/process_identity.hpp"
#include "shm/segment.hpp"

#include "support/harness.hpp"
#include "support/process_probe.hpp"
#include "support/run_group.hpp"

#include <doctest/doctest.h>

#include <fmt/format.h>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/bind_executor.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/experimental/deferred.hpp>
#include <asio/read_until.hpp>
#include <asio/steady_timer.hpp>

#include <fcntl.h>
#include <signal.h>
#include <pthread.h>
#include <sys/file.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <iterator>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

using namespace cohort;
using namespace std::chrono_literals;
using namespace asio::experimental::awaitable_operators;
namespace fs = std::filesystem;

using test::run_group;

namespace {

group_spec ranks_of(int nprocs, std::vector<std::string> args) {
  group_spec spec;
  spec.entry = command(test::target, std::move(args));
  spec.nprocs = nprocs;
  return spec;
}

// Two shell ranks that run `traps` (with $0 `dir`, $1 the rank), note
// that they are up, and loop; started under `spec` (its entry and ranks
// set here) on `io`, which `runner` then runs. Returns once both are up.
group two_shell_ranks_up(asio::io_context& io, std::thread& runner, const fs::path& dir, const std::string& traps,
                         group_spec spec) {
  spec.entry = command("/bin/sh", {"-c", traps + "; : > \"$0/up-$1\"; while true; do sleep 0.05; done", dir.string()});
  spec.nprocs = 2;
  spec.args = {{0, {"0"}}, {1, {"1"}}};
  group g = start_processes(io.get_executor(), spec);
  runner = std::thread([&io] { io.run(); });
  const auto up = [&] { return fs::exists(dir / "up-0") && fs::exists(dir / "up-1"); };
  REQUIRE(test::within(10s, up, 5ms));
  return g;
}

// The names of the file_system segments in /dev/shm named for `maker`.
std::vector<std::string> segment_files_of(pid_t maker) {
  std::vector<std::string> found;
  const std::string prefix = "cohort_" + std::to_string(maker) + "_";
  for (const auto& e : fs::directory_iterator("/dev/shm")) {
    if (e.path().filename().string().starts_with(prefix)) found.push_back(e.path().filename().string());
  }
  return found;
}

pid_t first_line_pid(const fs::path& file) {
  std::ifstream in(file);
  pid_t pid = 0;
  in >> pid;
  return pid;
}

// The marker a process of a group of `supervisor`'s carries:
// COHORT_GROUP_<supervisor>_0=1.
std::string group_marker_of(pid_t supervisor) { return cohort::detail::group_marker_prefix(supervisor) + "0=1"; }

// Forks a process carrying the marker of a group of `supervisor`'s, as a
// rank's setsid grandchild would: sleep 30 with that marker alone in its
// environment. Its pid once its environment is the marked one (exec done:
// before, /proc shows this process's environment, and a guardian spares
// it), or -1 (a child not marked within 10 s is killed and reaped). No
// doctest macro: a forked supervisor calls it too.
pid_t fork_marked_sleeper(pid_t supervisor) {
  const std::string marker = group_marker_of(supervisor);
  const pid_t pid = ::fork();
  if (pid == 0) {
    char* argv[] = {const_cast<char*>("sleep"), const_cast<char*>("30"), nullptr};
    char* envp[] = {const_cast<char*>(marker.c_str()), nullptr};
    ::execve("/bin/sleep", argv, envp);
    ::_exit(127);
  }
  if (pid < 0) return -1;
  if (!test::within(10s, [&] { return cohort::detail::environment_holds(pid, marker); })) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    return -1;
  }
  return pid;
}

// fork_marked_sleeper, by default for this process's groups.
pid_t marked_sleeper(pid_t supervisor = ::getpid()) {
  const pid_t pid = fork_marked_sleeper(supervisor);
  REQUIRE(pid > 0);
  return pid;
}

// waitpid's status of child `pid`, or -1 when it has not ended (WNOHANG).
int exit_of(pid_t pid, int options) {
  int status = 0;
  return ::waitpid(pid, &status, options) == pid ? status : -1;
}

// A forked child that is killed and reaped when the scope ends, a failed
// REQUIRE's included, unless it was reaped before (pid set to -1).
struct child_of_test {
  pid_t pid;
  explicit child_of_test(pid_t child) : pid(child) {}
  child_of_test(const child_of_test&) = delete;
  child_of_test& operator=(const child_of_test&) = delete;
  ~child_of_test() {
    if (pid <= 0) return;
    ::kill(pid, SIGKILL);
    exit_of(pid, 0);
  }
};

// Whether child `pid` ends by SIGKILL within 10 s. Reaped either way (killed
// here when it outlives the wait).
bool killed_soon(pid_t pid) {
  int status = -1;
  if (!test::within(10s, [&] { return (status = exit_of(pid, WNOHANG)) != -1; })) {
    ::kill(pid, SIGKILL);
    exit_of(pid, 0);
    MESSAGE("process ", pid, " outlived its SIGKILL by 10 s");
    return false;
  }
  if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) return true;
  MESSAGE("process ", pid, " ended otherwise: ",
          WIFEXITED(status) ? fmt::format("exit code {}", WEXITSTATUS(status))
                            : fmt::format("signal {}", WIFSIGNALED(status) ? WTERMSIG(status) : 0));
  return false;
}

// Forks a supervisor that runs `before` (when given), starts a guardian
// and a group of `spec`, runs `after` (when given), writes the file
// `started` (when named) once the start has returned (the ranks' process
// groups are noted for the guardian then), and runs for up to a minute;
// its pid.
pid_t guarded_group(const group_spec& spec, void (*before)() = nullptr, void (*after)() = nullptr,
                    const fs::path& started = {}) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    try {
      if (before != nullptr) before();
      cohort::guardian guard;
      asio::io_context io;
      group g = start_processes(io.get_executor(), spec);
      if (after != nullptr) after();
      if (!started.empty()) std::ofstream(started).flush();
      io.run_for(60s);
    } catch (const std::exception& e) {  // never back into the test runner, a copy of this process's
      std::fprintf(stderr, "the supervisor failed: %s\n", e.what());
      ::_exit(3);
    }
    ::_exit(1);
  }
  REQUIRE(pid > 0);
  return pid;
}

// guarded_group of one shell rank running `script` ($0 is `dir`), which
// writes `dir`/started.
pid_t guarded_supervisor(const fs::path& dir, const std::string& script, void (*before)() = nullptr,
                         void (*after)() = nullptr) {
  group_spec spec;
  spec.entry = command("/bin/sh", {"-c", script, dir.string()});
  return guarded_group(spec, before, after, dir / "started");
}

// Once the rank of supervisor `pid` (guarded_supervisor) is up, sends
// SIGKILL to `target` (the supervisor, or its process group), and checks
// that the supervisor ends, and soon after it the process whose pid the
// rank wrote first in `dir/noted`.
void check_killed_with_supervisor(const fs::path& dir, pid_t pid, pid_t target, const char* noted) {
  const bool up = test::within(30s, [&] { return fs::exists(dir / "up") && fs::exists(dir / "started"); }, 5ms);
  ::kill(target, SIGKILL);
  CHECK(killed_soon(pid));
  REQUIRE(up);
  const pid_t left = first_line_pid(dir / noted);
  REQUIRE(left > 0);
  CHECK(test::within(10s, [&] { return !test::alive(left); }, 5ms));
  if (test::alive(left)) ::kill(left, SIGKILL);
}

// The exit code of forked child `pid` once it ends, within 60 s; past that
// it is killed and reaped, and the test fails.
int exit_code_of(pid_t pid) {
  int status = -1;
  if (!test::within(60s, [&] { return (status = exit_of(pid, WNOHANG)) != -1; })) {
    ::kill(pid, SIGKILL);
    exit_of(pid, 0);
    FAIL("the forked child did not end within 60 s");
  }
  REQUIRE(WIFEXITED(status));
  return WEXITSTATUS(status);
}

// For a forked child's check: 0 holds, 3 the machine leaves nothing to
// look at (said, not failed), anything else fails.
void check_forked(pid_t pid) {
  REQUIRE(pid > 0);
  const int code = exit_code_of(pid);
  if (code == 3) {
    WARN("this process's descriptor table or limit leaves the test nothing to look at");
    return;
  }
  CHECK(code == 0);
}

// The user's error directory under `tmp`, as cohort names it.
fs::path user_error_dir(const fs::path& tmp) { return tmp / ("cohort-errors-" + std::to_string(::geteuid())); }

// The names of the entries of `dir`, sorted.
std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> found;
  for (const auto& entry : fs::directory_iterator(dir)) found.push_back(entry.path().filename().string());
  std::sort(found.begin(), found.end());
  return found;
}

// This machine's boot id and this process's pid namespace, as error files'
// names begin.
std::string machine_key() {
  std::string boot = test::read_file("/proc/sys/kernel/random/boot_id").substr(0, 36);
  struct stat st{};
  REQUIRE(::stat("/proc/self/ns/pid", &st) == 0);
  return fmt::format("{}-{}-", boot, st.st_ino);
}

// What an error file of process `pid` (started at `start`) is named, with
// `key` (default: this machine's and namespace's) before them.
std::string error_file_name(pid_t pid, std::uint64_t start, const std::string& key = machine_key()) {
  return fmt::format("{}{}-{}-0-1.json", key, pid, start);
}

// A child forked by hand (no cohort start), paused until killed.
pid_t fork_paused() {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::pause();
    ::_exit(0);
  }
  return pid;
}

// The pid and start time of a process that has ended: forked, its start
// time read, then killed and reaped.
std::pair<pid_t, std::uint64_t> ended_process() {
  const pid_t pid = fork_paused();
  REQUIRE(pid > 0);
  const auto start = os::start_time_of(pid);
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  REQUIRE(start);
  REQUIRE(*start > 0);
  return {pid, *start};
}

// Runs the target program with TMPDIR set to `tmp`; its exit status and
// what it printed.
std::pair<exit_status, std::string> run_in_tmpdir_printing(const fs::path& tmp, std::vector<std::string> args) {
  asio::io_context io;
  return test::run(io, [&]() -> asio::awaitable<std::pair<exit_status, std::string>> {
    spawn_options options{.out = stdio::pipe()};
    options.env.set("TMPDIR", tmp.string());
    child c = co_await spawn(command(test::target, std::move(args)), options);
    std::string out = co_await test::read_all(c.out());
    co_return std::pair{co_await c.wait(), out};
  }());
}

exit_status run_in_tmpdir(const fs::path& tmp, std::vector<std::string> args) {
  return run_in_tmpdir_printing(tmp, std::move(args)).first;
}

// What the target's leave-error-file printed, run with TMPDIR `tmp`: the
// rank's error file, and whether it was there after the wait and after a
// forked child's exit() (1 or 0; -1 when not printed).
struct left_error_file {
  fs::path file;
  int after_wait = -1;
  int after_child = -1;
};

left_error_file leave_error_file(const fs::path& tmp) {
  const auto [status, said] = run_in_tmpdir_printing(tmp, {"leave-error-file"});
  REQUIRE(status.code() == 0);
  left_error_file left;
  std::istringstream in(said);
  std::string file;
  in >> file >> left.after_wait >> left.after_child;
  left.file = file;
  return left;
}

// Writes `pids` to `dir`/pids whole, so a reader never sees part of them.
void publish_pids(const std::string& dir, const std::vector<pid_t>& pids) {
  const fs::path file = fs::path(dir) / "pids";
  {
    std::ofstream out(file.string() + ".part");
    for (pid_t pid : pids) out << pid << ' ';
  }
  fs::rename(file.string() + ".part", file);
}

std::vector<pid_t> published_pids(const fs::path& dir) {
  std::ifstream in(dir / "pids");
  std::vector<pid_t> pids;
  for (pid_t pid; in >> pid;) pids.push_back(pid);
  return pids;
}

// Whether `pid`, a process the test started, is gone within `limit`:
// neither running nor a zombie. One still there is killed.
bool gone_within(pid_t pid, std::chrono::milliseconds limit) {
  if (test::within(limit, [&] { return ::kill(pid, 0) != 0 && errno == ESRCH; })) return true;
  ::kill(pid, SIGKILL);
  return false;
}

// Runs `spec`, whose one rank publishes pids into `dir`; with `kill_rank`,
// SIGKILLs the rank once they are there. The pids published.
std::vector<pid_t> run_publishing(const group_spec& spec, const fs::path& dir, bool kill_rank) {
  asio::io_context io;
  test::run(io, [&]() -> asio::awaitable<void> {
    group g = co_await start_processes(spec);
    asio::steady_timer tick(co_await asio::this_coro::executor);
    for (int i = 0; i < 2000 && !fs::exists(dir / "pids"); ++i) {
      tick.expires_after(1ms);
      co_await tick.async_wait(asio::use_awaitable);
    }
    if (kill_rank) ::kill(g.pids().at(0), SIGKILL);
    co_await g.wait();
  }());
  return published_pids(dir);
}

// How a run that SIGINT shut down ended.
struct interrupted_run {
  run_result result;
  std::chrono::steady_clock::duration after_sigint{};
};

// Runs one rank, `/bin/sh -c script` with `dir` as its $0, under a group
// that forwards SIGINT; once the script has written `dir`/ready, SIGINT
// reaches this process.
interrupted_run interrupt_shell_rank(const std::string& script, const fs::path& dir,
                                     std::chrono::milliseconds term_grace) {
  asio::io_context io;
  return test::run(io, [&]() -> asio::awaitable<interrupted_run> {
    group_spec spec;
    spec.entry = command("/bin/sh", {"-c", script, dir.string()});
    spec.shutdown.term_grace = term_grace;
    group g = co_await start_processes(spec);
    g.forward_signals({SIGINT}, {});
    asio::steady_timer tick(co_await asio::this_coro::executor);
    for (int i = 0; i < 10000 && !fs::exists(dir / "ready"); ++i) {
      tick.expires_after(1ms);
      co_await tick.async_wait(asio::use_awaitable);
    }
    const auto start = std::chrono::steady_clock::now();
    ::kill(::getpid(), SIGINT);
    run_result result = co_await g.wait();
    co_return interrupted_run{std::move(result), std::chrono::steady_clock::now() - start};
  }());
}

// Whether this kernel keeps /proc children lists.
bool has_children_lists() {
  return ::access(fmt::format("/proc/self/task/{}/children", ::gettid()).c_str(), R_OK) == 0;
}

// The threads of this process, from /proc.
std::size_t threads_of_self() {
  const auto tasks = fs::directory_iterator("/proc/self/task");
  return static_cast<std::size_t>(std::distance(fs::begin(tasks), fs::end(tasks)));
}

// Runs only_owned_children through a child it must see (`make_child`
// forks it, on whichever thread), a zombie of it, its reap, and a
// guardian (a child cohort started). The first answer that was wrong, or
// empty when none was; usable in a forked child, where doctest's checks
// are not. The child is killed and reaped however the checks go.
std::string only_owned_children_failure(const std::function<pid_t()>& make_child) {
  if (!test::children_of_self().empty()) return "children before the start";
  if (!cohort::detail::only_owned_children()) return "no child, yet not only owned ones";
  const pid_t raw = make_child();
  if (raw <= 0) return "fork failed";
  std::string failed;
  if (cohort::detail::only_owned_children()) failed = "a running child cohort did not start went unseen";
  ::kill(raw, SIGKILL);
  siginfo_t info{};
  const bool zombie = ::waitid(P_PID, static_cast<id_t>(raw), &info, WEXITED | WNOWAIT) == 0;
  if (failed.empty() && zombie && cohort::detail::only_owned_children()) {
    failed = "an unreaped child cohort did not start went unseen";
  }
  if (::waitpid(raw, nullptr, 0) != raw) return "waitpid failed";
  if (!zombie) return "waitid failed";
  if (failed.empty() && !cohort::detail::only_owned_children()) failed = "no child after the reap, yet not only owned ones";
  cohort::guardian guard;
  if (failed.empty() && !cohort::detail::only_owned_children()) failed = "the guardian was not counted as cohort's";
  guard.release();
  return failed;
}

}  // namespace

// Rank entries, with external linkage so that their names resolve in a
// re-executed rank.

// Starts a group of two sleeping program ranks, publishes their pids and
// waits to be killed.
void start_inner_group(int, std::string dir) {
  asio::io_context io;
  group_spec inner = ranks_of(2, {"sleep", "60"});
  group g = start_processes(io.get_executor(), inner);
  publish_pids(dir, g.pids());
  io.run();
}
COHORT_ENTRYPOINT(start_inner_group);

// Spawns a sleeping helper program, publishes its pid and dies by SIGKILL.
void spawn_helper_and_die(int, std::string dir) {
  asio::io_context io;
  child helper = spawn(io.get_executor(), command(test::target, {"sleep", "60"}));
  publish_pids(dir, {helper.pid()});
  ::raise(SIGKILL);
}
COHORT_ENTRYPOINT(spawn_helper_and_die);

// Forks a child that leaves for a session of its own and pauses; publishes
// its pid once it has, and returns.
void fork_setsid_child(int, std::string dir) {
  int ready[2];
  if (::pipe(ready) != 0) throw std::system_error(errno, std::system_category(), "pipe");
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setsid();
    const int null = ::open("/dev/null", O_RDWR);  // holds no pipe of the test's open
    for (int fd : {0, 1, 2}) ::dup2(null, fd);
    ::close(ready[0]);
    ::close(ready[1]);
    ::sleep(30);
    ::_exit(0);
  }
  ::close(ready[1]);
  char byte;
  [[maybe_unused]] auto n = ::read(ready[0], &byte, 1);
  ::close(ready[0]);
  publish_pids(dir, {pid});
}
COHORT_ENTRYPOINT(fork_setsid_child);

// Two ranks that fail on their own, one just after the other, the second
// still exiting as the shutdown the first started reaches it. Rank 0
// reports its error, waits until rank 1 has reported its own, and exits 1.
// Rank 1 waits for rank 0's report, reports its own (dated after rank 0's,
// before the shutdown) with SIGTERM blocked, and exits 1 200 ms after the
// shutdown's SIGTERM: it is reaped after the shutdown signalled.
void fail_one_after_the_other(int rank, std::string dir) {
  const fs::path folder(dir);
  const auto reported = [&](int which) { return fs::exists(folder / fmt::format("reported-{}", which)); };
  const auto report = [&](const char* message) {
    if (!record_error(error_report{message, {}, std::nullopt})) ::_exit(2);
    std::ofstream(folder / fmt::format("reported-{}", rank)).flush();
  };
  if (rank == 0) {
    report("std::runtime_error: first");
    test::within(10s, [&] { return reported(1); });
    ::_exit(1);
  }
  sigset_t term;
  ::sigemptyset(&term);
  ::sigaddset(&term, SIGTERM);
  ::pthread_sigmask(SIG_BLOCK, &term, nullptr);
  test::within(10s, [&] { return reported(0); });
  report("std::runtime_error: second");
  const timespec limit{10, 0};
  if (::sigtimedwait(&term, nullptr, &limit) != SIGTERM) ::_exit(3);
  std::this_thread::sleep_for(200ms);
  ::_exit(1);
}
COHORT_ENTRYPOINT(fail_one_after_the_other);

// For the test of a rank that ends before every rank has started: the
// first rank's pid, in memory the supervisor shares with its forked ranks,
// and the file the other ranks make on SIGTERM.
static std::atomic<pid_t>* first_rank = nullptr;
static char term_file[256] = {};

// Notes SIGTERM in term_file.
static void note_term(int) {
  const int fd = ::open(term_file, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  if (fd >= 0) ::close(fd);
}

// The ranks' hook (before their function, as they report set-up): the
// first rank to reach it goes on; the others note SIGTERM from here on (a
// shutdown may come before their function runs) and wait, 10 s at most,
// until it has ended, not yet reaped (its state Z), so that the start
// returns after. Allocates nothing.
static int let_the_first_end(void*) noexcept {
  const auto self = static_cast<pid_t>(::syscall(SYS_getpid));
  pid_t first = 0;
  if (first_rank->compare_exchange_strong(first, self)) return 0;
  ::signal(SIGTERM, note_term);
  char path[32] = "/proc/";
  char digits[16];
  int n = 0;
  for (pid_t p = first; p > 0; p /= 10) digits[n++] = static_cast<char>('0' + p % 10);
  std::size_t at = std::strlen(path);
  while (n > 0) path[at++] = digits[--n];
  std::memcpy(path + at, "/stat", 6);
  for (int i = 0; i < 10000; ++i) {
    char text[512];
    const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
    const auto got = fd >= 0 ? ::read(fd, text, sizeof text - 1) : -1;
    if (fd >= 0) ::close(fd);
    if (got > 0) {
      text[got] = '\0';
      const char* close = std::strrchr(text, ')');
      if (close != nullptr && close[1] == ' ' && close[2] == 'Z') return 0;
    }
    const timespec tick{0, 1'000'000};
    ::nanosleep(&tick, nullptr);
  }
  return 0;
}

// The first rank makes a file_system segment's file, stamped with its pid
// and start time, writes its pid and dies holding it; the others note
// SIGTERM and go on.
void end_first_or_wait(int, std::string dir) {
  if (first_rank->load() == os::this_process()) {
    const std::uint64_t start_time = os::start_time_of(os::this_process()).value_or(0);
    const shm::segment_stamp stamp{shm::segment_magic, 0x0123456789abcdefULL, shm::header_size, os::pid_namespace(),
                                   start_time, {}};
    const auto file = fmt::format("/dev/shm/cohort_{}_0123456789abcdef", os::this_process());
    std::ofstream(file).write(reinterpret_cast<const char*>(&stamp), sizeof stamp);
    std::ofstream(fs::path(dir) / "rank.tmp") << os::this_process() << "\n";
    fs::rename(fs::path(dir) / "rank.tmp", fs::path(dir) / "rank");
    ::_exit(3);
  }
  ::signal(SIGTERM, note_term);
  for (;;) ::pause();
}
COHORT_ENTRYPOINT(end_first_or_wait);

// For the tests of a supervisor killed while its ranks start: the ranks
// that have passed their set-up hook, counted in memory the supervisor
// shares with its ranks (a forked one's hook runs in the rank, a spawned
// one's in memory shared with the supervisor), and the file that lets the
// others on.
static std::atomic<int>* ranks_let_on = nullptr;
static char go_on_file[256] = {};

// The first rank through goes on at once; the others wait, in their set-up,
// for go_on_file (at most 20 s): the start has not returned until then.
static int hold_all_but_the_first(void*) noexcept {
  if (ranks_let_on->fetch_add(1) == 0) return 0;
  for (int i = 0; i < 2000 && ::access(go_on_file, F_OK) != 0; ++i) {
    const timespec tick{0, 10'000'000};
    ::nanosleep(&tick, nullptr);
  }
  return 0;
}

// Writes `pid` to `dir`/`file` (whole, by a rename), then `dir`/up, and
// waits to be ended.
[[noreturn]] void publish_up_and_wait(const std::string& dir, const char* file, pid_t pid) {
  // Written under a name of this process's own: the ranks of a group that
  // publish at once would otherwise write one file, and one rename it
  // while another had just truncated it.
  const fs::path written = fs::path(dir) / fmt::format("{}.{}.tmp", file, ::getpid());
  std::ofstream(written) << pid << "\n";
  fs::rename(written, fs::path(dir) / file);
  std::ofstream(fs::path(dir) / "up").flush();
  for (;;) ::pause();
}

// Starts a child in this rank's process group with an empty environment,
// publishes its pid in `dir`/fresh and says it is up.
void start_unmarked_child(int, std::string dir) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    char sleep_name[] = "sleep", sixty[] = "60";
    char* const argv[] = {sleep_name, sixty, nullptr};
    char* const envp[] = {nullptr};
    ::execve("/bin/sleep", argv, envp);
    ::_exit(127);
  }
  publish_up_and_wait(dir, "fresh", pid);
}
COHORT_ENTRYPOINT(start_unmarked_child);

// Forks a child that leaves for a session of its own and sleeps, executing
// nothing; writes its pid to `dir`/detached, then `dir`/up, and waits.
void fork_detached_child(int, std::string dir) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setsid();
    const int null = ::open("/dev/null", O_RDWR);  // holds no pipe of the test's open
    for (int fd : {0, 1, 2}) ::dup2(null, fd);
    ::sleep(60);
    ::_exit(0);
  }
  publish_up_and_wait(dir, "detached", pid);
}
COHORT_ENTRYPOINT(fork_detached_child);

// Forks a child that makes a file_system segment (a shared tensor it
// keeps), publishes its pid in `dir`/maker once it has, and sleeps.
void fork_segment_maker(int, std::string dir) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    set_sharing_strategy(sharing_strategy::file_system);
    const tensor kept = tensor::full({16}, 1.0, dtype::float32, {.shared = true});
    std::ofstream(fs::path(dir) / "maker.tmp") << os::this_process() << "\n";
    fs::rename(fs::path(dir) / "maker.tmp", fs::path(dir) / "maker");
    for (;;) ::pause();
  }
  ::pause();
}
COHORT_ENTRYPOINT(fork_segment_maker);

TEST_SUITE("group") {
  TEST_CASE("every rank runs, and a run where all exit 0 has no failures") {
    auto result = run_group(ranks_of(4, {"exit", "0"}));
    CHECK(result.ok());
    REQUIRE(result.statuses.size() == 4);
    for (const auto& status : result.statuses) CHECK((status && status->success()));
    CHECK(result.first_failure() == nullptr);
    CHECK(test::children_of_self().empty());
  }

  TEST_CASE("a rank whose wait fails counts as failed once, by the supervisor's error, not as raising one") {
    // Rank 0 is reaped here before the group's wait runs: that wait then
    // finds no child. Its failure shuts rank 1 down. Before, the wait's
    // error was the rank's message, and throw_first_failure threw it as a
    // process_raised_error, "rank 0 raised cohort: waiting for ...".
    auto spec = ranks_of(2, {});
    spec.args = {{0, {"exit", "0"}}, {1, {"sleep", "30"}}};
    asio::io_context io;
    group g = start_processes(io.get_executor(), spec);
    REQUIRE(g.pids().size() == 2);
    int status = -1;
    REQUIRE(::waitpid(g.pids()[0], &status, 0) == g.pids()[0]);
    REQUIRE(WIFEXITED(status));
    io.run();
    const auto result = g.result();
    REQUIRE(result);
    REQUIRE(result->failures.size() == 1);
    CHECK(result->failures[0].rank == 0);
    CHECK(result->failures[0].status.code() == 255);
    CHECK(result->failures[0].supervisor_error.find("cohort: waiting for the rank's exit: ") == 0);
    CHECK(result->failures[0].message.empty());
    REQUIRE(result->statuses.size() == 2);
    REQUIRE(result->statuses[1]);
    CHECK(result->statuses[1]->signaled());
    CHECK(result->unreaped.empty());
    std::string thrown;
    try {
      throw_first_failure(*result);
    } catch (const process_raised_error& e) {
      thrown = fmt::format("process_raised_error: {}", e.what());
    } catch (const process_exited_error& e) {
      thrown = fmt::format("process_exited_error: {}", e.what());
    } catch (const process_error& e) {
      CHECK(e.rank() == 0);
      CHECK(e.pid() == g.pids()[0]);
      thrown = e.what();
    }
    CHECK(thrown == fmt::format("rank 0 (pid {}) failed: {}", g.pids()[0], result->failures[0].supervisor_error));
  }

  TEST_CASE("per-rank arguments and environments reach their rank") {
    auto spec = ranks_of(3, {});
    spec.args = {{0, {"exit", "10"}}, {1, {"exit", "11"}}, {2, {"exit-env", "CODE"}}};
    spec.envs = {{0, {}}, {1, {}}, {2, {{"CODE", "12"}}}};
    spec.shutdown.grace = 10s;  // the first failure must not cut the others short
    auto result = run_group(spec);
    for (int rank = 0; rank < 3; ++rank) {
      REQUIRE(result.statuses[static_cast<std::size_t>(rank)]);
      CHECK(result.statuses[static_cast<std::size_t>(rank)]->code() == 10 + rank);
    }
    CHECK(result.failures.size() == 3);
  }

  TEST_CASE("the first failure shuts the other ranks down with SIGTERM") {
    auto spec = ranks_of(4, {});
    spec.args = {{0, {"sleep", "30"}}, {1, {"exit", "3"}}, {2, {"sleep", "30"}}, {3, {"sleep", "30"}}};
    auto result = run_group(spec);
    REQUIRE(result.failures.size() == 1);
    const auto* first = result.first_failure();
    REQUIRE(first != nullptr);
    CHECK(first->rank == 1);
    CHECK(first->status.code() == 3);
    for (int rank : {0, 2, 3}) CHECK(result.statuses[static_cast<std::size_t>(rank)]->signal() == SIGTERM);
    CHECK_FALSE(result.ok());
    CHECK(test::children_of_self().empty());
  }

  TEST_CASE("a rank that left its own process group still gets the shutdown's signals, and ends") {
    auto spec = ranks_of(2, {});
    spec.args = {{0, {"leave-group", "30"}}, {1, {"exit-after", "300", "3"}}};
    spec.shutdown.term_grace = 300ms;
    spec.shutdown.kill_wait = 300ms;
    const auto start = std::chrono::steady_clock::now();
    auto result = run_group(spec);
    CHECK(std::chrono::steady_clock::now() - start < 10s);
    REQUIRE(result.first_failure() != nullptr);
    CHECK(result.first_failure()->rank == 1);
    CHECK(result.unreaped.empty());
    REQUIRE(result.statuses[0]);
    CHECK(result.statuses[0]->signal() == SIGTERM);  // once, not twice: it never got to SIGKILL
    CHECK(test::children_of_self().empty());
  }

  TEST_CASE("a rank SIGKILL leaves unreaped is reported; neither wait() nor the io_context's run() waits for it") {
    auto spec = ranks_of(1, {"traceable", "30"});
    spec.shutdown.term_grace = 200ms;
    spec.shutdown.kill_wait = 2s;
    // Teed through a pipe the rank still holds: the logs' last reads fall
    // within the same kill_wait.
    test::temp_dir logs;
    spec.logs.dir = logs.path;
    spec.logs.tee = std_streams::all;
    spec.logs.tee_through_pipes = true;
    spec.logs.console_out = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
    std::optional<cohort::guardian> guard(std::in_place);  // which notes the ranks' process groups
    asio::io_context io;
    group g = start_processes(io.get_executor(), spec);
    // Holds the rank's exit from this process past SIGKILL, for 20 s at most.
    test::exit_holder holder(g.pids()[0], 20, /*stop_at_exit=*/true);
    if (!holder.held()) {
      MESSAGE("ptrace is refused here: not checked");
      g.stop();
      io.run();
      return;
    }
    g.stop();
    const auto start = std::chrono::steady_clock::now();
    io.run();
    // term_grace, then one kill_wait for the exits, the sweep and the
    // logs together: before, each waited a kill_wait of its own (6.2 s).
    const auto took = std::chrono::steady_clock::now() - start;
    CHECK(took >= 2200ms);
    CHECK(took < 5s);  // before, 6.2 s
    ::close(spec.logs.console_out);
    const auto result = g.result();
    REQUIRE(result);
    CHECK(result->unreaped == std::vector<int>{0});
    CHECK_FALSE(result->statuses[0]);
    CHECK(result->stopped);
    // The note goes with the run: the thread that reaps the rank lets go of
    // its pid, which may then be another process's.
    CHECK_FALSE(cohort::detail::rank_group_noted(g.pids()[0]));
    guard.reset();
    holder.end();
    const auto deadline = std::chrono::steady_clock::now() + 5s;
    while (!test::children_of_self().empty() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(10ms);
    }
    CHECK(test::children_of_self().empty());  // reaped once the tracer let go
  }

  // Before, the sweep and the logs' last reads each waited a kill_wait of
  // their own for a process a tracer held at its exit.
  TEST_CASE("a descendant held past the sweep's SIGKILL keeps the run's end within one kill_wait, logs and all") {
    test::temp_dir dir, logs;
    group_spec spec;
    spec.name = "held";
    spec.nprocs = 1;
    // A child that holds the rank's stdout, then the rank's own success.
    spec.entry = command("/bin/sh", {"-c",
                                     "sleep 30 & echo $! > \"$0/pid\"; "
                                     "while [ ! -e \"$0/go\" ]; do sleep 0.01; done; exit 0",
                                     dir.path.string()});
    spec.shutdown.kill_wait = 4s;
    spec.logs.dir = logs.path;
    spec.logs.tee = std_streams::all;
    spec.logs.tee_through_pipes = true;
    spec.logs.console_out = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
    asio::io_context io;
    group g = start_processes(io.get_executor(), spec);
    pid_t child = 0;
    for (const auto until = std::chrono::steady_clock::now() + 10s;
         (child = first_line_pid(dir.path / "pid")) <= 0 && std::chrono::steady_clock::now() < until;) {
      std::this_thread::sleep_for(10ms);
    }
    REQUIRE(child > 0);
    test::exit_holder holder(child, 20, /*stop_at_exit=*/true);
    std::ofstream(dir.path / "go").flush();
    if (!holder.held()) {
      MESSAGE("ptrace is refused here: not checked");
      io.run();
      ::close(spec.logs.console_out);
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    io.run();
    const auto took = std::chrono::steady_clock::now() - start;
    ::close(spec.logs.console_out);
    CHECK(took >= 3900ms);  // it did wait for the held child
    CHECK(took < 6s);       // once: before, 8 s
    REQUIRE(g.result());
    CHECK(g.result()->statuses[0]->success());
    // Let go, it dies as this process's child (its subreaper's, as the rank
    // ended), which no run reaps any more.
    holder.end();
    CHECK(::waitpid(child, nullptr, 0) == child);
  }

  TEST_CASE("ranks that succeed early leave supervision on: a later failure still shuts the rest down") {
    auto spec = ranks_of(4, {});
    spec.args = {{0, {"exit", "0"}}, {1, {"exit-after", "200", "4"}}, {2, {"sleep", "30"}}, {3, {"exit", "0"}}};
    auto result = run_group(spec);
    CHECK(result.statuses[0]->success());
    CHECK(result.statuses[3]->success());
    CHECK(result.statuses[1]->code() == 4);
    CHECK(result.statuses[2]->signal() == SIGTERM);
    REQUIRE(result.failures.size() == 1);
    CHECK(result.failures[0].rank == 1);
    CHECK(test::children_of_self().empty());
  }

  TEST_CASE("a rank that ignores SIGTERM is SIGKILLed once the grace period is over") {
    // Rank 0 fails once rank 1 ignores SIGTERM, whenever that is on a
    // loaded machine.
    test::temp_dir dir;
    group_spec spec;
    spec.entry = command("/bin/sh", {"-c",
                                     "if [ \"$1\" = 1 ]; then trap '' TERM; : > \"$0/ignoring\"; exec sleep 60; fi; "
                                     "while [ ! -e \"$0/ignoring\" ]; do sleep 0.01; done; exit 1",
                                     dir.path.string()});
    spec.nprocs = 2;
    spec.args = {{0, {"0"}}, {1, {"1"}}};
    spec.shutdown.term_grace = 300ms;
    auto start = std::chrono::steady_clock::now();
    auto result = run_group(spec);
    CHECK(std::chrono::steady_clock::now() - start >= 300ms);  // the grace is honoured
    CHECK(result.statuses[1]->signal() == SIGKILL);
    REQUIRE(result.first_failure() != nullptr);
    CHECK(result.first_failure()->rank == 0);
  }

  // Before, the rest of a rank's process group was SIGKILLed as soon as the
  // rank itself had ended: a shell wrapper dies at SIGTERM at once, and the
  // program it ran lost its grace.
  TEST_CASE("what a rank runs in its process group keeps the SIGTERM grace after the rank has ended") {
    test::temp_dir dir;
    group_spec spec;
    // Rank 0: a shell running, in the foreground, one that cleans up for
    // 0.3 s on SIGTERM; rank 1 fails once that one is ready.
    const std::string script =
        "if [ \"$1\" = 1 ]; then while [ ! -e \"$0/ready\" ]; do sleep 0.01; done; exit 3; fi; "
        "sh -c 'trap \"sleep 0.3; echo done > \\\"$0/cleaned\\\"; exit 0\" TERM; "
        "touch \"$0/ready\"; while :; do sleep 0.05; done' \"$0\"";
    spec.entry = command("/bin/sh", {"-c", script, dir.path.string()});
    spec.nprocs = 2;
    spec.args = {{0, {"0"}}, {1, {"1"}}};
    spec.shutdown.term_grace = 30s;
    const auto result = run_group(spec);
    REQUIRE(result.first_failure() != nullptr);
    CHECK(result.first_failure()->rank == 1);
    CHECK(test::read_file(dir.path / "cleaned") == "done\n");
    CHECK(test::children_of_self().empty());
  }

  // In a pid namespace of its own, where the test sets the next pid: a
  // process that takes the pid of a rank that ended (its group empty) and
  // leads a group of its own is no part of the run. send_signal's signal
  // once marked the rank's group as the shutdown's, whose later step then
  // signalled that process.
  TEST_CASE("a shutdown signals no process group that took the id of an ended rank's") {
    const int code = test::exit_code_in_child([] {
      if (::unshare(CLONE_NEWPID | CLONE_NEWNS) != 0) return 77;
      const pid_t init = ::fork();  // the namespace's first process
      if (init == 0) {
        if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
            ::mount("proc", "/proc", "proc", 0, nullptr) != 0) {
          ::_exit(77);
        }
        // Started before the group, so that what it forks is not the
        // run's: forks a process at the pid it is given, which leads its
        // own group, and says whether a signal ended it.
        int ask[2], answer[2];
        if (::pipe(ask) != 0 || ::pipe(answer) != 0) ::_exit(6);
        const pid_t maker = ::fork();
        if (maker == 0) {
          pid_t at = 0;
          if (::read(ask[0], &at, sizeof at) != sizeof at) ::_exit(1);
          std::ofstream("/proc/sys/kernel/ns_last_pid") << at - 1;
          const pid_t other = ::fork();
          if (other == 0) {
            ::setpgid(0, 0);
            ::execl("/bin/sleep", "sleep", "20", static_cast<char*>(nullptr));
            ::_exit(127);
          }
          (void)!::write(answer[1], &other, sizeof other);
          int status = 0;
          ::waitpid(other, &status, 0);
          ::_exit(WIFSIGNALED(status) ? WTERMSIG(status) : 0);
        }
        asio::io_context io;
        group_spec spec;
        spec.entry = command("/bin/sh", {"-c", "if [ \"$0\" = 0 ]; then sleep 0.2; exit 0; fi; "
                                               "if [ \"$0\" = 1 ]; then sleep 2; exit 1; fi; exec sleep 30"});
        spec.nprocs = 3;
        spec.args = {{0, {"0"}}, {1, {"1"}}, {2, {"2"}}};
        group g = start_processes(io.get_executor(), spec);
        const pid_t first = g.pids()[0];
        std::thread runner([&io] { io.run(); });
        g.send_signal(SIGWINCH);  // ignored by each rank
        while (::kill(-first, 0) == 0 || fs::exists("/proc/" + std::to_string(first))) {
          std::this_thread::sleep_for(5ms);
        }
        pid_t other = 0;
        const bool made = ::write(ask[1], &first, sizeof first) == sizeof first &&
                          ::read(answer[0], &other, sizeof other) == sizeof other && other == first;
        (void)g.join(60s);
        runner.join();
        if (made) ::kill(other, SIGKILL);
        int status = 0;
        ::waitpid(maker, &status, 0);
        if (!made) ::_exit(77);  // the pid went to another process first
        // The SIGKILL above ended it, not the run's SIGTERM.
        ::_exit(WIFEXITED(status) && WEXITSTATUS(status) == SIGKILL ? 0 : 3);
      }
      int status = 0;
      return ::waitpid(init, &status, 0) == init && WIFEXITED(status) ? WEXITSTATUS(status) : 5;
    });
    if (code == 77) {
      MESSAGE("no pid namespace here (or the pid went to another process): not checked");
      return;
    }
    CHECK(code == 0);
  }

  // Before, the first group to end took every orphan handed to this
  // process during its run, another group's too, and killed it.
  TEST_CASE("a group's end leaves alone what another running group's ended rank left") {
    test::temp_dir dir;
    const auto left_pid = dir.path / "left";
    // B's rank 0 leaves a process in its group and exits 0, once A has
    // started (its pid is one A's run could have made); rank 1 runs on.
    group_spec b;
    b.entry = command("/bin/sh", {"-c", "if [ \"$0\" = 0 ]; then sleep 0.3; sleep 30 & echo $! > \"$1.tmp\"; "
                                        "mv \"$1.tmp\" \"$1\"; exit 0; fi; exec sleep 30"});
    b.nprocs = 2;
    b.args = {{0, {"0", left_pid.string()}}, {1, {"1", left_pid.string()}}};
    // A ends soon after B's rank 0 has left its process, however long that
    // takes on a loaded machine.
    group_spec a;
    a.entry = command("/bin/sh", {"-c",
                                  "n=0; while [ ! -e \"$0\" ] && [ $n -lt 2000 ]; do sleep 0.01; n=$((n+1)); done; "
                                  "sleep 0.2",
                                  left_pid.string()});
    a.nprocs = 1;
    asio::io_context io;
    group gb = start_processes(io.get_executor(), b);
    group ga = start_processes(io.get_executor(), a);
    std::thread runner([&io] { io.run(); });
    REQUIRE(ga.join(30s));
    CHECK(ga.result()->ok());
    REQUIRE(fs::exists(left_pid));
    const pid_t left = std::stoi(test::read_file(left_pid));
    CHECK(test::alive(left));  // B runs on: what its rank left is B's to end
    gb.stop();
    REQUIRE(gb.join(30s));
    runner.join();
    CHECK_FALSE(test::alive(left));
  }

  TEST_CASE("a grandchild that escaped with setsid is gone after the run") {
    test::temp_dir dir;
    for (int code : {0, 1}) {
      auto spec = ranks_of(1, {"setsid-grandchild", std::to_string(code)});
      spec.options.out = stdio::file(dir.path / "grandchild");
      auto result = run_group(spec);
      const pid_t grandchild = first_line_pid(dir.path / "grandchild");
      REQUIRE(grandchild > 0);
      CHECK(result.statuses[0]->code() == code);
      CHECK_FALSE(test::alive(grandchild));
      CHECK_FALSE(fs::exists("/proc/" + std::to_string(grandchild)));  // reaped by this subreaper
    }
  }

  // Before, the copy's end ended the run as one whose io_context is
  // destroyed under it: the rank's children were killed (and, but for the
  // child objects' own guard, the ranks too).
  TEST_CASE("a process forked during a run that drops its copy of it leaves the ranks and their children running") {
    std::optional<asio::io_context> io(std::in_place);
    group_spec spec;
    spec.entry = command("/bin/sh", {"-c", "sleep 30 & wait"});
    spec.nprocs = 1;
    std::optional<group> g(start_processes(io->get_executor(), spec));
    CHECK(test::exit_code_in_child([&] {
            g.reset();
            io.reset();
            return 0;
          }) == 0);
    g->stop();  // SIGTERM to the rank's process group: the shell and its sleep
    const run_result result = test::run(*io, g->wait());
    REQUIRE(result.statuses.size() == 1);
    REQUIRE(result.statuses[0]);
    CHECK(result.statuses[0]->signal() == SIGTERM);
  }

  // Before, a forked process that went on running its copy of the
  // io_context (as asio's notify_fork has it) and dropped its copy of the
  // group stopped the run there: the copy's waits for the ranks failed, and
  // its shutdown killed what the ranks had started. Nor could its join()
  // or wait() ever end.
  TEST_CASE("a process forked during a run that runs its copy of the io_context acts on nothing of the run") {
    test::temp_dir dir;
    std::optional<asio::io_context> io(std::in_place);
    group_spec spec;
    spec.entry = command("/bin/sh", {"-c", fmt::format("sleep 30 & echo $! > {}; wait", (dir.path / "sleep").string())});
    spec.nprocs = 1;
    std::optional<group> g(start_processes(io->get_executor(), spec));
    REQUIRE(test::within(10s, [&] { return first_line_pid(dir.path / "sleep") > 0; }, 5ms));
    const pid_t sleeper = first_line_pid(dir.path / "sleep");
    const int refused = test::exit_code_in_child([&] {
      io->notify_fork(asio::execution_context::fork_child);
      int code = 0;
      const auto refuses = [](auto&& call) {
        try {
          call();
        } catch (const std::logic_error& e) {
          return std::string_view(e.what()).find("a copy of it that fork() made") != std::string_view::npos;
        } catch (...) {
        }
        return false;
      };
      asio::io_context elsewhere;
      if (!refuses([&] { g->stop(); })) code |= 1;
      if (!refuses([&] { g->send_signal(SIGUSR1); })) code |= 2;
      if (!refuses([&] { (void)g->join(0ms); })) code |= 4;
      if (!refuses([&] { (void)test::run(elsewhere, g->wait()); })) code |= 8;
      g.reset();
      io->run_for(1s);  // what of the run's supervision the copy holds runs here
      return code;
    });
    CHECK(refused == 0);
    CHECK(test::alive(sleeper));
    g->stop();  // SIGTERM to the rank's process group: the shell and its sleep
    const run_result result = test::run(*io, g->wait());
    REQUIRE(result.statuses.size() == 1);
    REQUIRE(result.statuses[0]);
    CHECK(result.statuses[0]->signal() == SIGTERM);
  }

  // Before, a run's end with no descriptor left could list the children
  // handed to it (through the one it keeps aside) but not hold them, and
  // left the rank's `setsid` grandchild alive, saying so in sweep_error.
  TEST_CASE("a run's end that has no descriptor left still ends the ranks' setsid children") {
    test::temp_dir dir;
    {
      auto spec = ranks_of(1, {"setsid-grandchild", "0"});
      spec.options.out = stdio::file(dir.path / "could");
      const auto result = run_group(spec);
      CHECK(result.sweep_error.empty());
      CHECK_FALSE(test::alive(first_line_pid(dir.path / "could")));
    }
    // In a child of its own, whose descriptors run out once its rank is up.
    const pid_t runner = ::fork();
    REQUIRE(runner >= 0);
    if (runner == 0) {
      ::alarm(30);
      rlimit few{64, 64};
      ::setrlimit(RLIMIT_NOFILE, &few);
      asio::io_context io;
      auto spec = ranks_of(1, {"setsid-grandchild", "0"});
      spec.options.out = stdio::file(dir.path / "could-not");
      spec.shutdown.kill_wait = 200ms;
      group g = start_processes(io.get_executor(), spec);
      if (!test::within(10s, [&] { return first_line_pid(dir.path / "could-not") > 0; }, 5ms)) ::_exit(10);
      const pid_t grandchild = first_line_pid(dir.path / "could-not");
      std::vector<int> taken;
      for (int fd; (fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) taken.push_back(fd);
      run_result result;
      asio::co_spawn(io, [&]() -> asio::awaitable<void> { result = co_await g.wait(); }, asio::detached);
      io.run();
      for (const int fd : taken) ::close(fd);
      const bool ended = !test::alive(grandchild);  // read once there are descriptors again
      if (!ended) {
        std::fprintf(stderr, "the grandchild %d lives on\n", grandchild);
        ::kill(grandchild, SIGKILL);
      }
      if (!result.sweep_error.empty()) std::fprintf(stderr, "sweep_error: '%s'\n", result.sweep_error.c_str());
      ::_exit(ended && result.sweep_error.empty() && result.statuses[0] && result.statuses[0]->success() ? 0 : 1);
    }
    int status = 0;
    REQUIRE(test::within(40s, [&] { return ::waitpid(runner, &status, WNOHANG) == runner; }, 10ms));
    CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
    const pid_t left = first_line_pid(dir.path / "could-not");
    if (left > 0) ::kill(left, SIGKILL);
  }

  TEST_CASE("a grandchild that escaped with setsid is gone after the run, also beside a child cohort started") {
    // The run's end skips its look when every child left is one cohort
    // started (here a guardian); the grandchild handed over is not one.
    test::temp_dir dir;
    cohort::guardian guard;
    auto spec = ranks_of(1, {"setsid-grandchild", "0"});
    spec.options.out = stdio::file(dir.path / "grandchild");
    auto result = run_group(spec);
    const pid_t grandchild = first_line_pid(dir.path / "grandchild");
    REQUIRE(grandchild > 0);
    CHECK(result.statuses[0]->success());
    CHECK_FALSE(test::alive(grandchild));
    CHECK_FALSE(fs::exists("/proc/" + std::to_string(grandchild)));  // reaped by this subreaper
    guard.release();
  }

  TEST_CASE("only the children cohort started: not while one it did not start runs or lies unreaped") {
    if (!has_children_lists()) {
      MESSAGE("this kernel keeps no /proc children lists: the check always answers false, not checked");
      CHECK_FALSE(cohort::detail::only_owned_children());
      return;
    }
    // In a forked child, whose only thread lists its children once.
    const pid_t single = ::fork();
    if (single == 0) {
      const bool one_thread = threads_of_self() == 1;
      const std::string failed = only_owned_children_failure([] { return fork_paused(); });
      if (!failed.empty()) std::fprintf(stderr, "%s\n", failed.c_str());
      ::_exit(!one_thread ? 2 : failed.empty() ? 0 : 1);
    }
    REQUIRE(single > 0);
    int status = 0;
    REQUIRE(::waitpid(single, &status, 0) == single);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);

    // With a second thread, whose children are on its own list: it forks
    // the child cohort did not start when asked, and lives until the checks
    // are done.
    std::promise<void> asked, done;
    std::promise<pid_t> forked;
    std::thread other([&] {
      asked.get_future().wait();
      forked.set_value(fork_paused());
      done.get_future().wait();
    });
    CHECK(threads_of_self() >= 2);
    const std::string failed = only_owned_children_failure([&] {
      asked.set_value();
      return forked.get_future().get();
    });
    done.set_value();
    other.join();
    CHECK_MESSAGE(failed.empty(), failed);
  }

  TEST_CASE("a rank killed while its own group runs leaves no inner rank behind, not even a zombie") {
    for (auto method : {start_method::spawn, start_method::fork, start_method::forkserver}) {
      INFO(std::string(to_string(method)));
      test::temp_dir dir;
      group_spec spec;
      spec.entry = call(method, start_inner_group, dir.path.string());
      const auto inner = run_publishing(spec, dir.path, true);
      REQUIRE(inner.size() == 2);
      for (pid_t pid : inner) CHECK(gone_within(pid, 500ms));
    }
  }

  TEST_CASE("a rank killed by a signal leaves no helper it spawned behind, not even a zombie") {
    for (auto method : {start_method::spawn, start_method::fork, start_method::forkserver}) {
      INFO(std::string(to_string(method)));
      test::temp_dir dir;
      group_spec spec;
      spec.entry = call(method, spawn_helper_and_die, dir.path.string());
      const auto helpers = run_publishing(spec, dir.path, false);
      REQUIRE(helpers.size() == 1);
      CHECK(gone_within(helpers[0], 500ms));
    }
  }

  // Before, what a running rank left behind was reaped only as a rank
  // ended: its orphans stayed zombies of this process meanwhile.
  TEST_CASE("orphans a running rank leaves are reaped as they die, while the rank still runs") {
    test::temp_dir dir;
    asio::io_context io;
    std::thread runner;
    group_spec spec;
    spec.entry = command("/bin/sh", {"-c",
                                     "for i in 1 2 3; do /bin/sh -c '/bin/sleep 0.1 & echo $! >> \"$0/orphans\"' \"$0\"; "
                                     "done; : > \"$0/up\"; exec /bin/sleep 30",
                                     dir.path.string()});
    spec.nprocs = 1;
    group g = start_processes(io.get_executor(), spec);
    runner = std::thread([&io] { io.run(); });
    REQUIRE(test::within(10s, [&] { return fs::exists(dir.path / "up"); }, 5ms));
    std::vector<pid_t> orphans;
    std::istringstream listed(test::read_file(dir.path / "orphans"));
    for (pid_t pid; listed >> pid;) orphans.push_back(pid);
    REQUIRE(orphans.size() == 3);
    // Each is this process's once its parent shell has ended, and a zombie
    // from its end on until reaped; then it is gone.
    const auto all_gone = [&] {
      return std::all_of(orphans.begin(), orphans.end(), [](pid_t pid) { return test::state_of(pid) == '\0'; });
    };
    CHECK(test::within(10s, all_gone, 10ms));
    CHECK(test::alive(g.pids().at(0)));  // the rank still runs
    g.stop();
    runner.join();
  }

  TEST_CASE("a child of a forked rank that left for its own session is gone after the run") {
    for (auto method : {start_method::fork, start_method::forkserver}) {
      INFO(std::string(to_string(method)));
      test::temp_dir dir;
      group_spec spec;
      spec.entry = call(method, fork_setsid_child, dir.path.string());
      const auto escaped = run_publishing(spec, dir.path, false);
      REQUIRE(escaped.size() == 1);
      CHECK(gone_within(escaped[0], 500ms));
    }
  }

  TEST_CASE("with the ranks in this process's group, their marked helper ends with the run, its own child lives on") {
    // In this process's group a rank's orphan is told from a child this
    // process forked itself only by the group's marker: the helper a
    // program rank leaves running in the background carries it and is
    // ended; this process's own child, forked while the run lasts, is
    // never touched.
    test::temp_dir dir;
    group_spec spec;
    spec.entry = command("/bin/sh", {"-c", "/bin/sleep 60 & echo $! > \"$0/pids\"; exec /bin/sleep 0.2",
                                     dir.path.string()});
    spec.options.new_process_group = false;
    pid_t own = -1;
    asio::io_context io;
    const run_result result = test::run(io, [&]() -> asio::awaitable<run_result> {
      group g = co_await start_processes(spec);
      asio::steady_timer tick(co_await asio::this_coro::executor);
      for (int i = 0; i < 2000 && !fs::exists(dir.path / "pids"); ++i) {
        tick.expires_after(1ms);
        co_await tick.async_wait(asio::use_awaitable);
      }
      own = ::fork();
      if (own == 0) {
        ::pause();
        ::_exit(0);
      }
      co_return co_await g.wait();
    }());
    REQUIRE(own > 0);
    const bool own_alive = test::alive(own);
    ::kill(own, SIGKILL);
    ::waitpid(own, nullptr, 0);
    CHECK(result.ok());
    CHECK(own_alive);
    const auto helpers = published_pids(dir.path);
    REQUIRE(helpers.size() == 1);
    CHECK(gone_within(helpers[0], 500ms));
  }

  TEST_CASE("a chain of unmarked processes, each in a session of its own, is gone after the run") {
    // Each link starts the next with a fresh environment in a new session
    // and waits for it: none carries the marker or shares a rank's group
    // or session, so each is found only once its parent has died and
    // handed it to the supervisor, a link per pass of the sweep.
    test::temp_dir dir;
    constexpr int links = 30;
    {
      std::ofstream script(dir.path / "link.sh");
      script << "echo $$ >> \"$2/pids\"\n"
                "if [ \"$1\" -gt 0 ]; then\n"
                "  /usr/bin/setsid /usr/bin/env -i /bin/sh \"$2/link.sh\" $(($1 - 1)) \"$2\" &\n"
                "  wait\n"
                "else\n"
                "  : > \"$2/up\"\n"
                "  exec /bin/sleep 300\n"
                "fi\n";
    }
    for (int code : {0, 1}) {
      INFO("the rank exits " << code);
      fs::remove(dir.path / "pids");
      fs::remove(dir.path / "up");
      group_spec spec;
      spec.entry = command("/bin/sh", {"-c",
                                       "/usr/bin/setsid /usr/bin/env -i /bin/sh \"$0/link.sh\" " +
                                           std::to_string(links - 1) +
                                           " \"$0\" & while [ ! -e \"$0/up\" ]; do sleep 0.01; done; exit " +
                                           std::to_string(code),
                                       dir.path.string()});
      spec.nprocs = 1;
      const auto result = run_group(spec);
      CHECK(result.statuses[0]->code() == code);
      const auto pids = published_pids(dir.path);
      REQUIRE(pids.size() == static_cast<std::size_t>(links));
      std::vector<pid_t> left;
      for (pid_t pid : pids) {
        if (::kill(pid, 0) == 0) left.push_back(pid);
      }
      CHECK_MESSAGE(left.empty(), left.size() << " of the " << links << " links outlived the run");
      for (pid_t pid : left) gone_within(pid, 0ms);  // killed, as the run should have
      for (pid_t pid : left) ::waitpid(pid, nullptr, WNOHANG);
    }
  }

  TEST_CASE("bad rank maps and rank counts are refused before anything starts") {
    asio::io_context io;
    auto spec = ranks_of(3, {"exit", "0"});
    spec.args = {{0, {}}, {2, {}}, {5, {}}};
    CHECK_THROWS_WITH_AS(start_processes(io.get_executor(), spec),
                         "cohort::start_processes: args must name every rank 0..2; missing 1; no such rank 5",
                         std::invalid_argument);
    spec.args = {};
    spec.envs = {{0, {}}, {1, {}}};
    CHECK_THROWS_WITH_AS(start_processes(io.get_executor(), spec), doctest::Contains("envs must name every rank 0..2; missing 2"),
                         std::invalid_argument);
    spec.envs = {};
    spec.nprocs = 0;
    CHECK_THROWS_AS(start_processes(io.get_executor(), spec), std::invalid_argument);
    spec.nprocs = 3;
    // Before, a negative wait was taken as none.
    spec.shutdown.kill_wait = -1ms;
    CHECK_THROWS_WITH_AS(start_processes(io.get_executor(), spec),
                         "cohort::start_processes: shutdown.kill_wait is -1 ms; a wait is never negative",
                         std::invalid_argument);
    // Before, no wait after SIGKILL was taken, and every rank it ended was
    // reported unreaped, as one stuck in the kernel.
    spec.shutdown.kill_wait = 0ms;
    CHECK_THROWS_WITH_AS(start_processes(io.get_executor(), spec),
                         doctest::Contains("shutdown.kill_wait is 0 ms; SIGKILL takes a moment to end a process"),
                         std::invalid_argument);
    spec.shutdown.kill_wait = 1ms;
    spec.shutdown.grace = -5s;
    CHECK_THROWS_WITH_AS(start_processes(io.get_executor(), spec), doctest::Contains("shutdown.grace is -5000 ms"),
                         std::invalid_argument);
    spec.shutdown = {};
    spec.options.out = stdio::pipe();  // nothing would read it: a rank that fills it stops for good
    CHECK_THROWS_WITH_AS(start_processes(io.get_executor(), spec),
                         doctest::Contains("options.out is a pipe, which a group gives no way to read"),
                         std::invalid_argument);
    spec.options.out = stdio::inherit();
    spec.options.in = stdio::pipe();
    CHECK_THROWS_WITH_AS(start_processes(io.get_executor(), spec),
                         doctest::Contains("options.in is a pipe, which a group gives no way to write"),
                         std::invalid_argument);
    CHECK(test::children_of_self().empty());
  }

  TEST_CASE("a program rank that cannot start is named, and the others go") {
    asio::io_context io;
    auto spec = ranks_of(3, {"sleep", "30"});
    spec.args = {{0, {}}, {1, {}}, {2, {std::string(1 << 20, 'x')}}};  // over execve's limit for one argument
    spec.start_threads = 1;
    try {
      start_processes(io.get_executor(), spec);
      FAIL("no exception");
    } catch (const std::system_error& e) {
      const std::string what = e.what();
      CHECK(what.find(fmt::format("cohort: rank 2 of '{}': ", test::target)) == 0);
      CHECK(e.code().value() == E2BIG);
      CHECK(what.find(e.code().message()) == what.size() - e.code().message().size());  // said once, at the end
      CHECK(what.find(e.code().message()) == what.rfind(e.code().message()));
    }
    CHECK(test::children_of_self().empty());
  }

  TEST_CASE("a launch that fails midway kills and reaps the ranks already started") {
    asio::io_context io;
    auto spec = ranks_of(3, {"sleep", "30"});
    spec.envs = {{0, {}}, {1, {{"BAD=NAME", "x"}}}, {2, {}}};
    CHECK_THROWS_AS(start_processes(io.get_executor(), spec), std::invalid_argument);
    CHECK(test::children_of_self().empty());
  }

  TEST_CASE("ranks started by several threads at once get their own arguments and outlive those threads") {
    auto spec = ranks_of(16, {});
    for (int rank = 0; rank < 16; ++rank) spec.args[rank] = {"exit-after", "300", std::to_string(rank)};
    spec.start_threads = 4;
    spec.shutdown.grace = 10s;  // every rank ends on its own
    auto result = run_group(spec);
    for (int rank = 0; rank < 16; ++rank) {
      REQUIRE(result.statuses[static_cast<std::size_t>(rank)]);
      CHECK(result.statuses[static_cast<std::size_t>(rank)]->code() == rank);  // not a parent-death SIGKILL
    }
    CHECK(result.failures.size() == 15);
  }

  TEST_CASE("a pid window holds the processes made since it opened, not those before") {
    cohort::detail::pid_window window;
    const pid_t child = ::fork();
    if (child == 0) ::_exit(0);
    REQUIRE(child > 0);
    window.refresh();
    CHECK(window.holds(child));
    CHECK_FALSE(window.holds(::getpid()));
    CHECK_FALSE(window.holds(1));
    const auto listed = window.pids(1 << 20);
    REQUIRE(listed);
    CHECK(std::find(listed->begin(), listed->end(), child) != listed->end());
    CHECK(std::find(listed->begin(), listed->end(), ::getpid()) == listed->end());
    CHECK(std::all_of(listed->begin(), listed->end(), [&](pid_t pid) { return window.holds(pid); }));
    ::waitpid(child, nullptr, 0);
  }

  TEST_CASE("256 ranks run and are all reported") {
    const auto room = test::nofile_limit::at_least(4096);  // a pidfd each, and more on the reactor
    auto result = run_group(ranks_of(256, {"exit", "0"}));
    CHECK(result.ok());
    CHECK(result.statuses.size() == 256);
    CHECK(std::all_of(result.statuses.begin(), result.statuses.end(), [](const auto& s) { return s && s->success(); }));
  }

  TEST_CASE("a named group_spec awaited in start_processes starts every rank with its arguments") {
    asio::io_context io;
    auto result = test::run(io, []() -> asio::awaitable<run_result> {
      group_spec spec{.entry = command(test::target, {"exit-env", "CODE"}), .nprocs = 3};
      spec.envs = {{0, {{"CODE", "0"}}}, {1, {{"CODE", "0"}}}, {2, {{"CODE", "0"}}}};
      group g = co_await start_processes(spec);
      co_return co_await g.wait();
    }());
    CHECK(result.ok());
    CHECK(result.statuses.size() == 3);
  }

#if !COHORT_AWAIT_TEMPORARY_BUG
  // g++ 12 refuses this form (tests/compile_fail/group_spec_temporary.cpp).
  TEST_CASE("a group_spec temporary awaited in start_processes starts every rank") {
    asio::io_context io;
    auto result = test::run(io, []() -> asio::awaitable<run_result> {
      group g = co_await start_processes(group_spec{
          .entry = command(test::target, {"exit", "0"}), .nprocs = 4, .args = {{0, {}}, {1, {}}, {2, {}}, {3, {}}}});
      co_return co_await g.wait();
    }());
    CHECK(result.ok());
    CHECK(result.statuses.size() == 4);
  }
#endif

  TEST_CASE("stop() shuts the group down and the result says it was stopped") {
    asio::io_context io;
    auto result = test::run(io, []() -> asio::awaitable<run_result> {
      group_spec spec = ranks_of(3, {"sleep", "30"});
      group g = co_await start_processes(spec);
      CHECK(g.pids().size() == 3);
      g.stop();
      co_return co_await g.wait();
    }());
    CHECK(result.stopped);
    CHECK(result.failures.empty());
    CHECK_FALSE(result.ok());
    for (const auto& s : result.statuses) CHECK(s->signal() == SIGTERM);
  }

  TEST_CASE("a stop or a shutdown signal once every rank has exited 0 stops nothing: the run is ok") {
    bool signal = false;
    SUBCASE("stop()") {}
    SUBCASE("interrupt()") { signal = true; }
    test::temp_dir dir;
    // The ranks write more than the console's pipe holds and exit 0: the
    // run waits for the console until the request has come, and a thread
    // reads it then.
    int console[2];
    REQUIRE(::pipe2(console, O_CLOEXEC) == 0);
    const auto ended = dir.path / "ended";
    group_spec spec;
    spec.entry = command("/bin/sh", {"-c", "seq 1 100000; : > \"$0-$1\"", ended.string()});
    spec.nprocs = 2;
    spec.args = {{0, {"0"}}, {1, {"1"}}};
    spec.logs.prefix_all = true;
    spec.logs.console_out = console[1];
    std::thread reader;
    asio::io_context io;
    auto result = test::run(io, [&]() -> asio::awaitable<run_result> {
      group g = co_await start_processes(spec);
      const auto pids = g.pids();
      asio::steady_timer pause(co_await asio::this_coro::executor);
      // Both have ended and been reaped: the group has seen their exits.
      const auto exited = [&] {
        const auto reaped = [](pid_t pid) { return !fs::exists("/proc/" + std::to_string(pid)); };
        return std::all_of(pids.begin(), pids.end(), reaped);
      };
      for (int i = 0; i < 1000 && !exited(); ++i) {
        pause.expires_after(20ms);
        co_await pause.async_wait(asio::use_awaitable);
      }
      pause.expires_after(200ms);
      co_await pause.async_wait(asio::use_awaitable);
      if (signal) {
        g.interrupt(SIGINT);
      } else {
        g.stop();
      }
      reader = std::thread([&] {
        char buffer[65536];
        while (::read(console[0], buffer, sizeof buffer) > 0) {
        }
      });
      co_return co_await g.wait();
    }());
    ::close(console[1]);
    if (reader.joinable()) reader.join();
    ::close(console[0]);
    CHECK(fs::exists(ended.string() + "-0"));
    CHECK(fs::exists(ended.string() + "-1"));
    CHECK(result.ok());
    CHECK_FALSE(result.stopped);
    CHECK(result.failures.empty());
    for (const auto& s : result.statuses) CHECK(s->code() == 0);
    // The signal still ended the wait for the console: the result names it.
    if (signal) CHECK(result.signal == SIGINT);
    CHECK(result.log_errors.empty());
  }

  TEST_CASE("cancelling the coroutine that waits shuts the group down") {
    asio::io_context io;
    std::vector<pid_t> pids;
    test::run(io, [&]() -> asio::awaitable<void> {
      group_spec spec = ranks_of(2, {"sleep", "30"});
      group g = co_await start_processes(spec);
      pids = g.pids();
      asio::steady_timer timer(co_await asio::this_coro::executor, 50ms);
      auto first = co_await (g.wait() || timer.async_wait(asio::use_awaitable));
      CHECK(first.index() == 1);
      auto result = g.result();
      REQUIRE(result);  // the cancelled wait ended only after the shutdown
      CHECK(result->stopped);
    }());
    for (pid_t pid : pids) CHECK_FALSE(fs::exists("/proc/" + std::to_string(pid)));
  }

  TEST_CASE("join() waits at most its timeout, and says when the run is over") {
    asio::io_context io;
    auto work = asio::make_work_guard(io);
    std::thread runner([&] { io.run(); });
    auto spec = ranks_of(2, {"sleep", "30"});
    group g = start_processes(io.get_executor(), spec);
    CHECK_FALSE(g.join(20ms));
    CHECK_FALSE(g.result());
    g.stop();
    CHECK(g.join(10s));
    CHECK(g.result()->stopped);
    work.reset();
    runner.join();
  }

  TEST_CASE("join() with a timeout too long for the clock to add waits for the end") {
    asio::io_context io;
    auto work = asio::make_work_guard(io);
    std::thread runner([&] { io.run(); });
    auto spec = ranks_of(1, {"exit-after", "150", "0"});
    group g = start_processes(io.get_executor(), spec);
    CHECK(g.join(std::chrono::milliseconds::max()));
    REQUIRE(g.result());
    CHECK(g.result()->ok());
    // One too long to count in milliseconds, which wrapped to a negative
    // timeout before.
    auto later_spec = ranks_of(1, {"exit-after", "150", "0"});
    group later = start_processes(io.get_executor(), later_spec);
    CHECK(later.join(std::chrono::hours::max()));
    work.reset();
    runner.join();
  }

  TEST_CASE("a forwarded shutdown signal ends the run, and the result names it") {
    asio::io_context io;
    auto result = test::run(io, []() -> asio::awaitable<run_result> {
      group_spec spec = ranks_of(2, {"sleep", "30"});
      group g = co_await start_processes(spec);
      g.forward_signals({SIGTERM}, {});
      asio::steady_timer settle(co_await asio::this_coro::executor, 20ms);  // the handler is in place
      co_await settle.async_wait(asio::use_awaitable);
      ::kill(::getpid(), SIGTERM);
      co_return co_await g.wait();
    }());
    REQUIRE(result.signal);
    CHECK(*result.signal == SIGTERM);
    CHECK(result.stopped);
    for (const auto& s : result.statuses) CHECK(s->signal() == SIGTERM);
  }

  TEST_CASE("forward_signals() with no arguments shuts down on SIGHUP, and is callable inside a co_await expression") {
    asio::io_context io;
    auto result = test::run(io, []() -> asio::awaitable<run_result> {
      group_spec spec = ranks_of(2, {"sleep", "30"});
      group g = co_await start_processes(spec);
      asio::steady_timer settle(co_await asio::this_coro::executor, 20ms);  // the handler is in place
      // A braced default argument here was refused by g++ 12.
      co_await (g.forward_signals(), settle.async_wait(asio::use_awaitable));
      ::kill(::getpid(), SIGHUP);
      co_return co_await g.wait();
    }());
    REQUIRE(result.signal);
    CHECK(*result.signal == SIGHUP);
    CHECK(result.stopped);
    for (const auto& s : result.statuses) CHECK(s->signal() == SIGHUP);
  }

  TEST_CASE("after the run, the signals it caught are handled as they were before") {
    static std::atomic<int> caught{0};
    struct sigaction counting {};
    counting.sa_handler = [](int) { caught.fetch_add(1); };
    struct sigaction ignoring {};
    ignoring.sa_handler = SIG_IGN;
    struct sigaction usr1_before {}, hup_before {};
    REQUIRE(::sigaction(SIGUSR1, &counting, &usr1_before) == 0);
    REQUIRE(::sigaction(SIGHUP, &ignoring, &hup_before) == 0);
    asio::io_context io;
    auto result = test::run(io, []() -> asio::awaitable<run_result> {
      group_spec spec = ranks_of(1, {"exit-after", "50", "0"});
      group g = co_await start_processes(spec);
      g.forward_signals({SIGHUP}, {SIGUSR1});
      co_return co_await g.wait();
    }());
    CHECK(result.ok());
    ::raise(SIGUSR1);  // without the handler back, this would end the test program
    CHECK(caught.load() == 1);
    struct sigaction hup_now {};
    REQUIRE(::sigaction(SIGHUP, nullptr, &hup_now) == 0);
    CHECK((hup_now.sa_handler == SIG_IGN));  // parenthesised: doctest cannot print a function pointer
    ::sigaction(SIGUSR1, &usr1_before, nullptr);
    ::sigaction(SIGHUP, &hup_before, nullptr);
  }

  TEST_CASE("two runs that catch one signal, the first ending first, leave it handled as it was before either") {
    static std::atomic<int> caught{0};
    struct sigaction counting {};
    counting.sa_handler = [](int) { caught.fetch_add(1); };
    struct sigaction before {};
    REQUIRE(::sigaction(SIGUSR2, &counting, &before) == 0);
    asio::io_context io;
    group_spec first = ranks_of(1, {"exit-after", "100", "0"});
    group_spec second = ranks_of(1, {"exit-after", "400", "0"});
    group a = start_processes(io.get_executor(), first);
    a.forward_signals({}, {SIGUSR2});
    group b = start_processes(io.get_executor(), second);
    b.forward_signals({}, {SIGUSR2});
    io.run_for(std::chrono::seconds(30));
    REQUIRE(a.result());
    REQUIRE(b.result());
    struct sigaction now {};
    REQUIRE(::sigaction(SIGUSR2, nullptr, &now) == 0);
    CHECK((now.sa_handler == counting.sa_handler));  // parenthesised: doctest cannot print a function pointer
    ::raise(SIGUSR2);
    CHECK(caught.load() == 1);
    ::sigaction(SIGUSR2, &before, nullptr);
  }

  TEST_CASE("signals to pass on reach every rank") {
    asio::io_context io;
    auto result = test::run(io, []() -> asio::awaitable<run_result> {
      group_spec spec = ranks_of(2, {"sleep", "30"});
      group g = co_await start_processes(spec);
      g.forward_signals({SIGTERM}, {SIGUSR1});
      asio::steady_timer settle(co_await asio::this_coro::executor, 20ms);
      co_await settle.async_wait(asio::use_awaitable);
      ::kill(::getpid(), SIGUSR1);  // the ranks die of it: SIGUSR1's default action
      co_return co_await g.wait();
    }());
    CHECK_FALSE(result.signal);
    REQUIRE_FALSE(result.failures.empty());
    CHECK(result.first_failure()->status.signal() == SIGUSR1);
    for (const auto& s : result.statuses) CHECK(s->signal() == SIGUSR1);
  }

  TEST_CASE("a second shutdown signal skips the grace period") {
    test::temp_dir dir;
    asio::io_context io;
    auto start = std::chrono::steady_clock::now();
    auto result = test::run(io, [&dir]() -> asio::awaitable<run_result> {
      group_spec spec = ranks_of(1, {"ignore-term"});
      spec.options.out = stdio::file(dir.path / "out");
      spec.shutdown.term_grace = 60s;
      group g = co_await start_processes(spec);
      g.forward_signals({SIGTERM}, {});
      asio::steady_timer settle(co_await asio::this_coro::executor);
      for (int i = 0; i < 1000 && test::read_file(dir.path / "out") != "ready\n"; ++i) {  // SIGTERM is ignored by then
        settle.expires_after(10ms);
        co_await settle.async_wait(asio::use_awaitable);
      }
      ::kill(::getpid(), SIGTERM);
      settle.expires_after(300ms);  // past the 100 ms in which it would be the first passed on again
      co_await settle.async_wait(asio::use_awaitable);
      ::kill(::getpid(), SIGTERM);
      co_return co_await g.wait();
    }());
    CHECK(std::chrono::steady_clock::now() - start < 30s);  // far below the 60 s grace
    CHECK(*result.signal == SIGTERM);
    CHECK(result.statuses[0]->signal() == SIGKILL);
  }

  TEST_CASE("the first shutdown signal again at once is the same one passed on, not a second: the waits are kept") {
    // As `timeout N program` passes on a terminal's Ctrl-C, which reached
    // the program itself too.
    test::temp_dir dir;
    asio::io_context io;
    const auto start = std::chrono::steady_clock::now();
    auto result = test::run(io, [&]() -> asio::awaitable<run_result> {
      group_spec spec;
      spec.entry = command("/bin/sh", {"-c",
                                       "trap 'echo INT >> \"$0/seen\"' INT; trap 'echo TERM >> \"$0/seen\"; exit 0' TERM; "
                                       "echo > \"$0/ready\"; while true; do sleep 0.05; done",
                                       dir.path.string()});
      spec.shutdown.term_grace = 1s;
      group g = co_await start_processes(spec);
      g.forward_signals({SIGINT}, {});
      asio::steady_timer tick(co_await asio::this_coro::executor);
      for (int i = 0; i < 10000 && !fs::exists(dir.path / "ready"); ++i) {
        tick.expires_after(1ms);
        co_await tick.async_wait(asio::use_awaitable);
      }
      ::kill(::getpid(), SIGINT);
      ::kill(::getpid(), SIGINT);
      co_return co_await g.wait();
    }());
    CHECK(std::chrono::steady_clock::now() - start >= 900ms);  // SIGTERM came after term_grace
    REQUIRE(result.signal);
    CHECK(*result.signal == SIGINT);
    REQUIRE(result.statuses[0]);
    CHECK(result.statuses[0]->exited());  // by its TERM trap, not SIGKILL
    CHECK(test::read_file(dir.path / "seen") == "INT\nTERM\n");
  }

  TEST_CASE("a forwarded SIGINT reaches the ranks first, and one that handles it ends on its own") {
    test::temp_dir dir;
    auto run = interrupt_shell_rank("trap 'echo > \"$0/interrupted\"; exit 0' INT; echo > \"$0/ready\"; "
                                    "while true; do sleep 0.05; done",
                                    dir.path, 10s);
    CHECK(fs::exists(dir.path / "interrupted"));
    REQUIRE(run.result.signal);
    CHECK(*run.result.signal == SIGINT);
    CHECK(run.result.stopped);
    CHECK(run.result.failures.empty());
    REQUIRE(run.result.statuses[0]);
    CHECK(run.result.statuses[0]->exited());
    CHECK(run.result.statuses[0]->code() == 0);
    CHECK(run.after_sigint < 10s);  // it ended before any SIGTERM was due
  }

  TEST_CASE("a rank that ignores the forwarded SIGINT gets SIGTERM after term_grace") {
    test::temp_dir dir;
    auto run = interrupt_shell_rank("trap '' INT; echo > \"$0/ready\"; exec sleep 30", dir.path, 200ms);
    CHECK(*run.result.signal == SIGINT);
    CHECK(run.result.failures.empty());
    REQUIRE(run.result.statuses[0]);
    CHECK(run.result.statuses[0]->signal() == SIGTERM);
    CHECK(run.after_sigint >= 200ms);
  }

  TEST_CASE("a rank that ignores the forwarded SIGINT and SIGTERM is SIGKILLed after two term_grace waits") {
    test::temp_dir dir;
    auto run = interrupt_shell_rank("trap '' INT TERM; echo > \"$0/ready\"; exec sleep 30", dir.path, 200ms);
    CHECK(*run.result.signal == SIGINT);
    CHECK(run.result.failures.empty());
    CHECK(run.result.unreaped.empty());
    REQUIRE(run.result.statuses[0]);
    CHECK(run.result.statuses[0]->signal() == SIGKILL);
    CHECK(run.after_sigint >= 400ms);
  }

  // Before, each rank failed: a spawn or fork rank with a decode_error
  // under rank -1, a forkserver rank killed by SIGABRT with no report.
  TEST_CASE("a function_call without arguments, built by hand, is refused at the start") {
    for (auto method : {start_method::spawn, start_method::fork, start_method::forkserver}) {
      INFO(std::string(to_string(method)));
      group_spec spec;
      spec.entry = function_call{"fork_setsid_child", encoded{}, method, false};
      asio::io_context io;
      CHECK_THROWS_WITH_AS(start_processes(io.get_executor(), spec),
                           doctest::Contains("the call of 'fork_setsid_child' holds no arguments"),
                           std::invalid_argument);
    }
  }

  TEST_CASE("signals that cannot be handled are refused") {
    asio::io_context io;
    auto spec = ranks_of(1, {"exit", "0"});
    group g = start_processes(io.get_executor(), spec);
    CHECK_THROWS_AS(g.forward_signals({SIGKILL}), std::invalid_argument);
    CHECK_THROWS_AS(g.forward_signals({}, {0}), std::invalid_argument);
    // Kept by glibc for its threads: before, refused by sigaction, and the
    // error blamed asio's signal pipe.
    for (int sig = __SIGRTMIN; sig < SIGRTMIN; ++sig) {
      CAPTURE(sig);
      CHECK_THROWS_WITH_AS(g.forward_signals({SIGHUP, sig}), doctest::Contains("cannot handle"), std::invalid_argument);
      CHECK_THROWS_AS(g.interrupt(sig), std::invalid_argument);
    }
    // Each rank's exit sends SIGCHLD: taken, it would end or reach the run at every exit.
    CHECK_THROWS_AS(g.forward_signals({SIGTERM, SIGCHLD}), std::invalid_argument);
    CHECK_THROWS_AS(g.forward_signals({}, {SIGCHLD}), std::invalid_argument);
    CHECK_THROWS_AS(g.interrupt(SIGKILL), std::invalid_argument);
    CHECK_THROWS_AS(g.interrupt(SIGSTOP), std::invalid_argument);
    CHECK_THROWS_AS(g.send_signal(0), std::invalid_argument);
    CHECK_THROWS_AS(g.send_signal(NSIG), std::invalid_argument);
    io.run();
    group none;
    CHECK_THROWS_AS(none.interrupt(SIGTERM), std::logic_error);
    CHECK_THROWS_AS(none.send_signal(SIGTERM), std::logic_error);
  }

  TEST_CASE("interrupt(X) from another thread shuts the run down as a caught X would; a second one hurries it") {
    test::temp_dir dir;
    asio::io_context io;
    group_spec spec;
    spec.options.out = stdio::null();
    spec.shutdown.term_grace = 60s;
    // Rank 0 ends at SIGINT, rank 1 ignores SIGINT and SIGTERM: only the
    // second interrupt ends it before the 60 s grace.
    std::thread runner;
    group g = two_shell_ranks_up(io, runner, dir.path, "if [ $1 = 0 ]; then trap 'exit 0' INT; else trap '' INT TERM; fi",
                                 spec);
    g.interrupt(SIGINT);
    const auto rank0_gone = [&] { return !test::alive(g.pids()[0]); };
    CHECK(test::within(10s, rank0_gone, 5ms));
    CHECK_FALSE(g.join(300ms));  // rank 1 waits out the grace
    g.interrupt(SIGINT);
    CHECK(g.join(30s));
    runner.join();
    const auto result = g.result();
    REQUIRE(result);
    REQUIRE(result->signal);
    CHECK(*result->signal == SIGINT);
    CHECK(result->stopped);
    CHECK(result->failures.empty());
    CHECK(result->statuses[0]->code() == 0);
    CHECK(result->statuses[1]->signal() == SIGKILL);
  }

  TEST_CASE("send_signal reaches every live rank, the run going on") {
    test::temp_dir dir;
    asio::io_context io;
    std::thread runner;
    group g = two_shell_ranks_up(io, runner, dir.path, "trap 'echo got > \"$0/got-$1\"; exit 0' USR1", {});
    g.send_signal(SIGUSR1);
    CHECK(g.join(30s));
    runner.join();
    const auto result = g.result();
    REQUIRE(result);
    CHECK(result->ok());
    CHECK_FALSE(result->signal);
    CHECK(test::read_file(dir.path / "got-0") == "got\n");
    CHECK(test::read_file(dir.path / "got-1") == "got\n");
  }

  TEST_CASE("a rank's error file reaches the failure: message, trace and time") {
    auto spec = ranks_of(2, {});
    spec.args = {{0, {"sleep", "30"}}, {1, {"record-error", "boom"}}};
    auto result = run_group(spec);
    const auto* first = result.first_failure();
    REQUIRE(first != nullptr);
    CHECK(first->rank == 1);
    CHECK(first->status.code() == 1);
    CHECK(first->message == "std::runtime_error: boom");
    CHECK(first->trace == "frame 1\nframe 2");
  }

  TEST_CASE("an error file in the process's own directory is removed when the run ends") {
    auto spec = ranks_of(2, {});
    spec.args = {{0, {"exit", "0"}}, {1, {"record-error", "boom"}}};
    auto result = run_group(spec);
    REQUIRE(result.first_failure() != nullptr);
    CHECK(!fs::exists(result.first_failure()->error_file));
  }

  // Before, a directory at the name stayed, as only files were removed.
  TEST_CASE("a directory a rank leaves at its error file's name goes with the group, and a link in it is not followed") {
    test::temp_dir outside;
    std::ofstream(outside.path / "kept") << "not the rank's";
    group_spec spec;
    spec.entry = command("/bin/sh", {"-c",
                                     "mkdir -p \"$COHORT_ERROR_FILE/deeper\" && : > \"$COHORT_ERROR_FILE/deeper/x\" && "
                                     "ln -s \"$0\" \"$COHORT_ERROR_FILE/link\"; exit 6",
                                     outside.path.string()});
    spec.nprocs = 1;
    const auto result = run_group(spec);
    const auto* first = result.first_failure();
    REQUIRE(first != nullptr);
    CHECK(first->status.code() == 6);
    CHECK(first->message.empty());
    CHECK_FALSE(fs::exists(fs::symlink_status(first->error_file)));
    CHECK(names_in(outside.path) == std::vector<std::string>{"kept"});
  }

  TEST_CASE("an error file in the user's directory can be read after the run until the group object is destroyed") {
    auto spec = ranks_of(1, {"record-error", "boom"});
    asio::io_context io;
    std::optional<group> g;
    fs::path file;
    test::run(io, [&]() -> asio::awaitable<void> {
      g.emplace(co_await start_processes(spec));
      const run_result result = co_await g->wait();
      REQUIRE(result.first_failure() != nullptr);
      file = result.first_failure()->error_file;
    }());
    CHECK(fs::exists(file));
    g.reset();  // the run has ended: its state goes now, the io_context not run again
    CHECK_FALSE(fs::exists(file));
  }

  TEST_CASE("the first failure is the earliest by its error file's time, not the first seen") {
    auto spec = ranks_of(2, {});
    // Rank 0 failed long ago by its own account but exits 300 ms late; rank 1
    // fails now and is seen first.
    spec.args = {{0, {"record-error", "early", "1000", "300"}}, {1, {"record-error", "late"}}};
    spec.shutdown.grace = 10s;  // rank 0 ends on its own
    auto result = run_group(spec);
    REQUIRE(result.failures.size() == 2);
    CHECK(result.failures.front().rank == 1);  // seen first
    CHECK(result.first_failure()->rank == 0);
    CHECK(result.first_failure()->message == "std::runtime_error: early");
  }

  // Before, rank 1 counted only when its report was dated before every
  // failure recorded: reported just after rank 0's, it was left out as
  // though the shutdown had ended it.
  TEST_CASE("a rank that reported its failure before the shutdown's signal, reaped after it, is a failure") {
    test::temp_dir dir;
    group_spec spec;
    spec.entry = call(start_method::fork, fail_one_after_the_other, dir.path.string());
    spec.nprocs = 2;
    spec.shutdown.grace = 0s;
    spec.shutdown.term_grace = 10s;
    const auto result = run_group(spec);
    REQUIRE(result.failures.size() == 2);
    CHECK(result.failures[0].rank == 0);  // seen first
    CHECK(result.failures[1].rank == 1);
    CHECK(result.failures[1].status.code() == 1);
    CHECK(result.failures[1].message == "std::runtime_error: second");
    CHECK(result.failures[0].timestamp < result.failures[1].timestamp);
    REQUIRE(result.first_failure() != nullptr);
    CHECK(result.first_failure()->rank == 0);
    CHECK(result.first_failure()->message == "std::runtime_error: first");
  }

  TEST_CASE("error files go where error_dir says, one folder per rank") {
    test::temp_dir dir;
    auto spec = ranks_of(2, {"record-error", "kept"});
    spec.error_dir = dir.path;
    spec.shutdown.grace = 10s;
    run_group(spec);
    for (int rank : {0, 1}) {
      auto report = read_error_file(dir.path / std::to_string(rank) / "error.json");
      REQUIRE(report);
      CHECK(report->message == "std::runtime_error: kept");
    }
  }

  // Before, the unfinished reports of ranks killed while writing their
  // error files (error.json.<pid>-<n>.tmp) piled up in error_dir, one per
  // such rank and run.
  TEST_CASE("a run removes what ranks killed while writing their error files left in error_dir") {
    test::temp_dir dir;
    fs::create_directories(dir.path / "0");
    std::ofstream(dir.path / "0" / "error.json.4242-0.tmp") << "{\"mess";
    std::ofstream(dir.path / "0" / "notes.txt") << "the user's";
    auto spec = ranks_of(1, {"record-error", "kept"});
    spec.error_dir = dir.path;
    run_group(spec);
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir.path / "0")) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    CHECK(names == std::vector<std::string>{"error.json", "notes.txt"});
  }

  // Before, a second group given the first's error_dir removed its reports
  // at start, and each read the other's as its own rank's.
  TEST_CASE("an error_dir that another group of this process holds is refused, by any path to it, until that group "
            "has gone") {
    test::temp_dir dir;
    asio::io_context io;
    auto first_spec = ranks_of(1, {"sleep", "30"});
    first_spec.error_dir = dir.path;
    std::optional<group> first(start_processes(io.get_executor(), first_spec));
    auto second_spec = ranks_of(1, {"exit", "0"});
    for (const auto& same : {dir.path, dir.path / "." / "", dir.path / ".." / dir.path.filename()}) {
      CAPTURE(same);
      second_spec.error_dir = same;
      try {
        start_processes(io.get_executor(), second_spec);
        FAIL("the second group started");
      } catch (const std::invalid_argument& e) {
        CHECK(std::string(e.what()).find("is another group's of this process") != std::string::npos);
      }
    }
    // Another folder is the second group's own.
    test::temp_dir other;
    second_spec.error_dir = other.path;
    CHECK(run_group(second_spec).ok());
    first->stop();
    io.run();
    first.reset();
    second_spec.error_dir = dir.path;
    CHECK(run_group(second_spec).ok());
  }

  // Before, the path of a folder not made yet was held as written, a
  // trailing separator kept: a second group given the folder without it
  // once it was made started, and removed the first's report.
  TEST_CASE("an error_dir not made yet is held by the folder, however its path ends") {
    test::temp_dir dir;
    for (const auto& first_path : {dir.path / "fresh" / "", dir.path / "fresh" / "x" / "..", dir.path / "fresh" / "."}) {
      CAPTURE(first_path);
      fs::remove_all(dir.path / "fresh");
      asio::io_context io;
      auto first_spec = ranks_of(1, {"sleep", "30"});
      first_spec.error_dir = first_path;
      std::optional<group> first(start_processes(io.get_executor(), first_spec));
      auto second_spec = ranks_of(1, {"exit", "0"});
      for (const auto& same : {dir.path / "fresh", dir.path / "fresh" / ""}) {
        CAPTURE(same);
        second_spec.error_dir = same;
        CHECK_THROWS_WITH_AS(start_processes(io.get_executor(), second_spec),
                             doctest::Contains("is another group's of this process"), std::invalid_argument);
      }
      first->stop();
      io.run();
    }
  }

  // Before, destroying the group queued a stop() on the io_context even
  // once the run had ended, and that stop() held the run's state: with the
  // io_context not run again, the state lived on until the io_context's
  // destruction, too late to destroy its strand and timers, which were
  // leaked (about 830 bytes a group), and the error_dir stayed held.
  TEST_CASE("a group destroyed once its run has ended and been waited for lets go of its state at once") {
    test::temp_dir dir;
    asio::io_context io;
    std::unique_ptr<group> g;  // destroyed before the io_context
    group_spec spec = ranks_of(1, {"sleep", "30"});
    spec.error_dir = dir.path;
    std::atomic<bool> started{false};
    // Started by a coroutine on a strand made before the group, as a
    // service's connection would be, and stopped from another thread.
    auto waited = asio::co_spawn(
        asio::make_strand(io),
        [&]() -> asio::awaitable<run_result> {
          group started_group = co_await start_processes(spec);
          g = std::make_unique<group>(std::move(started_group));
          started = true;
          co_return co_await g->wait();
        },
        asio::use_future);
    std::thread stopper([&] {
      while (!started) std::this_thread::yield();
      g->stop();
    });
    io.run();
    stopper.join();
    CHECK(waited.get().stopped);
    g.reset();
    // Its error_dir is free again: the state has gone, and the io_context lives.
    auto second_spec = ranks_of(1, {"exit", "0"});
    second_spec.error_dir = dir.path;
    std::optional<run_result> second;
    CHECK_NOTHROW(second = run_group(second_spec));
    CHECK((second && second->ok()));
  }

  TEST_CASE("a relative error_dir reaches ranks that run elsewhere as an absolute path") {
    test::temp_dir dir, elsewhere;
    // The ranks start deeper than this process's directory: the relative
    // path would name another place from there.
    fs::path deep = elsewhere.path;
    for (auto part = fs::current_path(); part.has_relative_path(); part = part.parent_path()) deep /= "d";
    deep /= "d";
    fs::create_directories(deep);
    auto spec = ranks_of(1, {"record-error", "found"});
    spec.error_dir = fs::relative(dir.path, fs::current_path());
    REQUIRE(spec.error_dir.is_relative());
    spec.options.cwd = deep;
    const auto result = run_group(spec);
    REQUIRE(result.first_failure() != nullptr);
    CHECK(result.first_failure()->message == "std::runtime_error: found");
    CHECK(fs::exists(dir.path / "0" / "error.json"));
  }

  TEST_CASE("a rank that leaves a FIFO at its error file fails as it exited, and the run ends at once") {
    test::temp_dir dir;
    group_spec spec;
    spec.entry = command("/bin/sh", {"-c", "mkfifo \"$COHORT_ERROR_FILE\"; exit 3"});
    spec.nprocs = 1;
    spec.error_dir = dir.path;
    auto run = std::async(std::launch::async, [&] { return run_group(spec); });
    const bool at_once = run.wait_for(5s) == std::future_status::ready;
    if (!at_once) {
      // A supervisor stuck opening the FIFO: a writer's open lets it go on,
      // to an empty file.
      const int writer = ::open((dir.path / "0" / "error.json").c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
      if (writer >= 0) ::close(writer);
    }
    CHECK(at_once);
    const auto result = run.get();
    const auto* first = result.first_failure();
    REQUIRE(first != nullptr);
    CHECK(first->rank == 0);
    CHECK(first->status.code() == 3);
    CHECK(first->message.empty());
    CHECK(first->trace.empty());
  }

  TEST_CASE("a supervisor killed with SIGKILL leaves none of its ranks behind") {
    asio::io_context io;
    std::vector<pid_t> ranks;
    test::temp_dir tmp;  // the supervisor's TMPDIR: its error files go there
    fs::path stale;
    test::run(io, [&]() -> asio::awaitable<void> {
      command cmd(test::supervisor, {test::target, "3"});
      spawn_options options{.out = stdio::pipe()};
      options.env.set("TMPDIR", tmp.path.string());
      child supervisor = co_await spawn(cmd, options);
      std::string line;
      co_await asio::async_read_until(supervisor.out(), asio::dynamic_buffer(line), '\n', asio::use_awaitable);
      std::istringstream in(line);
      for (pid_t pid; in >> pid;) ranks.push_back(pid);
      const auto start = os::start_time_of(supervisor.pid());
      REQUIRE(start);
      stale = user_error_dir(tmp.path) / error_file_name(supervisor.pid(), *start);
      std::ofstream(stale) << "{}";
      supervisor.signal(SIGKILL);
      CHECK((co_await supervisor.wait()).signal() == SIGKILL);
    }());
    REQUIRE(ranks.size() == 3);
    auto deadline = std::chrono::steady_clock::now() + 10s;
    auto any_alive = [&] { return std::any_of(ranks.begin(), ranks.end(), [](pid_t p) { return test::alive(p); }); };
    while (any_alive() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
    CHECK_FALSE(any_alive());
    for (pid_t pid : ranks) {  // orphans may have come to this process, a subreaper since earlier tests
      siginfo_t info{};
      ::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG);
    }
    // An error file of the supervisor's, as one of its ranks could have
    // written, is left behind: the next process that starts a group removes it.
    REQUIRE(fs::exists(stale));
    CHECK(run_in_tmpdir(tmp.path, {"spawn-function", "fork"}).code() == 0);
    CHECK_FALSE(fs::exists(stale));
  }

  TEST_CASE("stale error files are removed; those of live processes, other namespaces and machines, other names are kept") {
    test::temp_dir tmp;
    const fs::path dir = user_error_dir(tmp.path);
    fs::create_directory(dir);
    fs::permissions(dir, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec);
    const auto [ended, ended_start] = ended_process();
    const std::uint64_t own_start = os::own_start_time();
    const std::string dead = error_file_name(ended, ended_start);
    const std::string recycled = error_file_name(::getpid(), own_start + 1);  // this pid, but another process's
    const std::string live = error_file_name(::getpid(), own_start);
    const std::string key = machine_key();
    // Another pid namespace's, and another machine's that shares this TMPDIR.
    const std::string other_namespace = error_file_name(ended, ended_start, key.substr(0, 37) + "1-");
    const std::string other_machine = error_file_name(ended, ended_start, "00000000-0000-0000-0000-000000000000" + key.substr(36));
    for (const auto& name : {dead, recycled, live, other_namespace, other_machine, std::string("notes.txt")}) {
      std::ofstream(dir / name) << "{}";
    }
    CHECK(run_in_tmpdir(tmp.path, {"spawn-function", "fork"}).code() == 0);
    auto kept = std::vector<std::string>{live, other_namespace, other_machine, "notes.txt"};
    std::sort(kept.begin(), kept.end());
    CHECK(names_in(dir) == kept);
    CHECK((fs::status(dir).permissions() & fs::perms::all) == fs::perms::owner_all);  // made private again
  }

  // Before, a directory at a stale file's name stayed for good.
  TEST_CASE("a directory an ended process's rank left at its error file's name is removed, with what it holds") {
    test::temp_dir tmp, outside;
    std::ofstream(outside.path / "kept") << "not the rank's";
    const fs::path dir = user_error_dir(tmp.path);
    fs::create_directory(dir);
    const auto [ended, ended_start] = ended_process();
    const fs::path stale = dir / error_file_name(ended, ended_start);
    fs::create_directories(stale / "deeper");
    std::ofstream(stale / "deeper" / "x") << "{}";
    fs::create_directory_symlink(outside.path, stale / "link");
    CHECK(run_in_tmpdir(tmp.path, {"spawn-function", "fork"}).code() == 0);
    CHECK(names_in(dir).empty());
    CHECK(names_in(outside.path) == std::vector<std::string>{"kept"});
  }

  TEST_CASE("a run whose ranks succeed leaves only the user's error directory, empty") {
    test::temp_dir tmp;
    CHECK(run_in_tmpdir(tmp.path, {"spawn-function", "fork"}).code() == 0);
    CHECK(names_in(tmp.path) == std::vector<std::string>{user_error_dir(tmp.path).filename().string()});
    CHECK(names_in(user_error_dir(tmp.path)).empty());
  }

  TEST_CASE("an error directory name taken by a file or a link: the process uses a directory of its own, gone at its exit") {
    test::temp_dir tmp;
    std::ofstream(tmp.path / "elsewhere") << "not a directory";
    fs::create_directory(tmp.path / "someone-elses");
    // A file; a link to a file; a link to a directory.
    const std::vector<std::pair<std::string, fs::path>> squatters = {
        {"file", {}}, {"link to a file", tmp.path / "elsewhere"}, {"link to a directory", tmp.path / "someone-elses"}};
    for (const auto& [what, target] : squatters) {
      CAPTURE(what);
      const fs::path name = user_error_dir(tmp.path);
      fs::remove(name);
      if (target.empty()) std::ofstream(name) << "taken";
      else fs::create_symlink(target, name);
      const auto left = leave_error_file(tmp.path);
      const fs::path own = left.file.parent_path();
      CHECK(own.parent_path() == tmp.path);
      CHECK(own.filename().string().starts_with(name.filename().string() + "-" + machine_key()));
      CHECK(left.after_wait == 1);
      CHECK(left.after_child == 1);
      CHECK_FALSE(fs::exists(own));  // removed at the exit, with the file
      CHECK((target.empty() ? fs::is_regular_file(fs::symlink_status(name)) : fs::is_symlink(name)));
      CHECK(names_in(tmp.path / "someone-elses").empty());
    }
  }

  TEST_CASE("with the user's directory taken, own directories of ended processes are removed; live ones kept") {
    test::temp_dir tmp;
    std::ofstream(user_error_dir(tmp.path)) << "taken";
    const auto [ended, ended_start] = ended_process();
    const std::string own = user_error_dir(tmp.path).filename().string() + "-";
    const fs::path dead = tmp.path / fmt::format("{}{}{}-{}-abcdef", own, machine_key(), ended, ended_start);
    const fs::path live = tmp.path / fmt::format("{}{}{}-{}-abcdef", own, machine_key(), ::getpid(), os::own_start_time());
    for (const auto& dir : {dead, live}) {
      fs::create_directory(dir);
      std::ofstream(dir / error_file_name(ended, ended_start)) << "{}";
    }
    CHECK(run_in_tmpdir(tmp.path, {"spawn-function", "fork"}).code() == 0);
    CHECK_FALSE(fs::exists(dead));
    CHECK(fs::exists(live));
    CHECK(names_in(tmp.path) == std::vector<std::string>{"cohort-errors-" + std::to_string(::geteuid()), live.filename().string()});
  }

  TEST_CASE("a process's error files left at its exit go then; a child it forks that calls exit() leaves them") {
    test::temp_dir tmp;
    const auto left = leave_error_file(tmp.path);
    CHECK(left.file.parent_path() == user_error_dir(tmp.path));
    CHECK(left.after_wait == 1);
    CHECK(left.after_child == 1);
    CHECK_FALSE(fs::exists(left.file));
    CHECK(names_in(user_error_dir(tmp.path)).empty());
  }

  TEST_CASE("a group's wait with a callback completes with the run's result") {
    asio::io_context io;
    const group_spec spec = ranks_of(2, {"exit", "0"});
    group g = start_processes(io.get_executor(), spec);
    std::optional<run_result> result;
    std::exception_ptr error;
    g.wait([&](std::exception_ptr e, run_result r) {
      error = e;
      result = std::move(r);
    });
    io.run();
    CHECK_FALSE(error);
    REQUIRE(result);
    CHECK(result->ok());
    CHECK(result->statuses.size() == 2);
  }

  TEST_CASE("start_processes and wait with use_future deliver the group and its result") {
    asio::io_context io;
    const test::io_thread runner(io);
    const group_spec spec = ranks_of(2, {"exit", "3"});
    group g = start_processes(io.get_executor(), spec, asio::use_future).get();
    CHECK(g.pids().size() == 2);
    run_result result = g.wait(asio::use_future).get();
    CHECK_FALSE(result.ok());
    CHECK(result.failures.size() >= 1);
    CHECK(result.failures[0].status.code() == 3);
    const group_spec bad = ranks_of(0, {"exit", "0"});
    CHECK_THROWS_AS(start_processes(io.get_executor(), bad, asio::use_future).get(), std::invalid_argument);
  }

  TEST_CASE("a deferred group wait cancelled through its slot shuts the group down and completes as aborted") {
    asio::io_context io;
    const group_spec spec = ranks_of(2, {"sleep", "30"});
    group g = start_processes(io.get_executor(), spec);
    auto pids = g.pids();
    auto wait = g.wait(asio::experimental::deferred);
    asio::cancellation_signal cancel;
    std::exception_ptr error;
    bool done = false;
    std::move(wait)(asio::bind_cancellation_slot(cancel.slot(), [&](std::exception_ptr e, run_result) {
      error = e;
      done = true;
    }));
    asio::steady_timer timer(io, 50ms);
    timer.async_wait([&](std::error_code) { cancel.emit(asio::cancellation_type::terminal); });
    io.run();
    CHECK(done);
    CHECK(test::aborted(error));
    auto result = g.result();
    REQUIRE(result);
    CHECK(result->stopped);
    for (pid_t pid : pids) CHECK_FALSE(test::alive(pid));
  }

  // Before, a partial or total cancellation emitted before the start ran
  // was lost, and the ranks started.
  TEST_CASE("a deferred start cancelled before it runs, by any type of cancellation, starts no rank and completes as "
            "aborted") {
    const asio::cancellation_type types[] = {asio::cancellation_type::terminal, asio::cancellation_type::partial,
                                             asio::cancellation_type::total};
    for (const auto type : types) {
      CAPTURE(static_cast<int>(type));
      asio::io_context io;
      const group_spec spec = ranks_of(2, {"sleep", "30"});
      auto start = start_processes(spec, asio::experimental::deferred);
      asio::cancellation_signal cancel;
      std::exception_ptr error;
      group started;
      std::move(start)(asio::bind_cancellation_slot(cancel.slot(), asio::bind_executor(io, [&](std::exception_ptr e, group g) {
        error = e;
        started = std::move(g);
      })));
      cancel.emit(type);
      io.run();
      CHECK(test::aborted(error));
      try {
        if (error) std::rethrow_exception(error);
      } catch (const std::system_error& e) {
        CHECK(std::string(e.what()).starts_with("cohort::start_processes"));
      }
      CHECK(started.pids().empty());
      CHECK(test::children_of_self().empty());
    }
  }

  TEST_CASE("program ranks run the spawn options' before_exec hook") {
    test::temp_dir dir;
    group_spec spec = ranks_of(1, {"print-nofile"});
    static rlim_t limit = 91;
    spec.options.before_exec = [](void* context) noexcept {
      const rlim_t value = *static_cast<const rlim_t*>(context);
      const rlimit lim{value, value};
      return ::setrlimit(RLIMIT_NOFILE, &lim) == 0 ? 0 : errno;
    };
    spec.options.before_exec_context = &limit;
    spec.options.out = stdio::file(dir.path / "out");
    CHECK(run_group(spec).ok());
    CHECK(test::read_file(dir.path / "out") == "91\n");
    spec.options.before_exec = [](void*) noexcept { return EACCES; };
    try {
      run_group(spec);
      FAIL("the group started");
    } catch (const std::system_error& e) {
      CHECK(e.code() == std::error_code(EACCES, std::system_category()));
      CHECK(std::string(e.what()).find("before_exec") != std::string::npos);
    }
  }

  // Before, the group's timers brought up asio's reactor on a fresh
  // io_context, and with a descriptor or two left that failed with asio's
  // bare "eventfd_select_interrupter: Too many open files".
  TEST_CASE("on a fresh io_context, a group with few descriptors left runs or fails naming the limit") {
    for (int free = 0; free <= 8; ++free) {
      CAPTURE(free);
      std::optional<run_result> result;
      std::string failure;
      {
        const test::descriptors_left left(free);
        try {
          result = run_group(ranks_of(2, {"exit", "0"}));
        } catch (const std::system_error& e) {
          failure = e.what();
          CHECK(e.code() == std::error_code(EMFILE, std::system_category()));
          CHECK(failure.find(fmt::format("RLIMIT_NOFILE is {}", left.limit.current())) != std::string::npos);
        }
      }
      if (result) CHECK(result->ok());
      else CHECK(failure.starts_with("cohort"));
    }
  }

  // Before, a supervisor whose ranks' pidfds and their descendants' took
  // its last descriptors could not list its children, and left the shells'
  // children handed to it unreaped: zombies that kept the ranks' process
  // groups alive, so that the shutdown waited out all of term_grace.
  TEST_CASE("with its last descriptors taken, a shutdown still reaps the orphans it is handed and waits for no grace") {
    int started = 0;
    for (int free = 0; free <= 24; ++free) {
      CAPTURE(free);
      // Rank 3 fails once every other rank's shell waits on its sleep: a
      // shell that the shutdown's SIGTERM reaches while it holds signals
      // back to fork (dash, about to vfork) dies of it after the fork, and
      // its child, which never got it, rightly holds the group for all of
      // term_grace.
      const test::temp_dir ready;
      group_spec spec;
      spec.entry = command("/bin/sh", {"-c",
                                       "if [ $0 = 3 ]; then n=0; while [ $(ls \"$1\" | wc -l) -lt 7 ] && [ $n -lt 1000 ]; "
                                       "do sleep 0.01; n=$((n+1)); done; exit 3; fi; sleep 200 & : > \"$1/$0\"; wait"});
      spec.nprocs = 8;
      for (int r = 0; r < spec.nprocs; ++r) spec.args[r] = {std::to_string(r), ready.path.string()};
      spec.shutdown.term_grace = 20s;
      std::optional<run_result> result;
      const auto began = std::chrono::steady_clock::now();
      {
        const test::descriptors_left left(free);
        try {
          result = run_group(spec);
        } catch (const std::system_error& e) {
          CHECK(e.code() == std::error_code(EMFILE, std::system_category()));
        }
      }
      if (!result) continue;
      ++started;
      const auto took = std::chrono::steady_clock::now() - began;
      CHECK(took < 10s);  // a bound against waiting out term_grace, far above the milliseconds it takes
      REQUIRE(result->failures.size() == 1);
      CHECK(result->failures.front().rank == 3);
    }
    CHECK(started > 0);
  }

  // Before, the scans for what the ranks left could open nothing once the
  // start had run out of descriptors (the started ranks held them), and
  // their first pass ended the sweep: a rank's shell killed as it started
  // its children handed them over after it. Live `setsid` children and
  // zombies were left to this process. Later, a `setsid` child handed over
  // once no descriptor was left to hold it by was never killed (seen under
  // load, a run in ten).
  TEST_CASE("a start that runs out of descriptors partway leaves no process of its ranks behind") {
    static std::atomic<int> launched{0};
    bool partway = false;
    for (int free = 4; free <= 40 && !partway; ++free) {
      CAPTURE(free);
      launched = 0;
      group_spec spec;
      spec.entry = command("/bin/sh", {"-c", "sleep 100 & setsid sleep 101 & wait"});
      spec.nprocs = 12;
      spec.start_threads = 1;
      // The third rank's launch waits, so that the first ones have started
      // their children when a later one fails.
      spec.options.before_exec = [](void*) noexcept {
        if (launched.fetch_add(1) + 1 == 3) {
          const timespec pause{0, 300'000'000};
          ::nanosleep(&pause, nullptr);
        }
        return 0;
      };
      std::string failure;
      {
        const test::descriptors_left left(free);
        try {
          run_group(spec);
        } catch (const std::system_error& e) {
          failure = e.what();
        }
      }
      if (failure.empty()) break;  // room for every rank, and none failed partway
      CHECK(failure.find("RLIMIT_NOFILE") != std::string::npos);
      const auto left_behind = test::children_of_self();
      std::string described;
      for (pid_t pid : left_behind) {
        described += fmt::format("{} {} [{}]; ", pid, test::state_of(pid), test::command_line(pid));
      }
      CAPTURE(described);
      CHECK(left_behind.empty());
      for (pid_t pid : left_behind) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
      }
      partway = launched >= 4;  // ranks had children when the start failed
    }
    CHECK(partway);
  }

  TEST_CASE("the descriptor table has room for every rank's descriptors before the first rank starts") {
    // Forked, so that the table is only as large as the open descriptors
    // need. Each rank's before_exec reads its parent's FDSize (the hook runs
    // in a child that shares this memory) and keeps the smallest.
    static std::atomic<long> smallest{-1};
    const pid_t pid = ::fork();
    if (pid == 0) {
      constexpr int n = 100;
      if (test::table_size(::getpid()) >= n) ::_exit(3);  // a table with room already: nothing to look at
      group_spec spec = ranks_of(n, {"exit", "0"});
      spec.options.before_exec = [](void*) noexcept {
        const long size = test::table_size(::getppid());
        long seen = smallest.load(std::memory_order_relaxed);
        while ((seen < 0 || size < seen) && !smallest.compare_exchange_weak(seen, size, std::memory_order_relaxed)) {
        }
        return 0;
      };
      int code = 1;
      try {
        if (run_group(spec).ok() && smallest.load() >= n) code = 0;
      } catch (...) {
        code = 2;
      }
      ::_exit(code);
    }
    check_forked(pid);
  }

  TEST_CASE("a file for the ranks' output is one, shared: each rank's lines are there, none written over") {
    test::temp_dir dir;
    const fs::path out = dir.path / "out";
    { std::ofstream(out) << "what was there before\n"; }
    // The same file, as 2>&1, however its path is spelled.
    fs::path err = out;
    SUBCASE("the same path") {}
    SUBCASE("spelled another way") { err = dir.path / "." / "out"; }
    SUBCASE("through a link") {
      fs::create_symlink(out, dir.path / "link");
      err = dir.path / "link";
    }
    group_spec spec;
    spec.entry = command("/bin/sh", {"-c", "echo \"rank $0 out\"; echo \"rank $0 err\" >&2"});
    spec.nprocs = 4;
    for (int rank = 0; rank < 4; ++rank) spec.args[rank] = {std::to_string(rank)};
    spec.options.out = stdio::file(out);
    spec.options.err = stdio::file(err);
    REQUIRE(run_group(spec).ok());
    const std::string text = test::read_file(out);
    CHECK(text.find("before") == std::string::npos);  // truncated once, at the start
    for (int rank = 0; rank < 4; ++rank) {
      CHECK(text.find(fmt::format("rank {} out\n", rank)) != std::string::npos);
      CHECK(text.find(fmt::format("rank {} err\n", rank)) != std::string::npos);
    }
    CHECK(text.size() == 4 * (std::string("rank 0 out\n").size() + std::string("rank 0 err\n").size()));
    // A path that cannot be opened is named, before any rank starts.
    spec.options.out = stdio::file(dir.path / "missing" / "out");
    try {
      run_group(spec);
      FAIL("no exception");
    } catch (const std::system_error& e) {
      CHECK(std::string(e.what()).find("options.out: cannot open") != std::string::npos);
      CHECK(e.code().value() == ENOENT);
    }
    // So is a FIFO that no process reads, at once, where its open waited
    // for a reader.
    const fs::path fifo = dir.path / "out.fifo";
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    spec.options.out = stdio::file(fifo);
    auto started = std::async(std::launch::async, [&] { return run_group(spec); });
    const bool at_once = started.wait_for(5s) == std::future_status::ready;
    // A start stuck opening the FIFO: a reader's open lets it go on.
    const int reader = at_once ? -1 : ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    CHECK(at_once);
    try {
      started.get();
      ::close(reader);
      FAIL("no exception");
    } catch (const std::system_error& e) {
      CHECK(std::string(e.what()).find("a FIFO that no process has open for reading") != std::string::npos);
      CHECK(e.code().value() == ENXIO);
    }
  }

  TEST_CASE("a start whose rank cannot start launches no rank after it; a count past pid_max is refused at once") {
    // The hook runs in each child just before its exec, on this process's
    // memory (the launch is vfork-style): it counts the launches.
    static std::atomic<int> launched{0};
    group_spec spec;
    spec.entry = command("/nonexistent/cohort-program");
    spec.nprocs = 64;
    spec.start_threads = 1;
    spec.options.before_exec = [](void*) noexcept {
      launched.fetch_add(1);
      return 0;
    };
    asio::io_context io;
    CHECK_THROWS_AS(start_processes(io.get_executor(), spec), std::system_error);
    CHECK(launched.load() == 1);

    long pid_max = 0;
    const bool read = static_cast<bool>(std::ifstream("/proc/sys/kernel/pid_max") >> pid_max);
    REQUIRE(read);
    spec.entry = command("true");
    spec.options.before_exec = nullptr;
    spec.nprocs = static_cast<int>(std::min<long>(pid_max + 1, std::numeric_limits<int>::max()));
    if (spec.nprocs > pid_max) {
      CHECK_THROWS_WITH_AS(start_processes(io.get_executor(), spec), doctest::Contains("pid_max"),
                           std::invalid_argument);
    }
  }

  TEST_CASE("a group whose io_context is gone refuses stop, signals, join and wait, and its end still ends the ranks") {
    group_spec spec = ranks_of(2, {"sleep", "30"});
    std::vector<pid_t> ranks;
    std::optional<group> g;
    {
      asio::io_context io;
      g = start_processes(io.get_executor(), spec);
      ranks = g->pids();
      io.run_for(20ms);
    }
    CHECK_THROWS_WITH_AS(g->stop(), doctest::Contains("io_context"), std::logic_error);
    CHECK_THROWS_WITH_AS(g->send_signal(SIGTERM), doctest::Contains("io_context"), std::logic_error);
    CHECK_THROWS_WITH_AS(g->interrupt(SIGTERM), doctest::Contains("io_context"), std::logic_error);
    CHECK_THROWS_WITH_AS(g->join(10ms), doctest::Contains("io_context"), std::logic_error);
    CHECK_THROWS_WITH_AS((void)g->wait(), doctest::Contains("io_context"), std::logic_error);
    g.reset();
    for (pid_t pid : ranks) {
      CAPTURE(pid);
      CHECK(test::within(5s, [pid] { return !test::alive(pid); }));
    }
  }

  // Before, the group's end reaped such a rank in its child object,
  // waiting for as long as the tracer held it.
  TEST_CASE("a group's end after its io_context went waits for no rank whose exit a tracer holds") {
    group_spec spec = ranks_of(1, {"traceable", "30"});
    std::optional<group> g;
    std::optional<asio::io_context> io(std::in_place);
    g = start_processes(io->get_executor(), spec);
    const pid_t rank = g->pids()[0];
    test::exit_holder holder(rank);  // for 20 s at most
    if (!holder.held()) {
      MESSAGE("ptrace is refused here: not checked");
      return;
    }
    io->run_for(20ms);
    io.reset();
    const auto start = std::chrono::steady_clock::now();
    g.reset();
    CHECK(std::chrono::steady_clock::now() - start < 10s);  // it waited the holder's 20 s
    holder.end();
    CHECK(test::within(5s, [rank] { return !fs::exists("/proc/" + std::to_string(rank)); }));  // reaped then
  }

  // Before, the wait ran on the gone io_context's strand: SIGSEGV.
  TEST_CASE("the wait of a run that ended before its io_context went gives the result, on the waiter's io_context") {
    group_spec spec = ranks_of(2, {"exit", "0"});
    std::optional<group> g;
    {
      asio::io_context io;
      g = start_processes(io.get_executor(), spec);
      io.run();
    }
    REQUIRE(g->result());
    asio::io_context other;
    auto waited = asio::co_spawn(other, [&]() -> asio::awaitable<run_result> { co_return co_await g->wait(); },
                                 asio::use_future);
    other.run();
    const auto r = waited.get();
    CHECK(r.ok());
    CHECK(r.statuses.size() == 2);
  }

  // The default token starts the wait when it is awaited: before, one made
  // while the io_context lived and awaited after it went ran on its strand.
  TEST_CASE("a wait made before the group's io_context went and awaited after it is refused, or gives the result") {
    for (const bool ended : {false, true}) {
      CAPTURE(ended);
      const auto args = ended ? std::vector<std::string>{"exit", "0"} : std::vector<std::string>{"sleep", "30"};
      group_spec spec = ranks_of(2, args);
      std::optional<group> g;
      std::optional<asio::awaitable<run_result>> waiting;
      {
        asio::io_context io;
        g = start_processes(io.get_executor(), spec);
        if (ended) io.run();
        else io.run_for(20ms);
        waiting.emplace(g->wait());
      }
      asio::io_context other;
      auto waited = asio::co_spawn(other, std::move(*waiting), asio::use_future);
      other.run();
      if (ended) {
        CHECK(waited.get().ok());
      } else {
        CHECK_THROWS_WITH_AS(waited.get(), doctest::Contains("io_context"), std::logic_error);
      }
    }
  }

  TEST_CASE("an io_context destroyed under a running group takes the ranks' processes with it") {
    test::temp_dir dir;
    group_spec spec;
    // Each rank starts a sleep in its process group and one in a session of
    // its own, and writes their pids.
    spec.entry = command("/bin/sh", {"-c", "sleep 321 & a=$!; setsid sleep 322 & echo \"$a $!\" > \"$0/$1.tmp\"; "
                                           "mv \"$0/$1.tmp\" \"$0/$1\"; wait", dir.path.string()});
    spec.nprocs = 2;
    spec.args = {{0, {"0"}}, {1, {"1"}}};
    std::vector<pid_t> ranks;
    {
      asio::io_context io;
      asio::co_spawn(io, [&]() -> asio::awaitable<void> {
        group g = co_await start_processes(spec);
        ranks = g.pids();
        co_await g.wait();
      }, asio::detached);
      const auto up = [&] { return fs::exists(dir.path / "0") && fs::exists(dir.path / "1"); };
      for (int i = 0; i < 500 && !up(); ++i) io.run_for(20ms);
      REQUIRE(up());
    }  // the supervision goes with it, unfinished
    std::vector<pid_t> left = ranks;
    for (const char* rank : {"0", "1"}) {
      std::istringstream pids(test::read_file(dir.path / rank));
      pid_t pid = 0;
      while (pids >> pid) left.push_back(pid);
    }
    REQUIRE(left.size() == 6);
    for (pid_t pid : left) {
      CAPTURE(pid);
      CHECK(test::within(5s, [pid] { return !test::alive(pid); }));
    }
  }

  // Before, the files stayed: only a run that finished swept them.
  TEST_CASE("an io_context destroyed under a running group removes the segment files its ranks made") {
    if (!fs::is_directory("/dev/shm")) {
      MESSAGE("no /dev/shm here: not checked");
      return;
    }
    test::temp_dir dir;
    group_spec spec;
    spec.entry =
        command("/bin/sh", {"-c", "echo $$ > \"$0/rank\"; while true; do sleep 0.05; done", dir.path.string()});
    spec.nprocs = 1;
    fs::path file;
    {
      asio::io_context io;
      asio::co_spawn(io, [&]() -> asio::awaitable<void> {
        group g = co_await start_processes(spec);
        co_await g.wait();
      }, asio::detached);
      pid_t rank = 0;
      for (int i = 0; i < 500 && (rank = first_line_pid(dir.path / "rank")) <= 0; ++i) io.run_for(20ms);
      REQUIRE(rank > 0);
      // The rank's file_system segment, made here under its name and stamp.
      const std::uint64_t start_time = os::start_time_of(rank).value_or(0);
      REQUIRE(start_time != 0);
      file = fs::path("/dev/shm") / fmt::format("cohort_{}_0123456789abcdef", rank);
      const shm::segment_stamp stamp{shm::segment_magic, 0x0123456789abcdefULL, shm::header_size, os::pid_namespace(),
                                     start_time, {}};
      std::ofstream(file).write(reinterpret_cast<const char*>(&stamp), sizeof stamp);
      REQUIRE(fs::exists(file));
    }  // the supervision goes with it, unfinished
    CHECK(!fs::exists(file));
    fs::remove(file);
  }

  // Before, the end stopped looking as soon as nothing noted was left,
  // before the killed rank had died and handed over its orphan, which then
  // went to init once the subreaper attribute was restored.
  TEST_CASE("an io_context destroyed under a running group takes a rank's unmarked orphan with it") {
    test::temp_dir dir;
    group_spec spec;
    // A sleep in a session of its own, without the group's marker: found
    // only as the rank's orphan.
    spec.entry = command("/bin/sh", {"-c", "setsid env -i sleep 323 & echo $! > \"$0/pid.tmp\"; "
                                           "mv \"$0/pid.tmp\" \"$0/pid\"; wait", dir.path.string()});
    {
      asio::io_context io;
      asio::co_spawn(io, [&]() -> asio::awaitable<void> {
        group g = co_await start_processes(spec);
        co_await g.wait();
      }, asio::detached);
      for (int i = 0; i < 500 && !fs::exists(dir.path / "pid"); ++i) io.run_for(20ms);
      REQUIRE(fs::exists(dir.path / "pid"));
    }
    const pid_t orphan = std::stoi(test::read_file(dir.path / "pid"));
    CHECK(test::within(5s, [orphan] { return !test::alive(orphan); }));
    if (test::alive(orphan)) ::kill(orphan, SIGKILL);
  }

  TEST_CASE("ranks outnumbering the descriptors left all end as they did") {
    // Forked, under a soft limit of 64 descriptors: 40 ranks alive at once
    // hold 40 pidfds, and where exits are watched on the reactor each wait
    // wants a second; the waits that find none left look on a timer instead.
    const pid_t pid = ::fork();
    if (pid == 0) {
      rlimit limit{};
      if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_max < 64) ::_exit(3);
      limit.rlim_cur = 64;
      if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) ::_exit(3);
      int code = 1;
      try {
        const auto result = run_group(ranks_of(40, {"exit-after", "300", "0"}));
        code = result.ok() && result.failures.empty() && result.statuses.size() == 40 ? 0 : 1;
      } catch (...) {
        code = 2;
      }
      ::_exit(code);
    }
    check_forked(pid);
  }

  TEST_CASE("the guardian: its end kills what carries this process's marker; after release() it kills nothing") {
    {
      const pid_t pid = marked_sleeper();
      { cohort::guardian guard; }  // reaped once it has looked
      CHECK(killed_soon(pid));
    }
    {
      const pid_t pid = marked_sleeper();
      cohort::guardian guard;
      const pid_t guardian = guard.pid();
      guard.release();
      errno = 0;
      CHECK(::waitpid(guardian, nullptr, WNOHANG) == -1);  // reaped by release(): not a child any more
      CHECK(errno == ECHILD);
      CHECK(exit_of(pid, WNOHANG) == -1);  // untouched: still asleep
      ::kill(pid, SIGKILL);
      const int status = exit_of(pid, 0);
      CHECK((WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL));
    }
    {
      // A plain fork's child that destroys its copy (exit() running the
      // destructors of statics, say) tells the guardian nothing. Before,
      // it asked for the look over the shared socket, which killed what
      // this process's groups still ran.
      const pid_t pid = marked_sleeper();
      std::optional<cohort::guardian> guard(std::in_place);
      std::fflush(nullptr);
      const pid_t child = ::fork();
      if (child == 0) {
        guard.reset();
        ::_exit(0);
      }
      REQUIRE(child > 0);
      CHECK(exit_code_of(child) == 0);
      std::this_thread::sleep_for(300ms);
      CHECK(exit_of(pid, WNOHANG) == -1);  // still asleep
      const pid_t guardian = guard->pid();
      CHECK(::kill(guardian, 0) == 0);  // still there
      guard.reset();  // this process's own end: it looks
      CHECK(killed_soon(pid));
    }
  }

  // /proc/<pid>/stat gives start times with the reader's boottime offset.
  // The supervisor here moves its children, a marked one and a guardian
  // that is a copy, into a time namespace 100 s behind its own. Before,
  // that guardian compared the children's start times, read there, with
  // the supervisor's, read in its own: the marked child seemed to have
  // started before the supervisor, and was spared. Needs CAP_SYS_ADMIN and
  // Linux 5.6.
  TEST_CASE("the guardian compares start times in its own time namespace") {
    for (const bool copy : {false, true}) {
      CAPTURE(copy);
      test::temp_dir dir;
      const std::string marked = (dir.path / "marked").string(), up = (dir.path / "up").string();
      const pid_t pid = ::fork();
      if (pid == 0) {
        // A guardian that shares this process's memory stays in its time
        // namespace; a copy goes where the other children go.
        if (copy) cohort::detail::start_guardians_as_copies(true);
        if (::unshare(CLONE_NEWTIME) != 0) ::_exit(77);
        const int offsets = ::open("/proc/self/timens_offsets", O_WRONLY | O_CLOEXEC);
        constexpr char behind[] = "boottime -100 0\n";
        if (offsets < 0 || ::write(offsets, behind, sizeof behind - 1) != sizeof behind - 1) ::_exit(77);
        ::close(offsets);
        std::optional<cohort::guardian> guard;
        try {
          guard.emplace();
        } catch (...) {  // never back into the test runner
          ::_exit(2);
        }
        // Published once the child has its marker (fork_marked_sleeper).
        const pid_t child = fork_marked_sleeper(::getpid());
        if (child < 0) ::_exit(2);
        publish_up_and_wait(dir.path.string(), "marked", child);
      }
      REQUIRE(pid > 0);
      child_of_test supervisor{pid};
      int status = -1;
      const bool started =
          test::within(30s, [&] { return fs::exists(up) || (status = exit_of(pid, WNOHANG)) != -1; }, 5ms);
      if (status != -1) {
        supervisor.pid = -1;  // reaped
        REQUIRE((WIFEXITED(status) && WEXITSTATUS(status) == 77));
        MESSAGE("no time namespace can be made here: not checked");
        return;
      }
      REQUIRE(started);
      const pid_t left = first_line_pid(marked);
      REQUIRE(left > 0);
      ::kill(pid, SIGKILL);
      supervisor.pid = -1;  // reaped by killed_soon
      CHECK(killed_soon(pid));
      CHECK(test::within(10s, [&] { return !test::alive(left); }, 5ms));
      if (test::alive(left)) ::kill(left, SIGKILL);
    }
  }

  // Before, the guardian killed whatever carried its process's marker,
  // however old: what an earlier supervisor that had the same pid left
  // behind died with the later one. The later supervisor takes the pid
  // through ns_last_pid, which only a privileged process can write. One
  // started after it with its marker, as its rank's child would be, dies.
  TEST_CASE("the guardian spares a process older than its own, whatever marker it carries") {
    const char* last_pid = "/proc/sys/kernel/ns_last_pid";
    if (::access(last_pid, W_OK) != 0) {
      MESSAGE("ns_last_pid cannot be written here: not checked");
      return;
    }
    long pid_max = 0;
    std::ifstream("/proc/sys/kernel/pid_max") >> pid_max;
    std::mt19937 random(std::random_device{}());
    for (int attempt = 0; attempt < 20; ++attempt) {
      long last = 0;
      std::ifstream(last_pid) >> last;
      // Far from the pids another run of this test (the other mode's,
      // running beside it) takes, whose guardian would kill this one's
      // marked processes.
      const long ahead = 1000 + std::uniform_int_distribution<long>(0, 100'000)(random);
      const auto target = static_cast<pid_t>(last + ahead < pid_max ? last + ahead : 1000 + ahead % 30'000);
      if (::kill(target, 0) == 0 || errno != ESRCH) continue;  // taken
      const pid_t older = marked_sleeper(target);
      // Start times count clock ticks (10 ms where USER_HZ is 100): one
      // that starts in the same tick is not older.
      std::this_thread::sleep_for(30ms);
      int ends[2];
      REQUIRE(::pipe(ends) == 0);
      std::ofstream(last_pid) << target - 1 << std::flush;
      const pid_t supervisor = ::fork();
      if (supervisor == 0) {
        ::close(ends[0]);
        if (::getpid() != target) ::_exit(3);
        std::optional<cohort::guardian> guard;
        try {
          guard.emplace();
        } catch (...) {  // never back into the test runner
          ::_exit(2);
        }
        const pid_t guardian = guard->pid();
        [[maybe_unused]] const auto n = ::write(ends[1], &guardian, sizeof guardian);
        ::pause();
        ::_exit(1);
      }
      REQUIRE(supervisor > 0);
      child_of_test ends_with_test{supervisor}, older_ends{older};
      ::close(ends[1]);
      pid_t guardian = -1;
      const bool took = supervisor == target && ::read(ends[0], &guardian, sizeof guardian) == sizeof guardian;
      ::close(ends[0]);
      if (!took) continue;  // both killed and reaped
      const pid_t younger = marked_sleeper(target);
      ::kill(supervisor, SIGKILL);
      ends_with_test.pid = -1;
      CHECK(killed_soon(supervisor));
      CHECK(killed_soon(younger));
      // The guardian's pass is over once it has ended.
      CHECK(test::within(15s, [&] { return !test::alive(guardian); }, 5ms));
      ::waitpid(guardian, nullptr, WNOHANG);  // where it was handed to this process
      CHECK(exit_of(older, WNOHANG) == -1);  // still asleep; killed and reaped as the scope ends
      return;
    }
    MESSAGE("no pid could be taken again here: not checked");
  }

  TEST_CASE("the guardian kills what a rank started in its process group with a fresh environment") {
    // The supervisor is killed outright once its rank is up: the rank dies
    // by its parent-death signal, its unmarked child by the guardian, which
    // reads the rank's group from the table written after it started, as
    // a copy too, and when this process has a guardian of its own (before,
    // the supervisor forked from it took its registry for its own, noted
    // nothing in its guardian's table, and the unmarked child lived on).
    // With how 3 the supervisor runs two guardians, and the first, which
    // took the note, ends after the start: the second takes its notes
    // (before, no guardian took notes from then on, and those made were
    // lost with the first).
    for (const int how : {0, 1, 2, 3}) {
      const bool copy = how == 1;
      CAPTURE(how);
      std::optional<cohort::guardian> own;
      if (how == 2) own.emplace();
      test::temp_dir dir;
      void (*as_copy)() = [] { cohort::detail::start_guardians_as_copies(true); };
      static std::optional<cohort::guardian> first;  // the supervisor's, in how 3
      void (*first_starts)() = [] { first.emplace(); };
      void (*first_ends)() = [] { first->release(); };
      const std::string script = "env -i /bin/sleep 60 & echo $! > \"$0/fresh\"; : > \"$0/up\"; wait";
      const pid_t pid = guarded_supervisor(dir.path, script, copy ? as_copy : how == 3 ? first_starts : nullptr,
                                           how == 3 ? first_ends : nullptr);
      check_killed_with_supervisor(dir.path, pid, pid, "fresh");
      if (own) own->release();
    }
  }

  // Makes the guardians started while it lives copies, or not.
  struct guardians_as_copies {
    explicit guardians_as_copies(bool copy) { cohort::detail::start_guardians_as_copies(copy); }
    ~guardians_as_copies() { cohort::detail::start_guardians_as_copies(false); }
    guardians_as_copies(const guardians_as_copies&) = delete;
    guardians_as_copies& operator=(const guardians_as_copies&) = delete;
  };

  // A guardian's pass spares another guardian by its name, and kills what
  // is in the process group of a rank: the rank's own guardian before it
  // has run took its parent's name and group. Before, the guardian set its
  // name and group only once it ran, and a supervisor among the ranks
  // started its own ranks meanwhile: under load, the outer guardian, its
  // supervisor killed, killed the inner one before it had run, and what the
  // inner ranks had started lived on.
  TEST_CASE("a guardian has its name and leads a process group of its own once it is made") {
    for (const bool copy : {false, true}) {
      CAPTURE(copy);
      std::optional<cohort::guardian> guard;
      {
        // Off again on the way out, even if the guardian's constructor throws.
        const guardians_as_copies as_copies(copy);
        guard.emplace();
      }
      const pid_t pid = guard->pid();
      const std::string name = test::read_file(fs::path("/proc") / std::to_string(pid) / "comm");
      const pid_t group = ::getpgid(pid);
      guard->release();
      CHECK(name == "cohort-guardian\n");
      CHECK(group == pid);
    }
  }

  // Before, the guardian of a supervisor that was one of the ranks carried
  // the rank's marker, and this process's guardian killed it, often before
  // it had done its work: what that supervisor's rank had started with a
  // fresh environment lived on. Three rounds, as it was a race.
  TEST_CASE("the guardian spares a rank's own guardian, which kills what that one's ranks started") {
    for (int round = 0; round < 3; ++round) {
      CAPTURE(round);
      test::temp_dir dir;
      const std::string inner = "env -i /bin/sleep 60 & echo $! > \"$0/fresh\"; : > \"$0/up\"; wait";
      const std::string script = "exec '" COHORT_TEST_SUPERVISOR "' --guarded \"$0\" '" + inner + "'";
      const pid_t pid = guarded_supervisor(dir.path, script);
      check_killed_with_supervisor(dir.path, pid, pid, "fresh");
    }
  }

  // Before, the guardian stayed in the supervisor's process group, and a
  // SIGKILL sent to the group (`timeout -s KILL`) ended it with the
  // supervisor: what the rank had started lived on.
  TEST_CASE("a SIGKILL sent to the supervisor's whole process group leaves nothing its ranks started") {
    test::temp_dir dir;
    const std::string script = "setsid sleep 60 & echo $! > \"$0/grandchild\"; : > \"$0/up\"; wait";
    const pid_t pid = guarded_supervisor(dir.path, script, [] { ::setpgid(0, 0); });
    check_killed_with_supervisor(dir.path, pid, -pid, "grandchild");
  }

  TEST_CASE("once its process is killed, the guardian removes the segment files that process and its ranks made") {
    // file_system segments are files in /dev/shm named for their maker;
    // the rank's is made by hand under that name. Beside it, one stamped
    // as made by another pid namespace's process with the rank's pid (a
    // /dev/shm that namespaces share) stays: before, it was removed too.
    if (!fs::is_directory("/dev/shm")) {
      MESSAGE("no /dev/shm here: not checked");
      return;
    }
    test::temp_dir dir;
    const std::string script = ": > /dev/shm/cohort_$$_0123456789abcdef; echo $$ > \"$0/rank\"; sleep 60";
    const pid_t pid = guarded_supervisor(dir.path, script, [] {
      set_sharing_strategy(sharing_strategy::file_system);
      static const tensor kept = tensor::full({16}, 1.0, dtype::float32, {.shared = true});
    });
    // The rank's pid read once its line is whole: the file exists from the
    // shell's open, before its write.
    pid_t rank = 0;
    const bool up = test::within(10s, [&] {
      if (rank <= 0 && fs::exists(dir.path / "rank")) rank = first_line_pid(dir.path / "rank");
      return rank > 0 && fs::exists(dir.path / "started") && !segment_files_of(pid).empty();
    }, 5ms);
    const bool rank_file = up && !segment_files_of(rank).empty();
    const auto foreign = fmt::format("cohort_{}_fedcba9876543210", rank);
    if (rank_file) {
      const shm::segment_stamp stamp{shm::segment_magic, 0xfedcba9876543210ULL, shm::header_size,
                                     os::pid_namespace() + 1, 1, {}};
      std::ofstream(fs::path("/dev/shm") / foreign).write(reinterpret_cast<const char*>(&stamp), sizeof stamp);
    }
    ::kill(pid, SIGKILL);
    CHECK(killed_soon(pid));
    REQUIRE(up);
    REQUIRE(rank_file);
    const std::vector<std::string> only_foreign{foreign};
    CHECK(test::within(10s, [&] {
      return segment_files_of(pid).empty() && segment_files_of(rank) == only_foreign;
    }, 5ms));
    CHECK(segment_files_of(rank) == only_foreign);
    for (const auto& name : segment_files_of(pid)) fs::remove(fs::path("/dev/shm") / name);
    for (const auto& name : segment_files_of(rank)) fs::remove(fs::path("/dev/shm") / name);
  }

  // The supervisor is killed while its start waits for the set-up of all
  // but one rank, which already runs its function and has started an
  // unmarked child in its process group. Before, function ranks were noted
  // for the guardian only once all had started: the child lived on.
  TEST_CASE("the guardian kills what a rank started before the rest of its group had started") {
    for (const start_method method : {start_method::fork, start_method::spawn}) {
      CAPTURE(to_string(method));
      test::temp_dir dir;
      const std::string go_on = (dir.path / "go-on").string();
      REQUIRE(go_on.size() < sizeof go_on_file);
      const pid_t pid = ::fork();
      if (pid == 0) {
        void* shared = ::mmap(nullptr, sizeof(std::atomic<int>), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                              -1, 0);
        if (shared == MAP_FAILED) ::_exit(2);
        ranks_let_on = new (shared) std::atomic<int>(0);
        std::memcpy(go_on_file, go_on.c_str(), go_on.size() + 1);
        cohort::guardian guard;
        group_spec spec;
        spec.entry = call(method, start_unmarked_child, dir.path.string());
        spec.nprocs = 3;
        spec.options.before_exec = hold_all_but_the_first;
        asio::io_context io;
        group g = start_processes(io.get_executor(), spec);
        io.run_for(60s);
        ::_exit(1);
      }
      REQUIRE(pid > 0);
      const bool up = test::within(30s, [&] { return fs::exists(dir.path / "up"); }, 5ms);
      ::kill(pid, SIGKILL);
      CHECK(killed_soon(pid));
      std::ofstream(go_on).flush();
      REQUIRE(up);
      const pid_t left = first_line_pid(dir.path / "fresh");
      REQUIRE(left > 0);
      CHECK(test::within(10s, [&] { return !test::alive(left); }, 5ms));
      if (test::alive(left)) ::kill(left, SIGKILL);
    }
  }

  // A child of a `fork` or `forkserver` rank that leaves the rank's process
  // group and executes nothing shows the supervisor's or the server's
  // initial environment in /proc/<pid>/environ, not the rank's: before, it
  // carried no marker the guardian knew, and outlived the supervisor
  // killed outright.
  TEST_CASE("the guardian kills the forked rank's child that left for a session of its own") {
    for (const start_method method : {start_method::fork, start_method::forkserver}) {
      CAPTURE(to_string(method));
      test::temp_dir dir;
      group_spec spec;
      spec.entry = call(method, fork_detached_child, dir.path.string());
      spec.nprocs = 2;
      const pid_t pid = guarded_group(spec, nullptr, nullptr, dir.path / "started");
      check_killed_with_supervisor(dir.path, pid, pid, "detached");
    }
  }

  // Before, the guardian removed only the files whose maker was the
  // supervisor or one of its ranks: a rank's own child is neither.
  TEST_CASE("once its process is killed, the guardian removes the segment files a rank's own child made") {
    if (!fs::is_directory("/dev/shm")) {
      MESSAGE("no /dev/shm here: not checked");
      return;
    }
    test::temp_dir dir;
    group_spec spec;
    spec.entry = call(start_method::fork, fork_segment_maker, dir.path.string());
    const pid_t pid = guarded_group(spec);
    pid_t maker = 0;
    test::within(30s, [&] { return (maker = first_line_pid(dir.path / "maker")) > 0; }, 5ms);
    const bool made = maker > 0 && !segment_files_of(maker).empty();
    ::kill(pid, SIGKILL);
    CHECK(killed_soon(pid));
    REQUIRE(made);
    CHECK(test::within(10s, [&] { return segment_files_of(maker).empty() && !test::alive(maker); }, 5ms));
    if (test::alive(maker)) ::kill(maker, SIGKILL);
    for (const auto& name : segment_files_of(maker)) fs::remove(fs::path("/dev/shm") / name);
  }

  TEST_CASE("the guardian also removes the segment files of a rank that ended before its process was killed") {
    // Rank 0 stands for a rank that made a file_system segment and died
    // holding it: its file, stamped with its pid and start time, is made
    // here while it runs. It fails; rank 1 ignores SIGTERM, so the run
    // waits out term_grace with rank 0 reaped and its process group's note
    // gone, and the supervisor is killed then. Beside the rank's file, one
    // with its pid stamped with another start time (a process that took
    // the pid since) stays. Before, the rank's file stayed too: the
    // guardian knew only the ranks whose process groups were noted.
    if (!fs::is_directory("/dev/shm")) {
      MESSAGE("no /dev/shm here: not checked");
      return;
    }
    test::temp_dir dir;
    group_spec spec;
    spec.entry = command("/bin/sh", {"-c",
                                     "if [ $1 = 0 ]; then echo $$ > \"$0/rank\"; "
                                     "while [ ! -e \"$0/made\" ]; do sleep 0.01; done; exit 3; fi; "
                                     "trap ': > \"$0/term\"' TERM; : > \"$0/armed\"; while true; do sleep 0.01; done",
                                     dir.path.string()});
    spec.nprocs = 2;
    spec.args = {{0, {"0"}}, {1, {"1"}}};
    spec.shutdown.term_grace = 60s;
    const pid_t pid = guarded_group(spec);
    pid_t rank = 0;
    test::within(10s, [&] { return (rank = first_line_pid(dir.path / "rank")) > 0; }, 5ms);
    const std::uint64_t start_time = rank > 0 ? os::start_time_of(rank).value_or(0) : 0;
    const auto file = fmt::format("cohort_{}_0123456789abcdef", rank);
    const auto other = fmt::format("cohort_{}_fedcba9876543210", rank);
    if (start_time != 0) {
      const shm::segment_stamp stamp{shm::segment_magic, 0x0123456789abcdefULL, shm::header_size, os::pid_namespace(),
                                     start_time, {}};
      std::ofstream(fs::path("/dev/shm") / file).write(reinterpret_cast<const char*>(&stamp), sizeof stamp);
      const shm::segment_stamp later{shm::segment_magic, 0xfedcba9876543210ULL, shm::header_size, os::pid_namespace(),
                                     start_time + 1, {}};
      std::ofstream(fs::path("/dev/shm") / other).write(reinterpret_cast<const char*>(&later), sizeof later);
    }
    // Rank 0 ends once rank 1 has its trap for the shutdown's SIGTERM.
    test::within(10s, [&] { return fs::exists(dir.path / "armed"); }, 5ms);
    std::ofstream(dir.path / "made").flush();
    // The shutdown's SIGTERM comes once rank 0's end is recorded.
    const bool shutting_down = test::within(10s, [&] { return fs::exists(dir.path / "term"); }, 5ms);
    ::kill(pid, SIGKILL);
    CHECK(killed_soon(pid));
    REQUIRE(start_time != 0);
    REQUIRE(shutting_down);
    CHECK(test::within(10s, [&] { return !fs::exists(fs::path("/dev/shm") / file); }, 5ms));
    CHECK(fs::exists(fs::path("/dev/shm") / other));
    fs::remove(fs::path("/dev/shm") / file);
    fs::remove(fs::path("/dev/shm") / other);
  }

  TEST_CASE("the guardian removes the segment files of a function rank that ended before every rank had started") {
    // Function ranks are noted once every rank has started: rank 0 (the
    // first to reach the hook) makes its file and ends before the others
    // report their set-up, so it is a zombie then. The others ignore
    // SIGTERM, so the run waits out term_grace with it reaped and its
    // process group's note gone, and the supervisor is killed then.
    // Before, its file stayed: a zombie's start time was read as 0, and it
    // was never noted.
    if (!fs::is_directory("/dev/shm")) {
      MESSAGE("no /dev/shm here: not checked");
      return;
    }
    test::temp_dir dir;
    const pid_t pid = ::fork();
    if (pid == 0) {
      void* shared = ::mmap(nullptr, sizeof(std::atomic<pid_t>), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                            -1, 0);
      if (shared == MAP_FAILED) ::_exit(2);
      first_rank = new (shared) std::atomic<pid_t>(0);
      const std::string term = (dir.path / "term").string();
      if (term.size() >= sizeof term_file) ::_exit(2);
      std::memcpy(term_file, term.c_str(), term.size() + 1);
      cohort::guardian guard;
      group_spec spec;
      spec.entry = call(start_method::fork, end_first_or_wait, dir.path.string());
      spec.nprocs = 4;
      spec.options.before_exec = let_the_first_end;
      spec.shutdown.term_grace = 60s;
      asio::io_context io;
      group g = start_processes(io.get_executor(), spec);
      std::ofstream(dir.path / "started").flush();
      io.run_for(60s);
      ::_exit(1);
    }
    REQUIRE(pid > 0);
    pid_t rank = 0;
    test::within(10s, [&] { return (rank = first_line_pid(dir.path / "rank")) > 0; }, 5ms);
    const auto file = fs::path("/dev/shm") / fmt::format("cohort_{}_0123456789abcdef", rank);
    const bool started = test::within(10s, [&] { return fs::exists(dir.path / "started"); }, 5ms);
    // The shutdown's SIGTERM comes once rank 0's end is recorded.
    const bool shutting_down = test::within(10s, [&] { return fs::exists(dir.path / "term"); }, 5ms);
    ::kill(pid, SIGKILL);
    CHECK(killed_soon(pid));
    REQUIRE(rank > 0);
    REQUIRE(started);
    REQUIRE(shutting_down);
    CHECK(test::within(10s, [&] { return !fs::exists(file); }, 5ms));
    fs::remove(file);
  }

  TEST_CASE("a start that fails after its first rank started lets that rank's note go") {
    // In a forked child, whose guardian is its own. The second launch's
    // hook fails it: the first rank was noted, and the ranks' pids were
    // not yet gathered when the start unwound.
    const pid_t pid = ::fork();
    if (pid == 0) {
      int code = 0;
      try {
        cohort::guardian guard;
        static std::atomic<int> launched{0};
        static std::atomic<pid_t> first{0};
        group_spec spec = ranks_of(2, {"sleep", "30"});
        spec.start_threads = 1;
        spec.options.before_exec = [](void*) noexcept {
          if (launched.fetch_add(1) == 0) {
            first.store(static_cast<pid_t>(::syscall(SYS_getpid)));
            return 0;
          }
          return EPERM;
        };
        asio::io_context io;
        try {
          (void)start_processes(io.get_executor(), spec);
          code = 2;
        } catch (const std::system_error&) {
        }
        if (first.load() <= 0) code = 3;
        if (cohort::detail::rank_group_noted(first.load())) code = 4;
      } catch (...) {
        code = 5;
      }
      ::_exit(code);
    }
    REQUIRE(pid > 0);
    CHECK(exit_code_of(pid) == 0);
  }

  TEST_CASE("a rank's process group is noted for the guardian while it may hold the rank's processes") {
    // In a forked child, whose guardian is its own. Rank 0 ends at once and
    // its group with it; rank 1 runs until told. With new_process_group
    // off, the ranks are in this process's group, which is never noted.
    test::temp_dir dir;
    const pid_t pid = ::fork();
    if (pid == 0) {
      int code = 0;
      const auto fail = [&](int step) {
        if (code == 0) code = step;
      };
      try {
        cohort::guardian guard;
        group_spec spec;
        spec.entry = command("/bin/sh", {"-c", "[ $1 = 0 ] && exit 0; while [ ! -e \"$0/end\" ]; do sleep 0.01; done",
                                         dir.path.string()});
        spec.nprocs = 2;
        spec.args = {{0, {"0"}}, {1, {"1"}}};
        asio::io_context io;
        group g = start_processes(io.get_executor(), spec);
        const auto pids = g.pids();
        std::thread runner([&io] { io.run(); });
        if (!cohort::detail::rank_group_noted(pids[1])) fail(2);
        if (!test::within(10s, [&] { return !cohort::detail::rank_group_noted(pids[0]); }, 5ms)) fail(3);
        if (!cohort::detail::rank_group_noted(pids[1])) fail(4);
        std::ofstream(dir.path / "end").flush();
        if (!g.join(10s)) fail(5);
        runner.join();
        if (cohort::detail::rank_group_noted(pids[1])) fail(6);
        spec.options.new_process_group = false;
        spec.entry = command("/bin/sh", {"-c", "while [ ! -e \"$0/end2\" ]; do sleep 0.01; done", dir.path.string()});
        asio::io_context io2;
        group same = start_processes(io2.get_executor(), spec);
        for (pid_t rank : same.pids()) {
          if (cohort::detail::rank_group_noted(rank) || cohort::detail::rank_group_noted(::getpgrp())) fail(7);
        }
        std::ofstream(dir.path / "end2").flush();
        io2.run_for(10s);
        if (!same.result()) fail(8);
      } catch (...) {
        fail(9);
      }
      ::_exit(code);
    }
    REQUIRE(pid > 0);
    CHECK(exit_code_of(pid) == 0);
  }

  // Before, the guardian's start said only "socketpair: Too many open
  // files" or "clone: Resource temporarily unavailable", naming no limit.
  TEST_CASE("a guardian that can get no descriptor or no process names the limit that refused it") {
    const auto failure = [](int descriptors) {
      const test::descriptors_left left(descriptors);
      try {
        cohort::guardian guard;
        guard.release();
      } catch (const std::system_error& e) {
        return std::string(e.what());
      }
      return std::string();
    };
    const std::string limit_note = " (open file limit RLIMIT_NOFILE is ";
    const std::string no_socket = failure(0);
    CHECK(no_socket.starts_with("cohort::guardian: socketpair" + limit_note));
    CHECK(no_socket.ends_with(std::strerror(EMFILE)));
    // Room for the socket pair, none for the pidfd that the clone makes.
    const std::string no_pidfd = failure(2);
    CHECK(no_pidfd.starts_with("cohort::guardian: clone" + limit_note));
    CHECK(no_pidfd.ends_with(std::strerror(EMFILE)));
    // A user with no process left to make: root is not bound by RLIMIT_NPROC.
    const int code = test::exit_code_in_child([] {
      if (::setresuid(65534, 65534, 65534) != 0) return 77;
      const rlimit none{0, 0};
      if (::setrlimit(RLIMIT_NPROC, &none) != 0) return 2;
      try {
        cohort::guardian guard;
        return 3;
      } catch (const std::system_error& e) {
        const std::string what = e.what();
        return what.starts_with("cohort::guardian: clone (process limit RLIMIT_NPROC is 0 for this user") ? 0 : 4;
      }
    });
    if (code == 77) {
      MESSAGE("no other user can be taken here: the process limit is not tried");
    } else {
      CHECK(code == 0);
    }
  }

  TEST_CASE("the guardian shares this process's memory on Linux 5.16 and later (x86-64, AArch64), and is a copy before") {
    utsname name{};
    REQUIRE(::uname(&name) == 0);
    int major = 0, minor = 0;
    REQUIRE(std::sscanf(name.release, "%d.%d", &major, &minor) == 2);
#if defined(__x86_64__) || defined(__aarch64__)
    const bool shares = major > 5 || (major == 5 && minor >= 16);
#else
    const bool shares = false;
#endif
    cohort::guardian guard;
    constexpr long kcmp_vm = 1;  // KCMP_VM: whether two processes have the same memory
    errno = 0;
    const long same = ::syscall(SYS_kcmp, ::getpid(), guard.pid(), kcmp_vm, 0L, 0L);
    if (same < 0) {
      MESSAGE("kcmp is refused here (" << std::strerror(errno) << "): not checked");
    } else {
      CHECK((same == 0) == shares);
    }
    guard.release();
  }

  TEST_CASE("the guardian ignores every signal but SIGKILL, SIGSTOP and its faults, and catches none") {
    static std::atomic<int> handled = 0;
    struct sigaction count {}, before {};
    count.sa_handler = [](int) { handled.fetch_add(1); };
    REQUIRE(::sigaction(SIGUSR1, &count, &before) == 0);
    {
      cohort::guardian guard;
      // A mask of /proc/<guardian>/status, once it has unblocked its signals.
      const auto mask = [&](const char* name) { return test::signal_mask(guard.pid(), name).value_or(~0ULL); };
      REQUIRE(test::within(10s, [&] { return mask("SigBlk") == 0; }));
      const auto bit = [](int signal) { return 1ULL << (signal - 1); };
      const auto ignored = mask("SigIgn");
      CHECK(mask("SigCgt") == 0);  // no handler of this process's
      for (int signal : {SIGUSR1, SIGUSR2, SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGPIPE, SIGALRM, SIGTSTP, SIGRTMIN + 2}) {
        CHECK((ignored & bit(signal)) != 0);
      }
      for (int signal : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGKILL, SIGSTOP}) CHECK((ignored & bit(signal)) == 0);
      for (int signal : {SIGUSR1, SIGTERM, SIGINT, SIGHUP}) CHECK(::kill(guard.pid(), signal) == 0);
      int status = 0;
      CHECK(::waitpid(guard.pid(), &status, WNOHANG) == 0);  // alive
      CHECK(handled.load() == 0);  // sharing memory, a handler run there would count here
      guard.release();
    }
    ::sigaction(SIGUSR1, &before, nullptr);
  }

  TEST_CASE("the guardian keeps no descriptor but its own, also where close_range is refused") {
    const pid_t child = ::fork();
    if (child == 0) {
      // close_range refused, as before Linux 5.9 or under some seccomp
      // filters; the guardian inherits the filter.
      if (!test::refuse_system_call(SYS_close_range, ENOSYS)) ::_exit(77);
      const int extra = ::open("/dev/null", O_RDONLY);  // not the guardian's to keep
      if (extra < 0) ::_exit(2);
      cohort::guardian guard;
      // Its own: its end of the line and the parent's pidfd, once set up.
      const std::string fds = "/proc/" + std::to_string(guard.pid()) + "/fd";
      const auto above_stdio = [&] {
        int n = 0;
        std::error_code ec;
        for (const auto& entry : fs::directory_iterator(fds, ec)) n += std::stoi(entry.path().filename().string()) > 2;
        return n;
      };
      test::within(10s, [&] { return above_stdio() <= 2; });
      const int kept = above_stdio();
      guard.release();
      ::_exit(kept == 2 ? 0 : 1);
    }
    REQUIRE(child > 0);
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    REQUIRE(WIFEXITED(status));
    if (WEXITSTATUS(status) == 77) {
      MESSAGE("seccomp filters are refused here: not checked");
    } else {
      CHECK(WEXITSTATUS(status) == 0);
    }
  }

  // Before, the guardian kept this process's standard streams open: a
  // reader of its stdout pipe saw no end of file while the guardian lived,
  // though this process had let go of the pipe.
  TEST_CASE("the guardian holds none of this process's standard streams") {
    const pid_t child = ::fork();
    if (child == 0) {
      int ends[2];
      if (::pipe(ends) != 0) ::_exit(2);
      for (int target = 0; target < 3; ++target) ::dup2(ends[target == 0 ? 0 : 1], target);
      ::close(ends[0]);
      ::close(ends[1]);
      cohort::guardian guard;
      const std::string fds = "/proc/" + std::to_string(guard.pid()) + "/fd/";
      const auto link = [](const std::string& path) {
        std::error_code ec;
        return fs::read_symlink(path, ec).string();
      };
      // Set up once it holds nothing above the streams but its own two.
      test::within(10s, [&] {
        int n = 0;
        std::error_code ec;
        for (const auto& entry : fs::directory_iterator(fds, ec)) n += std::stoi(entry.path().filename().string()) > 2;
        return n <= 2;
      });
      int held = 0;
      for (int target = 0; target < 3; ++target) {
        const std::string own = link("/proc/self/fd/" + std::to_string(target));
        const std::string its = link(fds + std::to_string(target));
        held += its == own || its != "/dev/null" ? 1 : 0;
      }
      guard.release();
      ::_exit(held == 0 ? 0 : 10 + held);
    }
    REQUIRE(child > 0);
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }

  TEST_CASE("a guardian started on a thread whose stack and storage are gone still sweeps at its end") {
    // glibc puts a thread's storage (errno, the stack protector's canary)
    // on the stack it is given: once that is unmapped, a guardian that
    // touched the storage of the thread that started it would die of
    // SIGSEGV instead of sweeping.
    const pid_t pid = marked_sleeper();
    constexpr std::size_t stack_size = 1 << 20;
    void* stack = ::mmap(nullptr, stack_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    REQUIRE(stack != MAP_FAILED);
    pthread_attr_t attributes;
    REQUIRE(::pthread_attr_init(&attributes) == 0);
    REQUIRE(::pthread_attr_setstack(&attributes, stack, stack_size) == 0);
    std::optional<cohort::guardian> guard;
    pthread_t thread;
    const auto start = [](void* g) -> void* {
      static_cast<std::optional<cohort::guardian>*>(g)->emplace();
      return nullptr;
    };
    REQUIRE(::pthread_create(&thread, &attributes, start, &guard) == 0);
    REQUIRE(::pthread_join(thread, nullptr) == 0);
    ::pthread_attr_destroy(&attributes);
    REQUIRE(guard.has_value());
    REQUIRE(::munmap(stack, stack_size) == 0);
    guard.reset();
    CHECK(killed_soon(pid));
  }
}

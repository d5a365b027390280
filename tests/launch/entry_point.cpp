#include "cohort/entry_point.hpp"

#include "cohort/group.hpp"
#include "cohort/process_error.hpp"
#include "cohort/spawn_and_join.hpp"

#include "launch/forkserver.hpp"
#include "os/stack_trace.hpp"

#include "support/fork_beside.hpp"
#include "support/harness.hpp"
#include "support/join_by.hpp"
#include "support/process_probe.hpp"

#include <doctest/doctest.h>

#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>

#include <fmt/format.h>

#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <link.h>
#include <pthread.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdio>
#include <cwchar>
#include <exception>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <optional>
#include <set>
#include <sstream>
#include <iostream>
#include <iterator>
#include <thread>
#include <tuple>

using namespace cohort;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

// The behaviours of PyTorch's test/test_multiprocessing_spawn.py, for every
// start method. The entry points have external linkage so that their names
// appear in stack traces (the program is linked with -rdynamic).
namespace entry_tests {

void succeed(int) {}
COHORT_ENTRYPOINT(succeed);

int rank_itself(int rank) { return rank; }
COHORT_ENTRYPOINT(rank_itself);

// 1 when the rank's descriptor `fd` is open.
int descriptor_open(int, int fd) { return ::fcntl(fd, F_GETFD) >= 0 ? 1 : 0; }
COHORT_ENTRYPOINT(descriptor_open);

// How many of the rank's descriptors `fds` are open.
int descriptors_open(int, const std::vector<int>& fds) {
  return static_cast<int>(std::count_if(fds.begin(), fds.end(), [](int fd) { return ::fcntl(fd, F_GETFD) >= 0; }));
}
COHORT_ENTRYPOINT(descriptors_open);

// A thread started before main, as a library's static initialiser may start
// one, in each run of this program whose environment names it: the
// forkserver's too, which is this program run again.
constexpr const char* thread_before_main_env = "COHORT_TEST_THREAD_BEFORE_MAIN";
const bool thread_before_main = [] {
  if (std::getenv(thread_before_main_env) == nullptr) return false;
  std::thread([] {
    for (;;) ::pause();
  }).detach();
  return true;
}();

// The rank plus 100 when the thread's own id is the one glibc holds for it
// (tgkill to it reaches this process), the rank alone when not.
int rank_with_own_tid(int rank) { return rank + (::pthread_kill(::pthread_self(), 0) == 0 ? 100 : 0); }
COHORT_ENTRYPOINT(rank_with_own_tid);

// Uses about `kib` KiB of stack, a KiB a frame.
[[gnu::noinline]] int use_stack_frames(int kib) {
  volatile char frame[1024];
  for (auto& c : frame) c = static_cast<char>(kib);
  return kib == 0 ? 0 : use_stack_frames(kib - 1) + (frame[kib % 1024] & 0);
}

// Text of `n` bytes, and the size of a text.
std::string text_of_size(int, std::size_t n) { return std::string(n, 'x'); }
COHORT_ENTRYPOINT(text_of_size);
std::size_t size_of_text(int, const std::string& text) { return text.size(); }
COHORT_ENTRYPOINT(size_of_text);

// The rank, once `mib` MiB of stack were used.
int rank_after_deep_stack(int rank, int mib) { return use_stack_frames(mib * 1024) + rank; }
COHORT_ENTRYPOINT(rank_after_deep_stack);

// What a rank took of its parent that a fork or an exec would hand on:
// SIGUSR2 ignored or not, its descriptor limit, nice value and CPU count.
std::string inherited_state(int) {
  struct sigaction usr2 {};
  ::sigaction(SIGUSR2, nullptr, &usr2);
  rlimit nofile{};
  ::getrlimit(RLIMIT_NOFILE, &nofile);
  const int nice = ::getpriority(PRIO_PROCESS, 0);
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  ::sched_getaffinity(0, sizeof cpus, &cpus);
  return fmt::format("SIGUSR2 {}, {} descriptors, nice {}, {} CPUs", usr2.sa_handler == SIG_IGN ? "ignored" : "default",
                     nofile.rlim_cur, nice, CPU_COUNT(&cpus));
}
COHORT_ENTRYPOINT(inherited_state);

// "<working directory> <umask, octal>", as the rank finds them.
std::string where_and_umask(int) {
  const mode_t mask = ::umask(0);  // the rank has one thread: no one sees the 0
  ::umask(mask);
  return fmt::format("{} {:o}", std::filesystem::current_path().string(), mask);
}
COHORT_ENTRYPOINT(where_and_umask);

// "<pid - pgid> <pid - session>": 0 where the rank leads them.
std::string leads(int) { return fmt::format("{} {}", ::getpid() - ::getpgid(0), ::getpid() - ::getsid(0)); }
COHORT_ENTRYPOINT(leads);
// Rank 1 ends inside the function, with code 0, before it returns a value.
int exits_zero_before_returning(int rank) {
  if (rank == 1) std::exit(0);
  return rank;
}
COHORT_ENTRYPOINT(exits_zero_before_returning);
int rings_of_parent(int) { return static_cast<int>(test::ring_descriptors(::getppid()).size()); }
COHORT_ENTRYPOINT(rings_of_parent);

std::string describe_args(int rank, std::string text, std::vector<int> numbers, std::vector<std::byte> bytes) {
  int sum = 0;
  for (int n : numbers) sum += n;
  return fmt::format("{}:{}:{}:{}", rank, text, sum, bytes.size());
}
COHORT_ENTRYPOINT(describe_args);

constexpr int legitimate_throw_line = __LINE__ + 2;
[[noreturn]] void throw_legitimate(int rank) {
  throw std::invalid_argument(fmt::format("legitimate exception from rank {}", rank));
}

void raise_on(int rank, int which) {
  if (which < 0 || rank == which) throw_legitimate(rank);
}
COHORT_ENTRYPOINT(raise_on);

void throw_int(int) { throw 42; }
COHORT_ENTRYPOINT(throw_int);

void terminate_without_exception(int) { std::terminate(); }
COHORT_ENTRYPOINT(terminate_without_exception);

// An exception whose what() breaks its contract: null.
struct null_what : std::exception {
  const char* what() const noexcept override { return nullptr; }
};
void throw_null_what(int) { throw null_what{}; }
COHORT_ENTRYPOINT(throw_null_what);

// One whose what() breaks it another way: it throws.
const char* fail_to_say() { throw std::runtime_error("what() itself failed"); }
struct what_throws : std::exception {
  const char* what() const noexcept override { return fail_to_say(); }
};
void throw_what_throws(int) { throw what_throws{}; }
COHORT_ENTRYPOINT(throw_what_throws);

// Exceptions nested in exceptions: one of std::exception's in another, an
// int in that.
void throw_nested(int) {
  try {
    try {
      throw 7;
    } catch (...) {
      std::throw_with_nested(std::runtime_error("reading batch 12"));
    }
  } catch (...) {
    std::throw_with_nested(std::logic_error("training step 3"));
  }
}
COHORT_ENTRYPOINT(throw_nested);

// The rank, and the error file its environment names (one per rank).
std::string rank_and_error_file(int rank) {
  const char* file = std::getenv("COHORT_ERROR_FILE");
  return fmt::format("{} {}", rank, file != nullptr ? file : "");
}
COHORT_ENTRYPOINT(rank_and_error_file);

// Two functions of one name, each registered under it.
namespace shared_a {
int work(int) { return 1; }
COHORT_ENTRYPOINT(work);
}  // namespace shared_a
namespace shared_b {
int work(int) { return 2; }
COHORT_ENTRYPOINT(work);
}  // namespace shared_b

// What the std::logic_error that refused to start `fn` says.
template <class Fn>
std::string refusal_of(Fn& fn) {
  try {
    spawn_and_join(fn, std::tuple{}, 1);
    return "started";
  } catch (const std::logic_error& e) {
    return e.what();
  }
}

void signal_self(int rank, int sig) {
  if (rank == 0) ::raise(sig);
  std::this_thread::sleep_for(30s);
}
COHORT_ENTRYPOINT(signal_self);

void exit_with(int rank, int code) {
  if (rank == 0) ::_exit(code);
  std::this_thread::sleep_for(30s);
}
COHORT_ENTRYPOINT(exit_with);

// Rank 0 exits with code 3 at once; rank 1 raises half a second later.
void exit_then_raise(int rank) {
  if (rank == 0) ::_exit(3);
  std::this_thread::sleep_for(500ms);
  throw_legitimate(rank);
}
COHORT_ENTRYPOINT(exit_then_raise);

// An exception whose what() takes `ms` to answer, as a trace can take
// that long to symbolize.
struct slow_to_say : std::exception {
  int ms;
  explicit slow_to_say(int m) : ms(m) {}
  const char* what() const noexcept override {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    return "said late";
  }
};

// Rank 1 raises at once, an exception 600 ms in the telling; rank 0
// exits with code 3 after 200 ms, while rank 1 still tells it.
void raise_slowly_then_exit(int rank) {
  if (rank == 1) throw slow_to_say(600);
  std::this_thread::sleep_for(200ms);
  ::_exit(3);
}
COHORT_ENTRYPOINT(raise_slowly_then_exit);

// The same, rank 1 with a second thread, which does not block the
// shutdown's SIGTERM as the throwing thread does.
void raise_slowly_beside_a_thread_then_exit(int rank) {
  if (rank == 1) std::thread([] { std::this_thread::sleep_for(30s); }).detach();
  raise_slowly_then_exit(rank);
}
COHORT_ENTRYPOINT(raise_slowly_beside_a_thread_then_exit);

void succeed_then_raise(int rank) {
  if (rank == 0) return;
  std::this_thread::sleep_for(100ms);
  throw_legitimate(rank);
}
COHORT_ENTRYPOINT(succeed_then_raise);

// Writes this process's pid into `dir`, then sleeps.
// Makes the file `dir`/<rank> once it runs, sleeps `ms`, returns its pid.
pid_t note_up_then_sleep(int rank, std::string dir, int ms) {
  std::ofstream{std::filesystem::path(dir) / std::to_string(rank)};
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  return ::getpid();
}
COHORT_ENTRYPOINT(note_up_then_sleep);

void record_pid_and_sleep(int rank, std::string dir) {
  std::ofstream(fs::path(dir) / fmt::format("{}-{}", rank, ::getpid())) << ::getpid();
  std::this_thread::sleep_for(60s);
}
COHORT_ENTRYPOINT(record_pid_and_sleep);

// Starts a nested group of two sleeping ranks, by the same start method.
void start_nested(int, std::string dir, int method) {
  join_options options;
  options.method = static_cast<start_method>(method);
  spawn_and_join(record_pid_and_sleep, std::tuple{dir}, 2, options);
}
COHORT_ENTRYPOINT(start_nested);

std::string environment_of(int, std::string name) {
  const char* value = std::getenv(name.c_str());
  return value != nullptr ? value : "<unset>";
}
COHORT_ENTRYPOINT(environment_of);

void print_rank(int rank) { std::printf("rank %d\n", rank); }
COHORT_ENTRYPOINT(print_rank);

// Rank 0 lets any process trace it, notes its pid in `dir`/pid and
// sleeps; rank 1 throws once `dir`/asked exists.
void traceable_then_fail(int rank, std::string dir) {
  if (rank == 0) {
    ::prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);  // EINVAL without Yama, where none is needed
    std::ofstream(fs::path(dir) / "pid.part") << ::getpid();
    fs::rename(fs::path(dir) / "pid.part", fs::path(dir) / "pid");
    std::this_thread::sleep_for(60s);
  }
  for (int i = 0; i < 3000 && !fs::exists(fs::path(dir) / "asked"); ++i) std::this_thread::sleep_for(10ms);
  throw std::runtime_error("rank 1 fails");
}
COHORT_ENTRYPOINT(traceable_then_fail);

// Waits for `dir`/release.
void wait_for_release(int, std::string dir) {
  for (int i = 0; i < 3000 && !fs::exists(fs::path(dir) / "release"); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}
COHORT_ENTRYPOINT(wait_for_release);

// Rank 0 returns at once; the others wait for `dir`/release.
void end_or_wait_for_release(int rank, std::string dir) {
  if (rank != 0) wait_for_release(rank, std::move(dir));
}
COHORT_ENTRYPOINT(end_or_wait_for_release);

// Each prints "rank <r>\n" into a buffer that it leaves unwritten: the
// rank's end has to write it.
void print_through_own_cout_buffer(int rank) {
  std::ios::sync_with_stdio(false);  // std::cout gets a buffer of its own, apart from stdout's
  std::cout << "rank " << rank << '\n';
}
COHORT_ENTRYPOINT(print_through_own_cout_buffer);

// The same, and then raises: the end of a rank that fails writes it too.
void print_through_own_cout_buffer_then_raise(int rank) {
  print_through_own_cout_buffer(rank);
  throw std::runtime_error("after printing");
}
COHORT_ENTRYPOINT(print_through_own_cout_buffer_then_raise);

void print_wide(int rank) {
  // A forked rank's stdout keeps the orientation its parent's had (narrow,
  // here, which refuses wide output); reopened, it has none.
  if (std::freopen(nullptr, "a", stdout) == nullptr) throw std::runtime_error("freopen");
  std::wprintf(L"rank %d\n", rank);  // stdout turns wide: its buffer is the wide one
}
COHORT_ENTRYPOINT(print_wide);

void print_to_buffered_stderr(int rank) {
  static char buffer[BUFSIZ];
  std::setvbuf(stderr, buffer, _IOFBF, sizeof buffer);
  std::fprintf(stderr, "rank %d\n", rank);
}
COHORT_ENTRYPOINT(print_to_buffered_stderr);

void print_to_both(int rank) {
  std::printf("out %d\n", rank);
  std::fflush(stdout);
  std::fprintf(stderr, "err %d\n", rank);
}
COHORT_ENTRYPOINT(print_to_both);

void say_at_exit() { std::fputs("exit handler\n", stdout); }

void print_with_exit_handler(int rank) {
  std::atexit(say_at_exit);
  std::printf("rank %d\n", rank);
}
COHORT_ENTRYPOINT(print_with_exit_handler);

// Writes "<rank>\n" on descriptor `fd`, kept open for it by keep_fds.
void write_rank_to(int rank, int fd) {
  const std::string line = std::to_string(rank) + "\n";
  if (::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) throw std::runtime_error("write");
}
COHORT_ENTRYPOINT(write_rank_to);

// Writes "<rank>\n" on descriptors `a` and `b`.
void write_rank_to_both(int rank, int a, int b) {
  write_rank_to(rank, a);
  write_rank_to(rank, b);
}
COHORT_ENTRYPOINT(write_rank_to_both);

int rank_times_two(int rank) { return rank * 2; }
COHORT_ENTRYPOINT(rank_times_two);

// How many result files (memfds named cohort-result) this process holds.
int result_files_held() {
  int n = 0;
  for (const auto& e : fs::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    if (fs::read_symlink(e.path(), ec).string().find("memfd:cohort-result") != std::string::npos) ++n;
  }
  return n;
}

int count_result_files(int) { return result_files_held(); }
COHORT_ENTRYPOINT(count_result_files);

void refuse_result_files(int) {
  if (result_files_held() != 0) throw std::runtime_error("a rank of a void function holds a result file");
}
COHORT_ENTRYPOINT(refuse_result_files);

// What the descriptors from 3 up that a program this rank ran would
// inherit (those without FD_CLOEXEC) name.
std::vector<std::string> inherited_by_programs(int) {
  std::vector<std::string> open;
  for (const auto& e : fs::directory_iterator("/proc/self/fd")) {
    const int fd = std::stoi(e.path().filename().string());
    const int flags = ::fcntl(fd, F_GETFD);
    std::error_code ec;
    if (fd > 2 && flags >= 0 && (flags & FD_CLOEXEC) == 0) open.push_back(fs::read_symlink(e.path(), ec).string());
  }
  return open;
}
COHORT_ENTRYPOINT(inherited_by_programs);

// Throws from `depth` frames down, for a trace of that many lines.
[[gnu::noinline]] void throw_from_below(int depth) {
  if (depth == 0) throw std::runtime_error("the reason, deep down");
  throw_from_below(depth - 1);
  asm volatile("");  // not a tail call: each level keeps its frame
}

// As on a disk with 4 KiB left: the error file takes the message, and not
// the trace of 200 frames after it.
void raise_with_little_room(int) {
  const rlimit little{4096, RLIM_INFINITY};
  ::setrlimit(RLIMIT_FSIZE, &little);
  throw_from_below(200);
}
COHORT_ENTRYPOINT(raise_with_little_room);

// In a rank: runs 3 ranks of rank_times_two by `inner` (parallel starts
// for spawn), and returns the sum of what they returned.
int sum_of_inner(int, int inner) {
  join_options options{.method = static_cast<start_method>(inner), .start_threads = 3};
  int sum = 0;
  for (int value : spawn_and_join(rank_times_two, std::tuple{}, 3, options)) sum += value;
  return sum;
}
COHORT_ENTRYPOINT(sum_of_inner);

int rank_after_a_while(int rank) {
  std::this_thread::sleep_for(200ms);
  return rank * 10;
}
COHORT_ENTRYPOINT(rank_after_a_while);

const start_method all_methods[] = {start_method::spawn, start_method::fork, start_method::forkserver};

// Runs `call` as `nprocs` ranks to the end.
run_result run_group(const group_spec& spec) {
  asio::io_context io;
  return test::run(io, [&]() -> asio::awaitable<run_result> {
    group g = co_await start_processes(spec);
    co_return co_await g.wait();
  }());
}

// Starts one rank of `succeed` by `method`: a line saying it started, or
// what the std::logic_error that refused it says.
std::string try_start(start_method method) {
  try {
    spawn_and_join(succeed, std::tuple{}, 1, test::join_by(method));
    return fmt::format("{}: started\n", to_string(method));
  } catch (const std::logic_error& e) {
    return fmt::format("{}: {}\n", to_string(method), e.what());
  }
}

// In a rank: loads the stand-in CUDA driver at `driver` and starts a rank
// by fork; initialises the driver (cuInit) and starts one by every method.
// Returns what each start did, a line each.
std::string starts_around_cuda_init(int, std::string driver) {
  void* library = ::dlopen(driver.c_str(), RTLD_NOW);
  if (library == nullptr) throw std::runtime_error(::dlerror());
  auto init = reinterpret_cast<int (*)(unsigned)>(::dlsym(library, "cuInit"));
  if (init == nullptr) throw std::runtime_error("the driver has no cuInit");
  std::string said = try_start(start_method::fork);
  init(0);
  for (start_method method : {start_method::fork, start_method::spawn, start_method::forkserver}) {
    said += try_start(method);
  }
  return said;
}
COHORT_ENTRYPOINT(starts_around_cuda_init);

// prepare handler: after the flush a fork start makes, before the fork.
std::atomic<bool> buffer_at_fork{false};
[[maybe_unused]] const bool buffer_at_fork_registered = [] {
  ::pthread_atfork([] { if (buffer_at_fork.load()) std::fputs("X", stdout); }, nullptr, nullptr);
  return true;
}();

// This process's stdout on `fd` (closed here) for as long as it lives; what
// stdio holds is written before each switch.
class stdout_onto {
 public:
  explicit stdout_onto(int fd) : saved_(::dup(STDOUT_FILENO)) {
    REQUIRE(saved_ >= 0);
    REQUIRE(fd >= 0);
    std::fflush(stdout);
    ::dup2(fd, STDOUT_FILENO);
    ::close(fd);
  }
  stdout_onto(const stdout_onto&) = delete;
  stdout_onto& operator=(const stdout_onto&) = delete;
  ~stdout_onto() {
    std::fflush(stdout);
    std::clearerr(stdout);
    ::dup2(saved_, STDOUT_FILENO);
    ::close(saved_);
  }

 private:
  int saved_;
};

// What one rank of `c`, succeeding, wrote to its stdout (a file).
std::string output_of_one_rank(const function_call& c) {
  test::temp_dir dir;
  group_spec spec;
  spec.entry = c;
  spec.nprocs = 1;
  spec.options.out = stdio::file(dir.path / "out");
  REQUIRE(run_group(spec).ok());
  return test::read_file(dir.path / "out");
}

run_result run_function(const function_call& call, int nprocs, shutdown_policy shutdown = {}) {
  group_spec spec;
  spec.entry = call;
  spec.nprocs = nprocs;
  spec.shutdown = shutdown;
  return run_group(spec);
}

template <class F>
void for_each_method(F&& body) {
  for (start_method method : all_methods) {
    CAPTURE(to_string(method));
    body(method);
  }
}

// What starting `n` ranks of `succeed` under `options` throws; fails the
// test when nothing is thrown.
std::system_error start_failure(const join_options& options, int n) {
  try {
    spawn_and_join(succeed, std::tuple{}, n, options);
  } catch (const std::system_error& e) {
    return e;
  }
  FAIL("no exception");
  return std::system_error(std::error_code(), "");
}

// The forkserver of this process.
pid_t forkserver_pid() { return test::forkserver_of_self(); }

// Checks the code of a check run by test::exit_code_in_child: 0 holds, 77
// is `not_set_up` (said, not failed), anything else fails.
void check_child_code(int code, const char* not_set_up) {
  if (code == 77) {
    MESSAGE(not_set_up);
  } else {
    CHECK(code == 0);
  }
}

// Runs one rank of `succeed` on `io` by `method`, and readies io for more.
void run_once(asio::io_context& io, start_method method) {
  group_spec once;
  once.entry = call(method, succeed);
  group g = start_processes(io.get_executor(), once);
  io.run();
  REQUIRE(g.result()->ok());
  io.restart();
}

int files_in(const fs::path& dir) {
  int n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++n;
  return n;
}

// The dynamic loader that this program names (PT_INTERP), which the tests'
// helper programs, built alike, name too; empty where there is none.
std::string program_interpreter() {
  std::string found;
  ::dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* out) {
        for (ElfW(Half) i = 0; i < info->dlpi_phnum; ++i) {
          if (info->dlpi_phdr[i].p_type != PT_INTERP) continue;
          *static_cast<std::string*>(out) = reinterpret_cast<const char*>(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
        }
        return 1;  // the first object is the program
      },
      &found);
  return found;
}

}  // namespace entry_tests

using namespace entry_tests;

namespace {

// Runs `program args...` and returns what it printed.
asio::awaitable<std::string> output_of(std::string program, std::vector<std::string> args) {
  command cmd(program, args);
  spawn_options options{.out = stdio::pipe()};
  child c = co_await spawn(cmd, options);
  std::string text = co_await test::read_all(c.out());
  co_await c.wait();
  co_return text;
}

// Runs this test program, listing its tests (its main runs then), with
// `variable` set to `value` and `in` for its stdin (held open until it
// ends, where a pipe); returns how it ended and what it wrote to stdout and
// to stderr.
asio::awaitable<std::tuple<exit_status, std::string, std::string>> listed_with(std::string variable,
                                                                                 std::string value, stdio in) {
  command cmd(std::filesystem::read_symlink("/proc/self/exe").string(), {"--list-test-cases"});
  spawn_options options{.in = std::move(in), .out = stdio::pipe(), .err = stdio::pipe()};
  options.env.set(variable, value);
  child c = co_await spawn(cmd, options);
  std::string out = co_await test::read_all(c.out());
  std::string err = co_await test::read_all(c.err());
  const exit_status status = co_await c.wait();
  co_return std::tuple{status, out, err};
}

}  // namespace

TEST_SUITE("entry points") {
  // Before, child_main served forks on descriptor 0 for any value that was
  // not a number ("", "abc"), and the program exited 0 without running its
  // main, silently.
  TEST_CASE("child_main refuses a COHORT_FORKSERVER that names no socket, naming the variable, and main does not run") {
    for (const std::string value : {"abc", "", "0", "12x"}) {
      CAPTURE(value);
      asio::io_context io;
      const auto [status, out, err] = test::run(io, listed_with("COHORT_FORKSERVER", value, stdio::null()));  // 0: not a socket
      INFO(err);
      CHECK_FALSE(status.success());
      CHECK(out.find("every rank of a function runs") == std::string::npos);
      CHECK(err.find(fmt::format("COHORT_FORKSERVER=\"{}\" names no socket", value)) != std::string::npos);
    }
  }

  // Before, a value of the right shape had this program read whatever
  // descriptor it named as the arguments: standard input holding what
  // decodes as them ran the function in place of main and exited 0, and
  // any failure was reported as that of a rank -1, not naming the variable.
  TEST_CASE("child_main refuses a COHORT_ENTRY naming descriptors cohort did not make, naming the variable, and main does not run") {
    const test::temp_dir dir;
    const fs::path args_file = dir.path / "args";
    {
      const encoded no_arguments = encode(std::tuple<>{});
      std::ofstream file(args_file, std::ios::binary);
      file.write(reinterpret_cast<const char*>(no_arguments.bytes().data()),
                 static_cast<std::streamsize>(no_arguments.bytes().size()));
    }
    const std::string name = call(entry_tests::succeed).name;
    const std::vector<std::tuple<std::string, stdio>> cases = {
        {fmt::format("0,-1,0,{}", name), stdio::file(args_file)},  // a regular file holding a call's arguments
        {fmt::format("0,-1,0,{}", name), stdio::pipe()},           // a pipe held open
        {fmt::format("0,1,0,{}", name), stdio::pipe()},
        {fmt::format("99,-1,0,{}", name), stdio::null()},          // no descriptor
        {"garbage", stdio::null()},
    };
    for (const auto& [value, in] : cases) {
      CAPTURE(value);
      asio::io_context io;
      const auto [status, out, err] = test::run(io, listed_with("COHORT_ENTRY", value, in));
      INFO(err);
      CHECK_FALSE(status.success());
      CHECK(out.find("every rank of a function runs") == std::string::npos);
      CHECK(err.find("std::invalid_argument") != std::string::npos);
      CHECK(err.find(fmt::format("COHORT_ENTRY=\"{}\" names no arguments cohort wrote", value)) != std::string::npos);
      CHECK(err.find("rank -1") == std::string::npos);
    }
  }


  TEST_CASE("every rank of a function runs and the run succeeds") {
    for_each_method([](start_method method) {
      auto r = run_function(call(method, succeed), 4);
      CHECK(r.ok());
      REQUIRE(r.statuses.size() == 4);
      for (const auto& s : r.statuses) CHECK(s->success());
    });
  }

  // Before, spawn_and_join's own io_context threw asio's bare
  // "eventfd_select_interrupter: Too many open files" with a descriptor or
  // two left.
  TEST_CASE("spawn_and_join with few descriptors left runs or fails naming the limit") {
    for (int free = 0; free <= 8; ++free) {
      CAPTURE(free);
      bool ran = false;
      std::string failure;
      {
        const test::descriptors_left left(free);
        try {
          join_options options;
          options.method = start_method::fork;
          spawn_and_join(entry_tests::succeed, std::tuple{}, 2, options);  // throws where a rank failed
          ran = true;
        } catch (const std::system_error& e) {
          failure = e.what();
          CHECK(e.code() == std::error_code(EMFILE, std::system_category()));
          CHECK(failure.find(fmt::format("RLIMIT_NOFILE is {}", left.limit.current())) != std::string::npos);
        }
      }
      if (!ran) CHECK(failure.starts_with("cohort"));
    }
  }

  // Before, the environment's refusal came unnamed, where a program's rank
  // was named.
  TEST_CASE("a function's rank whose environment is refused is named, under every start method") {
    for_each_method([](start_method method) {
      group_spec spec;
      spec.entry = call(method, succeed);
      spec.nprocs = 3;
      spec.envs = {{0, {}}, {1, {}}, {2, {{"A=B", "1"}}}};
      try {
        run_group(spec);
        FAIL("the group started");
      } catch (const std::invalid_argument& e) {
        CHECK(std::string(e.what()) ==
              fmt::format("cohort: rank 2 of 'succeed' ({}): cohort::environment: bad variable name 'A=B': it holds '='",
                          to_string(method)));
      }
      CHECK(test::children_of_self().empty());
    });
  }

  TEST_CASE("two functions registered under one name are each refused by it, and say why") {
    const std::string why = "cohort: two different entry points are registered as 'work'";
    CHECK(refusal_of(shared_a::work) == why);
    CHECK(refusal_of(shared_b::work) == why);
    // A call made by hand names the one it means no better: its rank runs
    // neither, and says why. Before, it ran the first registered.
    for_each_method([&](start_method method) {
      function_call by_hand;
      by_hand.name = "work";
      by_hand.args = encode(std::tuple{});
      by_hand.method = method;
      const auto r = run_function(by_hand, 1);
      CHECK_FALSE(r.ok());
      REQUIRE(r.first_failure() != nullptr);
      CHECK(r.first_failure()->message.find(why.substr(std::string("cohort: ").size())) != std::string::npos);
    });
  }

  TEST_CASE("a rank gets a result file only when its function returns a value") {
    for_each_method([](start_method method) {
      CHECK(call(method, count_result_files).returns_value);
      CHECK_FALSE(call(method, refuse_result_files).returns_value);
      auto counted = run_function(call(method, count_result_files), 2);
      REQUIRE(counted.ok());
      for (const auto& value : counted.return_values) CHECK(value->as<int>() == 1);
      auto refused = run_function(call(method, refuse_result_files), 2);
      CHECK(refused.ok());
      for (const auto& value : refused.return_values) CHECK_FALSE(value.has_value());
    });
  }

  TEST_CASE("a rank's result file is close-on-exec: programs it runs do not get it, under every start method") {
    for_each_method([](start_method method) {
      const auto inherited = spawn_and_join(inherited_by_programs, std::tuple{}, 2, test::join_by(method));
      REQUIRE(inherited.size() == 2);
      for (const auto& names : inherited) {
        std::string listed;
        for (const auto& name : names) listed += name + ' ';
        CHECK(listed == "");
      }
    });
  }

  TEST_CASE("a rank whose error file has room for its message but not its trace reports the message") {
    for_each_method([](start_method method) {
      try {
        spawn_and_join(raise_with_little_room, std::tuple{}, 1, test::join_by(method));
        FAIL("no exception");
      } catch (const process_raised_error& e) {
        // The first report, written before the trace was known, stands.
        CHECK(e.message() == "std::runtime_error: the reason, deep down");
      } catch (const process_exited_error& e) {
        FAIL("the report was lost: " << std::string(e.what()));
      }
    });
  }

  TEST_CASE("spawn_and_join's own loop makes no io_uring ring: its exits wait on the reactor") {
    const int before = static_cast<int>(test::ring_descriptors(::getpid()).size());
    const join_options options{.method = start_method::fork};
    const auto seen = spawn_and_join(rings_of_parent, std::tuple{}, 1, options);
    REQUIRE(seen.size() == 1);
    CHECK(seen[0] == before);
  }

  TEST_CASE("a process that ignores SIGCHLD starts no rank, under any method, and is told why") {
    for_each_method([](start_method method) {
      for (const bool by_flag : {false, true}) {
        CAPTURE(by_flag);
        struct sigaction ignore {}, before {};
        ignore.sa_handler = by_flag ? SIG_DFL : SIG_IGN;
        ignore.sa_flags = by_flag ? SA_NOCLDWAIT : 0;
        REQUIRE(::sigaction(SIGCHLD, &ignore, &before) == 0);
        const join_options options{.method = method};
        CHECK_THROWS_WITH_AS(spawn_and_join(succeed, std::tuple{}, 2, options), doctest::Contains("ignores SIGCHLD"),
                             std::logic_error);
        ::sigaction(SIGCHLD, &before, nullptr);
        CHECK(test::children_of_self().empty());
      }
    });
  }

  TEST_CASE("every method's ranks ignore the signals, and take the limits, nice value and CPUs, of the moment") {
    // The forkserver runs by now, started with this process's state of then:
    // its ranks must not take its own.
    REQUIRE(spawn_and_join(rank_itself, std::tuple{}, 1, test::join_by(start_method::forkserver)).size() == 1);
    struct sigaction ignore {}, before {};
    ignore.sa_handler = SIG_IGN;
    REQUIRE(::sigaction(SIGUSR2, &ignore, &before) == 0);
    rlimit nofile{};
    REQUIRE(::getrlimit(RLIMIT_NOFILE, &nofile) == 0);
    const rlimit lowered{nofile.rlim_cur - 7, nofile.rlim_max};
    REQUIRE(::setrlimit(RLIMIT_NOFILE, &lowered) == 0);
    std::string expected;
    std::vector<std::string> seen;
    // Nice value and affinity are the thread's: changed in one of its own.
    std::thread own([&] {
      REQUIRE(::setpriority(PRIO_PROCESS, 0, ::getpriority(PRIO_PROCESS, 0) + 3) == 0);
      cpu_set_t cpus;
      CPU_ZERO(&cpus);
      REQUIRE(::sched_getaffinity(0, sizeof cpus, &cpus) == 0);
      for (int cpu = 0, kept = 0; cpu < CPU_SETSIZE; ++cpu) {
        if (CPU_ISSET(cpu, &cpus) && kept++ > 0) CPU_CLR(cpu, &cpus);  // the first allowed alone
      }
      REQUIRE(::sched_setaffinity(0, sizeof cpus, &cpus) == 0);
      expected = inherited_state(0);
      for (start_method method : all_methods) {
        const join_options options{.method = method};
        seen.push_back(spawn_and_join(inherited_state, std::tuple{}, 1, options).at(0));
      }
    });
    own.join();
    ::setrlimit(RLIMIT_NOFILE, &nofile);
    ::sigaction(SIGUSR2, &before, nullptr);
    CHECK(expected.find("SIGUSR2 ignored") == 0);
    CHECK(expected.find(", 1 CPUs") != std::string::npos);
    REQUIRE(seen.size() == std::size(all_methods));
    for (std::size_t i = 0; i < std::size(all_methods); ++i) {
      CAPTURE(to_string(all_methods[i]));
      CHECK(seen[i] == expected);
    }
  }

  TEST_CASE("every method starts its ranks in the parent's working directory and umask of the moment") {
    // The forkserver runs by now (started here, in this directory, with
    // this umask): its ranks must not take its own.
    REQUIRE(spawn_and_join(rank_itself, std::tuple{}, 1, test::join_by(start_method::forkserver)).size() == 1);
    test::temp_dir elsewhere;
    const auto home = std::filesystem::current_path();
    std::filesystem::current_path(elsewhere.path);
    const mode_t mask = ::umask(027);
    std::filesystem::create_directory(elsewhere.path / "sub");
    std::vector<std::string> seen, in_sub, in_thread;
    for (start_method method : all_methods) {
      join_options options{.method = method};
      seen.push_back(spawn_and_join(where_and_umask, std::tuple{}, 1, options).at(0));
      options.spawn.cwd = "sub";  // relative: to the caller's directory
      in_sub.push_back(spawn_and_join(where_and_umask, std::tuple{}, 1, options).at(0));
    }
    // A thread with a umask of its own (its own fs_struct): its ranks get it.
    std::thread own([&] {
      REQUIRE(::unshare(CLONE_FS) == 0);
      ::umask(077);
      for (start_method method : all_methods) {
        const join_options options{.method = method};
        in_thread.push_back(spawn_and_join(where_and_umask, std::tuple{}, 1, options).at(0));
      }
    });
    own.join();
    ::umask(mask);
    std::filesystem::current_path(home);
    const auto there = std::filesystem::canonical(elsewhere.path).string();
    for (std::size_t i = 0; i < std::size(all_methods); ++i) {
      CAPTURE(to_string(all_methods[i]));
      CHECK(seen[i] == there + " 27");
      CHECK(in_sub[i] == there + "/sub 27");
      CHECK(in_thread.at(i) == there + " 77");
    }
  }

  TEST_CASE("a function rank leads a session of its own with new_session, under every start method") {
    for (start_method method : all_methods) {
      CAPTURE(to_string(method));
      join_options options{.method = method};
      CHECK(spawn_and_join(leads, std::tuple{}, 1, options).at(0) != "0 0");  // a group, in this session
      options.spawn.new_session = true;
      CHECK(spawn_and_join(leads, std::tuple{}, 1, options).at(0) == "0 0");
    }
  }

  TEST_CASE("from a directory whose path is over PATH_MAX, every method starts its ranks there and their reports arrive") {
    // No rank could enter it by name (the forkserver's enter it by
    // descriptor), and a relative error_dir stays relative: its absolute
    // path is too long to use.
    REQUIRE(spawn_and_join(rank_itself, std::tuple{}, 1, test::join_by(start_method::forkserver)).size() == 1);
    test::temp_dir top;
    const auto home = std::filesystem::current_path();
    std::filesystem::current_path(top.path);
    const std::string part(200, 'd');
    int depth = 0;
    for (; depth < 25; ++depth) {
      REQUIRE(::mkdir(part.c_str(), 0700) == 0);
      REQUIRE(::chdir(part.c_str()) == 0);
    }
    const std::string inside = std::filesystem::current_path().string();
    REQUIRE(inside.size() > PATH_MAX);
    std::vector<std::string> said;
    for (start_method method : all_methods) {
      join_options options{.method = method};
      const auto where = spawn_and_join(where_and_umask, std::tuple{}, 1, options).at(0);
      said.push_back(where.substr(0, where.rfind(' ')));
      options.error_dir = "errors";
      try {
        spawn_and_join(raise_on, std::tuple{0}, 1, options);
        said.push_back("no failure");
      } catch (const std::exception& e) {
        said.push_back(std::string(e.what()).find("legitimate exception from rank 0") != std::string::npos ? "reported"
                                                                                                       : e.what());
      }
      std::filesystem::remove_all("errors");
    }
    for (; depth > 0; --depth) {
      REQUIRE(::chdir("..") == 0);
      REQUIRE(::rmdir(part.c_str()) == 0);
    }
    std::filesystem::current_path(home);
    for (std::size_t i = 0; i < std::size(all_methods); ++i) {
      CAPTURE(to_string(all_methods[i]));
      CHECK(said[2 * i] == inside);
      CHECK(said[2 * i + 1] == "reported");
    }
  }

  TEST_CASE("the first argument is the rank, and what a rank returns reaches the parent") {
    for_each_method([](start_method method) {
      auto r = run_function(call(method, rank_itself), 5);
      REQUIRE(r.ok());
      REQUIRE(r.return_values.size() == 5);
      for (int rank = 0; rank < 5; ++rank) CHECK(r.return_values[static_cast<std::size_t>(rank)]->as<int>() == rank);
    });
  }

  // A fork launch hands its first ranks their plans from its own frame and
  // the rest from the heap: every rank, past the first eight too, must run
  // as itself, with its own environment, and return through its own file.
  TEST_CASE("twenty forked ranks each run as themselves, with their own environment and result") {
    join_options options;
    options.method = start_method::fork;
    const auto seen = spawn_and_join(rank_and_error_file, std::tuple{}, 20, options);
    REQUIRE(seen.size() == 20);
    std::set<std::string> files;
    for (int rank = 0; rank < 20; ++rank) {
      const auto& line = seen[static_cast<std::size_t>(rank)];
      CAPTURE(line);
      const auto space = line.find(' ');
      REQUIRE(space != std::string::npos);
      CHECK(line.substr(0, space) == std::to_string(rank));
      const auto file = line.substr(space + 1);
      CHECK(file.ends_with(fmt::format("-{}.json", rank)));
      files.insert(file);
    }
    CHECK(files.size() == 20);
  }

  TEST_CASE("arguments cross whole: strings with NULs, vectors and a megabyte of bytes") {
    for_each_method([](start_method method) {
      std::string text("a\0b", 3);
      std::vector<std::byte> big(1 << 20, std::byte{7});
      auto values = spawn_and_join(describe_args, std::tuple{text, std::vector<int>{1, 2, 3}, big}, 2,
                                   test::join_by(method));
      REQUIRE(values.size() == 2);
      CHECK(values[0] == fmt::format("0:{}:6:{}", text, big.size()));
      CHECK(values[1] == fmt::format("1:{}:6:{}", text, big.size()));
    });
  }

  TEST_CASE("a non-blocking join reports false until every rank has ended") {
    for_each_method([](start_method method) {
      test::temp_dir dir;
      group_spec spec;
      spec.entry = call(method, end_or_wait_for_release, dir.path.string());
      spec.nprocs = 2;
      asio::io_context io;
      auto work = asio::make_work_guard(io);
      std::thread runner([&] { io.run(); });
      group g = start_processes(io.get_executor(), spec);
      const std::vector<pid_t> pids = g.pids();
      REQUIRE(pids.size() == 2);
      // Rank 0 ends and is reaped; rank 1 is held until released.
      const auto deadline = std::chrono::steady_clock::now() + 10s;
      while (::kill(pids[0], 0) == 0 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(5ms);
      CHECK(::kill(pids[0], 0) == -1);
      for (int poll = 0; poll < 5; ++poll) CHECK_FALSE(g.join(10ms));
      CHECK_FALSE(g.result().has_value());
      CHECK(::kill(pids[1], 0) == 0);
      std::ofstream{dir.path / "release"};
      CHECK(g.join(10s));
      REQUIRE(g.result().has_value());
      CHECK(g.result()->ok());
      CHECK(g.result()->statuses.size() == 2);
      CHECK(::kill(pids[1], 0) == -1);
      work.reset();
      runner.join();
    });
  }

  TEST_CASE("a rank's trace names the throwing function, its file and line, in a program linked to the shared library") {
    // tests/support/thrower.cpp: linked to libcohort.so, without -rdynamic.
    for_each_method([](start_method method) {
      asio::io_context io;
      const std::string text = test::run(io, output_of(test::thrower, {std::string(to_string(method))}));
      INFO(text);
      const auto newline = text.find('\n');
      REQUIRE(newline != std::string::npos);
      const std::string line = text.substr(0, newline);
      const std::string first = text.substr(newline + 1, text.find('\n', newline + 1) - newline - 1);
      CHECK(first.rfind("#0 thrower::throw_here(int)", 0) == 0);
      if (os::stack_has_source_lines()) CHECK(first.ends_with("support/thrower.cpp:" + line));
      CHECK(text.find("cohort::") == std::string::npos);
    });
  }

  TEST_CASE("an exception in one rank reaches the parent with rank, pid, type, message and trace") {
    for_each_method([](start_method method) {
      try {
        spawn_and_join(raise_on, std::tuple{1}, 2, test::join_by(method));
        FAIL("no exception");
      } catch (const process_raised_error& e) {
        CHECK(e.rank() == 1);
        CHECK(e.pid() > 0);
        CHECK(e.message() == "std::invalid_argument: legitimate exception from rank 1");
        const std::string what = e.what();
        CHECK(what.find(fmt::format("rank 1 (pid {}) raised std::invalid_argument: legitimate exception from rank 1", e.pid())) == 0);
        // The trace is taken where the exception was thrown.
        CHECK(e.trace().find("throw_legitimate") != std::string::npos);
        INFO(e.trace());
        CHECK(e.trace().rfind("#0 entry_tests::throw_legitimate(int)", 0) == 0);
        if (os::stack_has_source_lines()) {
          const std::string first = e.trace().substr(0, e.trace().find('\n'));
          CHECK(first.ends_with(fmt::format("launch/entry_point.cpp:{}", legitimate_throw_line)));
        }
        // It ends with the function: nothing of cohort's or libc's below it.
        CHECK(e.trace().find("cohort::") == std::string::npos);
        CHECK(e.trace().find("libcohort") == std::string::npos);
        CHECK(e.trace().find("libc.so") == std::string::npos);
      }
    });
  }

  TEST_CASE("a rank that calls std::terminate without an exception reports a trace that starts at its function") {
    for_each_method([](start_method method) {
      try {
        spawn_and_join(terminate_without_exception, std::tuple{}, 1, test::join_by(method));
        FAIL("no exception");
      } catch (const process_raised_error& e) {
        CHECK(e.message() == "std::terminate called without an exception");
        INFO(e.trace());
        // Neither the handler's frames nor the runtime's terminate above it.
        CHECK(e.trace().rfind("#0 entry_tests::terminate_without_exception(int)", 0) == 0);
        CHECK(e.trace().find("cohort::") == std::string::npos);
        CHECK(e.trace().find("libstdc++") == std::string::npos);
        CHECK(e.trace().find("terminate()") == std::string::npos);
      }
    });
  }

  // Before, the handler read the null what() into a string: the rank died
  // of SIGSEGV, with no report.
  TEST_CASE("a rank whose exception's what() is null reports its type") {
    for_each_method([](start_method method) {
      try {
        spawn_and_join(throw_null_what, std::tuple{}, 1, test::join_by(method));
        FAIL("no exception");
      } catch (const process_raised_error& e) {
        CHECK(e.message() == "entry_tests::null_what: ");
        CHECK(e.trace().rfind("#0 entry_tests::throw_null_what(int)", 0) == 0);
      }
    });
  }

  // Before, what() threw inside the handler, which then reported that
  // exception, with the handler's frames in its trace.
  TEST_CASE("a rank whose exception's what() throws reports its type and what that threw, with the trace of its throw") {
    for_each_method([](start_method method) {
      try {
        spawn_and_join(throw_what_throws, std::tuple{}, 1, test::join_by(method));
        FAIL("no exception");
      } catch (const process_raised_error& e) {
        CHECK(e.message() == "entry_tests::what_throws: (its what() threw std::runtime_error: what() itself failed)");
        INFO(e.trace());
        CHECK(e.trace().rfind("#0 entry_tests::throw_what_throws(int)", 0) == 0);
        CHECK(e.trace().find("cohort::") == std::string::npos);
        CHECK(e.trace().find("fail_to_say") == std::string::npos);
      }
    });
  }

  TEST_CASE("a rank's nested exception is reported by the types the program threw, each cause after it") {
    for_each_method([](start_method method) {
      try {
        spawn_and_join(throw_nested, std::tuple{}, 1, test::join_by(method));
        FAIL("no exception");
      } catch (const process_raised_error& e) {
        CHECK(e.message() ==
              "std::logic_error: training step 3; caused by std::runtime_error: reading batch 12; caused by int");
      }
    });
  }

  TEST_CASE("a terminate handler the program set stays, and its forked ranks still report an exception") {
    static std::atomic<int> own_handler_calls{0};
    const std::terminate_handler own = [] {
      own_handler_calls.fetch_add(1);
      std::_Exit(99);
    };
    const std::terminate_handler before = std::set_terminate(own);
    for (start_method method : {start_method::fork, start_method::forkserver}) {
      CAPTURE(to_string(method));
      try {
        spawn_and_join(raise_on, std::tuple{0}, 1, test::join_by(method));
        FAIL("no exception");
      } catch (const process_raised_error& e) {
        CHECK(e.message() == "std::invalid_argument: legitimate exception from rank 0");
      }
      const bool kept = std::get_terminate() == own;
      CHECK(kept);
    }
    std::set_terminate(before);
    CHECK(own_handler_calls.load() == 0);
  }

  TEST_CASE("outside a rank, the terminate handler forked ranks inherit does the runtime's default") {
    spawn_and_join(succeed, std::tuple{}, 1, test::join_by(start_method::fork));
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      const int null = ::open("/dev/null", O_WRONLY);
      ::dup2(null, 2);  // where the default says "terminate called without an active exception"
      std::terminate();
    }
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    // The default aborts; a rank's handler would have exited with code 1.
    CHECK(WIFSIGNALED(status));
    if (WIFSIGNALED(status)) CHECK(WTERMSIG(status) == SIGABRT);
  }

  TEST_CASE("when every rank raises, the first failure is one of them") {
    for_each_method([](start_method method) {
      auto r = run_function(call(method, raise_on, -1), 2);
      CHECK_FALSE(r.ok());
      // Whether the second raises before the first failure's SIGTERM
      // reaches it is a race; each failure reported is its own rank's.
      REQUIRE_FALSE(r.failures.empty());
      for (const auto& f : r.failures) {
        CHECK(f.message == fmt::format("std::invalid_argument: legitimate exception from rank {}", f.rank));
      }
      const auto* first = r.first_failure();
      REQUIRE(first != nullptr);
      CHECK_THROWS_AS(throw_first_failure(r), process_raised_error);
    });
  }

  TEST_CASE("a rank still reporting its exception when a later failure's shutdown comes is the first failure") {
    for_each_method([](start_method method) {
      for (auto* fn : {raise_slowly_then_exit, raise_slowly_beside_a_thread_then_exit}) {
        const std::string threads = fn == raise_slowly_then_exit ? "one thread" : "two threads";
        CAPTURE(threads);
        auto r = run_function(call(method, fn), 2);
        CHECK_FALSE(r.ok());
        const auto* first = r.first_failure();
        REQUIRE(first != nullptr);
        CHECK(first->rank == 1);
        CHECK(first->message.find("said late") != std::string::npos);
        CHECK_FALSE(first->trace.empty());
        CHECK(first->status.code() == 1);  // it finished its report: the shutdown's SIGTERM waited
        CHECK(r.failures.size() == 2);      // rank 0's exit is there too
      }
    });
  }

  TEST_CASE("an exception that is not a std::exception is reported by its type") {
    for_each_method([](start_method method) {
      auto r = run_function(call(method, throw_int), 1);
      REQUIRE(r.failures.size() == 1);
      CHECK(r.failures[0].message == "int");
      CHECK(r.failures[0].status.code() == 1);
    });
  }

  TEST_CASE("a rank killed by a signal gives process_exited_error naming the signal") {
    for_each_method([](start_method method) {
      try {
        spawn_and_join(signal_self, std::tuple{SIGABRT}, 2, test::join_by(method));
        FAIL("no exception");
      } catch (const process_exited_error& e) {
        CHECK(e.rank() == 0);
        CHECK(e.signal() == SIGABRT);
        CHECK(e.exit_code() == -1);
        CHECK(std::string(e.what()).find("killed by signal SIGABRT") != std::string::npos);
      }
    });
  }

  TEST_CASE("a rank that exits 0 inside a function returning a value fails with its exit, saying so, rather than leave "
            "no result") {
    for_each_method([](start_method method) {
      try {
        spawn_and_join(exits_zero_before_returning, std::tuple{}, 2, test::join_by(method));
        FAIL("no exception");
      } catch (const process_exited_error& e) {  // nothing was raised: the rank exited, too early
        CHECK(e.rank() == 1);
        CHECK(e.exit_code() == 0);
        CHECK(e.signal() == 0);
        CHECK(std::string(e.what()).find("exited with code 0 before its function returned (exit() inside it?)") !=
              std::string::npos);
      }
    });
  }

  TEST_CASE("a rank exiting non-zero gives process_exited_error with the code") {
    for_each_method([](start_method method) {
      try {
        spawn_and_join(exit_with, std::tuple{123}, 2, test::join_by(method));
        FAIL("no exception");
      } catch (const process_exited_error& e) {
        CHECK(e.rank() == 0);
        CHECK(e.exit_code() == 123);
        CHECK(std::string(e.what()) == fmt::format("rank 0 (pid {}) exited with code 123", e.pid()));
      }
    });
  }

  TEST_CASE("a rank SIGKILL leaves unreaped is reported, not waited for, and reaped once it can be") {
    // A tracer that never waits holds rank 0's exit from this process (see
    // exit_holder) past the shutdown's SIGKILL, for 20 s at most.
    test::temp_dir dir;
    std::optional<test::exit_holder> holder;
    std::thread tracer([&] {
      for (int i = 0; i < 3000 && !fs::exists(dir.path / "pid"); ++i) std::this_thread::sleep_for(10ms);
      pid_t pid = 0;
      std::ifstream(dir.path / "pid") >> pid;
      if (pid > 0) holder.emplace(pid);
      std::ofstream(dir.path / "asked");
    });
    join_options options;
    options.shutdown.term_grace = 200ms;
    options.shutdown.kill_wait = 200ms;
    const auto start = std::chrono::steady_clock::now();
    try {
      spawn_and_join(traceable_then_fail, std::tuple{dir.path.string()}, 2, options);
      FAIL("no exception");
    } catch (const process_raised_error& e) {
      CHECK(e.rank() == 1);
    }
    const auto took = std::chrono::steady_clock::now() - start;
    tracer.join();
    REQUIRE(holder);
    if (!holder->held()) {
      MESSAGE("ptrace is refused here: not checked");
      return;
    }
    CHECK(took < 10s);  // it waited the holder's 20 s
    CHECK(test::children_of_self().size() == 2);  // the holder, and rank 0 unreaped
    holder->end();
    const auto deadline = std::chrono::steady_clock::now() + 5s;
    while (!test::children_of_self().empty() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(10ms);
    }
    CHECK(test::children_of_self().empty());
  }

  TEST_CASE("an exit seen first is the first failure, though a later exception's error file has a timestamp") {
    for_each_method([](start_method method) {
      shutdown_policy shutdown;
      shutdown.grace = 10s;  // rank 1 raises on its own, before any signal
      const auto r = run_function(call(method, exit_then_raise), 2, shutdown);
      REQUIRE(r.failures.size() == 2);
      const auto* first = r.first_failure();
      REQUIRE(first != nullptr);
      CHECK(first->rank == 0);
      CHECK(first->status.code() == 3);
      CHECK_THROWS_AS(throw_first_failure(r), process_exited_error);
    });
  }

  TEST_CASE("a rank that succeeds first does not hide a later exception") {
    for_each_method([](start_method method) {
      CHECK_THROWS_AS(spawn_and_join(succeed_then_raise, std::tuple{}, 2, test::join_by(method)),
                      process_raised_error);
    });
  }

  TEST_CASE("a nested group dies with its parent's run: no process of either survives") {
    for_each_method([](start_method method) {
      test::temp_dir dir;
      group_spec spec;
      spec.entry = call(method, start_nested, dir.path.string(), static_cast<int>(method));
      spec.nprocs = 1;
      spec.shutdown.term_grace = 5s;
      asio::io_context io;
      auto r = test::run(io, [&]() -> asio::awaitable<run_result> {
        group g = co_await start_processes(spec);
        // Stop once both nested ranks have started.
        asio::steady_timer tick(co_await asio::this_coro::executor);
        for (int i = 0; i < 2000 && files_in(dir.path) < 2; ++i) {
          tick.expires_after(5ms);
          co_await tick.async_wait(asio::use_awaitable);
        }
        g.stop();
        co_return co_await g.wait();
      }());
      CHECK(r.stopped);
      REQUIRE(files_in(dir.path) == 2);
      for (const auto& e : fs::directory_iterator(dir.path)) {
        const pid_t pid = std::stoi(e.path().filename().string().substr(2));
        CHECK_FALSE(test::alive(pid));
      }
      CHECK(test::children_of_self().empty());  // nor a zombie handed to this subreaper
    });
  }

  TEST_CASE("a function rank gets its error file and the group's environment") {
    for_each_method([](start_method method) {
      group_spec spec;
      spec.entry = call(method, environment_of, std::string("COHORT_ERROR_FILE"));
      spec.nprocs = 2;
      spec.envs = {{0, {{"ONLY", "0"}}}, {1, {{"ONLY", "1"}}}};
      spec.error_dir = test::temp_dir().path;  // removed at once: re-created by the run
      asio::io_context io;
      auto r = test::run(io, [&]() -> asio::awaitable<run_result> {
        group g = co_await start_processes(spec);
        co_return co_await g.wait();
      }());
      REQUIRE(r.ok());
      CHECK(r.return_values[1]->as<std::string>() == (spec.error_dir / "1" / "error.json").string());
      fs::remove_all(spec.error_dir);
      auto only = run_function(call(method, environment_of, std::string("COHORT_ENTRY")), 1);
      CHECK(only.return_values[0]->as<std::string>() == "<unset>");
    });
  }

  TEST_CASE("what a function prints reaches its stdout, and the parent's unwritten output does not") {
    for_each_method([](start_method method) {
      std::fputs("unwritten text of the parent", stdout);  // buffered: no newline, no flush
      const auto text = output_of_one_rank(call(method, print_rank));
      std::fputs("\n", stdout);
      std::fflush(stdout);
      CHECK(text == "rank 0\n");
    });
  }

  TEST_CASE("what a rank leaves in any standard stream's buffer is written at its end") {
    for_each_method([](start_method method) {
      CHECK(output_of_one_rank(call(method, print_through_own_cout_buffer)) == "rank 0\n");
      CHECK(output_of_one_rank(call(method, print_wide)) == "rank 0\n");
      test::temp_dir dir;
      group_spec raising;
      raising.entry = call(method, print_through_own_cout_buffer_then_raise);
      raising.options.out = stdio::file(dir.path / "raised");
      const auto raised = run_group(raising);
      REQUIRE(raised.first_failure() != nullptr);
      CHECK(raised.first_failure()->message.find("after printing") != std::string::npos);
      CHECK(test::read_file(dir.path / "raised") == "rank 0\n");
      group_spec spec;
      spec.entry = call(method, print_to_buffered_stderr);
      spec.nprocs = 1;
      spec.options.err = stdio::file(dir.path / "err");
      REQUIRE(run_group(spec).ok());
      CHECK(test::read_file(dir.path / "err") == "rank 0\n");
    });
  }

  TEST_CASE("stderr as stdout goes where the rank's stdout goes, for every start method") {
    for_each_method([](start_method method) {
      test::temp_dir dir;
      group_spec spec;
      spec.entry = call(method, print_to_both);
      spec.nprocs = 1;
      spec.options.out = stdio::file(dir.path / "out");
      spec.options.err = stdio::same_as_stdout();
      REQUIRE(run_group(spec).ok());
      CHECK(test::read_file(dir.path / "out") == "out 0\nerr 0\n");
    });
  }

  TEST_CASE("output the parent had buffered is written before a forked rank starts, once") {
    test::temp_dir dir;
    const fs::path out = dir.path / "out";
    run_result r;
    {
      const stdout_onto file(::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
      std::fputs("the parent's text, ", stdout);  // a file: fully buffered, unwritten
      group_spec spec;
      spec.entry = call(start_method::fork, print_rank);
      spec.nprocs = 1;  // stdout inherited: the same file
      r = run_group(spec);
    }
    REQUIRE(r.ok());
    CHECK(test::read_file(out) == "the parent's text, rank 0\n");
  }

  TEST_CASE("text buffered between the flush and the fork is the parent's alone to write") {
    test::temp_dir dir;
    const fs::path out = dir.path / "out";
    run_result r;
    {
      const stdout_onto file(::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
      group_spec spec;
      spec.entry = call(start_method::fork, succeed);
      spec.nprocs = 2;
      buffer_at_fork = true;
      r = run_group(spec);
      buffer_at_fork = false;
    }  // the parent's "X" of each fork is written here
    REQUIRE(r.ok());
    CHECK(test::read_file(out) == "XX");
  }

  TEST_CASE("a fork start survives a std::cout set to throw whose stdout refuses writes") {
    run_result r;
    {
      const stdout_onto refusing(::open("/dev/null", O_RDONLY | O_CLOEXEC));  // writes fail with EBADF
      std::fputs("text that cannot be written", stdout);
      const auto mask = std::cout.exceptions();
      std::cout.exceptions(std::ios::badbit);
      r = run_function(call(start_method::fork, rank_itself), 2);
      std::cout.exceptions(mask);
      std::cout.clear();
    }
    REQUIRE(r.ok());
    CHECK(r.return_values[1]->as<int>() == 1);
  }

  TEST_CASE("exit handlers run in spawned ranks only; forked ones end with _exit") {
    for_each_method([](start_method method) {
      CHECK(output_of_one_rank(call(method, print_with_exit_handler)) ==
            (method == start_method::spawn ? "rank 0\nexit handler\n" : "rank 0\n"));
    });
  }

  TEST_CASE("a return value read as another type is refused") {
    auto r = run_function(call(start_method::fork, rank_itself), 1);
    REQUIRE(r.return_values[0]);
    CHECK_THROWS_AS(r.return_values[0]->as<std::string>(), decode_error);
  }

  TEST_CASE("a function that is not registered cannot be called") {
    CHECK_THROWS_AS(call(+[](int) {}), std::logic_error);
  }

  TEST_CASE("re-executing start methods refuse a program whose main does not call child_main") {
    for (const char* method : {"spawn", "forkserver"}) {
      CAPTURE(method);
      asio::io_context io;
      spawn_options options{.out = stdio::pipe()};
      child c = spawn(io.get_executor(), command(test::target, {"spawn-function", method}), options);
      std::string text;
      auto status = test::run(io, [&]() -> asio::awaitable<exit_status> {
        text = co_await test::read_all(c.out());
        co_return co_await c.wait();
      }());
      CHECK(status.code() == 3);
      CHECK(text.find(fmt::format("the {} start method re-executes this program, whose main must call "
                                  "cohort::child_main(argc, argv) first", method)) != std::string::npos);
    }
    CHECK(run(command(test::target, {"spawn-function", "fork"})).code() == 0);  // fork needs no re-execution
  }

  TEST_CASE("a program run by the dynamic loader (ld.so ./program) runs its ranks by every start method") {
    const std::string loader = program_interpreter();
    if (loader.empty() || ::access(loader.c_str(), X_OK) != 0) {
      MESSAGE("skipped: no dynamic loader to run (" << loader << ")");
      return;
    }
    // By a path relative to its directory, which the loader's command line
    // holds as it was written.
    const fs::path target = test::target;
    for (const std::string method : {"spawn", "forkserver", "fork"}) {
      CAPTURE(method);
      asio::io_context io;
      spawn_options options{.cwd = target.parent_path(), .out = stdio::pipe()};
      const command cmd(loader, {"./" + target.filename().string(), "run-function", method});
      child c = spawn(io.get_executor(), cmd, options);
      std::string text;
      auto status = test::run(io, [&]() -> asio::awaitable<exit_status> {
        text = co_await test::read_all(c.out());
        co_return co_await c.wait();
      }());
      CHECK(text == "40\n41\n");
      CHECK(status.code() == 0);
    }
  }

  // Before, only the program's path was made absolute: the loader's own
  // options that name paths (--library-path, --preload) were given again
  // as written, relative to a directory the ranks no longer start in.
  TEST_CASE("a program run by the loader with relative paths in its options runs its ranks elsewhere with them") {
    const std::string loader = program_interpreter();
    if (loader.empty() || ::access(loader.c_str(), X_OK) != 0) {
      MESSAGE("skipped: no dynamic loader to run (" << loader << ")");
      return;
    }
    const fs::path target = test::target;
    // The build's folder, which holds the library beside the tests' folder.
    const fs::path library = target.parent_path().parent_path() / "libcohort.so.0";
    REQUIRE(fs::exists(library));
    const fs::path from = library.parent_path();
    for (const std::string method : {"spawn", "forkserver", "fork"}) {
      CAPTURE(method);
      asio::io_context io;
      spawn_options options{.cwd = from, .out = stdio::pipe(), .err = stdio::pipe()};
      // The ranks start in "/", where none of the relative paths leads.
      const command cmd(loader, {"--library-path", ".", "--preload", "./libcohort.so.0",
                                 fs::relative(target, from).string(), "run-function", method, "/"});
      child c = spawn(io.get_executor(), cmd, options);
      std::string text, errors;
      auto status = test::run(io, [&]() -> asio::awaitable<exit_status> {
        auto err = asio::co_spawn(io, test::read_all(c.err()), asio::use_future);
        text = co_await test::read_all(c.out());
        auto code = co_await c.wait();
        errors = err.get();
        co_return code;
      }());
      CAPTURE(errors);
      CHECK(text == "40\n41\n");
      CHECK(status.code() == 0);
      CHECK(errors.find("cannot be preloaded") == std::string::npos);
    }
  }

  TEST_CASE("a rank whose main goes on past child_main's exit code cannot start ranks of its own") {
    asio::io_context io;
    spawn_options options{.out = stdio::pipe()};
    child c = spawn(io.get_executor(), command(test::target, {"ignore-child-main"}), options);
    std::string text;
    auto status = test::run(io, [&]() -> asio::awaitable<exit_status> {
      text = co_await test::read_all(c.out());
      co_return co_await c.wait();
    }());
    CAPTURE(text);
    CHECK(status.code() == 3);
    // The rank's own start was refused, and its error reached the top.
    CHECK(text.find("rank 0 of 'does_nothing'") != std::string::npos);
    CHECK(text.find("this process already ran a function through cohort::child_main, whose exit code its main must "
                    "return") != std::string::npos);
  }

  TEST_CASE("a process that initialised CUDA refuses fork starts, saying to use spawn or forkserver, which still start "
            "(test_wrong_cuda_fork, test_cuda_bad_call)") {
    // In a rank of its own: this process never loads the driver.
    auto said = spawn_and_join(starts_around_cuda_init, std::tuple{test::fake_libcuda}, 1);
    REQUIRE(said.size() == 1);
    CHECK(said[0] ==
          "fork: started\n"  // the driver loaded, not initialised
          "fork: cohort: rank 0 of 'succeed' (fork): this process has initialised CUDA, which a forked child "
          "cannot use; use the spawn or forkserver start method\n"
          "spawn: started\n"
          "forkserver: started\n");
  }

  TEST_CASE("args per rank are refused for a function entry") {
    group_spec spec;
    spec.entry = call(succeed);
    spec.nprocs = 1;
    spec.args = {{0, {"x"}}};
    asio::io_context io;
    CHECK_THROWS_AS(start_processes(io.get_executor(), spec), std::invalid_argument);
  }

  TEST_CASE("a pipe in spawn_and_join's streams is refused, naming join_options") {
    join_options options;
    options.spawn.out = stdio::pipe();
    CHECK_THROWS_WITH_AS(spawn_and_join(succeed, std::tuple{}, 1, options),
                         "cohort::spawn_and_join: join_options::spawn.out is a pipe, which nothing reads for the "
                         "ranks; use a file, stdio::null() or stdio::fd()",
                         std::invalid_argument);
    options.spawn.out = stdio::inherit();
    options.spawn.in = stdio::pipe();
    CHECK_THROWS_WITH_AS(spawn_and_join(succeed, std::tuple{}, 1, options),
                         doctest::Contains("join_options::spawn.in is a pipe, which nothing writes"),
                         std::invalid_argument);
  }

  TEST_CASE("a rank that cannot be prepared stops the start: no process, no descriptor left") {
    for_each_method([](start_method method) {
      group_spec spec;
      spec.entry = call(method, record_pid_and_sleep, std::string("/nonexistent"));
      spec.nprocs = 4;
      spec.envs = {{0, {}}, {1, {}}, {2, {{"BAD=NAME", "x"}}}, {3, {}}};
      asio::io_context io;
      run_once(io, method);  // the descriptors that stay with io and the process are open now
      const int fds_before = test::open_fd_count();
      CHECK_THROWS_AS(start_processes(io.get_executor(), spec), std::invalid_argument);
      CHECK(test::open_fd_count() == fds_before);
      CHECK(test::children_of_self().empty());
    });
  }

  TEST_CASE("spawn ranks started by several threads at once outlive those threads and return their own values") {
    group_spec spec;
    spec.entry = call(start_method::spawn, rank_after_a_while);
    spec.nprocs = 8;
    spec.start_threads = 4;  // ranks made by pool threads: their parent-death signal must not fire
    asio::io_context io;
    auto r = test::run(io, [&]() -> asio::awaitable<run_result> {
      group g = co_await start_processes(spec);
      co_return co_await g.wait();
    }());
    CHECK(r.ok());
    for (int rank = 0; rank < 8; ++rank) {
      REQUIRE(r.return_values[static_cast<std::size_t>(rank)]);
      CHECK(r.return_values[static_cast<std::size_t>(rank)]->as<int>() == rank * 10);
    }
  }

  TEST_CASE("a handler of the parent's does not run in a rank: the signal acts as by default") {
    struct sigaction handler{}, old{};
    handler.sa_handler = [](int) {};
    REQUIRE(::sigaction(SIGUSR1, &handler, &old) == 0);
    for_each_method([](start_method method) {
      try {
        spawn_and_join(signal_self, std::tuple{SIGUSR1}, 2, test::join_by(method));
        FAIL("no exception");
      } catch (const process_exited_error& e) {
        CHECK(e.rank() == 0);
        CHECK(e.signal() == SIGUSR1);
      }
    });
    ::sigaction(SIGUSR1, &old, nullptr);
  }

  TEST_CASE("a forked rank starts groups of its own by every method: the parent's server and pool are not its") {
    // Used here first, so the forked ranks inherit copies of them.
    REQUIRE(run_function(call(start_method::forkserver, rank_itself), 2).ok());
    REQUIRE(run_function(call(start_method::spawn, rank_itself), 4).ok());
    for (start_method inner : all_methods) {
      CAPTURE(to_string(inner));
      auto r = run_function(call(start_method::fork, sum_of_inner, static_cast<int>(inner)), 2);
      REQUIRE(r.ok());
      for (const auto& value : r.return_values) CHECK(value->as<int>() == 0 + 2 + 4);
    }
    // A rank's own forkserver ends with the rank: no orphan, not even a
    // zombie, is handed to this subreaper.
    CHECK(test::children_of_self().empty());
  }

  TEST_CASE("keep_fds reach the ranks at the same numbers, through every start method") {
    for_each_method([](start_method method) {
      int ends[2];
      REQUIRE(::pipe2(ends, O_CLOEXEC) == 0);
      // A number that the forkserver's own descriptors may well hold.
      const int kept = ::fcntl(ends[1], F_DUPFD_CLOEXEC, 7);
      ::close(ends[1]);
      join_options options{.method = method};
      options.spawn.keep_fds = {kept};
      spawn_and_join(write_rank_to, std::tuple{kept}, 3, options);
      ::close(kept);
      std::string text;
      char buf[64];
      for (ssize_t n; (n = ::read(ends[0], buf, sizeof buf)) > 0;) text.append(buf, static_cast<std::size_t>(n));
      ::close(ends[0]);
      std::sort(text.begin(), text.end());
      CHECK(text == "\n\n\n012");
    });
  }

  TEST_CASE("keep_fds listed out of order and twice reach the ranks, through every start method") {
    for_each_method([](start_method method) {
      int first[2], second[2];
      REQUIRE(::pipe2(first, O_CLOEXEC) == 0);
      REQUIRE(::pipe2(second, O_CLOEXEC) == 0);
      const int low = ::fcntl(first[1], F_DUPFD_CLOEXEC, 20);
      const int high = ::fcntl(second[1], F_DUPFD_CLOEXEC, 40);
      ::close(first[1]);
      ::close(second[1]);
      join_options options{.method = method};
      options.spawn.keep_fds = {high, low, high};
      spawn_and_join(write_rank_to_both, std::tuple{low, high}, 2, options);
      ::close(low);
      ::close(high);
      for (int end : {first[0], second[0]}) {
        std::string text;
        char buf[64];
        for (ssize_t n; (n = ::read(end, buf, sizeof buf)) > 0;) text.append(buf, static_cast<std::size_t>(n));
        ::close(end);
        std::sort(text.begin(), text.end());
        CHECK(text == "\n\n01");
      }
    });
  }

  TEST_CASE("many ranks each run as their own rank and get their keep_fds, through every start method") {
    for_each_method([](start_method method) {
      int ends[2];
      REQUIRE(::pipe2(ends, O_CLOEXEC) == 0);
      join_options options{.method = method};
      options.spawn.keep_fds = {ends[1]};
      // More ranks, with their descriptors, than one request to the
      // forkserver carries.
      constexpr int ranks = 70;
      spawn_and_join(write_rank_to, std::tuple{ends[1]}, ranks, options);
      ::close(ends[1]);
      std::string text;
      char buf[256];
      for (ssize_t n; (n = ::read(ends[0], buf, sizeof buf)) > 0;) text.append(buf, static_cast<std::size_t>(n));
      ::close(ends[0]);
      std::vector<int> seen;
      std::istringstream lines(text);
      for (int rank; lines >> rank;) seen.push_back(rank);
      std::sort(seen.begin(), seen.end());
      std::vector<int> all(ranks);
      for (int rank = 0; rank < ranks; ++rank) all[static_cast<std::size_t>(rank)] = rank;
      CHECK(seen == all);
    });
  }

  TEST_CASE("a forkserver that died since the last start is started again") {
    auto r = run_function(call(start_method::forkserver, rank_itself), 3);
    REQUIRE(r.ok());
    const pid_t server = forkserver_pid();
    REQUIRE(server > 0);
    REQUIRE(::kill(server, SIGKILL) == 0);
    while (test::alive(server)) std::this_thread::sleep_for(1ms);
    r = run_function(call(start_method::forkserver, rank_itself), 3);
    CHECK(r.ok());
    for (int rank = 0; rank < 3; ++rank) CHECK(r.return_values[static_cast<std::size_t>(rank)]->as<int>() == rank);
    CHECK(forkserver_pid() != server);
  }

  // Before, a start read the server's reply with no deadline: a server
  // stopped by SIGSTOP held that start, and every later one, for good.
  TEST_CASE("a forkserver that was stopped is ended and replaced, not waited on") {
    REQUIRE(run_function(call(start_method::forkserver, rank_itself), 1).ok());
    const pid_t server = forkserver_pid();
    REQUIRE(server > 0);
    REQUIRE(::kill(server, SIGSTOP) == 0);
    while (test::state_of(server) != 'T') std::this_thread::sleep_for(1ms);
    std::atomic<bool> over{false};
    bool resumed = false;  // by this test, after 20 s: the start was held
    std::thread watchdog([&] {
      for (int i = 0; i < 2000 && !over; ++i) std::this_thread::sleep_for(10ms);
      if (!over) resumed = ::kill(server, SIGCONT) == 0;
    });
    const auto r = run_function(call(start_method::forkserver, rank_itself), 3);
    over = true;
    watchdog.join();
    CHECK_FALSE(resumed);
    CHECK(r.ok());
    for (int rank = 0; rank < 3 && r.ok(); ++rank) {
      CHECK(r.return_values[static_cast<std::size_t>(rank)]->as<int>() == rank);
    }
    CHECK(forkserver_pid() != server);
    CHECK_FALSE(test::alive(server));  // ended and reaped
  }

  // Before, a fork or forkserver rank of a process whose standard stream
  // was closed got, at that stream's number, the descriptor of the
  // process's own that took it (close-on-exec: asio's eventfd, say), which
  // a spawned program never sees.
  TEST_CASE("a rank of a process whose standard stream is closed sees it closed, whatever took its number") {
    for (int stream = 0; stream < 3; ++stream) {
      CAPTURE(stream);
      const int code = test::exit_code_in_child([stream] {
        detail::stop_forkserver();  // this process's own, started with its streams as they are now
        const int other = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
        ::close(stream);
        if (other < 0 || ::fcntl(other, F_DUPFD_CLOEXEC, stream) != stream) return 2;
        for (start_method method : {start_method::spawn, start_method::fork, start_method::forkserver}) {
          const auto r = run_function(call(method, descriptor_open, stream), 2);
          if (!r.ok()) return 3;
          for (const auto& v : r.return_values) {
            if (v->as<int>() != 0) return 10 + static_cast<int>(method);
          }
          // stderr as stdout follows a closed stdout, closed too.
          join_options options{.method = method};
          options.spawn.err = stdio::same_as_stdout();
          if (stream == 1 && spawn_and_join(descriptor_open, std::tuple{2}, 1, options) != std::vector{0}) {
            return 20 + static_cast<int>(method);
          }
        }
        detail::stop_forkserver();
        return 0;
      });
      CHECK(code == 0);
    }
  }

  // Before, the forkserver's rank moved its descriptors under the server's
  // own descriptor limit, the one it started with: a kept descriptor
  // numbered above it failed the start with a bare "No child processes".
  TEST_CASE("a forkserver rank keeps a descriptor numbered above the limit the server started with") {
    const int code = test::exit_code_in_child([] {
      rlimit files{};
      if (::getrlimit(RLIMIT_NOFILE, &files) != 0 || files.rlim_max < 4096) return 77;
      files.rlim_cur = 1024;
      if (::setrlimit(RLIMIT_NOFILE, &files) != 0) return 77;
      detail::stop_forkserver();
      join_options options{.method = start_method::forkserver};
      (void)spawn_and_join(succeed, std::tuple{}, 1, options);  // the server starts under 1024
      files.rlim_cur = 4096;
      if (::setrlimit(RLIMIT_NOFILE, &files) != 0) return 77;
      const int high = ::fcntl(::open("/dev/null", O_RDONLY | O_CLOEXEC), F_DUPFD, 3000);
      if (high < 3000) return 2;
      options.spawn.keep_fds = {high};
      const auto seen = spawn_and_join(descriptor_open, std::tuple{high}, 2, options);
      detail::stop_forkserver();
      return seen == std::vector{1, 1} ? 0 : 3;
    });
    check_child_code(code, "the descriptor limit could not be raised to 4096 here: not checked");
  }

  // Before, the forkserver's rank moved every descriptor above the highest
  // number it was to keep: with one kept just below the open file limit
  // there was no number left, and the start failed with "Too many open
  // files" where spawn and fork kept it.
  TEST_CASE("a rank keeps a descriptor numbered just below the open file limit, through every start method") {
    const int code = test::exit_code_in_child([] {
      rlimit files{};
      if (::getrlimit(RLIMIT_NOFILE, &files) != 0) return 77;
      files.rlim_cur = std::min<rlim_t>(files.rlim_max, 512);
      if (::setrlimit(RLIMIT_NOFILE, &files) != 0) return 77;
      detail::stop_forkserver();  // the next one starts under this limit
      const int limit = static_cast<int>(files.rlim_cur);
      for (int below : {1, 4}) {
        const int high = ::dup2(::open("/dev/null", O_RDONLY | O_CLOEXEC), limit - below);
        if (high != limit - below) return 2;
        for (start_method method : all_methods) {
          join_options options{.method = method};
          options.spawn.keep_fds = {high};
          try {
            if (spawn_and_join(descriptor_open, std::tuple{high}, 2, options) != std::vector{1, 1}) return 3;
          } catch (const std::exception& e) {
            std::fprintf(stderr, "%s\n", e.what());
            return 10 + static_cast<int>(method);
          }
        }
      }
      detail::stop_forkserver();
      return 0;
    });
    CHECK(code == 0);
  }

  // Before, the forkserver's rank moved its descriptors above the numbers
  // the server had received them at: under a limit lowered since the server
  // started, the ranks whose descriptors it held above that limit failed
  // with "Too many open files".
  TEST_CASE("a forkserver started before the open file limit was lowered starts many ranks under the lower one") {
    const int code = test::exit_code_in_child([] {
      detail::stop_forkserver();
      const join_options options{.method = start_method::forkserver};
      (void)spawn_and_join(succeed, std::tuple{}, 1, options);  // the server starts under this limit
      const test::nofile_limit lowered(static_cast<rlim_t>(test::open_fd_count() + 64));
      constexpr int ranks = 20;
      std::vector<int> seen;
      try {
        seen = spawn_and_join(rank_itself, std::tuple{}, ranks, options);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 2;
      }
      for (int rank = 0; rank < ranks; ++rank) {
        if (seen.at(static_cast<std::size_t>(rank)) != rank) return 3;
      }
      detail::stop_forkserver();
      return 0;
    });
    CHECK(code == 0);
  }

  // Before, every message to the forkserver carried up to 253 descriptors,
  // whatever the server's limit: under a low hard limit, which the server
  // cannot raise, the start was refused with EMFILE.
  TEST_CASE("a forkserver under a low hard open file limit takes the ranks' kept descriptors a few ranks at a time") {
    const int code = test::exit_code_in_child([] {
      constexpr int ranks = 8;
      std::vector<int> kept;
      for (int i = 0; i < 10; ++i) kept.push_back(::open("/dev/null", O_RDONLY | O_CLOEXEC));
      rlimit files{};
      files.rlim_cur = files.rlim_max = static_cast<rlim_t>(test::open_fd_count() + 56);
      if (::setrlimit(RLIMIT_NOFILE, &files) != 0) return 77;
      detail::stop_forkserver();  // the next one starts under this limit
      join_options options{.method = start_method::forkserver};
      options.spawn.keep_fds = kept;
      try {
        if (spawn_and_join(descriptor_open, std::tuple{kept.back()}, ranks, options) != std::vector(ranks, 1)) return 3;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 2;
      }
      detail::stop_forkserver();
      return 0;
    });
    check_child_code(code, "the hard descriptor limit could not be lowered here: not checked");
  }

  // Before, a forkserver rank moved every descriptor it was sent clear of
  // the numbers it keeps, and left each kept one's source open once
  // placed: it needed about twice as many numbers as it kept, and under a
  // low open file limit failed with "Too many open files" where spawned
  // and forked ranks kept them all.
  TEST_CASE("a rank keeps nearly as many descriptors as the open file limit allows, through every start method") {
    const int code = test::exit_code_in_child([] {
      const int open_now = test::open_fd_count();
      const int count = std::min(open_now + 24, static_cast<int>(detail::max_kept));
      rlimit files{};
      files.rlim_cur = files.rlim_max = static_cast<rlim_t>(open_now + count + 24);
      if (::setrlimit(RLIMIT_NOFILE, &files) != 0) return 77;
      detail::stop_forkserver();  // the next one starts under this limit
      std::vector<int> kept;
      for (int i = 0; i < count; ++i) kept.push_back(::open("/dev/null", O_RDONLY | O_CLOEXEC));
      if (std::count(kept.begin(), kept.end(), -1) != 0) return 2;
      for (start_method method : all_methods) {
        join_options options{.method = method};
        options.spawn.keep_fds = kept;
        try {
          if (spawn_and_join(descriptors_open, std::tuple{kept}, 2, options) != std::vector{count, count}) return 3;
        } catch (const std::exception& e) {
          std::fprintf(stderr, "%s\n", e.what());
          return 10 + static_cast<int>(method);
        }
      }
      detail::stop_forkserver();
      return 0;
    });
    check_child_code(code, "the hard descriptor limit could not be lowered here: not checked");
  }

  // Before, a forkserver whose program had started a thread before main
  // (a library's static initialiser) cloned ranks all the same: a rank
  // cloned while that thread held a lock (malloc's, stdio's) hung on it
  // for good.
  TEST_CASE("a forkserver running a thread started before main refuses to start ranks, saying why") {
    const int code = test::exit_code_in_child([] {
      detail::stop_forkserver();
      ::setenv(thread_before_main_env, "1", 1);
      try {
        (void)spawn_and_join(rank_itself, std::tuple{}, 2, test::join_by(start_method::forkserver));
        return 2;
      } catch (const std::system_error& e) {
        const std::string what = e.what();
        const bool said = what.find("rank 0 of 'rank_itself' (forkserver)") != std::string::npos &&
                          what.find("more than one thread, started before main") != std::string::npos &&
                          what.find("use the spawn or fork start method") != std::string::npos;
        if (!said || e.code().value() != EDEADLK) {
          std::fprintf(stderr, "%s\n", what.c_str());
          return 3;
        }
      }
      if (!test::children_of_self().empty()) return 4;  // the server aside
      // A server started without that thread starts them.
      detail::stop_forkserver();
      ::unsetenv(thread_before_main_env);
      if (spawn_and_join(rank_itself, std::tuple{}, 2, test::join_by(start_method::forkserver)) != std::vector{0, 1}) {
        return 5;
      }
      detail::stop_forkserver();
      return 0;
    });
    CHECK(code == 0);
  }

  // Before, a start whose exec failed with E2BIG said only "Argument list
  // too long" for the forkserver's start and a spawned rank's
  // re-execution, where a spawn names the variable and the kernel's limit.
  TEST_CASE("an environment variable too long for an exec is named when the forkserver or a spawned rank cannot start") {
    const int code = test::exit_code_in_child([] {
      detail::stop_forkserver();
      ::setenv("COHORT_TEST_HUGE", std::string(200000, 'x').c_str(), 1);
      for (const auto& [method, step] : {std::pair{start_method::spawn, "re-executing /proc/self/exe: execve: "},
                                         std::pair{start_method::forkserver, "starting the forkserver: execve: "}}) {
        try {
          (void)spawn_and_join(succeed, std::tuple{}, 1, test::join_by(method));
          return 2;
        } catch (const std::system_error& e) {
          const std::string what = e.what();
          const bool said =
              what.find(fmt::format("rank 0 of 'succeed' ({}): {}environment variable COHORT_TEST_HUGE is 200018 bytes",
                                    to_string(method), step)) != std::string::npos &&
              what.find("(MAX_ARG_STRLEN)") != std::string::npos;
          if (!said || e.code().value() != E2BIG) {
            std::fprintf(stderr, "%s\n", what.c_str());
            return 3;
          }
        }
      }
      return test::children_of_self().empty() ? 0 : 4;
    });
    CHECK(code == 0);
  }

  // Before, a rank whose pidfd could not be opened (the descriptor limit
  // reached once the ranks were made) gave no word of what failed.
  TEST_CASE("a fork or forkserver rank whose pidfd cannot be opened says so") {
    for (start_method method : {start_method::fork, start_method::forkserver}) {
      CAPTURE(to_string(method));
      const int code = test::exit_code_in_child([method] {
        detail::stop_forkserver();
        (void)spawn_and_join(succeed, std::tuple{}, 1, test::join_by(method));  // the server's descriptors open now
        const test::nofile_limit low(static_cast<rlim_t>(test::open_fd_count() + 24));
        try {
          (void)spawn_and_join(succeed, std::tuple{}, 64, test::join_by(method));
          return 2;
        } catch (const std::system_error& e) {
          const std::string what = e.what();
          const bool said =
              what.find(fmt::format("({}): pidfd_open (open file limit RLIMIT_NOFILE is", to_string(method))) !=
              std::string::npos;
          if (!said || e.code().value() != EMFILE) {
            std::fprintf(stderr, "%s\n", what.c_str());
            return 3;
          }
        }
        detail::stop_forkserver();
        return test::children_of_self().empty() ? 0 : 4;
      });
      CHECK(code == 0);
    }
  }

  // Before, the forkserver cloned with clone3 alone: where that is refused
  // (ENOSYS from a kernel before 5.3, or from a container runtime's default
  // seccomp profile), every forkserver start failed.
  TEST_CASE("the forkserver starts ranks where clone3 is refused") {
    const int code = test::exit_code_in_child([] {
      if (!test::refuse_system_call(SYS_clone3, ENOSYS)) return 77;
      detail::stop_forkserver();  // the one this process started runs without the filter
      const auto r = run_function(call(start_method::forkserver, rank_with_own_tid), 3);
      if (!r.ok()) return 2;
      for (int rank = 0; rank < 3; ++rank) {
        if (r.return_values[static_cast<std::size_t>(rank)]->as<int>() != rank + 100) return 3;
      }
      detail::stop_forkserver();
      return 0;
    });
    check_child_code(code, "seccomp filters are refused here: not checked");
  }

  // Before, a fork or forkserver rank closed the descriptors it does not
  // keep with close_range alone: where that is refused (before Linux 5.9,
  // or by a container's seccomp profile), every such rank failed to start.
  TEST_CASE("fork and forkserver ranks start, holding no stray descriptor, where close_range is refused") {
    for (const auto method : {start_method::fork, start_method::forkserver}) {
      CAPTURE(method);
      const int code = test::exit_code_in_child([method] {
        if (!test::refuse_system_call(SYS_close_range, ENOSYS)) return 77;
        detail::stop_forkserver();  // the one this process started runs without the filter
        const int stray = ::open("/dev/null", O_RDONLY);  // inherited across fork and exec alike
        if (stray < 0) return 2;
        const auto r = run_function(call(method, descriptor_open, stray), 2);
        detail::stop_forkserver();
        if (!r.ok()) return 3;
        for (const auto& value : r.return_values) {
          if (value->as<int>() != 0) return 5;
        }
        return 0;
      });
      check_child_code(code, "seccomp filters are refused here: not checked");
    }
  }

  // Before, the function's stack was 8 MiB wherever RLIMIT_STACK was
  // unlimited (`ulimit -s unlimited`), where the caller's own recursion
  // had room: a rank going deeper died of SIGSEGV.
  TEST_CASE("a function rank has the stack room an unlimited RLIMIT_STACK gives, by every start method") {
    const int code = test::exit_code_in_child([] {
      const rlimit unlimited{RLIM_INFINITY, RLIM_INFINITY};
      if (::setrlimit(RLIMIT_STACK, &unlimited) != 0) return 77;
      detail::stop_forkserver();  // the next one starts under this limit
      int failed = 0;
      for (std::size_t i = 0; i < std::size(all_methods); ++i) {
        if (spawn_and_join(rank_after_deep_stack, std::tuple{24}, 1, test::join_by(all_methods[i])) != std::vector{0}) {
          failed = 10 + static_cast<int>(i);
        }
      }
      detail::stop_forkserver();
      return failed;
    });
    check_child_code(code, "RLIMIT_STACK could not be made unlimited here: not checked");
  }

  // Before, the arguments' and the result's memfds were written past
  // RLIMIT_FSIZE: SIGXFSZ ended the caller (arguments, spawn and
  // forkserver) or the rank (its result).
  TEST_CASE("arguments or a result longer than RLIMIT_FSIZE allows fail the start or the rank, naming the limit") {
    const int code = test::exit_code_in_child([] {
      const rlimit limit{std::size_t{1} << 20, RLIM_INFINITY};
      if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) return 77;
      detail::stop_forkserver();  // the next one starts under this limit
      const auto names_limit = [](auto&& run) {
        try {
          run();
          return false;
        } catch (const std::exception& e) {
          return std::string(e.what()).find("RLIMIT_FSIZE") != std::string::npos;
        }
      };
      const std::string long_text(std::size_t{2} << 20, 'x');
      int failed = 0;
      for (std::size_t i = 0; i < std::size(all_methods); ++i) {
        const auto options = test::join_by(all_methods[i]);
        if (all_methods[i] != start_method::fork &&
            !names_limit([&] { (void)spawn_and_join(size_of_text, std::tuple{long_text}, 1, options); })) {
          failed = 10 + static_cast<int>(i);
        }
        if (!names_limit([&] { (void)spawn_and_join(text_of_size, std::tuple{long_text.size()}, 1, options); })) {
          failed = 20 + static_cast<int>(i);
        }
      }
      detail::stop_forkserver();
      return failed;
    });
    check_child_code(code, "RLIMIT_FSIZE could not be set here: not checked");
  }

  // Before, the forkserver held the standard streams the caller had as it
  // started: a reader of the caller's stdout pipe saw no end of file while
  // the server lived, though the caller had let go of the pipe.
  TEST_CASE("the forkserver holds none of the caller's standard streams") {
    const int code = test::exit_code_in_child([] {
      int ends[2];
      if (::pipe2(ends, O_CLOEXEC) != 0) return 2;
      ::dup2(ends[1], 1);
      ::close(ends[1]);
      detail::stop_forkserver();
      if (spawn_and_join(rank_itself, std::tuple{}, 2, test::join_by(start_method::forkserver)) != std::vector{0, 1}) {
        return 3;
      }
      const int null = ::open("/dev/null", O_WRONLY);
      ::dup2(null, 1);  // this process lets go of the pipe; the server lives on
      ::close(null);
      pollfd readable{ends[0], POLLIN, 0};
      char byte = 0;
      const bool ended = ::poll(&readable, 1, 5000) == 1 && ::read(ends[0], &byte, 1) == 0;
      detail::stop_forkserver();
      return ended ? 0 : 4;
    });
    CHECK(code == 0);
  }

  // Before, a forkserver rank's stack had the size the server's limit gave
  // as it started: a caller that raised its RLIMIT_STACK since had ranks
  // die of SIGSEGV where fork and spawn ranks had room.
  TEST_CASE("a forkserver rank has the stack room of the caller's RLIMIT_STACK, raised since the server started") {
    const int code = test::exit_code_in_child([] {
      rlimit limit{};
      if (::getrlimit(RLIMIT_STACK, &limit) != 0 || (limit.rlim_max != RLIM_INFINITY && limit.rlim_max < (64u << 20))) {
        return 77;
      }
      limit.rlim_cur = 8u << 20;
      if (::setrlimit(RLIMIT_STACK, &limit) != 0) return 77;
      detail::stop_forkserver();
      const auto by_server = test::join_by(start_method::forkserver);
      if (spawn_and_join(rank_itself, std::tuple{}, 1, by_server) != std::vector{0}) return 2;  // the server starts
      limit.rlim_cur = 64u << 20;
      if (::setrlimit(RLIMIT_STACK, &limit) != 0) return 77;
      const auto ranks = spawn_and_join(rank_after_deep_stack, std::tuple{24}, 2, by_server);
      detail::stop_forkserver();
      return ranks == std::vector{0, 1} ? 0 : 3;
    });
    check_child_code(code, "RLIMIT_STACK could not be set here: not checked");
  }

  // A forkserver's ranks are its siblings, and their parent-death signal
  // follows the thread that started it. Before, that was the first caller's
  // thread: its end killed the server and the ranks of every other run.
  TEST_CASE("the end of the thread whose run started the forkserver ends neither it nor another thread's ranks") {
    detail::stop_forkserver();
    test::temp_dir dir;
    std::atomic<bool> served{false};
    std::thread first([&] {
      (void)spawn_and_join(rank_itself, std::tuple{}, 1, test::join_by(start_method::forkserver));
      served = true;
      // Ends once the ranks below are up.
      (void)test::within(10s, [&] { return fs::exists(dir.path / "0") && fs::exists(dir.path / "1"); }, 5ms);
    });
    REQUIRE(test::within(10s, [&] { return served.load(); }, 1ms));
    const pid_t server = forkserver_pid();
    std::vector<pid_t> pids;
    CHECK_NOTHROW(pids = spawn_and_join(note_up_then_sleep, std::tuple{dir.path.string(), 1000}, 2,
                                        test::join_by(start_method::forkserver)));
    first.join();
    CHECK(pids.size() == 2);
    CHECK(server > 0);
    CHECK(forkserver_pid() == server);
  }

  TEST_CASE("a forkserver killed while it makes a request's ranks leaves no rank it did not name") {
    // The ranks are children of the thread that started the server
    // (CLONE_PARENT), as the server is.
    const auto children_now = [] {
      std::ptrdiff_t n = 0;
      for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
        std::ifstream list(task.path() / "children");
        n += std::distance(std::istream_iterator<pid_t>(list), std::istream_iterator<pid_t>());
      }
      return n;
    };
    int cut = 0;  // runs in which the start saw the server die
    for (int run = 0; run < 5 && cut == 0; ++run) {
      REQUIRE(run_function(call(start_method::forkserver, rank_itself), 1).ok());
      const pid_t server = forkserver_pid();
      REQUIRE(server > 0);
      test::temp_dir dir;
      group_spec spec;
      spec.entry = call(start_method::forkserver, wait_for_release, dir.path.string());
      spec.nprocs = 150;  // more than one request carries
      std::atomic<bool> over{false};
      std::thread killer([&] {  // kills the server once it has made a rank
        while (!over && children_now() < 2) {
        }
        if (!over) ::kill(server, SIGKILL);
      });
      bool failed = false;
      try {
        asio::io_context io;
        auto r = test::run(io, [&]() -> asio::awaitable<run_result> {
          group g = co_await start_processes(spec);
          over = true;
          std::ofstream{dir.path / "release"};
          co_return co_await g.wait();
        }());
        CHECK(r.ok());
      } catch (const std::system_error&) {
        failed = true;
      }
      over = true;
      killer.join();
      const pid_t now = forkserver_pid();
      if (failed || now != 0) ++cut;  // failed, or succeeded with a server started again
      auto left = test::children_of_self(true);
      // Killed after its last reply, the server is not noticed until the
      // next start, which reaps it: till then it is a zombie here.
      if (!failed && now == 0 && !test::alive(server)) std::erase(left, server);
      CHECK(left == (now != 0 ? std::vector<pid_t>{now} : std::vector<pid_t>{}));
    }
    CHECK(cut > 0);
  }

  TEST_CASE("running out of descriptors while starting names the rank and the limit, and leaves nothing") {
    for_each_method([](start_method method) {
      group_spec spec;
      spec.entry = call(method, rank_itself);
      spec.nprocs = 64;
      asio::io_context io;
      run_once(io, method);  // the descriptors that stay with io and the process are open now
      const int fds_before = test::open_fd_count();
      {
        test::nofile_limit low(static_cast<rlim_t>(fds_before + 24));
        try {
          start_processes(io.get_executor(), spec);
          FAIL("no exception");
        } catch (const std::system_error& e) {
          INFO(std::string(e.what()));
          CHECK(e.code().value() == EMFILE);
          CHECK(std::string(e.what()).find(fmt::format("of 'rank_itself' ({})", to_string(method))) != std::string::npos);
          CHECK(std::string(e.what()).find("RLIMIT_NOFILE") != std::string::npos);
        }
      }
      CHECK(test::children_of_self().empty());
      CHECK(test::open_fd_count() == fds_before);
    });
  }

  TEST_CASE("a launch failure names the rank and the start method") {
    for_each_method([](start_method method) {
      join_options options{.method = method};
      options.spawn.cwd = "/nonexistent/directory";
      const auto e = start_failure(options, 2);
      CHECK(std::string(e.what()).find(fmt::format("rank 0 of 'succeed' ({})", to_string(method))) != std::string::npos);
      CHECK(e.code().value() == ENOENT);
    });
  }

  TEST_CASE("a bad working directory or a stream file in a missing folder is named, for every start method") {
    for_each_method([](start_method method) {
      join_options options{.method = method};
      options.spawn.cwd = "/nonexistent/directory";
      const auto bad_cwd = start_failure(options, 1);
      INFO(bad_cwd.what());
      CHECK(std::string(bad_cwd.what()).find("cannot change directory to '/nonexistent/directory'") != std::string::npos);
      CHECK(std::string(bad_cwd.what()).find("/proc/self/exe") == std::string::npos);
      join_options to_file{.method = method};
      to_file.spawn.out = stdio::file("/nonexistent/folder/stdout.log");
      const auto bad_file = start_failure(to_file, 1);
      INFO(bad_file.what());
      CHECK(std::string(bad_file.what()).find("cannot open '/nonexistent/folder/stdout.log'") != std::string::npos);
      CHECK(bad_file.code().value() == ENOENT);
    });
  }

  // Before, a forkserver kept the open file limit it started with: one
  // started under a low limit refused with EMFILE, for the process's life,
  // every start whose descriptors did not fit under it, though the limit
  // had been raised since.
  TEST_CASE("a forkserver started under a low open file limit starts more ranks once the limit is raised") {
    const int code = test::exit_code_in_child([] {
      detail::stop_forkserver();
      {
        const test::nofile_limit low(static_cast<rlim_t>(test::open_fd_count() + 12));
        (void)spawn_and_join(succeed, std::tuple{}, 1, test::join_by(start_method::forkserver));
      }
      constexpr int ranks = 32;
      std::vector<int> seen;
      try {
        seen = spawn_and_join(rank_itself, std::tuple{}, ranks, test::join_by(start_method::forkserver));
      } catch (const std::exception& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 2;
      }
      for (int rank = 0; rank < ranks; ++rank) {
        if (seen.at(static_cast<std::size_t>(rank)) != rank) return 3;
      }
      detail::stop_forkserver();
      return 0;
    });
    CHECK(code == 0);
  }

  // Before, the registry of entry points had a plain mutex: a child forked
  // while another thread named an entry point (a call, a pool's map) found
  // it held for good, and hung naming one in turn.
  TEST_CASE("a plain fork while other threads name entry points: the child names them too") {
    const auto outcome = test::fork_beside(
        2, [] { (void)cohort::call(&entry_tests::rank_itself); }, 300,
        [] { return cohort::call(&entry_tests::rank_itself).name == "rank_itself" ? 0 : 1; });
    CHECK(outcome.hung == 0);
    CHECK(outcome.failed == 0);
  }
}

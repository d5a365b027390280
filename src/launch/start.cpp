// The parent's side of a function entry point: starting a rank by
// re-execution, by fork or through the forkserver, and reading back what the
// function returned.
#include "launch/entry.hpp"

#include "config.hpp"
#include "cohort/storage.hpp"
#include "launch/forkserver.hpp"
#include "launch/rank_mark.hpp"
#include "os/cuda_driver.hpp"
#include "os/descriptor_limit.hpp"
#include "os/fork_safe_mutex.hpp"
#include "process/launch.hpp"
#include "os/owned_fd.hpp"
#include "os/process_identity.hpp"
#include "os/raw_syscall.hpp"
#include "process/owned_pids.hpp"
#include "process/parallel.hpp"
#include "shm/fork.hpp"
#include "shm/keeper.hpp"

#include <fmt/format.h>

#include <fcntl.h>
#include <link.h>
#include <poll.h>
#include <stdio_ext.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#ifdef __GLIBCXX__
#include <ext/stdio_sync_filebuf.h>
#endif
#include <mutex>
#include <new>
#include <optional>
#include <stdexcept>
#include <string_view>

extern char** environ;

namespace cohort::detail {
namespace {

// A memfd, closed with the object; get() is -1 when it could not be made,
// with error() saying why, or when it was not wanted (a null name).
class memfd {
 public:
  explicit memfd(const char* name)
      : fd_(name != nullptr ? ::memfd_create(name, MFD_CLOEXEC) : -1), error_(fd_ < 0 && name != nullptr ? errno : 0) {}
  memfd(const memfd&) = delete;
  memfd& operator=(const memfd&) = delete;
  ~memfd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const noexcept { return fd_; }
  int error() const noexcept { return error_; }
  int release() noexcept { return std::exchange(fd_, -1); }

 private:
  int fd_;
  int error_;
};

// The memfd a rank's result lands in, when the function returns one.
const char* result_file(const function_call& call) { return call.returns_value ? result_memfd_name : nullptr; }

// One rank of a batch: its result memfd (when wanted), its prepared launch
// and its process, from when it is made until a child object adopts it. A
// process made but not adopted (a later rank failed) is killed and reaped
// here.
struct rank_launch {
  memfd result;
  std::unique_ptr<prepared_launch> prepared;
  pid_t pid = -1;

  explicit rank_launch(const function_call& call) : result(result_file(call)) {}
  rank_launch(const rank_launch&) = delete;
  rank_launch& operator=(const rank_launch&) = delete;
  ~rank_launch() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
};

// std::cout's buffer when it is libstdc++'s default, which keeps nothing
// and writes through stdout's: as this process had it when it last flushed
// for a fork (null when it had another), and as its forked ranks inherit it.
std::atomic<std::streambuf*> cout_through_stdout{nullptr};

// Whether `f` holds output not yet written. glibc's FILE fields are read
// as its own putc macros read them, rather than through __fpending: a
// forked rank whose streams hold nothing then runs no stdio code at all.
COHORT_FORKED_CHILD_PATH bool holds_output(std::FILE* f) noexcept {
#ifdef __GLIBC__
  if (f->_mode <= 0) return f->_IO_write_ptr != f->_IO_write_base;  // not wide
#endif
  return ::__fpending(f) > 0;
}

}  // namespace

// What a rank holds for its standard streams at its end is written, as
// exit() would; a stream with nothing held is left alone. In a forked
// child every page of code it runs for the first time is a page fault,
// and a rank that printed nothing, or flushed what it printed, would pay
// five of them here to write nothing. std::cout is flushed unless it is
// still the buffer that writes through stdout, which holds nothing itself.
COHORT_FORKED_CHILD_PATH void flush_held_output() noexcept {
  const auto* through_stdout = cout_through_stdout.load(std::memory_order_relaxed);
  if (through_stdout == nullptr || std::cout.rdbuf() != through_stdout) {
    try {
      std::cout.flush();
    } catch (...) {
    }
  }
  if (holds_output(stdout)) std::fflush(stdout);
  if (holds_output(stderr)) std::fflush(stderr);
}

// A fork writes first what this process has buffered for stdout and stderr,
// as Python's multiprocessing does: it appears once, before anything a rank
// prints. It also binds, in this process, the symbols a rank's own flush at
// its end calls: a child resolving them itself would fault in the dynamic
// linker's tables of every library, a cost paid again by each child. And
// it notes whether std::cout writes through stdout, for the ranks' flush.
COHORT_FORKED_CHILD_PATH void flush_standard_streams() noexcept {
  try {
    std::cout.flush();
  } catch (...) {  // std::cout set to throw, and its stdout gone: what it held is lost, as at exit
  }
  std::fflush(stdout);
  std::fflush(stderr);
#ifdef __GLIBCXX__
  cout_through_stdout.store(dynamic_cast<__gnu_cxx::stdio_sync_filebuf<char>*>(std::cout.rdbuf()),
                            std::memory_order_relaxed);
#endif
}

COHORT_FORKED_CHILD_PATH void end_forked_rank(int code) noexcept {
  release_shared_memory_holds();
  flush_held_output();
  ::_exit(code);
}

namespace {

// What a forked child reads of its rank, copied side by side before the
// forks: the first read of each page costs each child a fault, and a
// rank's own objects spread over several pages of the heap.
struct rank_to_fork {
  launch_plan plan;
  int result_fd = -1;
  bool replace_environ = false;  // its environment is not this process's
  std::array<int, 4> keep{};  // the plan's kept descriptors, when they fit
};

// The child of a true fork of this process: sets itself up, reports on the
// pipe, calls the function and exits. What escapes run_entry ends the rank
// through std::terminate, never unwinding into the caller's frames, whose
// destructors are the parent's.
[[noreturn]] COHORT_FORKED_CHILD_PATH void run_forked_rank(rank_to_fork& r, int report_fd, const function_call& call,
                                                           int rank, const shm::keeper_address& keeper,
                                                           const from_forking_process& inherited) noexcept {
  auto& p = r.plan;
  set_up_or_report(p, report_fd, rank);
  shm::set_keeper(keeper);
  // Output the parent had buffered but not written is the parent's to
  // write: dropped here, or it would appear twice.
  if (holds_output(stdout)) ::__fpurge(stdout);
  if (holds_output(stderr)) ::__fpurge(stderr);
  // Unchanged, it is left unwritten (and unread): the page that holds it
  // would be copied.
  if (r.replace_environ) environ = const_cast<char**>(p.envp);
  end_forked_rank(run_entry(call.name, rank, call.args, r.result_fd, inherited));
}

// Forks every rank back to back (glibc's fork: its malloc and stdio locks
// are taken across it), with nothing allocated in between: after each fork
// the parent pays a copy for every page it writes, so the preparation is
// all done before, the children's stack included. Returns the rank that
// could not be forked, or -1.
// Not inlined, so that its loop, which each child returns through from its
// fork, is placed with the rest of a child's path.
[[gnu::noinline]] COHORT_FORKED_CHILD_PATH int fork_all(std::vector<std::unique_ptr<rank_launch>>& ranks,
                                                        const function_call& call, int report_fd,
                                                        const shm::keeper_address& keeper, launch_failure& f) {
  flush_standard_streams();
  std::optional<entry_stack> stack;
  const entry_stack* const mapped = entry_stack::ahead_of_forks(stack);
  const signals_blocked blocked;
  // Asked once for all: a handler another thread sets meanwhile stays in
  // the children, where it runs on their own copy of memory.
  const std::uint64_t reset = signals_to_reset();
  const from_forking_process inherited{mapped, ranks_inherit_terminate_handler(), look_up_entry(call.name)};
  // The first ranks' on the stack, which each child touches anyway, the
  // rest on the heap; made here: a child runs no more of this library than
  // it must.
  constexpr std::size_t near_count = 8;
  rank_to_fork near[near_count];
  std::vector<rank_to_fork> far;
  if (ranks.size() > near_count) far.reserve(ranks.size() - near_count);  // reserved: none moves once made
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const auto& x = *ranks[i];
    const rank_to_fork made{x.prepared->plan(), x.result.get(), false, {}};
    auto& r = i < near_count ? (near[i] = made) : far.emplace_back(made);
    r.plan.reset_signals = &reset;
    r.replace_environ = r.plan.envp != environ;
    if (r.plan.keep_count <= r.keep.size()) {
      std::copy_n(r.plan.keep, r.plan.keep_count, r.keep.begin());
      r.plan.keep = r.keep.data();
    }
  }
  // The first pids go on the stack, beside the frame each fork's return
  // writes anyway, and into the ranks' objects once the forks are done: a
  // write to another page after each fork would be one more page copied
  // per fork. Few, so that they seldom reach into the next page.
  constexpr std::size_t on_stack = 16;
  pid_t pids[on_stack];
  const auto record = [&](std::size_t forked) {
    for (std::size_t r = 0; r < std::min(forked, on_stack); ++r) ranks[r]->pid = pids[r];
  };
  // The ranks, and every fork of theirs that executes nothing, carry the
  // mark this process's guardian finds them by.
  const ranks_marked marked;
  shm::fork_batch batch;
  const os::fork_safe_mutexes_held held;
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    batch.before_fork();
    const pid_t pid = ::fork();
    if (pid == 0) {
      run_forked_rank(r < near_count ? near[r] : far[r - near_count], report_fd, call, static_cast<int>(r), keeper,
                      inherited);
    }
    if (pid < 0) {
      f = {stage::clone, errno, ""};
      batch.fork_failed();
      record(r);
      return static_cast<int>(r);
    }
    (r < on_stack ? pids[r] : ranks[r]->pid) = pid;
  }
  record(ranks.size());
  return -1;
}

// What a forked child reports once its set-up is done: stage::none, or where
// and why it failed. Smaller than PIPE_BUF: the reports of the ranks that
// share a pipe never interleave.
struct setup_report {
  int rank;
  stage where;
  int error;
  pid_t pid;
};

}  // namespace

// Success is reported too, rather than told by the pipe's end of file: a
// thread of the parent forking meanwhile would hold a copy of the write end.
// Raw calls, as the set-up's: no page of libc's code to fault in.
COHORT_FORKED_CHILD_PATH void write_report(int report_fd, int rank, stage where, int error) noexcept {
  const setup_report r{rank, where, error, os::this_process()};
  os::raw_syscall(SYS_write, report_fd, reinterpret_cast<long>(&r), sizeof r);
}

COHORT_FORKED_CHILD_PATH void report_failure(int report_fd, int rank, stage where, int error) noexcept {
  write_report(report_fd, rank, where, error);
  ::_exit(127);
}

COHORT_FORKED_CHILD_PATH void set_up_or_report(launch_plan& p, int report_fd, int rank) noexcept {
  if (!set_up_child(p)) report_failure(report_fd, rank, p.failed_at, p.error);
  write_report(report_fd, rank, stage::none, 0);
  os::raw_syscall(SYS_close, report_fd);
}

// The pipe ends once every rank has reported and closed its end, or died:
// a rank with no report by then died before it could say.
bool await_set_up(int report_fd, std::size_t count, std::size_t& rank, stage& where, int& error) {
  const os::owned_fd pipe(report_fd);
  std::vector<setup_report> reports(count, setup_report{-1, stage::none, 0, -1});  // rank -1: none yet
  setup_report batch[64];  // reads of whole reports only: every write is one
  for (std::size_t next = 0;;) {
    while (next < count && reports[next].rank >= 0 && reports[next].where == stage::none) ++next;
    if (next == count) return true;
    if (reports[next].rank >= 0) {
      rank = next;
      where = reports[next].where;
      error = reports[next].error;
      return false;
    }
    const ssize_t n = ::read(pipe.get(), batch, sizeof batch);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      rank = next;
      where = stage::start;
      error = n < 0 ? errno : ECHILD;
      return false;
    }
    for (std::size_t i = 0; i < static_cast<std::size_t>(n) / sizeof(setup_report); ++i) {
      const auto r = static_cast<std::size_t>(batch[i].rank);
      if (batch[i].rank >= 0 && r < count && reports[r].rank < 0) reports[r] = batch[i];
    }
  }
}

void end_unknown_ranks(int report_fd, std::span<const pid_t> known, std::chrono::milliseconds patience,
                       int announce_fd) {
  auto deadline = std::chrono::steady_clock::now() + patience;
  setup_report batch[64];
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd p{report_fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(std::max<std::int64_t>(left.count(), 0)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return;  // the patience ran out
    const ssize_t n = ::read(report_fd, batch, sizeof batch);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // every rank made has reported or died
    deadline = std::chrono::steady_clock::now() + patience;  // patience with each rank, not with all
    for (std::size_t i = 0; i < static_cast<std::size_t>(n) / sizeof(setup_report); ++i) {
      const pid_t pid = batch[i].pid;
      if (pid <= 0 || std::find(known.begin(), known.end(), pid) != known.end()) continue;
      // This process's own child, unreaped: neither its pid nor a group of
      // that number can be anyone else's.
      ::kill(-pid, SIGKILL);  // the group it leads, if it made one
      ::kill(pid, SIGKILL);
      const int pidfd = config::pidfd_open(pid);
      if (pidfd < 0) {  // no descriptor to wait on: as ~rank_launch
        end_and_withdraw(announce_fd, std::span(&pid, 1));
        ::waitpid(pid, nullptr, 0);
        continue;
      }
      pollfd exited{pidfd, POLLIN, 0};
      ::poll(&exited, 1, 1000);  // one stuck in the kernel is left, not waited on for good
      ::close(pidfd);
      if (::waitid(P_PID, static_cast<id_t>(pid), nullptr, WEXITED | WNOHANG | WNOWAIT) == 0) {
        withdraw_start_note(announce_fd, pid);  // dead, its pid still its own
      }
      ::waitpid(pid, nullptr, WNOHANG);
    }
  }
}

namespace {

// How this program was started, where the kernel ran the dynamic loader
// as the program (ld.so [options] ./program args): /proc/self/exe is then the
// loader, and what it needs to run the program again is noted here.
struct loader_command {
  bool through_loader = false;
  // The loader's options, then the program's path, made absolute; nullopt
  // where /proc/self/cmdline could not be read.
  std::optional<std::vector<std::string>> arguments;
};

loader_command& started_through_loader() {
  static loader_command c;
  return c;
}

// A program that names an interpreter, run by the kernel without one
// (AT_BASE, the interpreter's address, is 0): the loader was run itself.
bool run_by_the_loader_itself() {
  if (::getauxval(AT_BASE) != 0) return false;
  bool interpreted = false;
  ::dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* found) {
        for (ElfW(Half) i = 0; i < info->dlpi_phnum; ++i) {
          if (info->dlpi_phdr[i].p_type == PT_INTERP) *static_cast<bool*>(found) = true;
        }
        return 1;  // the first object is the program
      },
      &interpreted);
  return interpreted;
}

// `value` of a loader option whose entries are paths, each entry that is
// relative made absolute, so that a rank started in another directory
// finds what the program found. Entries are split at any of `separators`,
// kept as they were; an entry with no '/' is a name the loader looks up,
// not a path, and stays, unless `folders` (every entry a folder's path).
std::string absolute_entries(const std::string& value, std::string_view separators, bool folders) {
  std::string out;
  for (std::size_t at = 0; at <= value.size();) {
    const std::size_t end = std::min(value.find_first_of(separators, at), value.size());
    std::string entry = value.substr(at, end - at);
    if (!entry.empty() && entry.front() != '/' && (folders || entry.find('/') != std::string::npos)) {
      entry = std::filesystem::absolute(entry).string();
    }
    out += entry;
    if (end < value.size()) out += value[end];
    at = end + 1;
  }
  return out;
}

// The loader's options (glibc's ld.so) whose values hold paths: each taken
// relative to the directory the program started in, which a rank's need
// not be.
void make_option_paths_absolute(std::vector<std::string>& options) {
  for (std::size_t i = 0; i + 1 < options.size(); ++i) {
    const std::string& name = options[i];
    if (name == "--library-path" || name == "--glibc-hwcaps-prefix") {
      options[i + 1] = absolute_entries(options[i + 1], ":;", true);
      ++i;
    } else if (name == "--preload" || name == "--audit") {
      options[i + 1] = absolute_entries(options[i + 1], ": \t", false);
      ++i;
    } else if (name == "--argv0" || name == "--inhibit-rpath" || name == "--glibc-hwcaps-mask") {
      ++i;  // a value, but not a path
    }
  }
}

// Taken as the program starts, before its main can change the working
// directory or its argv: glibc calls a constructor with main's arguments,
// which the loader took its own off the front of. /proc/self/cmdline still
// holds those.
[[gnu::constructor]] void note_loader_command(int argc, char** /*argv*/, char** /*envp*/) {
  if (!run_by_the_loader_itself()) return;
  auto& c = started_through_loader();
  c.through_loader = true;
  try {
    std::ifstream in("/proc/self/cmdline", std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<std::string> all;
    for (std::size_t at = 0; at < text.size();) {
      const std::size_t end = std::min(text.find('\0', at), text.size());
      all.emplace_back(text, at, end - at);
      at = end + 1;
    }
    // The loader's name, its options and the program's path come before
    // the program's arguments past its argv[0].
    if (argc < 1 || all.size() <= static_cast<std::size_t>(argc)) return;
    std::vector<std::string> arguments(all.begin() + 1, all.end() - argc + 1);
    std::string& program = arguments.back();
    program = std::filesystem::absolute(program).string();
    make_option_paths_absolute(arguments);
    c.arguments = std::move(arguments);
  } catch (...) {
    // Unknown: a start that re-executes says so.
  }
}

}  // namespace

std::optional<command> reexecution(std::vector<std::string> args) {
  const auto& c = started_through_loader();
  if (!c.through_loader) return command("/proc/self/exe", std::move(args));
  if (!c.arguments) return std::nullopt;
  std::vector<std::string> all = *c.arguments;
  all.insert(all.end(), std::make_move_iterator(args.begin()), std::make_move_iterator(args.end()));
  return command("/proc/self/exe", std::move(all));
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
  // Only when run through the loader can the command be unknown.
  if (!reexecution({})) {
    throw std::logic_error(fmt::format(
        "{}: this program was started by running the dynamic loader (ld.so ./program), and the command line that "
        "runs it again could not be read from /proc/self/cmdline; start it by its own path",
        what));
  }
}

// A child forked from a process that has initialised CUDA cannot use it:
// the driver's contexts and threads are the parent's. The other start
// methods begin from a fresh image of the program.
void check_forkable(const std::string& what) {
  if (os::cuda_initialised()) {
    throw std::logic_error(fmt::format(
        "{}: this process has initialised CUDA, which a forked child cannot use; use the spawn or forkserver start method",
        what));
  }
}

child start_spawned(const asio::any_io_executor& executor, const function_call& call, int rank,
                    const spawn_options& options, int result_fd, const std::string& keeper, const std::string& what,
                    int announce_fd) {
  check_reexecutable(call, what);
  memfd args(args_memfd_name);
  if (args.get() < 0) {
    throw std::system_error(args.error(), std::system_category(), what + ": memfd_create" + os::descriptor_limit_note(args.error()));
  }
  if (!write_whole(args.get(), call.args.bytes())) {
    const int error = errno;
    throw std::system_error(error, std::system_category(),
                            what + ": writing the arguments" + os::file_size_limit_note(error));
  }
  spawn_options opts = options;
  opts.env.set(entry_env, fmt::format("{},{},{},{}", args.get(), result_fd, rank, call.name));
  if (!keeper.empty()) opts.env.set(shm::keeper_env, keeper);
  opts.keep_fds.push_back(args.get());
  if (result_fd >= 0) opts.keep_fds.push_back(result_fd);
  const command cmd = *reexecution({"--cohort-entry", call.name, std::to_string(rank)});  // checked above
  launch_failure f;
  std::shared_ptr<child_state> state;
  try {
    state = launch_program(executor, cmd, opts, f, announce_fd);
  } catch (const std::invalid_argument& e) {  // the options refused (an environment variable's name): the rank named
    throw std::invalid_argument(fmt::format("{}: {}", what, e.what()));
  }
  if (!state) {
    // Set-up failures (a working directory, a file for a stream) name their
    // cause; the exec itself is this program's re-execution, and says why it
    // failed (an environment variable too long for the kernel, say).
    if (f.where == stage::exec) f = failure_of_step("re-executing /proc/self/exe", f);
    if (f.where == stage::path_lookup) f = {stage::start, f.error, "re-executing /proc/self/exe"};
    throw std::system_error(f.error, std::system_category(), describe_failure(what, f));
  }
  return child(std::move(state));
}

}  // namespace

namespace {

std::string describe_rank(const function_call& call, int rank) {
  return fmt::format("cohort: rank {} of '{}' ({})", rank, call.name, to_string(call.method));
}

}  // namespace

std::vector<child> start_functions(const asio::any_io_executor& executor, const function_call& call,
                                   const std::vector<spawn_options>& options, std::vector<int>& result_fds,
                                   unsigned threads, int announce_fd) {
  const auto n = options.size();
  const auto fail = [&](std::size_t rank, launch_failure f) {
    // A rank that never execs reports only where it failed: the directory
    // it could not enter is the one its options name.
    if (f.where == stage::chdir && f.detail.empty() && rank < n) f.detail = options[rank].cwd.string();
    throw std::system_error(f.error, std::system_category(), describe_failure(describe_rank(call, static_cast<int>(rank)), f));
  };
  // A main that went on past child_main's exit code: each rank would start
  // ranks of its own, without end.
  if (child_main_returned_code()) {
    throw std::logic_error(fmt::format(
        "{}: this process already ran a function through cohort::child_main, whose exit code its main must return "
        "(if (auto rc = cohort::child_main(argc, argv)) return *rc;) instead of going on",
        describe_rank(call, 0)));
  }
  std::vector<child> children;
  children.reserve(n);
  result_fds.assign(n, -1);
  // What values still name as a rank ends goes to this process (empty:
  // none can, and the ranks wait for their receivers instead).
  const std::string keeper = shm::keeper_for_ranks();
  if (call.method == start_method::spawn) {
    check_reexecutable(call, describe_rank(call, 0));
    children.resize(n);
    try {
      for_each_parallel(n, start_threads(threads, n), [&](std::size_t r) {
        memfd result(result_file(call));
        if (result.error() != 0) fail(r, {stage::start, result.error(), "memfd_create"});
        children[r] = start_spawned(executor, call, static_cast<int>(r), options[r], result.get(), keeper,
                                    describe_rank(call, static_cast<int>(r)), announce_fd);
        result_fds[r] = result.release();
      });
    } catch (...) {
      std::vector<pid_t> started;
      for (const auto& c : children) {
        if (c) started.push_back(c.pid());
      }
      end_and_withdraw(announce_fd, started);
      throw;
    }
    return children;
  }
  if (call.method == start_method::fork) check_forkable(describe_rank(call, 0));
  if (call.method == start_method::forkserver) {
    check_reexecutable(call, describe_rank(call, 0));
    for (std::size_t r = 0; r < n; ++r) {
      if (options[r].before_exec != nullptr) {
        throw std::invalid_argument(fmt::format("{}: the forkserver cannot run spawn_options::before_exec",
                                                describe_rank(call, static_cast<int>(r))));
      }
      if (options[r].keep_fds.size() > max_kept) {
        throw std::invalid_argument(fmt::format("{}: the forkserver passes at most {} keep_fds",
                                                describe_rank(call, static_cast<int>(r)), max_kept));
      }
    }
  }

  // Everything prepared first: nothing has started if this fails. Forked
  // ranks report their set-up on one pipe; the forkserver makes its own.
  os::owned_fd report_read, report_write;
  if (call.method == start_method::fork) {
    int ends[2];
    if (::pipe2(ends, O_CLOEXEC) != 0) fail(0, {stage::pipe, errno, ""});
    report_read = os::owned_fd(ends[0]);
    report_write = os::owned_fd(ends[1]);
  }
  const auto context = context_lifetime(executor);  // once for all the ranks, before any starts
  const launch_guard launching;  // from the first fork until every rank is owned or gone
  std::vector<std::unique_ptr<rank_launch>> ranks;
  ranks.reserve(n);
  for (std::size_t r = 0; r < n; ++r) {
    auto& x = *ranks.emplace_back(std::make_unique<rank_launch>(call));
    if (x.result.error() != 0) fail(r, {stage::start, x.result.error(), "memfd_create"});
    launch_failure f;
    std::vector<int> keep;
    if (x.result.get() >= 0) keep.push_back(x.result.get());
    if (call.method == start_method::fork) keep.push_back(report_write.get());
    try {
      x.prepared = std::make_unique<prepared_launch>(options[r], keep, f);
    } catch (const std::invalid_argument& e) {  // as start_spawned names it
      throw std::invalid_argument(fmt::format("{}: {}", describe_rank(call, static_cast<int>(r)), e.what()));
    }
    if (!x.prepared->ok()) fail(r, f);
    x.prepared->plan().close_now = true;  // no exec to close them at
    x.prepared->plan().announce_fd = announce_fd;
  }

  // A start that fails once ranks are made ends them, and withdraws the
  // start notes they may have sent, before they are reaped.
  try {
    launch_failure f;
    if (call.method == start_method::fork) {
      const auto keeper_address = shm::parse_keeper(keeper);  // taken apart here, not in each child
      const int failed = fork_all(ranks, call, report_write.get(), keeper_address, f);
      report_write.reset();
      if (failed >= 0) fail(static_cast<std::size_t>(failed), f);
    } else {
      std::vector<server_request> requests;
      requests.reserve(n);
      for (std::size_t r = 0; r < n; ++r) {
        requests.push_back({&ranks[r]->prepared->plan(), static_cast<int>(r), ranks[r]->result.get()});
      }
      int report_fd = -1;
      const std::size_t started = start_from_server(requests, call, keeper, report_fd, f);
      report_read = os::owned_fd(report_fd);
      for (std::size_t r = 0; r < started; ++r) ranks[r]->pid = requests[r].pid;
      if (started < n) fail(started, f);
    }

    // Ours until reaped, so their pids cannot be recycled before this.
    for (std::size_t r = 0; r < n; ++r) {
      auto& x = *ranks[r];
      const int pidfd = config::pidfd_open(x.pid);
      if (pidfd < 0) fail(r, {stage::start, errno, "pidfd_open"});
      children.push_back(child(x.prepared->adopt(executor, context, std::exchange(x.pid, -1), pidfd)));
    }
    // The ranks set themselves up meanwhile; a failure of one ends them all.
    std::size_t failed = 0;
    if (!await_set_up(report_read.release(), n, failed, f.where, f.error)) fail(failed, f);
  } catch (...) {
    std::vector<pid_t> started;
    for (std::size_t r = 0; r < n; ++r) {
      if (ranks[r]->pid > 0) started.push_back(ranks[r]->pid);
      else if (r < children.size() && children[r]) started.push_back(children[r].pid());
    }
    end_and_withdraw(announce_fd, started);
    throw;
  }
  for (std::size_t r = 0; r < n; ++r) result_fds[r] = ranks[r]->result.release();
  return children;
}

std::optional<encoded> read_result(int result_fd) {
  std::vector<std::byte> bytes;
  if (!read_whole(result_fd, bytes)) {
    throw std::system_error(errno, std::system_category(), "cohort: reading a rank's result");
  }
  if (bytes.empty()) return std::nullopt;
  // As result_contents wrote it.
  std::uint64_t size = 0;
  if (bytes.size() < sizeof size) throw decode_error("cohort: a rank's result ends early");
  std::memcpy(&size, bytes.data(), sizeof size);
  if (size > bytes.size() - sizeof size) throw decode_error("cohort: a rank's result ends early");
  const std::span<const std::byte> all(bytes);
  auto value = encoded::from_bytes(std::vector<std::byte>(all.begin() + sizeof size, all.begin() + sizeof size + size));
  if (const auto holds = all.subspan(sizeof size + size); !holds.empty()) take_holds(value, holds);
  return value;
}

}  // namespace cohort::detail

// What the parent and the child sides of a function entry point share.
#pragma once

#include "cohort/child.hpp"
#include "cohort/encoding.hpp"
#include "cohort/entry_point.hpp"
#include "cohort/spawn.hpp"
#include "process/launch.hpp"

#include <chrono>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <typeinfo>

namespace cohort::detail {

/// The environment variable naming, in a child started by re-execution,
/// "<args fd>,<result fd>,<rank>,<function name>".
inline constexpr const char* entry_env = "COHORT_ENTRY";
/// In the forkserver process: "<socket fd>".
inline constexpr const char* forkserver_env = "COHORT_FORKSERVER";
/// The names of the memfds that entry_env's descriptors are, by which
/// child_main tells them from a stray value's: the arguments, and the
/// result the function's value is written to.
inline constexpr const char* args_memfd_name = "cohort-args";
inline constexpr const char* result_memfd_name = "cohort-result";

/// A stack of its own for a function, with a guard page below it, the size
/// RLIMIT_STACK gives the main thread (1 GiB where it is unlimited or
/// larger, 8 MiB where it cannot be read or is below 64 KiB, and where a
/// larger one cannot be mapped). A context switch onto it
/// costs far less than a thread in a freshly forked child. Mapped before
/// ranks are forked, it is in place in each of them, as its own copy, with
/// no mapping to make there. Throws std::system_error when it cannot be
/// mapped.
class entry_stack {
 public:
  entry_stack();
  /// The size one made now would have, by this process's RLIMIT_STACK.
  static std::size_t size_for_limit() noexcept;
  /// One mapped ahead of the forks of a batch into `into`, which the
  /// forking function holds in its own frame (a page each child touches
  /// anyway, where one of the heap would be a fault more in each); null
  /// when it cannot be (each child then maps its own).
  static const entry_stack* ahead_of_forks(std::optional<entry_stack>& into) noexcept;
  static constexpr std::size_t fallback_size = std::size_t{8} << 20;
  static constexpr std::size_t largest_size = std::size_t{1} << 30;
  entry_stack(const entry_stack&) = delete;
  entry_stack& operator=(const entry_stack&) = delete;
  ~entry_stack();

  void* bottom() const noexcept { return bottom_; }
  std::size_t size() const noexcept { return size_; }

 private:
  void* base_ = nullptr;
  void* bottom_ = nullptr;
  std::size_t size_ = 0;
  std::size_t mapped_ = 0;
};

/// A function registered as an entry point, and the thunk that calls it.
struct found_entry {
  entry_thunk thunk = nullptr;  ///< null when none was found
  erased_function fn = nullptr;
};
/// The function registered as `name`, or an empty found_entry when none is.
found_entry look_up_entry(const std::string& name);

/// What each rank forked from one process takes from it, worked out there
/// once before the forks: every page a forked rank reads or writes for the
/// first time costs it a fault of its own, so it looks nothing up itself.
struct from_forking_process {
  /// The stack the function runs on, mapped ahead of the forks; null: the
  /// rank maps one of its own.
  const entry_stack* stack = nullptr;
  /// Whether std::terminate already ends a rank as it should (see
  /// ranks_inherit_terminate_handler); if not, the rank sets it.
  bool terminate_handler_set = false;
  /// The function, looked up by its name; empty: the rank looks it up (and
  /// reports a name that names none).
  found_entry entry;
};

/// Runs the function registered as `name` as `rank` in this process, as
/// `inherited` says, and writes its encoded result to `result_fd` (closed
/// then). Returns 0; when an exception escapes the function, writes the
/// error file, reports on stderr and ends the process with code 1 (it never
/// returns then). The caller has told shared memory its keeper
/// (shm::set_keeper, or shm::find_keeper_in_environment).
int run_entry(const std::string& name, int rank, const encoded& args, int result_fd,
              const from_forking_process& inherited);

/// Makes std::terminate, in this process, call a handler that ends a rank
/// as an escaping exception should where os::running_rank() is set, and
/// does the C++ runtime's default work elsewhere; but only in place of that
/// default, so that a handler the program set stays. True when such a
/// handler is in effect: ranks forked from here then inherit it, and need
/// not set their own, which would fault a page of the runtime's code and
/// copy a page of its data in each of them. Called before forking ranks.
bool ranks_inherit_terminate_handler() noexcept;

/// Writes what stdout, stderr and std::cout hold at a process's end, as
/// exit() would, touching no stream that holds nothing.
void flush_held_output() noexcept;

/// Writes what stdout, stderr and std::cout hold, before forks; and notes
/// whether std::cout writes through stdout, which tells a forked rank's end
/// whether std::cout may hold anything of its own.
void flush_standard_streams() noexcept;

/// Ends a rank made by a fork, of the caller or of the forkserver, once its
/// function has run: lets go of its shared memory, writes what stdout,
/// stderr and std::cout hold (a stream that holds nothing is not touched),
/// and exits with `code` without exit handlers or static destructors,
/// which are another process's.
[[noreturn]] void end_forked_rank(int code) noexcept;

/// Calls the function registered as `name` in this thread, as fn(rank,
/// args...); returns its result encoded. Throws std::logic_error for an
/// unknown name, decode_error for arguments of other types, and what the
/// function throws.
std::optional<encoded> call_entry(const std::string& name, int rank, const encoded& args);

/// Whether child_main() ran in this process (and found no entry to run).
bool child_main_called() noexcept;

/// The command that runs this program again with `args` (spawn's ranks,
/// the forkserver): /proc/self/exe. Where the program was started by
/// running the dynamic loader as a program (ld.so ./program), /proc/self/exe
/// is the loader, which is given its own options and the program's path
/// first, as it was then, so that the same loader runs the same program.
/// nullopt where that command line could not be read.
std::optional<command> reexecution(std::vector<std::string> args);

/// Whether child_main() returned an exit code in this process: it ran an
/// entry point (or served forks), and main should have returned that code.
bool child_main_returned_code() noexcept;

/// Starts the ranks of `call`, rank r as `options[r]` says, and returns
/// them in rank order. Rank r's result will be in result_fds[r] (memfds owned
/// by the caller from then on) once it exits with code 0. Every launch is
/// prepared before any process is made; fork then forks them back to back,
/// forkserver sends its requests in a row; the ranks' set-up is confirmed
/// last. Throws std::system_error naming the first rank that could not
/// start, with no process of the call left.
/// spawn ranks are started on `threads` threads at once (see start_threads).
/// Each rank announces its start on `announce_fd` before it runs the
/// function (launch_plan::announce_fd); a start that fails withdraws the
/// notes before it reaps the ranks.
std::vector<child> start_functions(const asio::any_io_executor& executor, const function_call& call,
                                   const std::vector<spawn_options>& options, std::vector<int>& result_fds,
                                   unsigned threads = 1, int announce_fd = -1);

/// Reads what a function child left in its result memfd: nullopt when it
/// returned nothing. The storages it names are held here for as long as
/// the value lives (the child has ended). Throws decode_error on a
/// malformed value, shm_error when its shared memory cannot be opened.
std::optional<encoded> read_result(int result_fd);

/// In a child that never execs: sets it up as `p` says and writes the
/// outcome, as rank `rank`, on `report_fd`, the write end of a pipe that the
/// ranks of one start share; closes it then. On failure (where and why) it
/// exits with 127.
void set_up_or_report(launch_plan& p, int report_fd, int rank) noexcept;
/// Reports on `report_fd`, as set_up_or_report does, that rank `rank`'s
/// set-up failed at `where` with `error`, and ends the child.
[[noreturn]] void report_failure(int report_fd, int rank, stage where, int error) noexcept;
/// Reads the set-up reports of ranks 0..count-1 from the pipe they share,
/// in whatever order they come, and closes `report_fd`: true when every
/// set-up succeeded. Else false, with `rank` the first rank in rank order
/// that did not succeed, once every rank before it has: `where` and `error`
/// say why, or that it died before it could say (the pipe ended first).
/// The caller must hold no write end of the pipe.
bool await_set_up(int report_fd, std::size_t count, std::size_t& rank, stage& where, int& error);

/// After a forkserver failed before it said which processes it made: reads
/// the set-up reports on `report_fd`, the read end of the pipe those ranks
/// share (the caller holds no write end), until it ends or `patience` passes
/// without a report, and kills (SIGKILL, the process and the group it
/// leads) and reaps each reporting process not in `known`: this process's
/// children, by CLONE_PARENT. The start note each sent on `announce_fd`
/// is withdrawn once it has died, before it is reaped.
void end_unknown_ranks(int report_fd, std::span<const pid_t> known, std::chrono::milliseconds patience,
                       int announce_fd = -1);

/// Reads a whole file from offset 0 into `out`; false with errno set.
bool read_whole(int fd, std::vector<std::byte>& out);
/// Writes `bytes` at offset 0; false with errno set.
bool write_whole(int fd, std::span<const std::byte> bytes);

}  // namespace cohort::detail

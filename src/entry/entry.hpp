// What the parent and the child sides of a function entry point share.
#pragma once

#include "cohort/child.hpp"
#include "cohort/encoding.hpp"
#include "cohort/entry_point.hpp"
#include "cohort/spawn.hpp"
#include "process/launch.hpp"

#include <optional>
#include <string>
#include <typeinfo>

namespace cohort::detail {

/// The environment variable naming, in a child started by re-execution,
/// "<args fd>,<result fd>,<rank>,<function name>".
inline constexpr const char* entry_env = "COHORT_ENTRY";
/// In the forkserver process: "<socket fd>".
inline constexpr const char* forkserver_env = "COHORT_FORKSERVER";

/// Runs the function registered as `name` as `rank` in this process, and
/// writes its encoded result to `result_fd` (closed then). Returns 0; when an
/// exception escapes the function, writes the error file, reports on stderr
/// and ends the process with code 1 (it never returns then).
int run_entry(const std::string& name, int rank, const encoded& args, int result_fd);

/// The rank this process runs as an entry point, or -1.
int running_rank() noexcept;

/// Calls the function registered as `name` in this thread, as fn(rank,
/// args...); returns its result encoded. Throws std::logic_error for an
/// unknown name, decode_error for arguments of other types, and what the
/// function throws.
std::optional<encoded> call_entry(const std::string& name, int rank, const encoded& args);

/// Whether child_main() ran in this process (and found no entry to run).
bool child_main_called() noexcept;

/// Starts the ranks of `call`, rank r as `options[r]` says, and returns
/// them in rank order. Rank r's result will be in result_fds[r] (memfds owned
/// by the caller from then on) once it exits with code 0. Every launch is
/// prepared before any process is made; fork then forks them back to back,
/// forkserver sends its requests in a row; the ranks' set-up is confirmed
/// last. Throws std::system_error naming the first rank that could not
/// start, with no process of the call left.
/// spawn ranks are started on `threads` threads at once (see start_threads).
std::vector<child> start_functions(const asio::any_io_executor& executor, const function_call& call,
                                   const std::vector<spawn_options>& options, std::vector<int>& result_fds,
                                   unsigned threads = 1);

/// Reads what a function child left in its result memfd: nullopt when it
/// returned nothing. Throws decode_error on a malformed value.
std::optional<encoded> read_result(int result_fd);

/// In a child that never execs: sets it up as `p` says and writes the
/// outcome on `report_fd`, which it closes; on failure (where and why) it
/// exits with 127.
void set_up_or_report(launch_plan& p, int report_fd) noexcept;
/// Reads a child's set-up report and closes `report_fd`: true when the set-up
/// succeeded, else false with `where` and `error` set.
bool await_set_up(int report_fd, stage& where, int& error) noexcept;

/// The demangled name of a type.
std::string demangle(const std::type_info& type);

/// Reads a whole file from offset 0 into `out`; false with errno set.
bool read_whole(int fd, std::vector<std::byte>& out);
/// Writes `bytes` at offset 0; false with errno set.
bool write_whole(int fd, std::span<const std::byte> bytes);

}  // namespace cohort::detail

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

/// Whether child_main() ran in this process (and found no entry to run).
bool child_main_called() noexcept;

/// Starts rank `rank` of `call` as `call.method` says. The child's result
/// will be in `result_fd` (a memfd owned by the caller from then on) once it
/// exits with code 0. Throws std::system_error naming the rank when it cannot
/// start, with no process left.
///
/// With `set_up_report`, a forked child (fork, forkserver) is returned while
/// it still sets itself up: *set_up_report is then the read end of its report
/// pipe, owned by the caller, to pass to confirm_set_up(); -1 when there is
/// nothing to confirm (spawn is confirmed by the exec).
child start_function(const asio::any_io_executor& executor, const function_call& call, int rank,
                     const spawn_options& options, int& result_fd, int* set_up_report = nullptr);
/// Waits for the set-up report of a rank started with one (closing
/// `report_fd`). Throws std::system_error as start_function would when the
/// set-up failed; the child has then exited.
void confirm_set_up(int report_fd, const function_call& call, int rank);

/// Reads what a function child left in its result memfd: nullopt when it
/// returned nothing. Throws decode_error on a malformed value.
std::optional<encoded> read_result(int result_fd);

/// In a child that never execs: sets it up as `p` says and writes the
/// outcome on `report_fd`, which it closes; on failure (where and why) it
/// exits with 127.
void set_up_or_report(launch_plan& p, int report_fd) noexcept;
/// In the parent, right after the child was made: a pidfd for `pid`. Unless
/// p.deferred_report is set (it then receives `report_fd`), also reads the
/// child's report (closing `report_fd`). Returns -1 with p.failed_at and
/// p.error set and the child reaped when either fails.
int adopt_after_set_up(launch_plan& p, pid_t pid, int report_fd) noexcept;
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

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
child start_function(const asio::any_io_executor& executor, const function_call& call, int rank,
                     const spawn_options& options, int& result_fd);

/// Reads what a function child left in its result memfd: nullopt when it
/// returned nothing. Throws decode_error on a malformed value.
std::optional<encoded> read_result(int result_fd);

/// In a child that never execs: sets it up as `p` says; on failure writes
/// where and why on `report_fd` and exits with 127. Closes `report_fd`.
void set_up_or_report(launch_plan& p, int report_fd) noexcept;
/// In the parent: reads that report (and closes `report_fd`). Returns a pidfd
/// for `pid`, or -1 with p.failed_at and p.error set and the child reaped.
int adopt_after_set_up(launch_plan& p, pid_t pid, int report_fd) noexcept;

/// The demangled name of a type.
std::string demangle(const std::type_info& type);

/// Reads a whole file from offset 0 into `out`; false with errno set.
bool read_whole(int fd, std::vector<std::byte>& out);
/// Writes `bytes` at offset 0; false with errno set.
bool write_whole(int fd, std::span<const std::byte> bytes);

}  // namespace cohort::detail

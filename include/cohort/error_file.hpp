// The error file through which a rank tells its supervisor why it failed,
// in torchelastic's error.json shape, so Python workers decorated with
// torch's @record report to cohort too.
#pragma once

#include "cohort/export.hpp"

#include <chrono>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

COHORT_API_BEGIN

namespace cohort {

/// What an error file says. Built by a constructor, not as an aggregate:
/// g++ 12 destroys an aggregate temporary twice inside a co_await
/// expression (cohort/compiler.hpp), and `record_error(error_report{...})`
/// may well sit in one.
struct error_report {
  std::string message;  ///< "<type>: <what>" for exceptions
  std::string trace;    ///< the stack trace, when the writer had one
  std::optional<std::chrono::system_clock::time_point> timestamp;  ///< when the error happened

  error_report() = default;
  explicit error_report(std::string message, std::string trace = {},
                        std::optional<std::chrono::system_clock::time_point> timestamp = std::nullopt)
      : message(std::move(message)), trace(std::move(trace)), timestamp(timestamp) {}
};

/// The file this process should write its error to: $COHORT_ERROR_FILE,
/// else $TORCHELASTIC_ERROR_FILE; nullopt outside a supervised rank.
std::optional<std::filesystem::path> error_file_path();

/// Writes `report` to error_file_path() as torchelastic does:
/// {"message": {"message": ..., "extraInfo": {"py_callstack": ...,
/// "timestamp": "<unix seconds>", "timestamp_ns": "<unix nanoseconds>"}}}
/// (the second timestamp is cohort's: torch's readers take the first). The
/// timestamp defaults to now. "py_callstack" is the trace with the message
/// as its last line, as Python's traceback ends (torch shows only it where
/// there is one). A message or trace longer than 512 KiB is cut there, with
/// a note of how much was left out, so that the file stays within what
/// read_error_file takes. Bytes of the message or trace that are not
/// UTF-8 are written as U+FFFD. Returns false when there is no error file to
/// write, or it cannot be written. Never throws: it runs while a program is
/// failing.
bool record_error(const error_report& report) noexcept;
/// The same for an exception: the message is "<demangled type>: <what()>",
/// then "; caused by " and the same of each exception nested in it
/// (std::throw_with_nested).
bool record_error(const std::exception& error, std::string_view trace = {}) noexcept;

/// Makes an exception that no handler catches, in any thread of this
/// program, write the error file (record_error) with its message and the
/// symbolized stack trace of its throw, print both on stderr and end the
/// process with exit code 1: what torch's @record does for a Python worker,
/// for a C++ program run as a rank (by cohort-run or a group). Where
/// threads fail at once, the first one's report stands: the others wait for
/// its handler to end the process. Replaces the
/// terminate handler; call it first thing in main. A function entry point's
/// rank does this by itself.
void record_uncaught_exceptions() noexcept;

/// The largest error file read_error_file reads, in bytes (16 MiB): a rank
/// that wrote more there would have its supervisor hold all of it.
inline constexpr std::uintmax_t max_error_file_size = 16 * 1024 * 1024;

/// Reads an error file. Accepts torchelastic's shape, and a plain string in
/// "message"; the timestamp is "timestamp_ns" where there is one, else
/// "timestamp". The trace is "py_callstack" without a last line that
/// repeats the message (record_error's, or Python's traceback's). A lone
/// UTF-16 surrogate escape (Python's json.dump writes one for each
/// undecodable byte of a string) reads as U+FFFD. nullopt when the file is
/// missing, empty, larger than max_error_file_size
/// or not such a file; a field of the wrong type (a null trace, a timestamp
/// that is not a whole number) is read as absent. Only a regular file is
/// read: the path is opened without blocking, so a FIFO, a directory or a
/// device there gives nullopt at once.
std::optional<error_report> read_error_file(const std::filesystem::path& path);

}  // namespace cohort

COHORT_API_END

// What each rank runs, from the program form: a Python script with the
// interpreter torchrun would use, a module, or a program as given. Checked
// before any rank starts, so that a missing program is one line, not N
// failing ranks.
#pragma once

#include "run/options.hpp"

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace cohort_run {

/// A program that cannot be run: the message, and the shell's exit code
/// (127 not found, 126 not executable).
struct program_error : std::runtime_error {
  program_error(const std::string& what, int code) : std::runtime_error(what), exit_code(code) {}
  int exit_code;
};

/// How a check waits for the program it runs: at most `limit`, less where
/// `fd` (-1: none) becomes readable first; false once the run is to end (a
/// shutdown signal came), and the check then stops. signal_owner::pause.
using check_wait = std::function<bool(std::chrono::milliseconds limit, int fd)>;

/// The interpreter for scripts and modules: `chosen` when set, else
/// $PYTHON_EXEC, else the first python3 in PATH that finds the torch
/// package, else the first python3 in PATH. A python3 that has not
/// answered within 10 s is taken as not finding it (and said on stderr).
/// Where `wait` ends the checks, the rest of PATH is not asked: the first
/// python3 then, for a run that starts no rank.
std::string python_interpreter(const std::string& chosen, const check_wait& wait);

/// The command line every rank runs (program first); `wait` as for
/// python_interpreter. Throws program_error.
std::vector<std::string> rank_command(const run_options& o, const check_wait& wait);

/// Whether an argument of `command` after the program names the local rank
/// as torchrun's macro does: `${local_rank}`, or `$local_rank` not followed
/// by a letter, digit or `_`.
bool names_local_rank(const std::vector<std::string>& command);

/// `command` with each such name replaced by `local_rank`, in every
/// argument after the program (torchrun's substitution, except that `$$`
/// stays `$$`: a shell's own pid in `sh -c` scripts).
std::vector<std::string> with_local_rank(std::vector<std::string> command, int local_rank);

}  // namespace cohort_run

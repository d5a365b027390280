// The trace and message of an exception that no handler catches, taken in
// a terminate handler while the thrower's frames are still on the stack.
#pragma once

#include "cohort/error_file.hpp"

#include <exception>
#include <string>

namespace cohort::detail {

/// The frames from the throw down to the bottom of the program's own code,
/// innermost first, one "#N <frame>" line each (os::describe): the frames
/// of the terminate handler and of the C++ runtime above the throw are left
/// out, and so are cohort's below an entry point and libc's below main.
/// Call from a terminate handler.
std::string trace_of_throw();

/// "<demangled type>: <what()>" of `e`, a what() that returns null read as
/// empty, then "; caused by " and the same of each exception nested in it
/// (std::throw_with_nested, whose wrapper type is named as the type the
/// program gave it).
std::string exception_message(const std::exception& e);

/// exception_message() of the exception being handled, the type alone for
/// one not derived from std::exception, or a note that there is none.
std::string current_exception_message();

/// The report of the exception being handled, written to the error file
/// (when the process has one) as it is made. One thread of a process
/// writes it, the first to call this; another that calls it meanwhile
/// waits for that one's handler to end the process, so that the first
/// failure stands (it returns the first one's message, unwritten, only
/// where that handler has not ended the process after 10 s: it may be
/// waiting for a lock this thread holds). Called again on the first
/// thread, because the exception's what() threw, it reports
/// "<type>: (its what() threw <that exception>)". Every signal that can be is
/// blocked in this thread and ignored by the process first, for good (the
/// faults' aside): a shutdown's SIGTERM, sent because another rank failed
/// later, must not end this one, by any of its threads, while it
/// symbolizes its trace
/// (tens of milliseconds), which would lose the first failure. The
/// message and the time come first, in a report of their own, so that a
/// SIGKILL during the trace still leaves them. Call from a terminate
/// handler, which then exits.
error_report report_uncaught() noexcept;

}  // namespace cohort::detail

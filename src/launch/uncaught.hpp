// The trace and message of an exception that no handler catches, taken in
// a terminate handler while the thrower's frames are still on the stack.
#pragma once

#include <string>

namespace cohort::detail {

/// The frames from the throw down to the bottom of the program's own code,
/// innermost first, one "#N <frame>" line each (os::describe): the frames
/// of the terminate handler and of the C++ runtime above the throw are left
/// out, and so are cohort's below an entry point and libc's below main.
/// Call from a terminate handler.
std::string trace_of_throw();

/// "<demangled type>: <what()>" of the exception being handled, the type
/// alone for one not derived from std::exception, or a note that there is
/// none.
std::string current_exception_message();

}  // namespace cohort::detail

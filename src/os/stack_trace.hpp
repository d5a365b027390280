// The calling thread's stack, symbolized: function names, and source file
// and line where the program carries debug information.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace cohort::os {

/// One frame of a stack, innermost first. Inlined calls appear as frames of
/// their own, at the caller's pc.
struct stack_frame {
  std::uintptr_t pc = 0;
  std::string function;  ///< demangled; empty when no symbol covers pc
  std::string file;      ///< the source file; empty without debug information
  int line = 0;
  std::string module;    ///< the executable or shared object that holds pc
};

/// The frames of the calling thread below this call. Names come from the
/// debug information and full symbol tables of every loaded module
/// (libbacktrace, where the toolchain provides it), else from the dynamic
/// symbols (dladdr), so they need no -rdynamic there. Allocates; meant for
/// a process that is failing, not for a hot path. Any thread may call it.
std::vector<stack_frame> current_stack();

/// "name at file:line", "name in module" or "module+0xoffset".
std::string describe(const stack_frame& frame);

/// Whether the frames come with file and line where debug information
/// exists (libbacktrace was found when cohort was built).
bool stack_has_source_lines() noexcept;

}  // namespace cohort::os

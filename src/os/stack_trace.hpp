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
  /// The stack's own first frame (_start, a thread's start); false on every
  /// frame of a stack cut off at its 128th.
  bool outermost = false;
};

/// The frames of the calling thread below this call. Names, files and lines
/// come from elfutils' libdw, loaded at the first call: the full symbol
/// tables and the DWARF of the modules on the stack, each read when one of
/// its frames is named, so they need no -rdynamic. Frames of the C and C++
/// runtimes' libraries (libc, libm, libstdc++, libgcc_s, the dynamic
/// loader) are named from their symbol tables only: their debug information,
/// where installed, is separate and compressed, and reading libc's took
/// 40 ms. Without libdw (not found at build or at run time), names come from
/// the dynamic symbols (dladdr). Allocates; meant for a process that is
/// failing, not for a hot path. Any thread may call it.
std::vector<stack_frame> current_stack();

/// "name at file:line", "name in module" or "module+0xoffset".
std::string describe(const stack_frame& frame);

/// Whether the frames come with file and line where debug information
/// exists: libdw's header was found when cohort was built and libdw.so.1
/// loads. Loads it.
bool stack_has_source_lines() noexcept;

}  // namespace cohort::os

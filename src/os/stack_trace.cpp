// Capturing and symbolizing the stack: libbacktrace reads DWARF and the
// symbol tables of every loaded module; without it, dladdr names what the
// dynamic symbol tables export.
#include "os/stack_trace.hpp"

#include "os/demangle.hpp"

#include <fmt/format.h>

#include <dlfcn.h>
#include <execinfo.h>
#include <link.h>

#include <mutex>
#include <string_view>

#if __has_include(<backtrace.h>) && defined(COHORT_HAVE_LIBBACKTRACE)
#include <backtrace.h>
#define COHORT_USE_LIBBACKTRACE 1
#endif

namespace cohort::os {
namespace {

// The module holding `pc` and pc's offset in it.
std::pair<std::string, std::uintptr_t> module_of(std::uintptr_t pc) {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(pc), &info) == 0 || info.dli_fname == nullptr) return {"", pc};
  return {info.dli_fname, pc - reinterpret_cast<std::uintptr_t>(info.dli_fbase)};
}

#ifdef COHORT_USE_LIBBACKTRACE

backtrace_state* state() {
  // Made once per process (libbacktrace cannot free one); threaded, so any
  // thread may capture.
  static backtrace_state* s = backtrace_create_state(nullptr, 1, [](void*, const char*, int) {}, nullptr);
  return s;
}

struct capture {
  std::vector<stack_frame> frames;
};

int on_frame(void* data, std::uintptr_t pc, const char* file, int line, const char* function) {
  auto& c = *static_cast<capture*>(data);
  if (pc == static_cast<std::uintptr_t>(-1)) return 0;
  stack_frame f;
  f.pc = pc;
  f.function = demangle(function);
  if (file != nullptr) f.file = file;
  f.line = line;
  f.module = module_of(pc).first;
  c.frames.push_back(std::move(f));
  return c.frames.size() >= 128 ? 1 : 0;
}

#endif

}  // namespace

std::vector<stack_frame> current_stack() {
#ifdef COHORT_USE_LIBBACKTRACE
  if (auto* s = state()) {
    capture c;
    backtrace_full(s, 1, on_frame, [](void*, const char*, int) {}, &c);
    // Frames without debug information: their symbol from the full symbol
    // table, which names functions the dynamic one hides.
    for (auto& f : c.frames) {
      if (!f.function.empty()) continue;
      backtrace_syminfo(
          s, f.pc,
          [](void* data, std::uintptr_t, const char* symbol, std::uintptr_t, std::uintptr_t) {
            static_cast<stack_frame*>(data)->function = demangle(symbol);
          },
          [](void*, const char*, int) {}, &f);
    }
    if (!c.frames.empty()) return std::move(c.frames);
  }
#endif
  void* pcs[128];
  const int n = ::backtrace(pcs, 128);
  std::vector<stack_frame> frames;
  for (int i = 1; i < n; ++i) {
    stack_frame f;
    // A return address points after the call: step back into it, as
    // libbacktrace does, so the frame names the calling function.
    f.pc = reinterpret_cast<std::uintptr_t>(pcs[i]) - 1;
    Dl_info info{};
    if (::dladdr(pcs[i], &info) != 0 && info.dli_sname != nullptr) f.function = demangle(info.dli_sname);
    f.module = module_of(f.pc).first;
    frames.push_back(std::move(f));
  }
  return frames;
}

std::string describe(const stack_frame& frame) {
  if (!frame.function.empty() && !frame.file.empty()) return fmt::format("{} at {}:{}", frame.function, frame.file, frame.line);
  if (!frame.function.empty()) return fmt::format("{} in {}", frame.function, frame.module.empty() ? "?" : frame.module);
  const auto [module, offset] = module_of(frame.pc);
  return module.empty() ? fmt::format("{:#x}", frame.pc) : fmt::format("{}+{:#x}", module, offset);
}

bool stack_has_source_lines() noexcept {
#ifdef COHORT_USE_LIBBACKTRACE
  return true;
#else
  return false;
#endif
}

}  // namespace cohort::os

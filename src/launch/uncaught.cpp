// What an exception that no handler catches leaves behind: the trace of its
// throw, symbolized while the thrower's frames are still on the stack, its
// message, and for programs that ask, the error file their supervisor reads.
#include "launch/uncaught.hpp"

#include "launch/entry.hpp"
#include "os/demangle.hpp"
#include "os/stack_trace.hpp"

#include "cohort/error_file.hpp"

#include <fmt/format.h>

#include <cxxabi.h>
#include <dlfcn.h>
#include <link.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <string_view>

namespace cohort {
namespace detail {
namespace {

bool in_module(const os::stack_frame& f, std::string_view name) {
  return f.module.find(name) != std::string::npos;
}

// A frame of cohort's shared library (`own_module`; "" where cohort is
// linked into the program) that no symbol names: without libdw, its hidden
// functions are known only by their module.
bool unnamed_in_cohort(const os::stack_frame& f, const std::string& own_module) {
  return f.function.empty() && !own_module.empty() && f.module == own_module;
}

// A frame of the C++ runtime's throw and terminate, or of this handler.
bool of_the_handler(const os::stack_frame& f, const std::string& own_module) {
  if (in_module(f, "libstdc++") || in_module(f, "libgcc_s")) return true;
  for (std::string_view prefix : {"__cxa_", "__cxxabiv1::", "std::terminate", "_Unwind_", "__gnu_cxx::__verbose_terminate"}) {
    if (f.function.starts_with(prefix)) return true;
  }
  // DWARF names a function of internal linkage without its scope.
  for (std::string_view own : {"on_uncaught", "on_uncaught_or_default", "on_uncaught_in_program",
                                 "cohort::detail::trace_of_throw", "cohort::detail::report_uncaught"}) {
    if (f.function.starts_with(own) || f.function.find(fmt::format("(anonymous namespace)::{}(", own)) != std::string::npos) {
      return true;
    }
  }
  return unnamed_in_cohort(f, own_module);
}

// The frame that threw: the runtime's throw or rethrow.
bool throws(const os::stack_frame& f) {
  return f.function == "__cxa_throw" || f.function == "__cxa_rethrow" || f.function.starts_with("std::rethrow_exception");
}

// A frame below the function: cohort's thunk (instantiated in the program),
// the call by name and a pool's worker loop (the function a pool worker
// runs, which calls each item's), the bottom of the entry's stack, the
// switch onto it (or libc's start of that stack), and libc's start of main.
bool below_the_function(const os::stack_frame& f, const std::string& own_module) {
  return f.function.find("cohort::detail::thunk") != std::string::npos ||
         f.function.find("cohort::detail::call_decoded") != std::string::npos ||
         f.function.starts_with("cohort::detail::call_entry(") ||
         f.function.starts_with("cohort::detail::cohort_pool_worker(") ||
         f.function.find("entry_stack_main") != std::string::npos || f.function == "cohort_stack_switch" ||
         f.function.find("start_context") != std::string::npos ||
         f.function.starts_with("__libc_start") || f.function == "_start" ||
         // A std::thread's start: libc's, libstdc++'s (unnamed: hidden) and
         // the calls to the thread's function instantiated in the program,
         // which DWARF names inlined without their scope.
         f.function == "start_thread" || f.function.starts_with("__clone") ||
         (f.function.empty() && in_module(f, "libstdc++")) || f.function.starts_with("std::thread::_State_impl<") ||
         f.function.starts_with("std::thread::_Invoker<") || f.function.starts_with("std::__invoke") ||
         f.file.ends_with("/bits/std_thread.h") || f.file.ends_with("/bits/invoke.h") ||
         (f.function.empty() && in_module(f, "/libc.so")) || unnamed_in_cohort(f, own_module);
}

// The shared library that holds cohort, or "" where cohort is linked into
// the program (statically): its frames then are the program's.
std::string cohort_library() {
  Dl_info self{};
  link_map* module = nullptr;
  void* address = reinterpret_cast<void*>(&cohort_library);
  if (::dladdr1(address, &self, reinterpret_cast<void**>(&module), RTLD_DL_LINKMAP) == 0 || self.dli_fname == nullptr ||
      module == nullptr || module->l_name == nullptr || module->l_name[0] == '\0') {
    return "";
  }
  return self.dli_fname;
}

}  // namespace

std::string trace_of_throw() {
  const auto frames = os::current_stack();
  const std::string own_module = cohort_library();
  std::size_t first = 0, end = frames.size();
  // Below the runtime's throw lies the program; without one (terminate
  // called directly), the handler's and the runtime's frames are skipped.
  const auto thrown = std::find_if(frames.begin(), frames.end(), throws);
  if (thrown != frames.end()) {
    first = static_cast<std::size_t>(thrown - frames.begin()) + 1;
  } else {
    // std::terminate called the handler: its frame is named from libstdc++'s
    // dynamic symbols even where the handler's own frames are not.
    const auto terminate = std::find_if(frames.begin(), frames.end(), [](const os::stack_frame& f) {
      return f.function.starts_with("std::terminate");
    });
    if (terminate != frames.end()) first = static_cast<std::size_t>(terminate - frames.begin()) + 1;
    while (first < end && of_the_handler(frames[first], own_module)) ++first;
  }
  // The stack's start (_start, a thread's start) that no symbol names (no
  // libdw) is left out as a named one would be.
  if (end > first && frames[end - 1].outermost && frames[end - 1].function.empty()) --end;
  // The frame that threw stays, whatever it is named: code inlined into
  // a frame named as one below the function (a thread's lambda in its
  // std::thread caller, built without -g) is the function's.
  while (end > first + 1 && below_the_function(frames[end - 1], own_module)) --end;
  std::string trace;
  for (std::size_t i = first; i < end; ++i) trace += fmt::format("#{} {}\n", i - first, os::describe(frames[i]));
  return trace;
}

std::string current_exception_message() {
  auto error = std::current_exception();
  if (!error) return "std::terminate called without an exception";
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return os::exception_message(e);
  } catch (...) {
    const std::type_info* type = abi::__cxa_current_exception_type();
    return type != nullptr ? os::demangle(*type) : "unknown exception";
  }
}

error_report report_uncaught() noexcept {
  sigset_t all;
  ::sigfillset(&all);
  ::pthread_sigmask(SIG_BLOCK, &all, nullptr);
  // A signal sent to the process goes to any thread that does not block
  // it: another thread of this one would take the shutdown's SIGTERM, and
  // its default action would end the process all the same. Ignored, it
  // ends nothing. Not the signals of a fault (the kernel forces those) nor
  // SIGCHLD, whose ignoring would change how children are reaped.
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig == SIGKILL || sig == SIGSTOP || sig == SIGCHLD || sig == SIGSEGV || sig == SIGBUS || sig == SIGFPE ||
        sig == SIGILL || sig == SIGTRAP || sig == SIGABRT || sig == SIGSYS) {
      continue;
    }
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    ::sigaction(sig, &ignore, nullptr);  // refused for libc's own signals, which it keeps blocked
  }
  error_report report{{}, {}, std::chrono::system_clock::now()};
  try {
    report.message = current_exception_message();
    record_error(report);
    report.trace = trace_of_throw();
    record_error(report);
  } catch (...) {
    // Out of memory for the words: what was made stands.
  }
  return report;
}

namespace {

[[noreturn]] void on_uncaught_in_program() {
  const auto [message, trace, when] = report_uncaught();
  flush_held_output();
  std::fprintf(stderr, "cohort: uncaught exception in pid %d: %s\n%s", static_cast<int>(::getpid()), message.c_str(),
               trace.c_str());
  std::fflush(stderr);
  ::_exit(1);
}

}  // namespace
}  // namespace detail

void record_uncaught_exceptions() noexcept { std::set_terminate(detail::on_uncaught_in_program); }

}  // namespace cohort

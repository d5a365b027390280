// What an exception that no handler catches leaves behind: the trace of its
// throw, symbolized while the thrower's frames are still on the stack, its
// message, and for programs that ask, the error file their supervisor reads.
#include "launch/uncaught.hpp"

#include "launch/entry.hpp"
#include "os/demangle.hpp"
#include "os/per_process.hpp"
#include "os/stack_trace.hpp"

#include "cohort/error_file.hpp"

#include <fmt/format.h>

#include <cxxabi.h>
#include <dlfcn.h>
#include <link.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <optional>
#include <string_view>
#include <thread>
#include <typeinfo>
#include <utility>

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

// A frame of the standard library's std::throw_with_nested, which throws
// for the function that called it (inlined from a header, so named even
// where libstdc++'s own frames are not).
bool throws_for_its_caller(const os::stack_frame& f) {
  return f.function.starts_with("std::throw_with_nested<") || f.function.starts_with("std::__throw_with_nested_impl<") ||
         f.function.starts_with("void std::throw_with_nested<") ||
         f.function.starts_with("void std::__throw_with_nested_impl<");
}

// A frame below the function: cohort's thunk (instantiated in the program),
// the call by name, a pool's worker loop (the function a pool worker runs,
// which calls each item's) and its thunk, the bottom of the entry's stack,
// the switch onto it (or libc's start of that stack), and libc's start of
// main.
bool below_the_function(const os::stack_frame& f, const std::string& own_module) {
  return f.function.find("cohort::detail::thunk") != std::string::npos ||
         f.function.find("cohort::detail::call_decoded") != std::string::npos ||
         f.function.starts_with("cohort::detail::call_entry(") ||
         f.function.starts_with("cohort::detail::cohort_pool_worker(") ||
         f.function.starts_with("cohort::detail::pool_worker_thunk(") ||
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

// What a handler has said so far of the exception it reports. The handler
// keeps it outside its frame: a what() that throws calls std::terminate
// again on the same thread (what() is noexcept), and that second handler
// goes on from it.
struct words {
  std::string text;
  bool in_what = false;  // text ends with the type of the exception whose what() runs
};

// The demangled type, std::throw_with_nested's wrapper of the runtime's
// own named as the type the program gave it.
std::string type_name(const std::type_info& type) {
  std::string name = os::demangle(type);
  constexpr std::string_view wrapper = "std::_Nested_exception<";
  if (name.starts_with(wrapper) && name.ends_with('>')) name = name.substr(wrapper.size(), name.size() - wrapper.size() - 1);
  return name;
}

// The type of the exception being handled.
std::string current_type_name() {
  const std::type_info* type = abi::__cxa_current_exception_type();
  return type != nullptr ? type_name(*type) : "unknown exception";
}

void describe(const std::exception_ptr& error, words& said);

// "<type>: <what()>" of `e`, a what() that breaks its contract by returning
// null read as empty, then "; caused by " and the same of the exception
// nested in it, if any.
void describe(const std::exception& e, words& said) {
  said.text += type_name(typeid(e));
  said.text += ": ";
  said.in_what = true;
  const char* what = e.what();
  said.in_what = false;
  said.text += what != nullptr ? what : "";
  const auto* nested = dynamic_cast<const std::nested_exception*>(&e);
  if (nested != nullptr && nested->nested_ptr()) {
    said.text += "; caused by ";
    describe(nested->nested_ptr(), said);
  }
}

// The same for `error`, one not derived from std::exception by its type
// alone (and its nested exception's words).
void describe(const std::exception_ptr& error, words& said) {
  std::exception_ptr cause;
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    describe(e, said);
    return;
  } catch (const std::nested_exception& nested) {
    said.text += current_type_name();
    cause = nested.nested_ptr();
  } catch (...) {
    said.text += current_type_name();
  }
  if (cause) {
    said.text += "; caused by ";
    describe(cause, said);
  }
}

void describe_current(words& said) {
  if (const auto error = std::current_exception()) {
    describe(error, said);
  } else {
    said.text += "std::terminate called without an exception";
  }
}

// The report of a process's uncaught exceptions, one per process: a child
// forked while a thread of its parent reported finds it unowned. The first
// thread in a terminate handler owns it and writes it; another that fails
// meanwhile waits for the owner's handler to end the process, so that the
// error file names the first failure, not the last.
struct uncaught_state {
  std::atomic<pid_t> owner{0};  // the owning thread, 0 until one claims it
  // The owner's message once made, and whether its report is written (its
  // handler then ends the process): released by the owner, acquired by a
  // thread that waited too long.
  std::atomic<const std::string*> message{nullptr};
  std::atomic<bool> written{false};
  // The owner's thread alone uses the rest, in each handler it enters.
  int entries = 0;
  int open = 0;  // parentheses said.text leaves open
  words said;
  error_report report;
};

// How long a thread that fails while another reports waits for that report
// to end the process: the owner may wait for the dynamic loader's lock,
// which this thread may hold (an exception thrown by a library's
// constructor as dlopen runs it). Longer than the owner's wait for the
// symbolizer (os::current_stack).
constexpr auto owner_wait = std::chrono::seconds(10);

// The owner's report as far as made (its message) where its handler has
// not ended the process within owner_wait; nullopt where it has not made
// its message either, for this thread to report its own exception.
std::optional<error_report> wait_for_owner(uncaught_state& state) {
  const auto until = std::chrono::steady_clock::now() + owner_wait;
  // Once the report is written, its handler is on its way to _exit.
  while (std::chrono::steady_clock::now() < until || state.written.load(std::memory_order_acquire)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const std::string* message = state.message.load(std::memory_order_acquire);
  if (message == nullptr) return std::nullopt;
  return error_report{*message, {}, std::chrono::system_clock::now()};
}

// Writes the report with what was said: the message, then the trace.
// The message is published first for a thread that waits too long, which
// reads it only while the report is not written: the owner may move the
// report out once it is.
void write_report(uncaught_state& state) noexcept {
  try {
    state.report.message = state.said.text;
    state.message.store(&state.report.message, std::memory_order_release);
    record_error(state.report);
    state.report.trace = trace_of_throw();
    record_error(state.report);
  } catch (...) {
    // Out of memory for the words: what was made stands.
  }
  state.written.store(true, std::memory_order_release);
}

// The report where the handler is entered again on the owner's thread. A
// what() that threw is written "<type>: (its what() threw <its words>)";
// a what() that throws in turn gets the same, and past a few its exception
// is named by type alone. Anything else that ended the handler leaves the
// report as it was.
error_report report_again(uncaught_state& state) noexcept {
  if (!state.said.in_what) {
    if (state.message.load(std::memory_order_relaxed) == nullptr) write_report(state);
    state.written.store(true, std::memory_order_release);
    return std::move(state.report);
  }
  state.said.in_what = false;
  try {
    state.said.text += "(its what() threw ";
    ++state.open;
    if (state.entries > 3) {
      state.said.text += current_type_name();
    } else {
      describe_current(state.said);
    }
    state.said.text.append(static_cast<std::size_t>(state.open), ')');
  } catch (...) {
    // Out of memory for the words: what was made stands.
  }
  write_report(state);
  return std::move(state.report);
}

}  // namespace

std::string trace_of_throw() {
  const auto frames = os::current_stack();
  const std::string own_module = cohort_library();
  std::size_t first = 0, end = frames.size();
  // Below the runtime's throw lies the program: below the outermost one,
  // where a what() the handler called threw and entered it again. Without
  // one (terminate called directly), the handler's and the runtime's
  // frames are skipped.
  const auto thrown = std::find_if(frames.rbegin(), frames.rend(), throws);
  if (thrown != frames.rend()) {
    first = static_cast<std::size_t>(frames.rend() - thrown);
    while (first + 1 < end && throws_for_its_caller(frames[first])) ++first;
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

std::string exception_message(const std::exception& e) {
  words said;
  describe(e, said);
  return said.text;
}

std::string current_exception_message() {
  words said;
  describe_current(said);
  return said.text;
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
  uncaught_state* state = nullptr;
  try {
    state = &os::of_this_process<uncaught_state>();
  } catch (...) {
    // Out of memory: this thread reports alone.
  }
  const pid_t self = ::gettid();
  pid_t owner = 0;
  // The first thread here owns the report; its own thread, entering
  // again, finds itself. Relaxed: a thread that finds another the owner
  // reads what that one made through `message` and `written`, which order
  // it.
  if (state != nullptr && !state->owner.compare_exchange_strong(owner, self, std::memory_order_relaxed) &&
      owner != self) {
    if (auto owners = wait_for_owner(*state)) return std::move(*owners);
    state = nullptr;
  }
  uncaught_state alone;
  if (state == nullptr) state = &alone;
  if (state->entries++ > 0) return report_again(*state);
  state->report.timestamp = std::chrono::system_clock::now();
  try {
    describe_current(state->said);
  } catch (...) {
    // Out of memory for the words: what was made stands.
  }
  write_report(*state);
  return std::move(state->report);
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

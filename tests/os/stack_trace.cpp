// The stack as os::current_stack sees it: inlined calls as frames of their
// own, source lines from a module's separate debug file, only the modules
// on the stack read, and modules loaded after an earlier trace named.
#include "os/stack_trace.hpp"

#include <doctest/doctest.h>

#include <dlfcn.h>
#include <pthread.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <thread>
#include <string>
#include <string_view>
#include <vector>

namespace {

using cohort::os::stack_frame;

constexpr int inner_line = __LINE__ + 2;
[[gnu::always_inline]] inline void inner(std::vector<stack_frame>& out) {
  out = cohort::os::current_stack();
}

constexpr int middle_line = __LINE__ + 2;
[[gnu::always_inline]] inline void middle(std::vector<stack_frame>& out) {
  inner(out);
}

constexpr int outer_line = __LINE__ + 2;
[[gnu::noinline]] void outer(std::vector<stack_frame>& out) {
  middle(out);
  asm volatile("");  // not a tail call
}

// The stack from a thread whose stack is `size` bytes.
std::vector<stack_frame> from_a_stack_of(std::size_t size) {
  std::vector<stack_frame> frames;
  pthread_attr_t attr;
  REQUIRE(::pthread_attr_init(&attr) == 0);
  REQUIRE(::pthread_attr_setstacksize(&attr, size) == 0);
  pthread_t thread;
  REQUIRE(::pthread_create(
              &thread, &attr,
              [](void* out) -> void* {
                outer(*static_cast<std::vector<stack_frame>*>(out));
                return nullptr;
              },
              &frames) == 0);
  ::pthread_attr_destroy(&attr);
  ::pthread_join(thread, nullptr);
  return frames;
}

// How many times `path` was opened since the last call, through `watch`.
int opens(int watch) {
  std::array<char, 4096> buffer{};
  int count = 0;
  for (;;) {
    const ssize_t n = ::read(watch, buffer.data(), buffer.size());
    if (n <= 0) return count;
    for (ssize_t at = 0; at < n;) {
      const auto* event = reinterpret_cast<const inotify_event*>(buffer.data() + at);
      if ((event->mask & IN_OPEN) != 0) ++count;
      at += static_cast<ssize_t>(sizeof(inotify_event) + event->len);
    }
  }
}

}  // namespace

// Each inlined call a frame, at the caller's pc, with its line.
void check_inlined(const std::vector<stack_frame>& frames) {
  REQUIRE(frames.size() >= 3);
  INFO(cohort::os::describe(frames[0]), "\n", cohort::os::describe(frames[1]), "\n", cohort::os::describe(frames[2]));
  CHECK(frames[0].function.find("inner") != std::string::npos);
  CHECK(frames[0].line == inner_line);
  CHECK(frames[1].function.find("middle") != std::string::npos);
  CHECK(frames[1].line == middle_line);
  CHECK(frames[2].function.find("outer") != std::string::npos);
  CHECK(frames[2].line == outer_line);
  for (const auto& f : {frames[0], frames[1], frames[2]}) {
    CHECK(f.file.ends_with("os/stack_trace.cpp"));
    // The source file is named with its directory, as the compiler saw it.
    CHECK(f.file.starts_with("/"));
    CHECK(f.pc == frames[0].pc);
  }
}

TEST_CASE("each inlined call is a frame of its own, at its caller's pc, with the caller's line of the call") {
  if (!cohort::os::stack_has_source_lines()) return;
  std::vector<stack_frame> frames;
  outer(frames);
  check_inlined(frames);
}

TEST_CASE("a thread with little stack left is symbolized all the same") {
  if (!cohort::os::stack_has_source_lines()) return;
  // libdw reads a line table with about 150 KiB of stack.
  check_inlined(from_a_stack_of(64 << 10));
}

// The frame of split_debug_call in the stack of a call through the library
// at `path`, loaded here.
stack_frame through_split_library(const std::string& path, int& call_line) {
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  REQUIRE(handle != nullptr);
  auto* call = reinterpret_cast<void (*)(void (*)(void*), void*)>(::dlsym(handle, "split_debug_call"));
  auto* line = reinterpret_cast<int (*)()>(::dlsym(handle, "split_debug_call_line"));
  REQUIRE(reinterpret_cast<void*>(call) != nullptr);
  REQUIRE(reinterpret_cast<void*>(line) != nullptr);
  call_line = line();
  std::vector<stack_frame> through;
  call([](void* out) { *static_cast<std::vector<stack_frame>*>(out) = cohort::os::current_stack(); }, &through);
  const auto frame =
      std::find_if(through.begin(), through.end(), [&](const stack_frame& f) { return f.module == path; });
  REQUIRE(frame != through.end());
  return *frame;
}

TEST_CASE("a module without a build id has its debug file found by its debuglink's CRC") {
  if (!cohort::os::stack_has_source_lines()) return;
  int call_line = 0;
  const stack_frame frame = through_split_library(COHORT_TEST_SPLIT_DEBUG_NO_ID, call_line);
  INFO(cohort::os::describe(frame));
  CHECK(frame.function == "split_debug_call");
  CHECK(frame.file.ends_with("support/split_debug.cpp"));
  CHECK(frame.line == call_line);
}

TEST_CASE("a trace reads a module's separate debug information only when one of its frames is on the stack") {
  if (!cohort::os::stack_has_source_lines()) return;
  // A trace taken before the library is loaded: one after still names it.
  REQUIRE(!cohort::os::current_stack().empty());
  const std::string library = COHORT_TEST_SPLIT_DEBUG;
  void* handle = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  REQUIRE(handle != nullptr);
  const int watch = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  REQUIRE(watch >= 0);
  REQUIRE(::inotify_add_watch(watch, (library + ".debug").c_str(), IN_OPEN) >= 0);

  // Loaded, but not on the stack: its debug file stays closed.
  const auto before = cohort::os::current_stack();
  REQUIRE(!before.empty());
  CHECK(opens(watch) == 0);
  CHECK(std::none_of(before.begin(), before.end(), [&](const stack_frame& f) { return f.module == library; }));

  // On the stack: its frame has the file and line its debug file holds.
  int call_line = 0;
  const stack_frame frame = through_split_library(library, call_line);
  CHECK(opens(watch) >= 1);
  INFO(cohort::os::describe(frame));
  CHECK(frame.function == "split_debug_call");
  CHECK(frame.file.ends_with("support/split_debug.cpp"));
  CHECK(frame.line == call_line);
  ::close(watch);
  ::dlclose(handle);
}

TEST_CASE("a trace looks for a module's debug file on this machine only, never through debuginfod") {
  if (!cohort::os::stack_has_source_lines()) return;
  // A frame of libstdc++ (the start of a std::thread), whose debug file is
  // not installed: libdw's standard search would then load its debuginfod
  // client and, with DEBUGINFOD_URLS set, fetch the file over the network.
  std::vector<stack_frame> frames;
  std::thread([&] { frames = cohort::os::current_stack(); }).join();
  CHECK(std::any_of(frames.begin(), frames.end(),
                    [](const stack_frame& f) { return f.module.find("libstdc++") != std::string::npos; }));
  std::ifstream maps("/proc/self/maps");
  const std::string mapped{std::istreambuf_iterator<char>(maps), std::istreambuf_iterator<char>()};
  CHECK(mapped.find("libdw") != std::string::npos);
  CHECK(mapped.find("libdebuginfod") == std::string::npos);
}

TEST_CASE("frames of the C runtime are named from its symbols, without its source lines") {
  std::vector<stack_frame> frames = cohort::os::current_stack();
  const auto libc = std::find_if(frames.begin(), frames.end(),
                                 [](const stack_frame& f) { return f.module.find("/libc.so") != std::string::npos; });
  REQUIRE(libc != frames.end());
  INFO(cohort::os::describe(*libc));
  CHECK(!libc->function.empty());
  CHECK(libc->function.find('@') == std::string::npos);  // no symbol version
  CHECK(libc->file.empty());
}

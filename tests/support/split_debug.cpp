// A shared library whose debug information lies in a file of its own
// (libsplit_debug.so.debug, found through its .gnu_debuglink), as
// distributions install theirs: for tests of how a stack is symbolized.
#include <atomic>

namespace split_debug {

std::atomic<int> calls{0};

}  // namespace split_debug

extern "C" {

// The line of the call in split_debug_call.
__attribute__((visibility("default"))) int split_debug_call_line() { return __LINE__ + 5; }

// Calls fn(arg) from a frame of this library.
__attribute__((visibility("default"), noinline)) void split_debug_call(void (*fn)(void*), void* arg) {
  split_debug::calls.fetch_add(1);
  fn(arg);
  split_debug::calls.fetch_add(1);  // not a tail call: this frame stays on the stack
}

}

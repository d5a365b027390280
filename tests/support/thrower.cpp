// A program linked against the shared library, as users link it, that
// throws. Run as `thrower METHOD` (spawn, fork, forkserver), its one function
// rank throws: it prints the line of that throw, then the trace the parent
// received. Run as `thrower uncaught`, it asks for its uncaught exceptions
// to be recorded, prints the line of its throw and throws from main's callee;
// as `thrower thread`, the same from a std::thread's function; as
// `thrower constructor LIBRARY`, it asks the same and loads LIBRARY, whose
// constructor throws; as `thrower constructor-race LIBRARY`, another thread
// throws meanwhile.
#include <cohort/error_file.hpp>
#include <cohort/entry_point.hpp>
#include <cohort/process_error.hpp>
#include <cohort/spawn_and_join.hpp>

#include <dlfcn.h>
#include <execinfo.h>

#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string_view>
#include <thread>

namespace thrower {

constexpr int throw_line = __LINE__ + 2;
[[noreturn]] void throw_here(int rank) {
  throw std::runtime_error("thrown by rank " + std::to_string(rank));
}
COHORT_ENTRYPOINT(throw_here);

constexpr int uncaught_line = __LINE__ + 2;
[[noreturn]] void throw_uncaught() {
  throw std::runtime_error("uncaught in main");
}

}  // namespace thrower

int main(int argc, char** argv) {
  if (auto rc = cohort::child_main(argc, argv)) return *rc;
  if (argc == 3 && std::string_view(argv[1]) == "constructor") {
    // A library whose constructor throws, loaded after asking for the
    // uncaught exceptions to be recorded.
    cohort::record_uncaught_exceptions();
    ::dlopen(argv[2], RTLD_NOW);
    return 3;
  }
  if (argc == 3 && std::string_view(argv[1]) == "constructor-race") {
    // The same, while another thread fails: it starts naming its frames
    // and waits for the loader's lock, which this thread holds in dlopen.
    cohort::record_uncaught_exceptions();
    void* pcs[4];
    ::backtrace(pcs, 4);  // the unwinder loaded ahead, which takes that lock too
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      thrower::throw_uncaught();
    }).detach();
    ::dlopen(argv[2], RTLD_NOW);
    return 3;
  }
  if (argc != 2) return 2;
  const std::string_view name = argv[1];
  if (name == "thread") {
    cohort::record_uncaught_exceptions();
    std::printf("%d\n", thrower::uncaught_line);
    std::fflush(stdout);
    std::thread([] { thrower::throw_uncaught(); }).join();
  }
  if (name == "uncaught") {
    cohort::record_uncaught_exceptions();
    std::printf("%d\n", thrower::uncaught_line);
    std::fflush(stdout);
    thrower::throw_uncaught();
  }
  cohort::join_options options;
  options.method = name == "fork" ? cohort::start_method::fork
                 : name == "forkserver" ? cohort::start_method::forkserver
                                        : cohort::start_method::spawn;
  std::printf("%d\n", thrower::throw_line);
  try {
    cohort::spawn_and_join(thrower::throw_here, std::tuple{}, 1, options);
  } catch (const cohort::process_raised_error& e) {
    std::printf("%s", e.trace().c_str());
    return 0;
  }
  return 1;
}

// A program linked against the shared library, as users link it, that
// throws. Run as `thrower METHOD` (spawn, fork, forkserver), its one function
// rank throws: it prints the line of that throw, then the trace the parent
// received. Run as `thrower uncaught`, it asks for its uncaught exceptions
// to be recorded, prints the line of its throw and throws from main's callee;
// as `thrower thread`, the same from a std::thread's function; as
// `thrower constructor LIBRARY`, it asks the same and loads LIBRARY, whose
// constructor throws; as `thrower constructor-race LIBRARY`, another thread
// throws meanwhile. As `thrower two-threads`, its main thread throws an
// exception whose what() lets another thread throw, then takes 200 ms; as
// `thrower fork-as-it-reports`, that what() forks a child whose thread
// throws, with the error file's path and ".child" as its own, and prints
// the child's exit code.
#include <cohort/error_file.hpp>
#include <cohort/entry_point.hpp>
#include <cohort/process_error.hpp>
#include <cohort/spawn_and_join.hpp>

#include <dlfcn.h>
#include <execinfo.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <stdexcept>
#include <exception>
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

// What the main thread's exception's what() does as the handler reports
// it, before it takes its time.
void (*while_saying)() = nullptr;

struct slow_to_say : std::runtime_error {
  using std::runtime_error::runtime_error;
  const char* what() const noexcept override {
    if (while_saying != nullptr) while_saying();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    return std::runtime_error::what();
  }
};

[[noreturn]] void throw_first() { throw slow_to_say("first, the main thread"); }
[[noreturn]] void throw_second() { throw std::runtime_error("second, another thread"); }

[[noreturn]] void throw_nested() {
  try {
    throw std::runtime_error("reading batch 12");
  } catch (...) {
    std::throw_with_nested(std::logic_error("training step 3"));
  }
}

std::atomic<bool> saying{false};

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
  if (name == "two-threads") {
    cohort::record_uncaught_exceptions();
    thrower::while_saying = [] {
      thrower::saying = true;
      thrower::saying.notify_all();
    };
    std::thread([] {
      thrower::saying.wait(false);
      thrower::throw_second();
    }).detach();
    thrower::throw_first();
  }
  if (name == "fork-as-it-reports") {
    cohort::record_uncaught_exceptions();
    thrower::while_saying = [] {
      const pid_t child = ::fork();
      if (child == 0) {
        const std::string file = std::string(std::getenv("COHORT_ERROR_FILE")) + ".child";
        ::setenv("COHORT_ERROR_FILE", file.c_str(), 1);
        // A thread of its own: this one's stack holds the parent's handler.
        std::thread([] { thrower::throw_second(); }).join();
      }
      int status = 0;
      ::waitpid(child, &status, 0);
      std::printf("%d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
      std::fflush(stdout);
    };
    thrower::throw_first();
  }
  if (name == "thread") {
    cohort::record_uncaught_exceptions();
    std::printf("%d\n", thrower::uncaught_line);
    std::fflush(stdout);
    std::thread([] { thrower::throw_uncaught(); }).join();
  }
  if (name == "nested") {
    cohort::record_uncaught_exceptions();
    thrower::throw_nested();
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

#include "python.hpp"

#include <doctest/doctest.h>

#include <cstdlib>
#include <string>

// The peer's interpreter is $COHORT_BENCH_PYTHON: here /bin/sh, whose
// "scripts" answer as a Python script would, so no Python is needed.
namespace {

class interpreter {
 public:
  explicit interpreter(const char* path) { ::setenv("COHORT_BENCH_PYTHON", path, 1); }
  interpreter(const interpreter&) = delete;
  interpreter& operator=(const interpreter&) = delete;
  ~interpreter() { ::unsetenv("COHORT_BENCH_PYTHON"); }
};

}  // namespace

TEST_SUITE("bench python peer") {
  using cohort::bench::python_peer;

  TEST_CASE("a peer answers each request with its own line, in turn") {
    const interpreter sh("/bin/sh");
    python_peer peer("echo ready; while read line; do echo \"got $line $1\"; done\n", {"x"});
    CHECK(peer.failure().empty());
    CHECK(peer.ask("a") == "got a x");
    CHECK(peer.ask("b c") == "got b c x");
  }

  TEST_CASE("a peer that exits before answering says how, with its last line on stderr") {
    const interpreter sh("/bin/sh");
    python_peer peer("echo ready; read line; echo gone >&2; exit 3\n", {});
    CHECK_FALSE(peer.ask("a").has_value());
    CHECK(peer.failure() == "/bin/sh exited with 3: gone");
    CHECK_FALSE(peer.ask("b").has_value());
    CHECK(peer.failure() == "/bin/sh exited with 3: gone");
  }

  TEST_CASE("a peer whose first line is not ready fails before any request") {
    const interpreter sh("/bin/sh");
    python_peer peer("echo hello; read line\n", {});
    CHECK(peer.failure() == "it began with \"hello\"");
    CHECK_FALSE(peer.ask("a").has_value());
  }

  TEST_CASE("a peer whose interpreter cannot run says so") {
    const interpreter none("/nonexistent/python3");
    python_peer peer("", {});
    CHECK(peer.failure() == "/nonexistent/python3 could not be run");
    CHECK_FALSE(peer.ask("a").has_value());
  }
}

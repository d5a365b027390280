#include "python.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

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

// Seconds since `start`.
double since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

TEST_SUITE("bench python script") {
  using cohort::bench::run_python;

  TEST_CASE("a script run to its end gives each line whole, however long, without its newline") {
    const interpreter sh("/bin/sh");
    // 1,000 numbers on one line (about 4 KB), as a baseline's trips print.
    const auto out = run_python("echo first; seq -s ' ' 1000 1999; printf last\n", "");
    CHECK(out.failure.empty());
    REQUIRE(out.lines.size() == 3);
    CHECK(out.lines[0] == "first");
    CHECK(out.lines[1].size() == 4999);
    CHECK(out.lines[1].starts_with("1000 1001 "));
    CHECK(out.lines[1].ends_with(" 1998 1999"));
    CHECK(out.lines[2] == "last");
  }

  TEST_CASE("a script that fails says how, with its last line on stderr") {
    const interpreter sh("/bin/sh");
    const auto out = run_python("echo partial; echo broken >&2; exit 4\n", "");
    CHECK(out.lines == std::vector<std::string>{"partial"});
    CHECK(out.failure == "/bin/sh exited with 4: broken");
  }
}

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

  TEST_CASE("a peer that answers nothing within its time limit is killed and says so") {
    const interpreter sh("/bin/sh");
    ::setenv("COHORT_BENCH_PEER_TIMEOUT", "1", 1);
    const auto start = std::chrono::steady_clock::now();
    python_peer peer("echo ready; read line; exec sleep 100\n", {});
    const auto answer = peer.ask("a");
    ::unsetenv("COHORT_BENCH_PEER_TIMEOUT");
    CHECK_FALSE(answer.has_value());
    CHECK(peer.failure() == "/bin/sh answered nothing within 1 s (COHORT_BENCH_PEER_TIMEOUT)");
    // Generous: the limit is 1 s; the sleep would hold it 100.
    CHECK(since(start) < 30);
  }

  TEST_CASE("a peer that dies while a process it left holds its stdout fails at once") {
    const interpreter sh("/bin/sh");
    const auto start = std::chrono::steady_clock::now();
    python_peer peer("echo ready; read line; sleep 100 & echo gone >&2; exit 3\n", {});
    CHECK_FALSE(peer.ask("a").has_value());
    CHECK(peer.failure() == "/bin/sh exited with 3: gone");
    CHECK(since(start) < 30);
  }

  TEST_CASE("a peer's answer written just before it exits is read") {
    const interpreter sh("/bin/sh");
    python_peer peer("echo ready; read line; echo last; exit 0\n", {});
    CHECK(peer.ask("a") == "last");
    CHECK_FALSE(peer.ask("b").has_value());
    CHECK(peer.failure() == "/bin/sh exited before it answered");
  }
}

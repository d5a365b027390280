#include "cohort/environment.hpp"

#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>

using cohort::environment;

namespace {

bool holds(const std::vector<std::string>& block, const std::string& entry) {
  return std::find(block.begin(), block.end(), entry) != block.end();
}

}  // namespace

TEST_SUITE("environment") {
  TEST_CASE("inherit() carries this process's variables, with changes on top") {
    ::setenv("COHORT_TEST_INHERITED", "yes", 1);
    ::setenv("COHORT_TEST_DROPPED", "x", 1);
    auto block = environment::inherit().set("COHORT_TEST_ADDED", "1").unset("COHORT_TEST_DROPPED").materialize();
    CHECK(holds(block, "COHORT_TEST_INHERITED=yes"));
    CHECK(holds(block, "COHORT_TEST_ADDED=1"));
    CHECK(std::none_of(block.begin(), block.end(), [](const std::string& e) { return e.rfind("COHORT_TEST_DROPPED=", 0) == 0; }));
  }

  TEST_CASE("empty() and from() hold exactly what they are given") {
    CHECK(environment::empty().materialize().empty());
    auto block = environment::from({{"B", "2"}, {"A", "1"}}).materialize();
    CHECK(block == std::vector<std::string>{"A=1", "B=2"});
  }

  TEST_CASE("later changes win, and values may hold '='") {
    auto block = environment::empty().set("K", "1").unset("K").set("K", "a=b").materialize();
    CHECK(block == std::vector<std::string>{"K=a=b"});
  }

  TEST_CASE("the packed block holds the entries of materialize(), in order, each ended by NUL") {
    ::setenv("COHORT_TEST_INHERITED", "yes", 1);
    ::setenv("COHORT_TEST_DROPPED", "x", 1);
    const auto env = environment::inherit().set("COHORT_TEST_ADDED", "a=b").set("COHORT_TEST_EMPTY", "").unset(
        "COHORT_TEST_DROPPED");
    std::vector<char> text{'x'};          // what was there goes
    std::vector<char*> pointers{nullptr};
    env.materialize(text, pointers);
    REQUIRE_FALSE(pointers.empty());
    CHECK(pointers.back() == nullptr);
    std::vector<std::string> packed;
    for (std::size_t i = 0; i + 1 < pointers.size(); ++i) {
      REQUIRE(pointers[i] >= text.data());
      REQUIRE(pointers[i] < text.data() + text.size());
      packed.emplace_back(pointers[i]);
      CHECK(pointers[i] + packed.back().size() < text.data() + text.size());  // its NUL is inside
    }
    CHECK(packed == env.materialize());
    CHECK(holds(packed, "COHORT_TEST_ADDED=a=b"));
    CHECK(holds(packed, "COHORT_TEST_EMPTY="));
    // Entries end to end: nothing between them, nothing after the last.
    std::size_t bytes = 0;
    for (const auto& e : packed) bytes += e.size() + 1;
    CHECK(text.size() == bytes);

    environment::empty().materialize(text, pointers);
    CHECK(pointers == std::vector<char*>{nullptr});
    // Refused after the entries that sort before it were written.
    CHECK_THROWS_AS(environment::inherit().set("A", "1").set("B=C", "x").materialize(text, pointers),
                    std::invalid_argument);
    CHECK(text.empty());
    CHECK(pointers.empty());
  }

  TEST_CASE("get() answers what the child will see") {
    ::setenv("COHORT_TEST_GET", "v", 1);
    CHECK(environment::inherit().get("COHORT_TEST_GET") == "v");
    CHECK_FALSE(environment::empty().get("COHORT_TEST_GET"));
    CHECK_FALSE(environment::inherit().unset("COHORT_TEST_GET").get("COHORT_TEST_GET"));
  }

  TEST_CASE("bad names and values are refused") {
    CHECK_THROWS_AS(environment::empty().set("", "x").materialize(), std::invalid_argument);
    CHECK_THROWS_AS(environment::empty().set("A=B", "x").materialize(), std::invalid_argument);
    CHECK_THROWS_AS(environment::empty().set("A", std::string("x\0y", 3)).materialize(), std::invalid_argument);
  }

  TEST_CASE("a refused name is shown whole in the message, a NUL in it written \\0, with the reason") {
    const auto refusal = [](const std::string& name) {
      try {
        environment::empty().set(name, "1").materialize();
      } catch (const std::invalid_argument& e) {
        return std::string(e.what());
      }
      return std::string("not refused");
    };
    CHECK(refusal(std::string("AB\0CD", 5)) == "cohort::environment: bad variable name 'AB\\0CD': it holds NUL");
    CHECK(refusal("A=B") == "cohort::environment: bad variable name 'A=B': it holds '='");
    CHECK(refusal("") == "cohort::environment: bad variable name '': it is empty");
  }

  TEST_CASE("path_candidates are where execvp looks, in PATH's order") {
    using list = std::vector<std::string>;
    CHECK(environment::empty().set("PATH", "/a::/b/").path_candidates("x") == list{"/a/x", "./x", "/b//x"});
    CHECK(environment::empty().set("PATH", "").path_candidates("x") == list{"./x"});
    // PATH unset: cohort's default.
    CHECK(environment::empty().path_candidates("x") == list{"/usr/local/bin/x", "/usr/bin/x", "/bin/x"});
    // The child's PATH, not this process's.
    const char* was = std::getenv("PATH");
    const std::optional<std::string> path = was != nullptr ? std::optional<std::string>(was) : std::nullopt;
    ::setenv("PATH", "/here", 1);
    CHECK(environment::inherit().set("PATH", "/there").path_candidates("x") == list{"/there/x"});
    CHECK(environment::inherit().path_candidates("x") == list{"/here/x"});
    if (path) {
      ::setenv("PATH", path->c_str(), 1);
    } else {
      ::unsetenv("PATH");
    }
    // A name with a slash, or none, is not searched for.
    CHECK(environment::empty().set("PATH", "/a").path_candidates("d/x").empty());
    CHECK(environment::empty().set("PATH", "/a").path_candidates("").empty());
  }

  TEST_CASE("only a regular file this process may execute is an executable file") {
    // Beside this test program, where files can be executed (a temporary
    // directory may be mounted noexec); removed however the case ends.
    struct scratch {
      std::filesystem::path dir;
      ~scratch() {
        std::error_code ignored;
        std::filesystem::remove_all(dir, ignored);
      }
    } made{std::filesystem::canonical("/proc/self/exe").parent_path() /
           ("environment-scratch-" + std::to_string(::getpid()))};
    std::filesystem::create_directory(made.dir);
    const std::string dir = made.dir.string();
    const std::string program = dir + "/program", data = dir + "/data", directory = dir + "/directory",
                      fifo = dir + "/fifo", link = dir + "/link";
    for (const auto& file : {program, data}) {
      const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
      REQUIRE(fd >= 0);
      ::close(fd);
    }
    REQUIRE(::mkdir(directory.c_str(), 0700) == 0);
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    REQUIRE(::symlink(program.c_str(), link.c_str()) == 0);
    // Modes set whatever the umask: every one but the data file's lets
    // this process execute it, so only its kind can tell them apart.
    for (const auto& path : {program, directory, fifo}) {
      REQUIRE(::chmod(path.c_str(), 0700) == 0);
      REQUIRE(::access(path.c_str(), X_OK) == 0);
    }
    REQUIRE(::chmod(data.c_str(), 0600) == 0);

    CHECK(cohort::is_executable_file(program));
    CHECK(cohort::is_executable_file(link));  // followed
    CHECK_FALSE(cohort::is_executable_file(data));
    CHECK_FALSE(cohort::is_executable_file(directory));
    CHECK_FALSE(cohort::is_executable_file(fifo));
    CHECK_FALSE(cohort::is_executable_file(dir + "/missing"));
    CHECK_FALSE(cohort::is_executable_file(""));
  }
}

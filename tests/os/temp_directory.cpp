#include "os/temp_directory.hpp"

#include "support/harness.hpp"

#include <doctest/doctest.h>

#include <stdlib.h>
#include <unistd.h>

#include <cstdlib>
#include <optional>
#include <string>

using namespace cohort;
namespace fs = std::filesystem;

namespace {

// Sets $TMPDIR, $TEMP and $TMP (nullopt: unset) for one test, and puts
// back what they were.
class temp_variables {
 public:
  temp_variables(std::optional<std::string> tmpdir, std::optional<std::string> temp = std::nullopt,
                 std::optional<std::string> tmp = std::nullopt) {
    const std::optional<std::string> values[] = {std::move(tmpdir), std::move(temp), std::move(tmp)};
    for (int i = 0; i < 3; ++i) {
      if (const char* was = std::getenv(names[i])) saved_[i] = was;
      if (values[i]) ::setenv(names[i], values[i]->c_str(), 1);
      else ::unsetenv(names[i]);
    }
  }
  temp_variables(const temp_variables&) = delete;
  temp_variables& operator=(const temp_variables&) = delete;
  ~temp_variables() {
    for (int i = 0; i < 3; ++i) {
      if (saved_[i]) ::setenv(names[i], saved_[i]->c_str(), 1);
      else ::unsetenv(names[i]);
    }
  }

 private:
  static constexpr const char* names[3] = {"TMPDIR", "TEMP", "TMP"};
  std::optional<std::string> saved_[3];
};

// Whether a file can be made in `dir`, and is then removed again.
bool writable(const fs::path& dir) {
  std::string pattern = (dir / "probe-XXXXXX").string();
  const int fd = ::mkstemp(pattern.data());
  if (fd < 0) return false;
  ::unlink(pattern.c_str());
  ::close(fd);
  return true;
}

}  // namespace

TEST_SUITE("temp_directory") {
  TEST_CASE("a usable $TMPDIR is the temporary directory") {
    test::temp_dir dir;
    temp_variables set(dir.path.string());
    CHECK(os::temp_directory() == dir.path);
    CHECK(fs::is_empty(dir.path));  // what it made to try the directory is gone
  }

  TEST_CASE("$TMPDIR empty, missing or not writable: another directory, absolute and writable") {
    for (const char* tmpdir : {"", "/nonexistent-cohort-tmpdir", "/proc", "/dev/null"}) {
      INFO("TMPDIR=", tmpdir);
      temp_variables set(std::string{tmpdir});
      std::error_code ec;
      const fs::path dir = os::temp_directory(ec);
      CHECK_FALSE(ec);
      CHECK(dir.is_absolute());
      CHECK(dir != fs::path(tmpdir));
      CHECK(fs::is_directory(dir));
      CHECK(writable(dir));
    }
  }

  TEST_CASE("$TEMP and then $TMP are tried after $TMPDIR, as Python tries them") {
    test::temp_dir temp, tmp;
    {
      temp_variables set("/nonexistent-cohort-tmpdir", temp.path.string(), tmp.path.string());
      CHECK(os::temp_directory() == temp.path);
    }
    temp_variables set("", "", tmp.path.string());
    CHECK(os::temp_directory() == tmp.path);
  }

  TEST_CASE("a relative $TMPDIR is made absolute") {
    test::temp_dir dir;
    fs::create_directory(dir.path / "sub");
    const auto here = fs::current_path();
    fs::current_path(dir.path);
    {
      temp_variables set("sub");
      CHECK(os::temp_directory() == dir.path / "sub");
    }
    fs::current_path(here);
  }
}

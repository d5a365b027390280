#include "os/temp_directory.hpp"

#include "support/harness.hpp"

#include <doctest/doctest.h>

#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/statfs.h>
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

// In a forked child with a mount namespace of its own: mounts at `dir` a
// tmpfs and fills it, of its blocks (one page, written) or of its inodes
// (empty files), and tells whether temp_directory() passes it over for
// $TEMP, `next`: 0 when it does, 77 when no tmpfs could be mounted here,
// another code when it does not.
int full_file_system_passed_over(const fs::path& dir, const fs::path& next, bool of_blocks) {
  if (::unshare(CLONE_NEWNS) != 0 || ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return 77;
  if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, of_blocks ? "size=4k,nr_inodes=64" : "size=1m,nr_inodes=8") != 0) {
    return 77;
  }
  for (int i = 0;; ++i) {
    const int fd = ::open((dir / std::to_string(i)).c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) break;
    const bool more = !of_blocks || ::write(fd, "x", 1) == 1;
    ::close(fd);
    if (!more) break;
  }
  struct statfs counts {};
  if (::statfs(dir.c_str(), &counts) != 0 || (of_blocks ? counts.f_bavail : counts.f_ffree) != 0) return 2;  // not full
  temp_variables set(dir.string(), next.string());
  return os::temp_directory() == next ? 0 : 1;
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

  // Before, a $TMPDIR that passed the checks of its mode and file system
  // was taken even where no file could be written, where Python's
  // tempfile, making and writing one, goes on to the next.
  TEST_CASE("a $TMPDIR on a full file system, of blocks or of inodes, is passed over as Python passes it over") {
    test::temp_dir full, next;
    for (const bool of_blocks : {true, false}) {
      CAPTURE(of_blocks);
      const int code = test::exit_code_in_child([&] {
        return full_file_system_passed_over(full.path, next.path, of_blocks);
      });
      if (code == 77) {
        MESSAGE("no tmpfs can be mounted here (no mount namespace of its own): a full file system is not tried");
        return;
      }
      CHECK(code == 0);
    }
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

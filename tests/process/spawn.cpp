#include "cohort/spawn.hpp"

#include "os/clone3.hpp"
#include "process/launch.hpp"

#include "support/fork_beside.hpp"
#include "support/harness.hpp"
#include "support/process_probe.hpp"

#include <doctest/doctest.h>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/bind_executor.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/experimental/deferred.hpp>
#include <asio/read.hpp>
#include <asio/strand.hpp>

#include <fmt/format.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstring>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace cohort;
namespace fs = std::filesystem;

namespace {

// Runs the target with `args` and returns what it printed, without the newline.
std::string output_of(std::vector<std::string> args, spawn_options options = {}) {
  asio::io_context io;
  options.out = stdio::pipe();
  return test::run(io, [&]() -> asio::awaitable<std::string> {
    command c_cmd{test::target, std::move(args)};
    child c = co_await spawn(c_cmd, options);
    std::string text = co_await test::read_all(c.out());
    auto status = co_await c.wait();
    CHECK(status.success());
    if (!text.empty() && text.back() == '\n') text.pop_back();
    co_return text;
  }());
}

exit_status status_of(std::vector<std::string> args) {
  asio::io_context io;
  return test::run(io, [&]() -> asio::awaitable<exit_status> {
    command c_cmd{test::target, std::move(args)};
    child c = co_await spawn(c_cmd);
    co_return co_await c.wait();
  }());
}

// The error a spawn throws, or a failed check when it does not throw.
std::system_error spawn_error(const command& cmd, const spawn_options& options = {}) {
  asio::io_context io;
  try {
    spawn(io.get_executor(), cmd, options);
  } catch (const std::system_error& e) {
    return e;
  }
  FAIL("spawn succeeded");
  return std::system_error(std::error_code());
}

// Hooks for spawn_options::before_exec: only system calls, as in the child.
int lower_nofile(void* context) noexcept {
  const rlimit lim{*static_cast<const rlim_t*>(context), *static_cast<const rlim_t*>(context)};
  return ::setrlimit(RLIMIT_NOFILE, &lim) == 0 ? 0 : errno;
}

int be_nicer(void*) noexcept { return ::setpriority(PRIO_PROCESS, 0, 7) == 0 ? 0 : errno; }

int refuse(void*) noexcept { return EPERM; }
// As C's calls fail: -1, errno saying why.
int refuse_as_c(void*) noexcept {
  errno = EACCES;
  return -1;
}
// As the kernel's calls fail: -errno.
int refuse_as_kernel(void*) noexcept { return -ENOENT; }

// Puts `Bytes` on the child's stack: spawn_options::before_exec allows
// 48 KiB. No core is dumped of a child that overruns it: its memory is
// this process's. Written from its low end first, as an unprobed buffer
// may be: the first write lands `Bytes` below the frame at once, past the
// stack and into its guard (before, a guard of one page, which such a
// write could skip, to land in this process's other memory).
template <std::size_t Bytes>
int use_stack(void*) noexcept {
  const rlimit no_core{0, 0};
  ::setrlimit(RLIMIT_CORE, &no_core);
  volatile char buffer[Bytes];
  for (std::size_t i = 0; i < Bytes; i += 256) buffer[i] = 1;
  return buffer[0] == 1 ? 0 : EPROTO;
}

int exit_at_once(void*) noexcept { ::_exit(3); }
int kill_self(void*) noexcept {
  ::syscall(SYS_kill, ::syscall(SYS_getpid), SIGKILL);
  return 0;
}

// Execs a shell that exits with 5 after half a second, in place of the
// spawn's program.
int exec_itself(void*) noexcept {
  char* const argv[] = {const_cast<char*>("sh"), const_cast<char*>("-c"), const_cast<char*>("sleep 0.5; exit 5"),
                        nullptr};
  ::execve("/bin/sh", argv, environ);
  return errno;
}

// The real-time signal the test below gives a handler, beside SIGUSR1 and SIGTERM.
int handled_realtime_signal() noexcept { return SIGRTMIN + 3; }
void no_op(int) {}

// A hook that checks the child's dispositions as a spawn leaves them before
// its exec: the parent's handlers and an ignored SIGPIPE and SIGXFSZ at
// their defaults, SIGUSR2 still ignored. EPROTO when one is not.
int dispositions_reset(void*) noexcept {
  const auto is = [](int sig, void (*handler)(int)) {
    struct sigaction sa {};
    return ::sigaction(sig, nullptr, &sa) == 0 && sa.sa_handler == handler;
  };
  for (int sig : {SIGUSR1, SIGTERM, handled_realtime_signal(), SIGPIPE, SIGXFSZ}) {
    if (!is(sig, SIG_DFL)) return EPROTO;
  }
  return is(SIGUSR2, SIG_IGN) ? 0 : EPROTO;
}

// Sets a signal's disposition for a scope.
class disposition {
 public:
  disposition(int sig, void (*handler)(int)) : sig_(sig) {
    struct sigaction sa {};
    sa.sa_handler = handler;
    ::sigaction(sig_, &sa, &saved_);
  }
  disposition(const disposition&) = delete;
  disposition& operator=(const disposition&) = delete;
  ~disposition() { ::sigaction(sig_, &saved_, nullptr); }

 private:
  int sig_;
  struct sigaction saved_ {};
};

bool has_unreaped_children() {
  siginfo_t info{};
  return ::waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) == 0;
}


}  // namespace

TEST_SUITE("spawn") {
  TEST_CASE("exit codes 0, 1 and 255 arrive as they were given") {
    for (int code : {0, 1, 255}) {
      auto status = status_of({"exit", std::to_string(code)});
      CHECK(status.exited());
      CHECK(status.code() == code);
      CHECK(fmt::format("{}", status) == fmt::format("exited with code {}", code));
    }
  }

  // Before, spawn(executor, cmd) took its options as a defaulted `{}`,
  // which g++ 12 destroyed twice inside this co_await: free() aborted.
  TEST_CASE("a child spawned with default options inside a co_await expression is awaited") {
    asio::io_context io;
    const command cmd{test::target, {"exit", "4"}};
    const auto status = test::run(io, [&]() -> asio::awaitable<exit_status> {
      co_return co_await spawn(io.get_executor(), cmd).wait();
    }());
    CHECK(status.code() == 4);
    const command fails{test::target, {"exit", "5"}};
    CHECK(run(fails).code() == 5);
  }

  TEST_CASE("deaths by SIGKILL, SIGSEGV and SIGTERM name the signal") {
    for (auto [name, number] : {std::pair{"KILL", SIGKILL}, {"SEGV", SIGSEGV}, {"TERM", SIGTERM}}) {
      auto status = status_of({"kill-self", name});
      CHECK(status.signaled());
      CHECK(status.signal() == number);
      CHECK(fmt::format("{}", status).starts_with(fmt::format("killed by signal SIG{} ({})", name, number)));
    }
  }

  TEST_CASE("the environment is inherited, extended, trimmed or replaced") {
    ::setenv("COHORT_SPAWN_TEST", "parent", 1);
    CHECK(output_of({"print-env", "COHORT_SPAWN_TEST"}) == "parent");
    CHECK(output_of({"print-env", "COHORT_SPAWN_TEST"}, {.env = environment::inherit().set("COHORT_SPAWN_TEST", "child")}) == "child");
    CHECK(output_of({"print-env", "COHORT_SPAWN_TEST"}, {.env = environment::inherit().unset("COHORT_SPAWN_TEST")}) == "<unset>");
    CHECK(output_of({"print-env", "HOME"}, {.env = environment::from({{"ONLY", "1"}})}) == "<unset>");
    CHECK(output_of({"print-env", "ONLY"}, {.env = environment::from({{"ONLY", "1"}})}) == "1");
  }

  TEST_CASE("the working directory is the one asked for") {
    test::temp_dir dir;
    CHECK(output_of({"print-cwd"}, {.cwd = dir.path}) == dir.path.string());
    CHECK(output_of({"print-cwd"}) == fs::current_path().string());
  }

  TEST_CASE("a spawn the process limit refuses names RLIMIT_NPROC") {
    // Not for root, whom RLIMIT_NPROC does not bind: in a child that runs
    // as nobody, with no room for one more process.
    const pid_t runner = ::fork();
    REQUIRE(runner >= 0);
    if (runner == 0) {
      ::alarm(20);
      if (::getuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) ::_exit(10);
      const rlimit none{0, 0};
      if (::setrlimit(RLIMIT_NPROC, &none) != 0) ::_exit(11);
      asio::io_context io;
      try {
        spawn(io.get_executor(), command("/bin/true"));
        ::_exit(12);
      } catch (const std::system_error& e) {
        const std::string what = e.what();
        const bool named = e.code() == std::error_code(EAGAIN, std::system_category()) &&
                           what.find(": clone (process limit RLIMIT_NPROC is 0 for this user, where it binds; or the system's: ") !=
                               std::string::npos;
        if (!named) std::fprintf(stderr, "%s\n", what.c_str());
        ::_exit(named ? 0 : 13);
      }
    }
    int status = 0;
    REQUIRE(::waitpid(runner, &status, 0) == runner);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }

  TEST_CASE("a bad working directory fails the spawn, naming it, and leaves no zombie") {
    auto e = spawn_error(command{test::target, {"exit", "0"}}, {.cwd = "/nonexistent/dir"});
    CHECK(e.code() == std::error_code(ENOENT, std::system_category()));
    CHECK(std::string(e.what()).find("/nonexistent/dir") != std::string::npos);
    CHECK(std::string(e.what()).find(test::target) != std::string::npos);
    CHECK_FALSE(has_unreaped_children());
  }

  TEST_CASE("a NUL inside the program, an argument, the working directory or a file path is refused, and so is "
            "stdin from a file opened for writing only") {
    asio::io_context io;
    const auto refused = [&](const command& cmd, const spawn_options& options, const char* what) {
      CAPTURE(what);
      CHECK_THROWS_WITH_AS(spawn(io.get_executor(), cmd, options), doctest::Contains(what), std::invalid_argument);
    };
    refused(command(std::string("/bin/true\0x", 11)), {}, "the program name holds NUL");
    refused(command(test::target, {"exit", std::string("0\0 1", 4)}), {}, "argument 2 holds NUL");
    spawn_options cwd;
    cwd.cwd = std::string("/tmp\0x", 6);
    refused(command(test::target, {"exit", "0"}), cwd, "the working directory holds NUL");
    spawn_options file;
    file.out = stdio::file(std::string("/tmp/a\0b", 8));
    refused(command(test::target, {"exit", "0"}), file, "a stream's file path holds NUL");
    spawn_options append_in;
    append_in.in = stdio::append("/tmp/never-read");  // output only: the child's reads would fail with EBADF
    refused(command(test::target, {"cat"}), append_in, "stdin from a file opened for writing only");
    CHECK_FALSE(has_unreaped_children());
  }

  TEST_CASE("the before_exec hook runs in the child: a lowered descriptor limit and a nice value are seen") {
    rlim_t limit = 77;
    CHECK(output_of({"print-nofile"}, {.before_exec = lower_nofile, .before_exec_context = &limit}) == "77");
    CHECK(output_of({"print-nofile"}) != "77");
    CHECK(output_of({"print-nice"}, {.before_exec = be_nicer}) == std::to_string(::getpriority(PRIO_PROCESS, 0) + 7));
  }

  TEST_CASE("a before_exec hook that fails fails the spawn with its errno, naming it, and leaves no zombie") {
    auto e = spawn_error(command{test::target, {"exit", "0"}}, {.before_exec = refuse});
    CHECK(e.code() == std::error_code(EPERM, std::system_category()));
    CHECK(std::string(e.what()).find("before_exec") != std::string::npos);
    CHECK(std::string(e.what()).find(test::target) != std::string::npos);
    CHECK_FALSE(has_unreaped_children());
    std::error_code ec;
    asio::io_context io;
    const spawn_options refusing{.before_exec = refuse};
    child c = spawn(io.get_executor(), command{test::target, {"exit", "0"}}, refusing, ec);
    CHECK(ec == std::error_code(EPERM, std::system_category()));
    CHECK_FALSE(c);
  }

  // Before, a negative return was taken as the errno value itself:
  // "Unknown error -1".
  TEST_CASE("a before_exec hook that fails as C's calls do, or as the kernel's, fails the spawn with that errno") {
    for (const auto& [hook, expected] : {std::pair{&refuse_as_c, EACCES}, std::pair{&refuse_as_kernel, ENOENT}}) {
      CAPTURE(expected);
      auto e = spawn_error(command{test::target, {"exit", "0"}}, {.before_exec = hook});
      CHECK(e.code() == std::error_code(expected, std::system_category()));
      CHECK(std::string(e.what()).find(std::strerror(expected)) != std::string::npos);
      CHECK_FALSE(has_unreaped_children());
    }
  }

  // Before, the spawn succeeded and the child later read as killed by
  // SIGSEGV (or exited with 3), never having run the program.
  TEST_CASE("a child that ends before its exec, its before_exec hook overrunning the stack, fails the spawn "
            "saying how") {
    const spawn_options within{.before_exec = use_stack<48 * 1024>};
    CHECK(run(command{test::target, {"exit", "0"}}, within).success());
    auto overrun = spawn_error(command{test::target, {"exit", "0"}}, {.before_exec = use_stack<96 * 1024>});
    CHECK(overrun.code() == std::error_code(ESRCH, std::system_category()));
    const std::string what = overrun.what();
    CHECK(what.find(test::target) != std::string::npos);
    CHECK(what.find("ended before its exec, killed by signal SIGSEGV") != std::string::npos);
    CHECK(what.find("the before_exec hook has 48 KiB of stack") != std::string::npos);
    CHECK_FALSE(has_unreaped_children());
    auto exited = spawn_error(command{test::target, {"exit", "0"}}, {.before_exec = exit_at_once});
    CHECK(exited.code() == std::error_code(ESRCH, std::system_category()));
    CHECK(std::string(exited.what()).find("ended before its exec, exited with code 3") != std::string::npos);
    CHECK_FALSE(has_unreaped_children());
    std::error_code ec;
    asio::io_context io;
    const spawn_options overrunning{.before_exec = use_stack<96 * 1024>};
    child c = spawn(io.get_executor(), command{test::target, {"exit", "0"}}, overrunning, ec);
    CHECK(ec == std::error_code(ESRCH, std::system_category()));
    CHECK_FALSE(c);
    CHECK_FALSE(has_unreaped_children());
  }

  // Before, the message ended in "No child processes" (ECHILD's words),
  // which said nothing true of it.
  TEST_CASE("a child killed before its exec fails the spawn saying how it ended, and no more") {
    auto killed = spawn_error(command{test::target, {"exit", "0"}}, {.before_exec = kill_self});
    const std::string what = killed.what();
    CHECK(what.find("ended before its exec, killed by signal SIGKILL") != std::string::npos);
    CHECK(what.find("No child processes") == std::string::npos);
    CHECK(what.ends_with(": No such process"));
    CHECK_FALSE(has_unreaped_children());
  }

  TEST_CASE("a before_exec hook that execs a program itself gets that program as the child") {
    // Before, the spawn took it for a child that ended before its exec: it
    // waited for the program to end, then failed.
    const spawn_options options{.before_exec = exec_itself};
    CHECK(run(command{"/bin/true", {}}, options).code() == 5);
    CHECK_FALSE(has_unreaped_children());
  }

  TEST_CASE("a program missing from PATH is a clear error") {
    auto e = spawn_error(command{"cohort-no-such-program", {}});
    CHECK(e.code() == std::error_code(ENOENT, std::system_category()));
    CHECK(std::string(e.what()).find("'cohort-no-such-program': not found in PATH") != std::string::npos);
    auto empty = spawn_error(command{"", {}});
    CHECK(empty.code() == std::error_code(ENOENT, std::system_category()));
  }

  TEST_CASE("a program found in PATH runs, and the child's own PATH is searched when set") {
    test::temp_dir dir;
    fs::copy_file(test::target, dir.path / "cohort-target-copy");
    CHECK(spawn_error(command{"cohort-target-copy", {"exit", "0"}}).code() == std::error_code(ENOENT, std::system_category()));
    auto path = environment::inherit().set("PATH", dir.path.string() + ":/usr/bin:/bin");
    CHECK(output_of({"print-env", "PATH"}, {.env = path}) == dir.path.string() + ":/usr/bin:/bin");
    asio::io_context io;
    auto status = test::run(io, [&]() -> asio::awaitable<exit_status> {
      command c_cmd{"cohort-target-copy", {"exit", "7"}};
      spawn_options c_opts{.env = path};
      child c = co_await spawn(c_cmd, c_opts);
      co_return co_await c.wait();
    }());
    CHECK(status.code() == 7);
  }

  TEST_CASE("a relative PATH entry is searched from the child's working directory, as execvp there would") {
    test::temp_dir dir;
    fs::create_directories(dir.path / "child" / "bin");
    fs::create_directories(dir.path / "parent" / "bin");
    fs::copy_file(test::target, dir.path / "child" / "bin" / "cohort-in-child-bin");
    fs::copy_file(test::target, dir.path / "parent" / "bin" / "cohort-in-parent-bin");
    struct back_to {
      fs::path where = fs::current_path();
      ~back_to() { fs::current_path(where); }
    } restore;
    fs::current_path(dir.path / "parent");
    const auto run_from = [&](const std::string& program) {
      asio::io_context io;
      return test::run(io, [&]() -> asio::awaitable<exit_status> {
        command c_cmd{program, {"exit", "6"}};
        spawn_options c_opts{.env = environment::inherit().set("PATH", "bin"), .cwd = dir.path / "child"};
        child c = co_await spawn(c_cmd, c_opts);
        co_return co_await c.wait();
      }());
    };
    std::optional<exit_status> found;
    std::string missing;
    try {
      found = run_from("cohort-in-child-bin");
      run_from("cohort-in-parent-bin");
    } catch (const std::system_error& e) {
      missing = e.what();
    }
    REQUIRE(found);
    CHECK(found->code() == 6);
    // What only the parent's directory holds is not there for the child:
    // not found, rather than found here and then missing at the exec.
    CHECK(missing.find("'cohort-in-parent-bin': not found in PATH") != std::string::npos);
  }

  TEST_CASE("a relative path with a slash is taken from the child's working directory") {
    test::temp_dir dir;
    fs::copy_file(test::target, dir.path / "relative-target");
    asio::io_context io;
    auto status = test::run(io, [&]() -> asio::awaitable<exit_status> {
      command c_cmd{"./relative-target", {"exit", "5"}};
      spawn_options c_opts{.cwd = dir.path};
      child c = co_await spawn(c_cmd, c_opts);
      co_return co_await c.wait();
    }());
    CHECK(status.code() == 5);
  }

  // Before, both said "not found in PATH", naming no file.
  TEST_CASE("a file or directory found in PATH that cannot be executed is named when nothing after it runs") {
    test::temp_dir dir;
    fs::create_directories(dir.path / "first");
    fs::create_directories(dir.path / "second");
    const auto plain = dir.path / "first" / "cohort-plain";
    std::ofstream(plain) << "not a program\n";
    fs::create_directory(dir.path / "first" / "cohort-directory");
    const spawn_options path{.env = environment::inherit().set("PATH", (dir.path / "first").string() + ":" +
                                                                          (dir.path / "second").string())};

    auto file = spawn_error(command{"cohort-plain", {}}, path);
    CHECK(file.code() == std::error_code(EACCES, std::system_category()));
    const std::string file_what = file.what();
    CHECK(file_what.find(plain.string()) != std::string::npos);
    CHECK(file_what.find("not executable") != std::string::npos);
    CHECK(file_what.find("not found") == std::string::npos);

    auto directory = spawn_error(command{"cohort-directory", {}}, path);
    CHECK(directory.code() == std::error_code(EACCES, std::system_category()));
    const std::string directory_what = directory.what();
    CHECK(directory_what.find((dir.path / "first" / "cohort-directory").string()) != std::string::npos);
    CHECK(directory_what.find("a directory") != std::string::npos);

    // As execvp does, the search goes on past them to a program.
    fs::copy_file(test::target, dir.path / "second" / "cohort-plain");
    asio::io_context io;
    CHECK(spawn(io.get_executor(), command{"cohort-plain", {"exit", "4"}}, path).join().code() == 4);
  }

  // Before, it said only "execve: No such file or directory", of a file
  // that is there.
  TEST_CASE("a script whose #! line names a missing interpreter fails naming that interpreter") {
    test::temp_dir dir;
    const auto script = dir.path / "script.sh";
    std::ofstream(script) << "#! /nonexistent/cohort-interpreter -e\necho hi\n";
    fs::permissions(script, fs::perms::owner_all);
    auto e = spawn_error(command{script.string(), {}});
    CHECK(e.code() == std::error_code(ENOENT, std::system_category()));
    const std::string what = e.what();
    CHECK(what.find(script.string()) != std::string::npos);
    CHECK(what.find("interpreter") != std::string::npos);
    CHECK(what.find("'/nonexistent/cohort-interpreter'") != std::string::npos);
    CHECK(what.find("missing") != std::string::npos);
    CHECK_FALSE(has_unreaped_children());
  }

  // Before, a carriage return ending the #! line was cut off the name, so
  // an interpreter that is there was said to be missing; and so was one
  // that is there but names a missing interpreter in turn.
  TEST_CASE("a script with DOS line endings, or whose interpreter's own is missing, says so") {
    test::temp_dir dir;
    const auto dos = dir.path / "dos.sh";
    std::ofstream(dos) << "#!/bin/sh\r\necho hi\r\n";
    fs::permissions(dos, fs::perms::owner_all);
    const std::string dos_what = spawn_error(command{dos.string(), {}}).what();
    CHECK(dos_what.find("carriage return") != std::string::npos);
    CHECK(dos_what.find("'/bin/sh\\r'") != std::string::npos);
    CHECK(dos_what.find("'/bin/sh', is missing") == std::string::npos);

    const auto inner = dir.path / "inner";
    std::ofstream(inner) << "#!/nonexistent/cohort-interpreter\n";
    fs::permissions(inner, fs::perms::owner_all);
    const auto outer = dir.path / "outer.sh";
    std::ofstream(outer) << "#!" << inner.string() << "\necho hi\n";
    fs::permissions(outer, fs::perms::owner_all);
    const std::string outer_what = spawn_error(command{outer.string(), {}}).what();
    CHECK(outer_what.find("'" + inner.string() + "', is missing") == std::string::npos);
    CHECK(outer_what.find("is there") != std::string::npos);
    CHECK_FALSE(has_unreaped_children());
  }

  TEST_CASE("a file that is not executable, or not a program, fails at exec with the cause") {
    test::temp_dir dir;
    auto plain = dir.path / "plain.txt";
    std::ofstream(plain) << "not a program\n";
    auto e = spawn_error(command{plain.string(), {}});
    CHECK(e.code() == std::error_code(EACCES, std::system_category()));
    CHECK(std::string(e.what()).find(plain.string()) != std::string::npos);
    CHECK(std::string(e.what()).find("execve") != std::string::npos);

    fs::permissions(plain, fs::perms::owner_all);
    auto noexec = spawn_error(command{plain.string(), {}});
    CHECK(noexec.code() == std::error_code(ENOEXEC, std::system_category()));

    auto directory = spawn_error(command{dir.path.string(), {}});
    CHECK(directory.code() == std::error_code(EACCES, std::system_category()));
    CHECK_FALSE(has_unreaped_children());
  }

  // Before, each said only what execve's errno says: "Exec format error",
  // "Permission denied" of a directory.
  TEST_CASE("a file of no executable format says no shell runs it, and a directory named with a slash says so") {
    test::temp_dir dir;
    const auto script = dir.path / "no-shebang";
    std::ofstream(script) << "echo hi\n";
    fs::permissions(script, fs::perms::owner_all);
    auto noexec = spawn_error(command{script.string(), {}});
    CHECK(noexec.code() == std::error_code(ENOEXEC, std::system_category()));
    const std::string noexec_what = noexec.what();
    CHECK(noexec_what.find("no #! line") != std::string::npos);
    CHECK(noexec_what.find("/bin/sh") != std::string::npos);

    const auto subdir = dir.path / "sub";
    fs::create_directory(subdir);
    for (const std::string& named : {subdir.string(), subdir.string() + "/"}) {
      auto directory = spawn_error(command{named, {}});
      CHECK(directory.code() == std::error_code(EACCES, std::system_category()));
      CHECK(std::string(directory.what()).find("is a directory") != std::string::npos);
    }
    CHECK_FALSE(has_unreaped_children());
  }

  // Before, a PATH folder this user may not search made a program that is
  // nowhere "found in PATH is not executable" (EACCES).
  TEST_CASE("a PATH folder that cannot be searched holds nothing found: a program that is nowhere is not found") {
    test::temp_dir dir;
    const auto locked = dir.path / "locked";
    fs::create_directory(locked);
    const spawn_options path{.env = environment::inherit().set("PATH", locked.string() + ":/usr/bin:/bin")};
    // In a child, as nobody where this is root (whom no folder's mode stops).
    const pid_t looker = ::fork();
    REQUIRE(looker >= 0);
    if (looker == 0) {
      if (::geteuid() == 0 ? ::setgid(65534) != 0 || ::setuid(65534) != 0 : ::chmod(locked.c_str(), 0) != 0) {
        ::_exit(77);
      }
      if (::access((locked / "x").c_str(), F_OK) == 0 || errno != EACCES) ::_exit(78);
      try {
        asio::io_context io;
        spawn(io.get_executor(), command{"cohort-no-such-program", {}}, path);
      } catch (const std::system_error& e) {
        const bool not_found = std::string(e.what()).find("not found in PATH") != std::string::npos;
        ::_exit(e.code() == std::error_code(ENOENT, std::system_category()) && not_found ? 0 : 1);
      }
      ::_exit(2);
    }
    int status = 0;
    REQUIRE(::waitpid(looker, &status, 0) == looker);
    fs::permissions(locked, fs::perms::owner_all);
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }

  // Before, a name too long for a file was "not found in PATH" with ENOENT.
  TEST_CASE("a program name longer than a file name may be fails the PATH search with ENAMETOOLONG, saying so") {
    auto e = spawn_error(command{std::string(5000, 'a'), {}});
    CHECK(e.code() == std::error_code(ENAMETOOLONG, std::system_category()));
    CHECK(std::string(e.what()).find("NAME_MAX") != std::string::npos);
  }

  // Before, both said only "Argument list too long".
  TEST_CASE("an argument past the kernel's limit for one string, or arguments past their room, are named") {
    auto one = spawn_error(command{test::target, {"exit", std::string(200'000, 'x')}});
    CHECK(one.code() == std::error_code(E2BIG, std::system_category()));
    const std::string one_what = one.what();
    CHECK(one_what.find("argument 2") != std::string::npos);
    CHECK(one_what.find("MAX_ARG_STRLEN") != std::string::npos);

    const spawn_options big_env{.env = environment::inherit().set("COHORT_BIG", std::string(200'000, 'y'))};
    const std::string env_what = spawn_error(command{test::target, {"exit", "0"}}, big_env).what();
    CHECK(env_what.find("COHORT_BIG") != std::string::npos);
    CHECK(env_what.find("MAX_ARG_STRLEN") != std::string::npos);

    // 7 MiB in all, past the most the kernel gives whatever the stack limit.
    auto all = spawn_error(command{test::target, std::vector<std::string>(70, std::string(100'000, 'z'))});
    CHECK(all.code() == std::error_code(E2BIG, std::system_category()));
    const std::string all_what = all.what();
    CHECK(all_what.find("stack limit") != std::string::npos);
    CHECK(all_what.find("MAX_ARG_STRLEN") == std::string::npos);
    CHECK_FALSE(has_unreaped_children());
  }

  // A child of this test (made by `make`, which returns its pid, 0 in the
  // child) that runs `sh -c "exit 3"` with the default options and ends
  // with the code the run reported: 100 for a death, 101 for an error; 77
  // from the child when it could not set itself up.
  template <typename Make>
  int code_of_a_run_in(Make make, bool new_pid_namespace = false) {
    std::fflush(nullptr);
    const pid_t pid = make();
    if (pid == 0) {
      if (new_pid_namespace && ::unshare(CLONE_NEWPID) != 0) ::_exit(77);
      try {
        const auto status = run(command{"/bin/sh", {"-c", "exit 3"}});
        ::_exit(status.exited() ? status.code() : 100);
      } catch (...) {
        ::_exit(101);
      }
    }
    REQUIRE(pid > 0);
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    REQUIRE(WIFEXITED(status));
    return WEXITSTATUS(status);
  }

  // Before, the child compared its parent's pid with the spawner's as
  // cached, which a process made without glibc's fork (no fork handler ran
  // in it) has from its own parent, and which a child in a new pid
  // namespace sees as 0: it ended with code 127 without running its
  // program, and the spawn reported that as the program's exit.
  TEST_CASE("a process made by _Fork() or a raw fork spawns programs that run") {
    CHECK(run(command{"/bin/sh", {"-c", "exit 3"}}).code() == 3);  // here first, as a parent would
    CHECK(code_of_a_run_in([] { return ::_Fork(); }) == 3);
    CHECK(code_of_a_run_in([] { return static_cast<pid_t>(::syscall(SYS_fork)); }) == 3);
  }

  TEST_CASE("a process whose children go into a new pid namespace spawns programs that run") {
    const int code = code_of_a_run_in([] { return ::fork(); }, true);
    if (code == 77) {
      MESSAGE("unshare(CLONE_NEWPID) is refused here: nothing checked");
      return;
    }
    CHECK(code == 3);
  }

  // Before, a lock that spawns with pipes take (their watch for the
  // io_context's end) was a plain mutex: a child forked while another
  // thread held it found it held for good, and its own first spawn with a
  // pipe hung. Held briefly, so many forks: on the old code one in one to
  // four hundred hung.
  TEST_CASE("a fork while other threads spawn with pipes: the child's own spawn with a pipe runs") {
    const auto spawn_with_a_pipe = [](const command& cmd) {
      asio::io_context io;
      spawn_options options;
      options.out = stdio::pipe();
      child c = spawn(io.get_executor(), cmd, options);
      std::string text;
      std::error_code ec;
      asio::read(c.out(), asio::dynamic_buffer(text), ec);
      return std::pair{c.join().code(), text};
    };
    const auto outcome = test::fork_beside(
        2, [&] { spawn_with_a_pipe(command{"/bin/true", {}}); }, 1000,
        [&] { return spawn_with_a_pipe(command{"/bin/sh", {"-c", "echo hi; exit 3"}}) == std::pair{3, std::string("hi\n")} ? 0 : 1; });
    CHECK(outcome.hung == 0);
    CHECK(outcome.failed == 0);
  }

  TEST_CASE("the error_code overload reports instead of throwing") {
    asio::io_context io;
    std::error_code ec;
    const spawn_options defaults;
    child c = spawn(io.get_executor(), command{"cohort-no-such-program", {}}, defaults, ec);
    CHECK(ec == std::error_code(ENOENT, std::system_category()));
    CHECK_FALSE(c);
    auto status = run(command{"cohort-no-such-program", {}}, defaults, ec);
    CHECK(ec == std::error_code(ENOENT, std::system_category()));
    (void)status;
  }

  TEST_CASE("a child leads its own process group unless told not to") {
    auto own = output_of({"print-pgid"});
    std::istringstream in(own);
    pid_t pid = 0, pgid = 0;
    in >> pid >> pgid;
    CHECK(pid == pgid);

    std::istringstream shared(output_of({"print-pgid"}, {.new_process_group = false}));
    shared >> pid >> pgid;
    CHECK(pgid == ::getpgid(0));
  }

  TEST_CASE("a child leads a session of its own with new_session, and a process group with it") {
    pid_t pid = 0, pgid = 0, sid = 0;
    std::istringstream usual(output_of({"print-pgid"}));
    usual >> pid >> pgid >> sid;
    CHECK(sid == ::getsid(0));
    for (const bool group : {true, false}) {
      std::istringstream own(output_of({"print-pgid"}, {.new_process_group = group, .new_session = true}));
      own >> pid >> pgid >> sid;
      CHECK(pgid == pid);
      CHECK(sid == pid);
    }
  }

  TEST_CASE("the parent-death signal is SIGKILL by default, and can be changed or disabled") {
    CHECK(output_of({"print-pdeathsig"}) == std::to_string(SIGKILL));
    CHECK(output_of({"print-pdeathsig"}, {.parent_death_signal = SIGTERM}) == std::to_string(SIGTERM));
    CHECK(output_of({"print-pdeathsig"}, {.parent_death_signal = 0}) == "0");
  }

  TEST_CASE("the child starts with no blocked signals and SIGPIPE at its default") {
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGUSR1);
    ::pthread_sigmask(SIG_BLOCK, &block, &old);
    auto saved = ::signal(SIGPIPE, SIG_IGN);
    auto mask = output_of({"print-sigmask"});
    auto sigpipe = output_of({"print-sigpipe"});
    ::signal(SIGPIPE, saved);
    ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
    CHECK(mask == "0");
    CHECK(sigpipe == "default");
  }

  TEST_CASE("the parent's handlers, an ignored SIGPIPE and an ignored SIGXFSZ are at their defaults before the exec") {
    asio::io_context io;
    const disposition usr1(SIGUSR1, no_op), term(SIGTERM, no_op), rt(handled_realtime_signal(), no_op);
    const disposition pipe(SIGPIPE, SIG_IGN), xfsz(SIGXFSZ, SIG_IGN), usr2(SIGUSR2, SIG_IGN);
    const command cmd{test::target, {"exit", "0"}};
    const spawn_options options{.before_exec = dispositions_reset};
    child c = spawn(io.get_executor(), cmd, options);  // throws EPROTO where the hook found one not reset
    CHECK(c.join().success());
  }

  TEST_CASE("a launch clones with clone3 where the kernel has it") {
    asio::io_context io;
    const command cmd{test::target, {"exit", "0"}};
    child c = spawn(io.get_executor(), cmd);
    CHECK(c.join().success());
    // clone3 with no arguments: EINVAL where the kernel has it, ENOSYS (or
    // a filter's EPERM) where it has not or refuses it.
    const bool kernel_has_clone3 = ::syscall(SYS_clone3, nullptr, 0) == -1 && errno == EINVAL;
    if (os::clone3_run_supported() && kernel_has_clone3 && test::kernel_at_least(5, 5)) {
      CHECK(detail::launches_use_clone3());
    } else {
      CHECK_FALSE(detail::launches_use_clone3());
    }
  }

  TEST_CASE("where clone3 is refused, spawn clones as before and still resets the dispositions") {
    // In a forked process, so that the filter stays there: it exits 0 when
    // a refused clone3 came first and the spawn still succeeded, the hook
    // having found every disposition as it should be.
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      if (!test::refuse_system_call(SYS_clone3, ENOSYS)) ::_exit(3);
      if (::syscall(SYS_clone3, nullptr, 0) != -1 || errno != ENOSYS) ::_exit(4);
      try {
        asio::io_context io;
        const disposition usr1(SIGUSR1, no_op), pipe(SIGPIPE, SIG_IGN), usr2(SIGUSR2, SIG_IGN);
        const command cmd{test::target, {"exit", "0"}};
        const spawn_options options{.before_exec = dispositions_reset};
        child c = spawn(io.get_executor(), cmd, options);
        if (detail::launches_use_clone3()) ::_exit(7);  // the refusal was not learnt
        ::_exit(c.join().success() ? 0 : 5);
      } catch (...) {
        ::_exit(6);
      }
    }
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    REQUIRE(WIFEXITED(status));
    if (WEXITSTATUS(status) == 3) {
      WARN_MESSAGE(false, "no seccomp filter could be installed here: the fallback is not tested");
      return;
    }
    CHECK(WEXITSTATUS(status) == 0);
  }

  TEST_CASE("only the standard streams and keep_fds are inherited, unless closing is off") {
    int leaky = ::open("/dev/null", O_RDONLY);  // no O_CLOEXEC on purpose
    int kept = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    REQUIRE(leaky >= 3);
    CHECK(output_of({"list-fds"}) == "");
    CHECK(output_of({"list-fds"}, {.keep_fds = {kept}}) == std::to_string(kept));
    auto open_without_closing = output_of({"list-fds"}, {.close_other_fds = false});
    CHECK(open_without_closing.find(std::to_string(leaky)) != std::string::npos);
    CHECK(open_without_closing.find(std::to_string(kept)) == std::string::npos);
    ::close(leaky);
    ::close(kept);
  }

  TEST_CASE("keep_fds must name open descriptors above 2") {
    asio::io_context io;
    const spawn_options standard{.keep_fds = {1}};
    CHECK_THROWS_AS(spawn(io.get_executor(), command{test::target, {"exit", "0"}}, standard), std::invalid_argument);
    const spawn_options closed{.keep_fds = {987654}};
    CHECK_THROWS_AS(spawn(io.get_executor(), command{test::target, {"exit", "0"}}, closed), std::invalid_argument);
  }

  TEST_CASE("a spawn leaves no descriptor open in the parent") {
    const int before = test::open_fd_count();
    {
      asio::io_context io;
      test::run(io, []() -> asio::awaitable<void> {
        command c_cmd{test::target, {"cat"}};
        spawn_options c_opts{.in = stdio::pipe(), .out = stdio::pipe(), .err = stdio::null()};
        child c = co_await spawn(c_cmd, c_opts);
        c.in().close();
        co_await test::read_all(c.out());
        co_await c.wait();
      }());
      spawn_error(command{test::target, {}}, {.cwd = "/nonexistent"});
    }
    CHECK(test::open_fd_count() == before);
  }

  TEST_CASE("1,000 children launched at once are all waited for") {
    test::nofile_limit limit(4096);
    if (limit.current() < 1100) {
      MESSAGE("RLIMIT_NOFILE hard limit below 1100: launching fewer children");
    }
    const int count = limit.current() < 1100 ? static_cast<int>(limit.current()) - 100 : 1000;
    asio::io_context io;
    std::vector<child> children;
    children.reserve(static_cast<std::size_t>(count));
    for (int i = 0; i < count; ++i) {
      children.push_back(spawn(io.get_executor(), command{test::target, {"exit", std::to_string(i % 256)}}));
    }
    int matched = 0;
    for (int i = 0; i < count; ++i) {
      asio::co_spawn(io, children[static_cast<std::size_t>(i)].wait(), [&matched, i](std::exception_ptr e, exit_status s) {
        if (!e && s.code() == i % 256) ++matched;
      });
    }
    io.run();
    CHECK(matched == count);
    CHECK_FALSE(has_unreaped_children());
  }

  TEST_CASE("running out of descriptors is EMFILE naming the limit, and nothing is left behind") {
    asio::io_context io;
    std::vector<child> children;
    std::optional<std::system_error> error;
    {
      test::nofile_limit limit(static_cast<rlim_t>(test::open_fd_count() + 8));
      try {
        const spawn_options piped{.out = stdio::pipe()};
        for (int i = 0; i < 64; ++i) {
          children.push_back(spawn(io.get_executor(), command{test::target, {"sleep", "30"}}, piped));
        }
      } catch (const std::system_error& e) {
        error = e;
      }
      CHECK(error.has_value());
      if (error) {
        CHECK(error->code() == std::error_code(EMFILE, std::system_category()));
        CHECK(std::string(error->what()).find(fmt::format("RLIMIT_NOFILE is {}", limit.current())) != std::string::npos);
      }
    }
    children.clear();  // kills and reaps them
    CHECK_FALSE(has_unreaped_children());
  }

  // Before, a spawn on an io_context that had never waited succeeded with
  // one or two descriptors left, and its first wait then threw asio's
  // "epoll: Too many open files" (a stream's pipe: asio's message, from the
  // spawn); asio's reactor is now brought up before the process starts.
  TEST_CASE("on a fresh io_context, a spawn with few descriptors left either runs to its wait or fails naming the "
            "limit") {
    for (const bool piped : {false, true}) {
      for (int free = 0; free <= 6; ++free) {
        CAPTURE(piped);
        CAPTURE(free);
        asio::io_context io;
        std::optional<exit_status> status;
        std::string failure;
        {
          const test::descriptors_left left(free);
          try {
            const command cmd{test::target, {"exit", "3"}};
            spawn_options options;
            if (piped) options.out = stdio::pipe();
            child c = spawn(io.get_executor(), cmd, options);
            status = test::run(io, c.wait());
          } catch (const std::system_error& e) {
            failure = e.what();
            CHECK(e.code() == std::error_code(EMFILE, std::system_category()));
            CHECK(failure.find(fmt::format("RLIMIT_NOFILE is {}", left.limit.current())) != std::string::npos);
          }
        }
        if (status) {
          CHECK(status->code() == 3);
        } else {
          CHECK(failure.starts_with(fmt::format("cohort::spawn '{}'", test::target)));
        }
        CHECK_FALSE(has_unreaped_children());
      }
    }
  }

  TEST_CASE("a command with its arguments in braces is built and spawned inside co_await") {
    asio::io_context io;
    const std::string code = "7";
    auto status = test::run(io, [&]() -> asio::awaitable<exit_status> {
      child c = co_await spawn(command(test::target, {"exit", code}));
      co_return co_await c.wait();
    }());
    CHECK(status.code() == 7);
  }

  TEST_CASE("command arguments in braces keep their order, and a vector is taken as it is") {
    const std::string name = "A";
    command listed("prog", {"first", name, std::string("third")});
    CHECK(listed.args == std::vector<std::string>{"first", "A", "third"});
    std::vector<std::string> vector{"x", "y"};
    CHECK(command("prog", vector).args == vector);
    CHECK(command("prog", {}).args.empty());
    CHECK(command("prog").args.empty());
  }

  TEST_CASE("named spawn options outlive the awaited spawn that reads them") {
    asio::io_context io;
    auto text = test::run(io, []() -> asio::awaitable<std::string> {
      spawn_options options{.cwd = "/", .out = stdio::pipe()};
      child c = co_await spawn(command(test::target, {"print-cwd"}), options);
      std::string out = co_await test::read_all(c.out());
      co_await c.wait();
      co_return out;
    }());
    CHECK(text == "/\n");
  }

#if !COHORT_AWAIT_TEMPORARY_BUG
  // g++ 12 refuses this form (tests/compile_fail/spawn_options_braced.cpp).
  TEST_CASE("spawn options in braces inside co_await hold until the child has started") {
    asio::io_context io;
    auto text = test::run(io, []() -> asio::awaitable<std::string> {
      child c = co_await spawn(command(test::target, {"print-cwd"}), {.cwd = "/", .out = stdio::pipe()});
      std::string out = co_await test::read_all(c.out());
      co_await c.wait();
      co_return out;
    }());
    CHECK(text == "/\n");
  }
#endif

  TEST_CASE("run() blocks until the child exits and returns its status") {
    CHECK(run(command{test::target, {"exit", "9"}}).code() == 9);
    CHECK(run(command{test::target, {"kill-self", "TERM"}}).signal() == SIGTERM);
  }

  TEST_CASE("spawn with a callback hands over the running child on the bound executor") {
    asio::io_context io;
    child started;
    std::exception_ptr error;
    spawn(command{test::target, {"exit", "6"}}, asio::bind_executor(io, [&](std::exception_ptr e, child c) {
      error = e;
      started = std::move(c);
    }));
    CHECK_FALSE(started);  // not before the io_context runs
    io.run();
    CHECK_FALSE(error);
    REQUIRE(started);
    CHECK(started.join().code() == 6);
  }

  TEST_CASE("spawn with use_future delivers the child, or the launch failure, through the future") {
    asio::io_context io;
    const test::io_thread runner(io);
    const spawn_options options;
    auto started = spawn(io.get_executor(), command{test::target, {"exit", "0"}}, options, asio::use_future);
    child c = started.get();
    CHECK(c.join().success());
    auto failed = spawn(io.get_executor(), command{"cohort-no-such-program"}, options, asio::use_future);
    CHECK_THROWS_AS(failed.get(), std::system_error);
    CHECK_FALSE(has_unreaped_children());
  }

  TEST_CASE("spawn whose handler names no executor, and given none, is refused at the call before any process starts") {
    const spawn_options options;
    CHECK_THROWS_WITH_AS((void)spawn(command{test::target, {"exit", "0"}}, options, asio::use_future),
                         doctest::Contains("has no associated io_context executor"), std::invalid_argument);
    bool called = false;
    CHECK_THROWS_WITH_AS(spawn(command{test::target, {"exit", "0"}}, [&](std::exception_ptr, child) { called = true; }),
                         doctest::Contains("bind one with asio::bind_executor"), std::invalid_argument);
    CHECK_FALSE(called);
    CHECK_THROWS_AS(spawn(asio::system_executor(), command{test::target, {"exit", "0"}}), std::invalid_argument);
    CHECK_FALSE(has_unreaped_children());
    CHECK(test::children_of_self().empty());
  }

  // Before, a strand of a strand was refused as no io_context's executor,
  // and the refusal named no operation.
  TEST_CASE("spawn runs on a strand of a strand of an io_context, and an executor of another kind is refused by name") {
    asio::io_context io;
    const spawn_options options;
    const auto strand = asio::make_strand(asio::make_strand(io));
    child c = spawn(strand, command{test::target, {"exit", "4"}}, options);
    CHECK(c.join().code() == 4);
    CHECK_THROWS_WITH_AS(spawn(asio::system_executor(), command{test::target, {"exit", "0"}}, options),
                         doctest::Contains("cohort::spawn: cohort needs the executor of an asio::io_context"),
                         std::invalid_argument);
    CHECK_FALSE(has_unreaped_children());
  }

  // Before, co_spawn's coroutine let terminal cancellations alone in, and a
  // partial or total one emitted before it ran was lost: the process started.
  TEST_CASE("a spawn cancelled before it runs, by any type of cancellation, starts nothing and completes as aborted") {
    const asio::cancellation_type types[] = {asio::cancellation_type::terminal, asio::cancellation_type::partial,
                                             asio::cancellation_type::total};
    for (const auto type : types) {
      for (const bool on_a_strand : {false, true}) {  // the handler's executor the operation's, or another
        CAPTURE(static_cast<int>(type));
        CAPTURE(on_a_strand);
        asio::io_context io;
        const auto strand = asio::make_strand(io);
        const asio::any_io_executor completion =
            on_a_strand ? asio::any_io_executor(strand) : asio::any_io_executor(io.get_executor());
        asio::cancellation_signal cancel;
        std::exception_ptr error;
        child started;
        bool done = false;
        const spawn_options options;
        spawn(io.get_executor(), command{test::target, {"sleep", "30"}}, options,
              asio::bind_cancellation_slot(cancel.slot(),
                                           asio::bind_executor(completion, [&](std::exception_ptr e, child c) {
                                             error = e;
                                             started = std::move(c);
                                             done = true;
                                           })));
        cancel.emit(type);
        io.run();
        CHECK(done);
        CHECK(test::aborted(error));
        CHECK_FALSE(started);
        CHECK(test::children_of_self().empty());
      }
    }
  }

  TEST_CASE("a deferred spawn cancelled before it runs starts nothing and completes as aborted") {
    asio::io_context io;
    auto op = spawn(command{test::target, {"sleep", "30"}}, asio::experimental::deferred);
    asio::cancellation_signal cancel;
    std::exception_ptr error;
    child started;
    std::move(op)(asio::bind_cancellation_slot(cancel.slot(), asio::bind_executor(io, [&](std::exception_ptr e, child c) {
      error = e;
      started = std::move(c);
    })));
    cancel.emit(asio::cancellation_type::terminal);
    io.run();
    CHECK(test::aborted(error));
    CHECK_FALSE(started);
    CHECK_FALSE(has_unreaped_children());
  }
}

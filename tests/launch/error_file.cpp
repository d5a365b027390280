#include "cohort/error_file.hpp"

#include "cohort/spawn.hpp"

#include "os/replace_file.hpp"
#include "os/stack_trace.hpp"

#include "support/harness.hpp"

#include <doctest/doctest.h>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <future>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

using namespace cohort;
namespace fs = std::filesystem;

namespace {

// Sets COHORT_ERROR_FILE (and clears TORCHELASTIC_ERROR_FILE) for one test.
struct error_file_env {
  explicit error_file_env(const fs::path& path) {
    ::setenv("COHORT_ERROR_FILE", path.c_str(), 1);
    ::unsetenv("TORCHELASTIC_ERROR_FILE");
  }
  ~error_file_env() { ::unsetenv("COHORT_ERROR_FILE"); }
};

// Runs the thrower's uncaught mode with its error file at `file`; returns
// its exit status and what it printed.
// `thrower uncaught` (or `thrower thread`); with `preload` as LD_PRELOAD
// where it is not empty.
asio::awaitable<std::pair<exit_status, std::string>> run_uncaught(fs::path file, std::string preload = "",
                                                                  std::string mode = "uncaught") {
  command cmd(test::thrower, {mode});
  spawn_options options{.out = stdio::pipe(), .err = stdio::null()};
  options.env.set("COHORT_ERROR_FILE", file.string());
  if (!preload.empty()) options.env.set("LD_PRELOAD", preload);
  child c = co_await spawn(cmd, options);
  std::string out = co_await test::read_all(c.out());
  exit_status status = co_await c.wait();
  co_return std::pair{status, out};
}

// `thrower constructor`: a library whose constructor throws, loaded by a
// program that records its uncaught exceptions; killed after a minute.
asio::awaitable<exit_status> run_throwing_constructor(fs::path file, std::string mode = "constructor") {
  command cmd("/usr/bin/timeout", {"-s", "KILL", "60", test::thrower, mode, COHORT_TEST_THROWING_CONSTRUCTOR});
  spawn_options options{.out = stdio::null(), .err = stdio::null()};
  options.env.set("COHORT_ERROR_FILE", file.string());
  options.env.set("COHORT_TEST_CONSTRUCTOR_SLEEP_MS", "500");
  child c = co_await spawn(cmd, options);
  co_return co_await c.wait();
}

nlohmann::json parse(const fs::path& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

}  // namespace

TEST_SUITE("error_file") {
  // The writer's name for a report in progress and the sweep's test of a
  // name are one pair: a sweep that missed the writer's name would leave
  // killed ranks' files piling up, one that took more would remove a
  // user's files.
  TEST_CASE("the name of a report being written is recognised beside its report, and no other") {
    const auto written = cohort::os::unfinished_file("/some/where/error.json", 7);
    CHECK(written.parent_path() == "/some/where");
    const auto name = written.filename().string();
    CHECK(name == fmt::format("error.json.{}-7.tmp", ::getpid()));
    CHECK(cohort::os::is_unfinished_file(name, "error.json"));
    CHECK(cohort::os::is_unfinished_file("error.json.4242-0.tmp", "error.json"));
    for (const char* other : {"error.json", "error.json.tmp", "error.json..tmp", "error.json.4242.tmp",
                              "error.json.4242-.tmp", "error.json.-0.tmp", "error.json.x-0.tmp", "error.json.42-0x.tmp",
                              "error.json.4242-0.tmp.bak", "error.jsonx.4242-0.tmp", "other.json.4242-0.tmp"}) {
      CAPTURE(other);
      CHECK_FALSE(cohort::os::is_unfinished_file(other, "error.json"));
    }
  }

  TEST_CASE("an exception is written in torchelastic's error.json shape") {
    test::temp_dir dir;
    error_file_env env(dir.path / "error.json");
    const auto before = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
    REQUIRE(record_error(std::invalid_argument("bad rank"), "at main()"));
    auto file = parse(dir.path / "error.json");
    REQUIRE(file["message"].is_object());
    CHECK(file["message"]["message"] == "std::invalid_argument: bad rank");
    // The trace ends with the message, as Python's does: torch shows only this.
    CHECK(file["message"]["extraInfo"]["py_callstack"] == "at main()\nstd::invalid_argument: bad rank\n");
    REQUIRE(file["message"]["extraInfo"]["timestamp"].is_string());  // torch writes seconds as a string
    CHECK(std::stoll(file["message"]["extraInfo"]["timestamp"].get<std::string>()) >= before);
    // With no trace, the message is all of it.
    REQUIRE(record_error(std::invalid_argument("bad rank")));
    const auto alone = parse(dir.path / "error.json");
    CHECK(alone["message"]["extraInfo"]["py_callstack"] == "std::invalid_argument: bad rank\n");
    CHECK(read_error_file(dir.path / "error.json")->trace.empty());
  }

  TEST_CASE("a Python traceback reads back without its last line, which repeats the message") {
    test::temp_dir dir;
    std::ofstream(dir.path / "py.json")
        << R"({"message": {"message": "ValueError: x", "extraInfo": {"py_callstack": )"
        << R"("Traceback (most recent call last):\n  File \"t.py\", line 1\nValueError: x\n", )"
        << R"("timestamp": "1"}}})";
    const auto report = read_error_file(dir.path / "py.json");
    REQUIRE(report);
    CHECK(report->trace == "Traceback (most recent call last):\n  File \"t.py\", line 1");
  }

  TEST_CASE("Python's escapes of lone surrogates (undecodable bytes) read as U+FFFD; pairs and escaped backslashes "
            "stay") {
    test::temp_dir dir;
    // What json.dump writes for os.fsdecode(b"caf\xe9"), an emoji's pair, and a backslash before "udce9".
    std::ofstream(dir.path / "py.json")
        << R"({"message": {"message": "OSError: caf\udce9 \ud83d\ude00 \\udce9 \udc80\ud800", "extraInfo": {}}})";
    const auto report = read_error_file(dir.path / "py.json");
    REQUIRE(report);
    CHECK(report->message == "OSError: caf\xef\xbf\xbd \xf0\x9f\x98\x80 \\udce9 \xef\xbf\xbd\xef\xbf\xbd");
  }

  TEST_CASE("a message or trace past 512 KiB is cut with a note, so that the file stays readable") {
    test::temp_dir dir;
    error_file_env env(dir.path / "error.json");
    // Control bytes are escaped six bytes for one: 17 MiB of them would make a file of about 200 MiB.
    const std::string huge(17 * 1024 * 1024, '\x01');
    REQUIRE(record_error(error_report{huge, huge, std::nullopt}));
    const auto report = read_error_file(dir.path / "error.json");
    REQUIRE(report);
    const std::size_t kept = 512 * 1024;
    const std::string note = fmt::format("... ({} bytes more left out)", huge.size() - kept);
    CHECK(report->message == huge.substr(0, kept) + note);
    CHECK(report->trace == huge.substr(0, kept) + note);
  }

  // Before, error_report was an aggregate, which g++ 12 destroys twice
  // inside a co_await expression: this aborted with a double free.
  TEST_CASE("a report built inside a co_await expression is written once and read back") {
    static_assert(!std::is_aggregate_v<error_report>);
    test::temp_dir dir;
    error_file_env env(dir.path / "error.json");
    const std::string message(100, 'm'), trace(100, 't');  // past std::string's inline buffer
    const auto passed = [](bool written) -> asio::awaitable<bool> { co_return written; };
    const auto write = [&]() -> asio::awaitable<bool> {
      co_return co_await passed(record_error(error_report{message, trace, std::nullopt}));
    };
    asio::io_context io;
    CHECK(test::run(io, write()));
    const auto report = read_error_file(dir.path / "error.json");
    REQUIRE(report);
    CHECK(report->message == message);
    CHECK(report->trace == trace);
  }

  TEST_CASE("what is written reads back") {
    test::temp_dir dir;
    error_file_env env(dir.path / "error.json");
    const auto stamp = std::chrono::system_clock::time_point(std::chrono::seconds(1700000000));
    REQUIRE(record_error(error_report{"ValueError: x", "Traceback ...", stamp}));
    auto report = read_error_file(dir.path / "error.json");
    REQUIRE(report);
    CHECK(report->message == "ValueError: x");
    CHECK(report->trace == "Traceback ...");
    CHECK(report->timestamp == stamp);
    // With no message, the trace is written and read as it is.
    REQUIRE(record_error(error_report{"", "frame 1\nframe 2", stamp}));
    CHECK(parse(dir.path / "error.json")["message"]["extraInfo"]["py_callstack"] == "frame 1\nframe 2");
    CHECK(read_error_file(dir.path / "error.json")->trace == "frame 1\nframe 2");
  }

  TEST_CASE("a timestamp within a second reads back to the nanosecond; torch's whole seconds stay what they say") {
    test::temp_dir dir;
    error_file_env env(dir.path / "error.json");
    using namespace std::chrono;
    const auto stamp = system_clock::time_point(seconds(1700000000) + nanoseconds(123456789));
    REQUIRE(record_error(error_report{"ValueError: x", "", stamp}));
    const auto file = parse(dir.path / "error.json");
    CHECK(file["message"]["extraInfo"]["timestamp"] == "1700000000");  // what torch's int() reads
    CHECK(file["message"]["extraInfo"]["timestamp_ns"] == "1700000000123456789");
    CHECK(read_error_file(dir.path / "error.json")->timestamp == stamp);
    std::ofstream(dir.path / "torch.json")
        << R"({"message": {"message": "E", "extraInfo": {"timestamp": "1700000001"}}})";
    CHECK(read_error_file(dir.path / "torch.json")->timestamp == system_clock::time_point(seconds(1700000001)));
  }

  TEST_CASE("a message or trace that is not UTF-8 is written with U+FFFD rather than lost") {
    test::temp_dir dir;
    error_file_env env(dir.path / "error.json");
    REQUIRE(record_error(std::runtime_error("cannot open /data/caf\xe9.bin"), "at \xff"));
    const auto report = read_error_file(dir.path / "error.json");
    REQUIRE(report);
    CHECK(report->message == "std::runtime_error: cannot open /data/caf\xef\xbf\xbd.bin");
    CHECK(report->trace == "at \xef\xbf\xbd");
  }

  TEST_CASE("fields of the wrong type read as absent: the rest of the report stays") {
    test::temp_dir dir;
    const auto read = [&](const std::string& text) {
      std::ofstream(dir.path / "odd.json", std::ios::trunc) << text;
      return read_error_file(dir.path / "odd.json");
    };
    auto a = read(R"({"message": {"message": "boom", "extraInfo": {"py_callstack": null, "timestamp": "1"}}})");
    REQUIRE(a);
    CHECK(a->message == "boom");
    CHECK(a->trace.empty());
    CHECK(a->timestamp == std::chrono::system_clock::time_point(std::chrono::seconds(1)));
    auto b = read(R"({"message": {"message": 7, "extraInfo": {"py_callstack": ["x"], "timestamp": 1.5e30}}})");
    REQUIRE(b);
    CHECK(b->message.empty());
    CHECK(b->trace.empty());
    CHECK_FALSE(b->timestamp);
    const char* const stamps[] = {R"("-5")", R"("12x")", "-5", "99999999999999999", R"("99999999999999999999")", "true",
                                  "{}"};
    for (const char* stamp : stamps) {
      auto c = read(std::string(R"({"message": {"message": "m", "extraInfo": {"timestamp": )") + stamp + "}}}");
      REQUIRE(c);
      CHECK(c->message == "m");
      CHECK_FALSE(c->timestamp);
    }
    auto d = read(R"({"message": {"message": "m", "extraInfo": "not an object"}})");
    REQUIRE(d);
    CHECK(d->message == "m");
  }

  TEST_CASE("a report that cannot be written whole leaves the one before it, and no other file") {
    test::temp_dir dir;
    const fs::path file = dir.path / "error.json";
    error_file_env env(file);
    REQUIRE(record_error(error_report{"RuntimeError: first", "short trace", std::nullopt}));
    // Past RLIMIT_FSIZE, in a child of its own: the write fails, and its
    // SIGXFSZ, whose default ends the process, does not end the writer.
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      const rlimit little{4096, RLIM_INFINITY};
      ::setrlimit(RLIMIT_FSIZE, &little);
      const error_report second{"RuntimeError: second", std::string(64 * 1024, 't'), std::nullopt};
      const bool written = record_error(second);
      ::_exit(written ? 1 : 0);
    }
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    const auto report = read_error_file(file);
    REQUIRE(report);
    CHECK(report->message == "RuntimeError: first");
    CHECK(report->trace == "short trace");
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir.path)) names.push_back(e.path().filename().string());
    CHECK(names == std::vector<std::string>{"error.json"});
  }

  TEST_CASE("a report written through a symbolic link replaces what it names; the link stays") {
    test::temp_dir dir;
    const fs::path real = dir.path / "real.json", link = dir.path / "link.json";
    std::ofstream(real) << "old";
    fs::create_symlink(real, link);
    error_file_env env(link);
    REQUIRE(record_error(std::runtime_error("through the link")));
    CHECK(fs::is_symlink(link));
    const auto report = read_error_file(real);
    REQUIRE(report);
    CHECK(report->message == "std::runtime_error: through the link");
  }

  // Before, a report through a link was renamed over the file it named: an
  // error file at /dev/stderr, a link to the log that stderr was open on,
  // took that log from under the descriptor, whose later lines went to a
  // file no one could open.
  TEST_CASE("a report through a link to a file open elsewhere reaches that file's readers and writers") {
    test::temp_dir dir;
    const fs::path log = dir.path / "stderr.log", link = dir.path / "stderr";
    const int open_log = ::open(log.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    REQUIRE(open_log >= 0);
    fs::create_symlink(log, link);
    error_file_env env(link);
    REQUIRE(record_error(std::runtime_error("to the log")));
    REQUIRE(::write(open_log, "after\n", 6) == 6);
    struct stat by_name{}, by_descriptor{};
    REQUIRE(::stat(log.c_str(), &by_name) == 0);
    REQUIRE(::fstat(open_log, &by_descriptor) == 0);
    ::close(open_log);
    CHECK(by_name.st_ino == by_descriptor.st_ino);  // still the file the descriptor writes
    std::ifstream in(log);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    CHECK(text.find("std::runtime_error: to the log") != std::string::npos);
    CHECK(text.ends_with("after\n"));
  }

  // Before, the open waited for a reader: a failing process whose error
  // file was such a FIFO never ended.
  TEST_CASE("a report to a FIFO that no process reads fails at once; one with a reader gets it") {
    test::temp_dir dir;
    const fs::path fifo = dir.path / "error.json";
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    error_file_env env(fifo);
    auto recorded = std::async(std::launch::async, [] { return record_error(std::runtime_error("unread")); });
    const bool at_once = recorded.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
    // A write stuck opening the FIFO: a reader's open lets it go on.
    const int unblocking = at_once ? -1 : ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    CHECK(at_once);
    CHECK_FALSE(recorded.get());
    ::close(unblocking);

    const int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    REQUIRE(reader >= 0);
    REQUIRE(record_error(std::runtime_error("read")));
    char buffer[4096];
    const ssize_t got = ::read(reader, buffer, sizeof buffer);
    ::close(reader);
    REQUIRE(got > 0);
    CHECK(std::string_view(buffer, static_cast<std::size_t>(got)).find("std::runtime_error: read") !=
          std::string_view::npos);
  }

  // Before, the new report was made with the default mode and renamed over
  // the old file, whatever its mode and links; and a name with no room for
  // the temporary file's suffix was not written at all.
  TEST_CASE("a report over an existing file keeps its mode and links; a long name is written too") {
    test::temp_dir dir;
    const fs::path file = dir.path / "error.json", other = dir.path / "other.json";
    std::ofstream(file) << "old";
    fs::permissions(file, fs::perms::owner_read | fs::perms::owner_write);
    error_file_env env(file);
    REQUIRE(record_error(std::runtime_error("private")));
    CHECK((fs::status(file).permissions() & fs::perms::all) == (fs::perms::owner_read | fs::perms::owner_write));
    fs::create_hard_link(file, other);
    REQUIRE(record_error(std::runtime_error("linked")));
    const auto through_other = read_error_file(other);
    REQUIRE(through_other);
    CHECK(through_other->message == "std::runtime_error: linked");
    const fs::path long_name = dir.path / std::string(250, 'e');
    error_file_env long_env(long_name);
    REQUIRE(record_error(std::runtime_error("long")));
    const auto report = read_error_file(long_name);
    REQUIRE(report);
    CHECK(report->message == "std::runtime_error: long");
  }

  TEST_CASE("TORCHELASTIC_ERROR_FILE is used when COHORT_ERROR_FILE is not set") {
    test::temp_dir dir;
    ::unsetenv("COHORT_ERROR_FILE");
    ::setenv("TORCHELASTIC_ERROR_FILE", (dir.path / "torch.json").c_str(), 1);
    CHECK(error_file_path() == dir.path / "torch.json");
    CHECK(record_error(std::runtime_error("r")));
    ::unsetenv("TORCHELASTIC_ERROR_FILE");
    CHECK(fs::exists(dir.path / "torch.json"));
  }

  TEST_CASE("without an error file, nothing is written and record_error says so") {
    ::unsetenv("COHORT_ERROR_FILE");
    ::unsetenv("TORCHELASTIC_ERROR_FILE");
    CHECK_FALSE(error_file_path());
    CHECK_FALSE(record_error(std::runtime_error("nowhere")));
  }

  TEST_CASE("a plain string message, a missing file and garbage are read sensibly") {
    test::temp_dir dir;
    std::ofstream(dir.path / "plain.json") << R"({"message": "RuntimeError: plain"})";
    auto plain = read_error_file(dir.path / "plain.json");
    REQUIRE(plain);
    CHECK(plain->message == "RuntimeError: plain");
    CHECK_FALSE(plain->timestamp);
    // Its time beside it, as torch reads it: before, it was read as none.
    std::ofstream(dir.path / "dated.json") << R"({"message": "RuntimeError: dated", "timestamp": "1700000002"})";
    auto dated = read_error_file(dir.path / "dated.json");
    REQUIRE(dated);
    CHECK(dated->message == "RuntimeError: dated");
    CHECK(dated->timestamp == std::chrono::system_clock::time_point(std::chrono::seconds(1700000002)));
    CHECK_FALSE(read_error_file(dir.path / "missing.json"));
    std::ofstream(dir.path / "garbage.json") << "not json {";
    CHECK_FALSE(read_error_file(dir.path / "garbage.json"));
    std::ofstream(dir.path / "other.json") << R"({"error": 1})";
    CHECK_FALSE(read_error_file(dir.path / "other.json"));
  }

  TEST_CASE("a directory, a FIFO or a file past 16 MiB reads as no report, at once") {
    test::temp_dir dir;
    CHECK_FALSE(read_error_file(dir.path));
    const fs::path fifo = dir.path / "fifo.json";
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    auto read = std::async(std::launch::async, [&] { return read_error_file(fifo); });
    const bool at_once = read.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
    if (!at_once) {
      // A read stuck opening the FIFO: a writer's open lets it go on, to
      // an empty file.
      const int writer = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
      if (writer >= 0) ::close(writer);
    }
    CHECK(at_once);
    CHECK_FALSE(read.get());
    const std::string report = R"({"message": "RuntimeError: large"})";
    std::ofstream(dir.path / "large.json") << report << std::string(16 * 1024 * 1024, ' ');
    CHECK_FALSE(read_error_file(dir.path / "large.json"));
    std::ofstream(dir.path / "small.json") << report << std::string(1024, ' ');
    CHECK(read_error_file(dir.path / "small.json"));
  }

  TEST_CASE("an exception escaping main of a program that records them writes its message and the trace of its throw") {
    test::temp_dir dir;
    const fs::path file = dir.path / "error.json";
    asio::io_context io;
    const auto [status, out] = test::run(io, run_uncaught(file));
    CHECK(status.exited());
    CHECK(status.code() == 1);
    const auto report = read_error_file(file);
    REQUIRE(report.has_value());
    CHECK(report->message == "std::runtime_error: uncaught in main");
    INFO(report->trace);
    const std::string first = report->trace.substr(0, report->trace.find('\n'));
    CHECK(first.rfind("#0 thrower::throw_uncaught()", 0) == 0);
    if (os::stack_has_source_lines()) CHECK(first.ends_with("support/thrower.cpp:" + out.substr(0, out.find('\n'))));
    // It ends at main: libc's start of the program is left out.
    CHECK(report->trace.find(" main") != std::string::npos);
    CHECK(report->trace.find("__libc_start") == std::string::npos);
    CHECK(report->timestamp.has_value());
  }

  TEST_CASE("two threads failing at once, one in a library's constructor as dlopen runs it, end the process") {
    // The other thread reports first and, naming its frames, waits for
    // the loader's lock, which the constructor's thread holds: that one
    // waits a bounded time for the other's report, then ends the process
    // with the other's message in the error file.
    test::temp_dir dir;
    const fs::path file = dir.path / "error.json";
    asio::io_context io;
    const exit_status status = test::run(io, run_throwing_constructor(file, "constructor-race"));
    CHECK(status.exited());
    CHECK(status.code() == 1);
    const auto report = read_error_file(file);
    REQUIRE(report.has_value());
    CHECK(report->message == "std::runtime_error: uncaught in main");
  }

  TEST_CASE("the trace of a std::throw_with_nested starts at the function that called it, not in the standard library") {
    test::temp_dir dir;
    const fs::path file = dir.path / "error.json";
    asio::io_context io;
    const auto [status, out] = test::run(io, run_uncaught(file, "", "nested"));
    CHECK(status.code() == 1);
    const auto report = read_error_file(file);
    REQUIRE(report.has_value());
    CHECK(report->message.starts_with("std::logic_error: training step 3"));
    INFO(report->trace);
    CHECK(report->trace.rfind("#0 thrower::throw_nested()", 0) == 0);
  }

  TEST_CASE("a thread that fails while another reports its exception leaves that report, the first, in the error file") {
    // The main thread's exception's what(), called as its report is made,
    // lets the other thread throw and takes 200 ms: time for that thread's
    // report to be written, had it not waited.
    test::temp_dir dir;
    const fs::path file = dir.path / "error.json";
    asio::io_context io;
    const auto [status, out] = test::run(io, run_uncaught(file, "", "two-threads"));
    CHECK(status.exited());
    CHECK(status.code() == 1);
    const auto report = read_error_file(file);
    REQUIRE(report.has_value());
    CHECK(report->message == "thrower::slow_to_say: first, the main thread");
    INFO(report->trace);
    CHECK(report->trace.rfind("#0 thrower::throw_first()", 0) == 0);
  }

  TEST_CASE("a child forked as a thread of its parent reports an exception reports its own, to its own error file") {
    // The parent's report is under way as the child forks: the child's
    // thread finds the report unowned, rather than wait on a thread it
    // lacks and then leave its error file unwritten.
    test::temp_dir dir;
    const fs::path file = dir.path / "error.json";
    asio::io_context io;
    const auto [status, out] = test::run(io, run_uncaught(file, "", "fork-as-it-reports"));
    CHECK(status.code() == 1);
    CHECK(out == "1\n");  // the child's exit code
    const auto child = read_error_file(dir.path / "error.json.child");
    REQUIRE(child.has_value());
    CHECK(child->message == "std::runtime_error: second, another thread");
    const auto parent = read_error_file(file);
    REQUIRE(parent.has_value());
    CHECK(parent->message == "thrower::slow_to_say: first, the main thread");
  }

  TEST_CASE("an exception escaping a std::thread's function has a trace that ends at that function") {
    test::temp_dir dir;
    const fs::path file = dir.path / "error.json";
    asio::io_context io;
    const auto [status, out] = test::run(io, run_uncaught(file, "", "thread"));
    CHECK(status.code() == 1);
    const auto report = read_error_file(file);
    REQUIRE(report.has_value());
    INFO(report->trace);
    CHECK(report->trace.rfind("#0 thrower::throw_uncaught()", 0) == 0);
    // The function, then the thread's lambda that called it; the thread's
    // start (libc's, libstdc++'s, std::thread's calls into the lambda) is
    // left out.
    CHECK(report->trace.find("#2 ") == std::string::npos);
    for (const char* start : {"start_thread", "clone", "bits/", "_State_impl", "libstdc++"}) {
      CHECK(report->trace.find(start) == std::string::npos);
    }
  }

  TEST_CASE("without libdw, a trace names frames by module and offset, and leaves out the C runtime's start") {
    test::temp_dir dir;
    const fs::path file = dir.path / "error.json";
    asio::io_context io;
    const auto [status, out] = test::run(io, run_uncaught(file, COHORT_TEST_NO_LIBDW));
    CHECK(status.code() == 1);
    const auto report = read_error_file(file);
    REQUIRE(report.has_value());
    INFO(report->trace);
    // throw_uncaught and main, both unnamed: the program exports neither.
    std::vector<std::string> lines;
    for (std::size_t at = 0; at < report->trace.size();) {
      const auto end = report->trace.find('\n', at);
      lines.push_back(report->trace.substr(at, end - at));
      at = end == std::string::npos ? report->trace.size() : end + 1;
    }
    REQUIRE(lines.size() == 2);
    for (const auto& line : lines) CHECK(line.find(std::string(test::thrower) + "+0x") != std::string::npos);
  }

  TEST_CASE("an exception escaping a library's constructor as dlopen runs it is reported, its trace too") {
    // dlopen holds the dynamic loader's lock as the constructor runs: the
    // trace is named on that thread, which may take the lock again.
    test::temp_dir dir;
    const fs::path file = dir.path / "error.json";
    asio::io_context io;
    const exit_status status = test::run(io, run_throwing_constructor(file));
    CHECK(status.exited());
    CHECK(status.code() == 1);
    const auto report = read_error_file(file);
    REQUIRE(report.has_value());
    CHECK(report->message == "std::runtime_error: thrown by a constructor as its library loads");
    INFO(report->trace);
    const std::string first = report->trace.substr(0, report->trace.find('\n'));
    if (os::stack_has_source_lines()) {
      CHECK(first.rfind("#0 throwing_constructor::settings::settings()", 0) == 0);
      CHECK(first.find("support/throwing_constructor.cpp:") != std::string::npos);
    }
  }
}

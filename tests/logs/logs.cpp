// Per-rank logs: files that hold exactly what the ranks wrote, console lines
// whole and prefixed, the console filter, and errors before any rank starts.
#include "cohort/group.hpp"

#include "support/fork_beside.hpp"
#include "support/harness.hpp"
#include "support/process_probe.hpp"
#include "support/run_group.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <doctest/doctest.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

using namespace cohort;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

using test::run_group;

namespace {

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// A file the console lines of a test go to.
struct console_file {
  fs::path path;
  int fd;
  explicit console_file(const fs::path& p) : path(p), fd(::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600)) {
    REQUIRE(fd >= 0);
  }
  ~console_file() { ::close(fd); }
  std::string text() const { return test::read_file(path); }
};

// `nprocs` ranks of `sh -c script`, where $R is the rank.
group_spec shell_ranks(int nprocs, const std::string& script) {
  group_spec spec;
  spec.name = "worker";
  spec.entry = command("/bin/sh", {"-c", script});
  spec.nprocs = nprocs;
  for (int r = 0; r < nprocs; ++r) spec.envs[r] = {{"R", std::to_string(r)}};
  return spec;
}

// One shell rank named `name` running `script`, every line prefixed on
// the console `fd`, with half a second for its end once killed.
group_spec on_console(int fd, const char* name, const std::string& script) {
  auto spec = shell_ranks(1, script);
  spec.name = name;
  spec.logs.prefix_all = true;
  spec.logs.console_out = fd;
  spec.shutdown.kill_wait = 500ms;
  return spec;
}

void print_lines(int rank) {
  std::printf("first %d\nsecond %d\nno newline %d", rank, rank, rank);
  std::fprintf(stderr, "error %d\n", rank);
}
COHORT_ENTRYPOINT(print_lines);

void print_and_throw(int rank) {
  std::printf("about to fail %d\n", rank);
  throw std::runtime_error("failed on purpose");
}
COHORT_ENTRYPOINT(print_and_throw);

}  // namespace

TEST_CASE("redirect and tee: the files hold the exact bytes, the console whole prefixed lines") {
  test::temp_dir dir;
  console_file out(dir.path / "console-out"), err(dir.path / "console-err");
  // stdout: lines, then a last line without its newline; stderr: binary bytes.
  auto spec = shell_ranks(3, "printf 'hello %s\\nlast %s' $R $R; printf '\\000\\377\\n%s\\000' $R >&2");
  spec.logs.dir = dir.path / "logs";
  spec.logs.run_id = "job7";
  spec.logs.attempt = 2;
  spec.logs.tee = std_streams::out;
  spec.logs.redirects = std_streams::err;
  spec.logs.console_out = out.fd;
  spec.logs.console_err = err.fd;
  const auto r = run_group(spec);
  REQUIRE(r.ok());
  CHECK(r.log_errors.empty());

  std::multiset<std::string> expected;
  for (int rank = 0; rank < 3; ++rank) {
    const auto folder = dir.path / "logs" / "job7" / "attempt_2" / std::to_string(rank);
    const auto id = std::to_string(rank);
    CHECK(test::read_file(folder / "stdout.log") == "hello " + id + "\nlast " + id);
    CHECK(test::read_file(folder / "stderr.log") == std::string("\0\377\n", 3) + id + std::string(1, '\0'));
    expected.insert("[worker" + id + "]:hello " + id);
    expected.insert("[worker" + id + "]:last " + id);
  }
  const auto console = lines_of(out.text());
  CHECK(std::multiset<std::string>(console.begin(), console.end()) == expected);
  CHECK(out.text().back() == '\n');  // the partial last line is ended on the console
  CHECK(err.text().empty());          // redirected only: not on the console
}

TEST_CASE("a teed stream is the rank's own file, followed, or a pipe under tee_through_pipes: exact file, whole console lines") {
  bool through_pipes = false;
  SUBCASE("followed") {}
  SUBCASE("through pipes") { through_pipes = true; }
  test::temp_dir dir;
  console_file out(dir.path / "console");
  // Each rank says what its stdout is ("pipe", or the device and inode of
  // the file), then prints a line without its newline just before it exits.
  auto spec = shell_ranks(2, "if [ -p /dev/stdout ]; then echo pipe; else stat -L -c '%d:%i' /proc/self/fd/1; fi; "
                             "printf 'bye %s' $R");
  spec.logs.dir = dir.path;
  spec.logs.tee = std_streams::out;
  spec.logs.tee_through_pipes = through_pipes;
  spec.logs.console_out = out.fd;
  const auto r = run_group(spec);
  REQUIRE(r.ok());
  CHECK(r.log_errors.empty());
  std::multiset<std::string> expected;
  for (int rank = 0; rank < 2; ++rank) {
    const auto id = std::to_string(rank);
    const auto file = dir.path / "none" / "attempt_0" / id / "stdout.log";
    struct stat st {};
    REQUIRE(::stat(file.c_str(), &st) == 0);
    const std::string stdout_was = through_pipes ? "pipe" : std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
    CHECK(test::read_file(file) == stdout_was + "\nbye " + id);
    expected.insert("[worker" + id + "]:" + stdout_was);
    expected.insert("[worker" + id + "]:bye " + id);
  }
  const auto console = lines_of(out.text());
  CHECK(std::multiset<std::string>(console.begin(), console.end()) == expected);
}

TEST_CASE("the prefix template names the role (${role}, ${role_name}), the global and the local rank, as torchrun's") {
  test::temp_dir dir;
  console_file out(dir.path / "console");
  auto spec = shell_ranks(2, "echo x");
  spec.name = "trainer";
  spec.logs.prefix_all = true;
  spec.logs.first_rank = 10;
  // As Python's string.Template.safe_substitute, which torchrun uses: $name
  // too, $$ for $, and what names nothing of ours kept as written.
  spec.logs.prefix = "<${role}|${role_name}|${rank}|${local_rank}|${other}|$local_rank|$rank_x|$$|${rank|$|${}> ";
  spec.logs.console_out = out.fd;
  REQUIRE(run_group(spec).ok());
  const auto console = lines_of(out.text());
  CHECK(std::multiset<std::string>(console.begin(), console.end()) ==
        std::multiset<std::string>{"<trainer|trainer|10|0|${other}|0|$rank_x|$|${rank|$|${}> x",
                                   "<trainer|trainer|11|1|${other}|1|$rank_x|$|${rank|$|${}> x"});
}

TEST_CASE("console_ranks: only the chosen ranks reach the console, the others their files") {
  test::temp_dir dir;
  console_file out(dir.path / "console");
  auto spec = shell_ranks(3, "echo from $R");
  spec.logs.dir = dir.path;
  spec.logs.prefix_all = true;
  spec.logs.console_ranks = std::set<int>{1};
  spec.logs.console_out = out.fd;
  REQUIRE(run_group(spec).ok());
  CHECK(out.text() == "[worker1]:from 1\n");
  const auto attempt = dir.path / "none" / "attempt_0";
  CHECK(test::read_file(attempt / "0" / "stdout.log") == "from 0\n");
  CHECK(test::read_file(attempt / "2" / "stdout.log") == "from 2\n");
  CHECK_FALSE(fs::exists(attempt / "1" / "stdout.log"));  // shown, not teed: no file
}

// Before, prefix_all pumped rank 0's stderr to the console and never made
// the file the options named; a rank outside console_ranks got /dev/null.
TEST_CASE("a stream the spawn options send to a file stays there under prefix_all and console_ranks, unless named") {
  test::temp_dir dir;
  console_file out(dir.path / "console");
  auto spec = shell_ranks(2, "echo out $R; echo err $R >&2");
  spec.options.err = stdio::append(dir.path / "errors");
  spec.logs.dir = dir.path / "logs";
  spec.logs.prefix_all = true;
  spec.logs.console_ranks = std::set<int>{0};
  spec.logs.tee = std::map<int, std_streams>{{1, std_streams::err}};  // named: the logs decide
  spec.logs.console_out = out.fd;
  spec.logs.console_err = out.fd;
  REQUIRE(run_group(spec).ok());
  CHECK(test::read_file(dir.path / "errors") == "err 0\n");
  const auto attempt = dir.path / "logs" / "none" / "attempt_0";
  CHECK_FALSE(fs::exists(attempt / "0" / "stderr.log"));
  CHECK(test::read_file(attempt / "1" / "stderr.log") == "err 1\n");
  CHECK(test::read_file(attempt / "1" / "stdout.log") == "out 1\n");
  CHECK(out.text() == "[worker0]:out 0\n");
}

TEST_CASE("a rerun with the same run id leaves only its own bytes in the log files") {
  test::temp_dir dir;
  console_file out(dir.path / "console");
  const auto folder = dir.path / "none" / "attempt_0";
  auto first = shell_ranks(2, "head -c 300000 /dev/zero; echo first $R >&2");
  first.logs.dir = dir.path;
  first.logs.redirects = std_streams::all;
  REQUIRE(run_group(first).ok());
  REQUIRE(fs::file_size(folder / "0" / "stdout.log") == 300000);
  // Rank 1's stdout has a second name: it is emptied where it is, so that
  // name sees the new run too.
  fs::create_hard_link(folder / "1" / "stdout.log", dir.path / "second-name");
  auto second = shell_ranks(2, "echo again $R; echo err $R >&2");
  second.logs.dir = dir.path;
  second.logs.tee = std_streams::out;
  second.logs.redirects = std_streams::err;
  second.logs.console_out = out.fd;
  REQUIRE(run_group(second).ok());
  CHECK(test::read_file(folder / "0" / "stdout.log") == "again 0\n");
  CHECK(test::read_file(folder / "0" / "stderr.log") == "err 0\n");
  CHECK(test::read_file(folder / "1" / "stdout.log") == "again 1\n");
  CHECK(test::read_file(dir.path / "second-name") == "again 1\n");
  const auto lines = lines_of(out.text());
  CHECK(std::multiset<std::string>(lines.begin(), lines.end()) == std::multiset<std::string>{"[worker0]:again 0", "[worker1]:again 1"});
}

TEST_CASE("per-rank redirects and tee") {
  test::temp_dir dir;
  console_file out(dir.path / "out"), err(dir.path / "err");
  auto spec = shell_ranks(3, "echo o$R; echo e$R >&2");
  spec.logs.dir = dir.path;
  spec.logs.redirects = std::map<int, std_streams>{{0, std_streams::all}};
  spec.logs.tee = std::map<int, std_streams>{{1, std_streams::err}};
  spec.logs.prefix_all = true;
  spec.logs.console_out = out.fd;
  spec.logs.console_err = err.fd;
  REQUIRE(run_group(spec).ok());
  const auto attempt = dir.path / "none" / "attempt_0";
  CHECK(test::read_file(attempt / "0" / "stdout.log") == "o0\n");
  CHECK(test::read_file(attempt / "0" / "stderr.log") == "e0\n");
  CHECK_FALSE(fs::exists(attempt / "1" / "stdout.log"));
  CHECK(test::read_file(attempt / "1" / "stderr.log") == "e1\n");
  CHECK_FALSE(fs::exists(attempt / "2" / "stdout.log"));
  CHECK_FALSE(fs::exists(attempt / "2" / "stderr.log"));
  const auto outs = lines_of(out.text()), errs = lines_of(err.text());
  CHECK(std::multiset<std::string>(outs.begin(), outs.end()) == std::multiset<std::string>{"[worker1]:o1", "[worker2]:o2"});
  CHECK(std::multiset<std::string>(errs.begin(), errs.end()) == std::multiset<std::string>{"[worker1]:e1", "[worker2]:e2"});
}

TEST_CASE("ranks writing megabytes at once: files exact, console lines never mixed") {
  // Pumps and followers share their buffers: on four threads, several read at once.
  int threads = 1;
  bool through_pipes = false;
  SUBCASE("followed files, on one thread") { threads = 1; }
  SUBCASE("followed files, on four threads") { threads = 4; }
  SUBCASE("through pipes, on one thread") { through_pipes = true; }
  SUBCASE("through pipes, on four threads") {
    through_pipes = true;
    threads = 4;
  }
  test::temp_dir dir;
  console_file out(dir.path / "console");
  // Lines of three lengths, so that reads end mid-line; 6 MB per rank,
  // the last line cut.
  const std::string longest(300, 'x');
  auto spec = shell_ranks(4, "yes \"$(printf 'rank %s short\\nrank %s a longer line of text\\nrank %s " + longest +
                                 "' $R $R $R)\" | head -c 6000000");
  spec.logs.dir = dir.path;
  spec.logs.tee = std_streams::out;
  spec.logs.tee_through_pipes = through_pipes;
  spec.logs.console_out = out.fd;
  REQUIRE(run_group(spec, threads).ok());
  std::map<std::string, std::size_t> lines_per_prefix;
  std::size_t bytes = 0;
  for (int rank = 0; rank < 4; ++rank) {
    const auto file = test::read_file(dir.path / "none" / "attempt_0" / std::to_string(rank) / "stdout.log");
    CHECK(file.size() == 6000000);
    CHECK(file.rfind("rank " + std::to_string(rank) + " short\n", 0) == 0);
    bytes += file.size();
  }
  const auto console = lines_of(out.text());
  std::size_t console_bytes = 0, partial = 0;
  for (const auto& line : console) {
    REQUIRE(line.size() > 10);
    const std::string prefix = line.substr(0, 10), rest = line.substr(10);  // "[workerN]:"
    const std::string rank = prefix.substr(7, 1);
    REQUIRE(prefix == "[worker" + rank + "]:");
    const std::string whole[] = {"rank " + rank + " short", "rank " + rank + " a longer line of text", "rank " + rank + " " + longest};
    if (std::find(std::begin(whole), std::end(whole), rest) == std::end(whole)) {
      // Only the cut last line of a rank, and only the start of one of its lines.
      REQUIRE(std::any_of(std::begin(whole), std::end(whole), [&](const std::string& w) { return w.rfind(rest, 0) == 0; }));
      ++partial;
    }
    console_bytes += rest.size() + 1;
    ++lines_per_prefix[prefix];
  }
  CHECK(partial <= 4);
  CHECK(lines_per_prefix.size() == 4);
  CHECK(console_bytes == bytes + partial);  // every byte once, plus the newline ending each cut line
}

namespace {

// Tees every stream of `spec` to its files under `dir`, followed or
// `through_pipes`; without `files`, prefixes them on the console only.
void tee_or_prefix(group_spec& spec, const fs::path& dir, bool files, bool through_pipes) {
  if (files) {
    spec.logs.dir = dir;
    spec.logs.tee = std_streams::all;
    spec.logs.tee_through_pipes = through_pipes;
  } else {
    spec.logs.prefix_all = true;
  }
}

// What `fd` gives until its writers are gone, read `chunk` bytes at a
// time; `after_each` sees what came so far after each read.
std::string read_to_end(int fd, std::size_t chunk = 65536,
                        const std::function<void(const std::string&)>& after_each = {}) {
  std::string text;
  std::vector<char> buffer(chunk);
  for (ssize_t n; (n = ::read(fd, buffer.data(), chunk)) > 0;) {
    text.append(buffer.data(), static_cast<std::size_t>(n));
    if (after_each) after_each(text);
  }
  return text;
}

// A shell condition that holds once `seen` exists, waiting for it at most 20 s.
std::string seen_within_20s(const fs::path& seen) {
  return "i=0; while [ ! -e " + seen.string() + " ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done; [ -e " +
         seen.string() + " ]";
}

// Runs `spec` while a thread makes `seen` once the console `out` holds `wanted`.
run_result run_watching(const group_spec& spec, const console_file& out, const std::string& wanted,
                        const fs::path& seen) {
  std::atomic<bool> done = false;
  std::thread watcher([&] {
    while (!done) {
      if (out.text().find(wanted) != std::string::npos) {
        std::ofstream{seen};
        return;
      }
      std::this_thread::sleep_for(10ms);
    }
  });
  const auto r = run_group(spec);
  done = true;
  watcher.join();
  return r;
}

}  // namespace

TEST_CASE("a line written after a burst reaches the console while its rank still runs") {
  // The burst makes the follower read the file on a timer, its watch quiet;
  // once the file stops growing, the watch must report writes again. The
  // rank waits (at most 20 s) for the test to see its last line on the
  // console, and says whether it did.
  test::temp_dir dir;
  console_file out(dir.path / "console");
  const auto seen = dir.path / "seen";
  auto spec = shell_ranks(1, "yes 'a line of the burst' | head -c 4000000; sleep 0.3; echo after the pause; " +
                                 seen_within_20s(seen) + " && echo saw it >&2 || echo did not see it >&2");
  spec.logs.dir = dir.path / "logs";
  spec.logs.tee = std_streams::out;
  spec.logs.redirects = std_streams::err;
  spec.logs.console_out = out.fd;
  const auto r = run_watching(spec, out, "[worker0]:after the pause\n", seen);
  REQUIRE(r.ok());
  CHECK(test::read_file(dir.path / "logs" / "none" / "attempt_0" / "0" / "stderr.log") == "saw it\n");
  const auto console = lines_of(out.text());
  CHECK(console.size() == 4000000 / 20 + 1);  // the burst's 20-byte lines, then the line after
  CHECK(console.back() == "[worker0]:after the pause");
}

// Before, \r\n came out as it is when one read took both, and as \n when
// a read ended between them.
TEST_CASE("a carriage return ends a console line, written as a newline but to a terminal; \\r\\n is one newline, "
          "however the reads were cut") {
  bool through_pipes = false;
  SUBCASE("followed") {}
  SUBCASE("through pipes") { through_pipes = true; }
  test::temp_dir dir;
  console_file out(dir.path / "console");
  const auto seen = dir.path / "seen";
  // The rank redraws a bar, then waits (at most 20 s) for the test to see
  // the redraw on the console, which no newline has followed yet; then a
  // Windows line end, and a '\r' that ends one read and a '\n' the next.
  auto spec = shell_ranks(1, "printf 'step 1\\rstep 2\\r'; " + seen_within_20s(seen) +
                                 " && printf 'saw it\\r\\n' || printf 'did not see it\\r\\n'; "
                                 "printf 'split\\r'; sleep 0.3; printf '\\nlast'");
  spec.logs.dir = dir.path / "logs";
  spec.logs.tee = std_streams::out;
  spec.logs.tee_through_pipes = through_pipes;
  spec.logs.console_out = out.fd;
  const auto r = run_watching(spec, out, "[worker0]:step 2\n", seen);
  REQUIRE(r.ok());
  // Not a terminal: each line is one rank's, ended by a newline.
  CHECK(out.text() == "[worker0]:step 1\n[worker0]:step 2\n[worker0]:saw it\n[worker0]:split\n[worker0]:last\n");
  CHECK(test::read_file(dir.path / "logs" / "none" / "attempt_0" / "0" / "stdout.log") ==
        "step 1\rstep 2\rsaw it\r\nsplit\r\nlast");
}

TEST_CASE("a line over 64 KiB reaches the console in 64 KiB pieces, however its bytes came in") {
  bool through_pipes = false;
  SUBCASE("followed") {}
  SUBCASE("through pipes") { through_pipes = true; }
  test::temp_dir dir;
  console_file out(dir.path / "console");
  // 200,000 bytes and a newline in one write; then 40,000, a pause, and
  // 40,000 more and a newline. Before, each reached the console whole when
  // one read took its end. Then 65,535 bytes and "\r\n", which is no
  // longer than 64 KiB: the line end is not counted (it was cut between
  // its '\r' and '\n'). Then lines of exactly 64 and 128 KiB, whole and
  // with their end after a pause: no empty piece after the last.
  auto spec = shell_ranks(1, "a=$(head -c 200000 /dev/zero | tr '\\0' a); b=$(head -c 40000 /dev/zero | tr '\\0' b); "
                             "c=$(head -c 65535 /dev/zero | tr '\\0' c); d=$(head -c 65536 /dev/zero | tr '\\0' d); "
                             "printf '%s\\n' \"$a\"; printf '%s' \"$b\"; sleep 0.3; printf '%s\\n' \"$b\"; "
                             "printf '%s\\r\\n' \"$c\"; printf '%s\\n' \"$d\"; printf '%s%s\\n' \"$d\" \"$d\"; "
                             "printf '%s' \"$d\"; sleep 0.3; printf '\\n'");
  spec.logs.dir = dir.path / "logs";
  spec.logs.tee = std_streams::out;
  spec.logs.tee_through_pipes = through_pipes;
  spec.logs.console_out = out.fd;
  const auto r = run_group(spec);
  REQUIRE(r.ok());
  const std::string prefix = "[worker0]:";
  const std::vector<std::string> expected{prefix + std::string(65536, 'a'), prefix + std::string(65536, 'a'),
                                          prefix + std::string(65536, 'a'), prefix + std::string(3392, 'a'),
                                          prefix + std::string(65536, 'b'), prefix + std::string(14464, 'b'),
                                          prefix + std::string(65535, 'c'), prefix + std::string(65536, 'd'),
                                          prefix + std::string(65536, 'd'), prefix + std::string(65536, 'd'),
                                          prefix + std::string(65536, 'd')};
  auto console = lines_of(out.text());
  for (auto& line : console) {  // "\r\n" stays so when one read took it whole
    if (!line.empty() && line.back() == '\r') line.pop_back();
  }
  std::string sizes;  // what a failure shows
  for (const auto& line : console) sizes += std::to_string(line.size()) + " ";
  CAPTURE(sizes);
  CHECK(console == expected);
}

TEST_CASE("what a paused console held back reaches it once it reads on, while the rank still runs") {
  bool through_pipes = false;
  SUBCASE("followed") {}
  SUBCASE("through pipes") { through_pipes = true; }
  test::temp_dir dir;
  int console[2];
  REQUIRE(::pipe2(console, O_CLOEXEC) == 0);
  // The console's pipe holds one page. The rank writes nearly that, then
  // in one write more than the rest of it, ended by a last line (a
  // follower then waits on its watch, not on a timer), and then nothing
  // until the test has seen that line (at most 20 s).
  REQUIRE(::fcntl(console[1], F_SETPIPE_SZ, 4096) == 4096);
  const auto seen = dir.path / "seen";
  auto spec = shell_ranks(1, "i=0; while [ $i -lt 37 ]; do printf '%099d\\n' $i; i=$((i+1)); done; sleep 0.2; "
                             "printf '%099d\\nlast\\n' 0; " +
                                 seen_within_20s(seen) + " && echo saw it >&2 || echo did not see it >&2");
  spec.logs.dir = dir.path / "logs";
  spec.logs.tee = std_streams::out;
  spec.logs.redirects = std_streams::err;
  spec.logs.tee_through_pipes = through_pipes;
  spec.logs.console_out = console[1];
  std::thread reader([&] {
    std::this_thread::sleep_for(1s);  // paused, until the pipe is full
    read_to_end(console[0], 65536, [&](const std::string& text) {
      if (text.ends_with("[worker0]:last\n")) std::ofstream{seen};
    });
  });
  const auto r = run_group(spec);
  ::close(console[1]);
  reader.join();
  ::close(console[0]);
  REQUIRE(r.ok());
  CHECK(test::read_file(dir.path / "logs" / "none" / "attempt_0" / "0" / "stderr.log") == "saw it\n");
}

TEST_CASE("two groups on one console that reads slowly: every line whole, each group's in order") {
  int console[2];
  REQUIRE(::pipe2(console, O_CLOEXEC) == 0);
  REQUIRE(::fcntl(console[1], F_SETPIPE_SZ, 4096) == 4096);  // full at once: most writes take part of their lines
  std::string text;
  std::thread reader([&] {
    text = read_to_end(console[0], 700, [](const std::string&) { std::this_thread::sleep_for(100us); });
  });
  std::vector<group_spec> specs;
  for (const char* name : {"A", "B"}) {
    auto& spec = specs.emplace_back(shell_ranks(1, std::string("seq -f '") + name + " %g' 1 5000"));
    spec.name = name;
    spec.logs.prefix_all = true;
    spec.logs.console_out = console[1];
  }
  asio::io_context io;
  const auto [a, b] = test::run(io, [&]() -> asio::awaitable<std::pair<run_result, run_result>> {
    group first = co_await start_processes(specs[0]);
    group second = co_await start_processes(specs[1]);
    auto first_result = co_await first.wait();
    co_return std::pair{std::move(first_result), co_await second.wait()};
  }(), 4);
  ::close(console[1]);
  reader.join();
  ::close(console[0]);
  CHECK(a.ok());
  CHECK(b.ok());
  std::map<std::string, int> count;
  std::string broken;
  for (const auto& line : lines_of(text)) {
    const std::string name = line.substr(1, 1);
    const std::string expected = "[" + name + "0]:" + name + " " + std::to_string(count[name] + 1);
    if (line != expected && broken.empty()) broken = line;
    ++count[name];
  }
  CHECK(broken == "");
  CHECK(count["A"] == 5000);
  CHECK(count["B"] == 5000);
}

TEST_CASE("two groups given one file as console by two descriptors: each line reaches it, whichever group ends first") {
  test::temp_dir dir;
  const auto console = dir.path / "console", other = dir.path / "other", go = dir.path / "go";
  const int fd_a = ::open(console.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  const int fd_b = ::open(console.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  REQUIRE(fd_a >= 0);
  REQUIRE(fd_b >= 0);
  std::vector<group_spec> specs;
  for (const auto& [name, script] : {std::pair{"A", std::string("echo A first")},
                                     std::pair{"B", "echo B first; while [ ! -e '" + go.string() +
                                                        "' ]; do sleep 0.01; done; echo B second"}}) {
    auto& spec = specs.emplace_back(shell_ranks(1, script));
    spec.name = name;
    spec.logs.prefix_all = true;
    spec.logs.console_out = spec.name == "A" ? fd_a : fd_b;
  }
  int reused = -1;
  asio::io_context io;
  const auto b = test::run(io, [&]() -> asio::awaitable<run_result> {
    group first = co_await start_processes(specs[0]);
    std::optional<group> a(std::move(first));
    group second = co_await start_processes(specs[1]);
    const auto a_result = co_await a->wait();
    CHECK(a_result.ok());
    a.reset();
    // A's descriptor goes, and its number comes back for another file.
    ::close(fd_a);
    reused = ::open(other.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    std::ofstream{go};
    co_return co_await second.wait();
  }());
  CHECK(b.ok());
  CHECK(b.log_errors.empty());
  REQUIRE(reused == fd_a);
  ::close(reused);
  ::close(fd_b);
  auto lines = lines_of(test::read_file(console));
  std::sort(lines.begin(), lines.end());
  CHECK(lines == std::vector<std::string>{"[A0]:A first", "[B0]:B first", "[B0]:B second"});
  CHECK(test::read_file(other).empty());
}

TEST_CASE("on a terminal a carriage return reaches the console as it is, for the line to be drawn over") {
  const int master = ::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
  REQUIRE(master >= 0);
  REQUIRE(::grantpt(master) == 0);
  REQUIRE(::unlockpt(master) == 0);
  const int terminal = ::open(::ptsname(master), O_RDWR | O_NOCTTY | O_CLOEXEC);
  REQUIRE(terminal >= 0);
  termios raw{};
  REQUIRE(::tcgetattr(terminal, &raw) == 0);
  ::cfmakeraw(&raw);  // the bytes as written, no "\n" made "\r\n"
  REQUIRE(::tcsetattr(terminal, TCSANOW, &raw) == 0);
  std::string shown;
  std::thread reader([&] { shown = read_to_end(master); });
  test::temp_dir dir;
  auto spec = shell_ranks(1, "printf 'a\\rb\\r\\nc\\r'; sleep 0.3; printf '\\nd\\n'");
  spec.logs.dir = dir.path / "logs";
  spec.logs.tee = std_streams::out;
  spec.logs.console_out = terminal;
  const auto r = run_group(spec);
  ::close(terminal);  // the reader's read then fails (EIO): no writer is left
  reader.join();
  ::close(master);
  REQUIRE(r.ok());
  CHECK(shown == "[worker0]:a\r[worker0]:b\r\n[worker0]:c\r\n[worker0]:d\n");
}

TEST_CASE("function ranks are logged by every start method") {
  for (start_method method : {start_method::spawn, start_method::fork, start_method::forkserver}) {
    CAPTURE(to_string(method));
    test::temp_dir dir;
    console_file out(dir.path / "out"), err(dir.path / "err");
    group_spec spec;
    spec.entry = call(method, print_lines);
    spec.nprocs = 2;
    spec.logs.dir = dir.path;
    spec.logs.tee = std_streams::all;
    spec.logs.console_out = out.fd;
    spec.logs.console_err = err.fd;
    REQUIRE(run_group(spec).ok());
    for (int rank = 0; rank < 2; ++rank) {
      const auto folder = dir.path / "none" / "attempt_0" / std::to_string(rank);
      const auto id = std::to_string(rank);
      CHECK(test::read_file(folder / "stdout.log") == "first " + id + "\nsecond " + id + "\nno newline " + id);
      CHECK(test::read_file(folder / "stderr.log") == "error " + id + "\n");
    }
    CHECK(lines_of(out.text()).size() == 6);
    const auto errs = lines_of(err.text());
    CHECK(std::multiset<std::string>(errs.begin(), errs.end()) == std::multiset<std::string>{"[default0]:error 0", "[default1]:error 1"});
  }
}

TEST_CASE("the error file of a rank lies in its log folder") {
  test::temp_dir dir;
  group_spec spec;
  spec.entry = call(start_method::fork, print_and_throw);
  spec.nprocs = 1;
  spec.logs.dir = dir.path;
  spec.logs.run_id = "r";
  spec.logs.redirects = std_streams::out;
  const auto r = run_group(spec);
  REQUIRE(r.failures.size() == 1);
  const auto folder = dir.path / "r" / "attempt_0" / "0";
  CHECK(r.failures[0].error_file == folder / "error.json");
  CHECK(fs::exists(folder / "error.json"));
  CHECK(r.failures[0].message.find("failed on purpose") != std::string::npos);
  CHECK(test::read_file(folder / "stdout.log") == "about to fail 0\n");
}

TEST_CASE("on_busy is told once when the ranks write faster than a read takes, and never for a few lines") {
  test::temp_dir dir;
  console_file out(dir.path / "console");
  std::atomic<int> told = 0;
  auto few = shell_ranks(2, "echo a; echo b");
  few.logs.dir = dir.path / "few";
  few.logs.tee = std_streams::out;
  few.logs.console_out = out.fd;
  few.logs.on_busy = [&told] { ++told; };
  REQUIRE(run_group(few).ok());
  CHECK(told == 0);
  // 4 MB of 201-byte lines per rank in one write: the kernel wakes the
  // reader of an empty pipe only once the pipe is full, so the pump's
  // first read takes a whole buffer (or the whole pipe, where the system
  // kept it small). Told once for the group, and every line still arrives.
  const auto source = (dir.path / "lines-").string();
  auto many = shell_ranks(2, "yes \"$(printf '%0200d' $R)\" | head -c 4000000 > " + source + "$R && dd if=" + source +
                                 "$R bs=4000000 count=1 iflag=fullblock status=none");
  many.logs.dir = dir.path / "many";
  many.logs.tee = std_streams::out;
  many.logs.console_out = out.fd;
  many.logs.on_busy = [&told] {
    ++told;
    throw std::runtime_error("ignored: the pumps go on without another thread");
  };
  REQUIRE(run_group(many).ok());
  CHECK(told == 1);
  for (int rank = 0; rank < 2; ++rank) {
    CHECK(fs::file_size(dir.path / "many" / "none" / "attempt_0" / std::to_string(rank) / "stdout.log") == 4000000);
  }
  const auto console = lines_of(out.text());
  CHECK(console.size() == 4 + 2 * (4000000 / 201 + 1));  // the few's lines, then each rank's, the cut last one too
}

TEST_CASE("a process left holding a rank's pipe does not hold up the end of the run") {
  test::temp_dir dir;
  console_file out(dir.path / "console");
  // The background sleep keeps the pipe open after the rank exits; the
  // end-of-run sweep kills it, and the pump sees the end of the stream.
  auto spec = shell_ranks(1, "sleep 60 & echo started");
  spec.logs.prefix_all = true;
  spec.logs.console_out = out.fd;
  const auto began = std::chrono::steady_clock::now();
  REQUIRE(run_group(spec).ok());
  CHECK(std::chrono::steady_clock::now() - began < 30s);
  CHECK(out.text() == "[worker0]:started\n");
  CHECK(test::children_of_self().empty());
}

TEST_CASE("a console whose reader has gone: no SIGPIPE here, the ranks run on, the files whole, log_errors says so") {
  bool through_pipes = false, files = true;
  SUBCASE("followed") {}
  SUBCASE("through pipes") { through_pipes = true; }
  SUBCASE("console only") { files = false; }
  // SIGPIPE at its default, as in most programs: without the library's
  // care, the first console write would end this process.
  struct sigaction dfl {}, before {};
  dfl.sa_handler = SIG_DFL;
  REQUIRE(::sigaction(SIGPIPE, &dfl, &before) == 0);
  test::temp_dir dir;
  int console[2];
  REQUIRE(::pipe2(console, O_CLOEXEC) == 0);
  ::close(console[0]);  // `| head` that has had its lines
  auto spec = shell_ranks(2, "seq 1 20000; echo done >&2");
  tee_or_prefix(spec, dir.path, files, through_pipes);
  spec.logs.console_out = console[1];
  console_file err(dir.path / "console-err");
  spec.logs.console_err = err.fd;
  const auto r = run_group(spec);
  ::close(console[1]);
  sigset_t pending;
  REQUIRE(::sigpending(&pending) == 0);
  CHECK(sigismember(&pending, SIGPIPE) == 0);
  REQUIRE(::sigaction(SIGPIPE, &before, nullptr) == 0);
  CHECK(r.ok());
  REQUIRE(r.log_errors.size() == 1);  // once for the console, not once per stream
  CHECK(r.log_errors[0].find("descriptor " + std::to_string(console[1])) != std::string::npos);
  CHECK(r.log_errors[0].find(std::strerror(EPIPE)) != std::string::npos);
  // stderr's console was still there: its lines all came.
  const auto err_lines = lines_of(err.text());
  CHECK(std::multiset<std::string>(err_lines.begin(), err_lines.end()) ==
        std::multiset<std::string>{"[worker0]:done", "[worker1]:done"});
  if (files) {
    std::string seq;
    for (int i = 1; i <= 20000; ++i) seq += std::to_string(i) + "\n";
    for (int rank = 0; rank < 2; ++rank) {
      CHECK(test::read_file(dir.path / "none" / "attempt_0" / std::to_string(rank) / "stdout.log") == seq);
    }
  }
}

// Before, a pump's write past RLIMIT_FSIZE raised SIGXFSZ, whose default
// action ended the supervising process.
TEST_CASE("log files and a console file past RLIMIT_FSIZE: no SIGXFSZ here, log_errors names each file") {
  test::temp_dir dir;
  const fs::path console_path = dir.path / "console";
  // In a child of its own: the limit, and SIGXFSZ at its default (as in
  // most programs), are the child's.
  const pid_t pid = ::fork();
  if (pid == 0) {
    int code = 10;
    try {
      struct sigaction dfl {};
      dfl.sa_handler = SIG_DFL;
      const rlimit little{64 * 1024, RLIM_INFINITY};
      if (::sigaction(SIGXFSZ, &dfl, nullptr) != 0 || ::setrlimit(RLIMIT_FSIZE, &little) != 0) ::_exit(11);
      auto spec = shell_ranks(2, "seq 1 40000");  // 229 KiB each
      tee_or_prefix(spec, dir.path, true, true);
      const int console = ::open(console_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
      spec.logs.console_out = console;
      const auto r = run_group(spec);
      int named = 0;  // the two ranks' stdout.log and the console
      for (const auto& e : r.log_errors) {
        if (e.find(std::strerror(EFBIG)) != std::string::npos) ++named;
      }
      code = r.ok() && named == 3 ? 0 : 12;
    } catch (...) {
      code = 13;
    }
    ::_exit(code);
  }
  REQUIRE(pid > 0);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  CHECK_FALSE(WIFSIGNALED(status));
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(fs::file_size(console_path) == 64 * 1024);
  for (int rank = 0; rank < 2; ++rank) {
    CHECK(fs::file_size(dir.path / "none" / "attempt_0" / std::to_string(rank) / "stdout.log") == 64 * 1024);
  }
}

TEST_CASE("a console nobody reads holds up neither the first failure nor the shutdown, and gets every line once read") {
  bool through_pipes = false, files = true;
  SUBCASE("followed") {}
  SUBCASE("through pipes") { through_pipes = true; }
  SUBCASE("console only") { files = false; }
  test::temp_dir dir;
  int console[2];
  REQUIRE(::pipe2(console, O_CLOEXEC) == 0);
  // Rank 0 writes far more than the console's pipe holds and waits; rank 1
  // fails a second in. A pump that waited in its write to the console
  // would see rank 1's exit, and end rank 0, only once the console is read.
  const fs::path ended = dir.path / "rank-0-ended";
  auto spec = shell_ranks(2, "if [ $R = 0 ]; then trap 'touch " + ended.string() +
                                 "; exit 143' TERM; seq 1 100000; sleep 60 & wait; else sleep 1; exit 3; fi");
  tee_or_prefix(spec, dir.path, files, through_pipes);
  spec.logs.console_out = console[1];
  std::atomic<bool> ended_unread = false;
  std::string text;
  std::thread reader([&] {
    const auto until = std::chrono::steady_clock::now() + 10s;
    while (!fs::exists(ended) && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(20ms);
    ended_unread = fs::exists(ended);
    text = read_to_end(console[0]);
  });
  const auto r = run_group(spec);
  ::close(console[1]);
  reader.join();
  ::close(console[0]);
  CHECK(ended_unread);
  REQUIRE(r.first_failure() != nullptr);
  CHECK(r.first_failure()->rank == 1);
  CHECK(r.first_failure()->status.code() == 3);
  CHECK(r.log_errors.empty());
  // Rank 0's lines came whole and in order, from 1 on: all it wrote.
  std::string expected_file;
  int count = 0;
  std::string out_of_order;
  for (const auto& line : lines_of(text)) {
    if (line.starts_with("[worker1]")) continue;
    ++count;
    if (out_of_order.empty() && line != "[worker0]:" + std::to_string(count)) out_of_order = line;
    expected_file += std::to_string(count) + "\n";
  }
  CHECK(out_of_order == "");
  CHECK(count > 1000);
  if (files) CHECK(test::read_file(dir.path / "none" / "attempt_0" / "0" / "stdout.log") == expected_file);
}

namespace {

// A run stopped a second after it started: its result, and how long from
// its start to its wait's end.
struct stopped_run {
  run_result result;
  std::chrono::steady_clock::duration took;
};

// Runs `spec` on `threads` threads and stops it after 1 s. Should it not
// have ended 30 s in, a thread reads `unread` to its end, so that a wait
// without end still ends (and fails the test's bound). `writer`, if not -1,
// is the test's own end of what `unread` reads: closed once the run has
// ended.
stopped_run stop_after_a_second(const group_spec& spec, int unread, int writer, int threads = 1) {
  std::atomic<bool> ended = false;
  std::thread rescue([&] {
    const auto until = std::chrono::steady_clock::now() + 30s;
    while (!ended && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(20ms);
    if (!ended) read_to_end(unread);
  });
  asio::io_context io;
  const auto start = std::chrono::steady_clock::now();
  std::chrono::steady_clock::duration took{};
  const auto r = test::run(io, [&]() -> asio::awaitable<run_result> {
    group g = co_await start_processes(spec);
    asio::steady_timer pause(io, 1s);
    co_await pause.async_wait(asio::use_awaitable);
    g.stop();
    auto result = co_await g.wait();
    took = std::chrono::steady_clock::now() - start;
    co_return result;
  }(), threads);
  ended = true;
  if (writer != -1) ::close(writer);
  rescue.join();
  return {r, took};
}

}  // namespace

TEST_CASE("a run asked to end waits for a console nobody reads at most another kill_wait, then says so") {
  bool through_pipes = false;
  SUBCASE("followed") {}
  SUBCASE("through pipes") { through_pipes = true; }
  test::temp_dir dir;
  int console[2];
  REQUIRE(::pipe2(console, O_CLOEXEC) == 0);
  // The rank writes far more than the console's pipe holds; nobody reads
  // it until 30 s have passed (so that a wait without end still ends).
  auto spec = shell_ranks(1, "seq 1 100000; sleep 60 & wait");
  tee_or_prefix(spec, dir.path, true, through_pipes);
  spec.logs.console_out = console[1];
  spec.shutdown.kill_wait = 500ms;
  const auto [r, took] = stop_after_a_second(spec, console[0], console[1]);
  ::close(console[0]);
  CHECK(r.stopped);
  // 1 s, the rank's end at SIGTERM, kill_wait for the pumps, and another for the console.
  CHECK(took < 20s);
  REQUIRE(r.log_errors.size() == 1);
  CHECK(r.log_errors[0].find("descriptor " + std::to_string(console[1])) != std::string::npos);
  CHECK(r.log_errors[0].find("took nothing for the time the run was given to end") != std::string::npos);
  // The file has what the rank wrote, in order (all of it when followed).
  const auto lines = lines_of(test::read_file(dir.path / "none" / "attempt_0" / "0" / "stdout.log"));
  std::string out_of_order;
  for (std::size_t i = 0; i < lines.size() && out_of_order.empty(); ++i) {
    if (lines[i] != std::to_string(i + 1)) out_of_order = lines[i];
  }
  CHECK(out_of_order == "");
  CHECK(lines.size() > 1000);
  if (!through_pipes) CHECK(lines.size() == 100000);
}

// Before, a console that took lines all along, only more slowly than the
// rank wrote them, was said to have taken nothing in the time the run was
// given to end.
TEST_CASE("a console that reads on too slowly for the time the run was given to end is said to have taken some") {
  bool through_pipes = false;
  SUBCASE("followed") {}
  SUBCASE("through pipes") { through_pipes = true; }
  test::temp_dir dir;
  int console[2];
  REQUIRE(::pipe2(console, O_CLOEXEC) == 0);
  // Far more than the reader below takes before the run ends: 4 KiB every
  // 10 ms, from the start until the group has let go of the pipe.
  auto spec = shell_ranks(1, "seq 1 1000000; sleep 60 & wait");
  tee_or_prefix(spec, dir.path, true, through_pipes);
  spec.logs.console_out = console[1];
  spec.shutdown.kill_wait = 500ms;
  std::size_t read = 0;
  std::thread reader([&] {
    std::vector<char> buffer(4096);
    for (ssize_t n; (n = ::read(console[0], buffer.data(), buffer.size())) > 0;) {
      read += static_cast<std::size_t>(n);
      std::this_thread::sleep_for(10ms);
    }
  });
  const auto [r, took] = stop_after_a_second(spec, -1, console[1]);
  reader.join();
  ::close(console[0]);
  CHECK(r.stopped);
  CHECK(read > 0);
  REQUIRE(r.log_errors.size() == 1);
  CHECK(r.log_errors[0].find("descriptor " + std::to_string(console[1])) != std::string::npos);
  CHECK(r.log_errors[0].find("it had not taken every line when the time the run was given to end ran out") !=
        std::string::npos);
  CHECK(r.log_errors[0].find("took nothing") == std::string::npos);
}

// A run of one rank that writes more than its console's pipe holds (and
// less than its own pipe does: it ends) and exits 0, with nobody reading
// the console for `unread_for`. `settle` after the rank's end (once
// kill_wait has passed, its last lines wait for the console), `ask` runs on
// the group. Its result, and how long the run took from `ask` on.
struct unread_console_run {
  run_result result;
  std::chrono::steady_clock::duration took{};
};
unread_console_run run_with_unread_console(const fs::path& dir, bool through_pipes, std::chrono::milliseconds kill_wait,
                                           std::chrono::milliseconds settle, std::chrono::seconds unread_for,
                                           const std::function<void(group&)>& ask) {
  int console[2];
  REQUIRE(::pipe2(console, O_CLOEXEC) == 0);
  REQUIRE(::fcntl(console[1], F_SETPIPE_SZ, 4096) == 4096);
  const auto ended = dir / "ended";
  auto spec = shell_ranks(1, "seq 1 10000; : > " + ended.string());
  tee_or_prefix(spec, dir, true, through_pipes);
  spec.logs.console_out = console[1];
  spec.shutdown.kill_wait = kill_wait;
  std::atomic<bool> done = false;
  std::thread rescue([&] {
    const auto until = std::chrono::steady_clock::now() + unread_for;
    while (!done && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(20ms);
    if (!done) read_to_end(console[0]);
  });
  asio::io_context io;
  unread_console_run run;
  run.result = test::run(io, [&]() -> asio::awaitable<run_result> {
    group g = co_await start_processes(spec);
    asio::steady_timer pause(io);
    for (int i = 0; i < 1000 && !fs::exists(ended); ++i) {
      pause.expires_after(20ms);
      co_await pause.async_wait(asio::use_awaitable);
    }
    pause.expires_after(settle);
    co_await pause.async_wait(asio::use_awaitable);
    const auto asked = std::chrono::steady_clock::now();
    ask(g);
    auto result = co_await g.wait();
    run.took = std::chrono::steady_clock::now() - asked;
    co_return result;
  }());
  done = true;
  ::close(console[1]);
  rescue.join();
  ::close(console[0]);
  return run;
}

TEST_CASE("stop() while the last lines wait for a console nobody reads ends the wait within kill_wait; the run is ok") {
  bool through_pipes = false;
  SUBCASE("followed") {}
  SUBCASE("through pipes") { through_pipes = true; }
  test::temp_dir dir;
  const auto stop = [](group& g) { g.stop(); };
  const auto [r, took] = run_with_unread_console(dir.path, through_pipes, 500ms, 1500ms, 30s, stop);
  // kill_wait for the console: long before it is read.
  CHECK(took < 20s);
  // The rank had exited 0 before stop(): nothing was stopped.
  CHECK(r.ok());
  CHECK_FALSE(r.stopped);
  REQUIRE(r.log_errors.size() == 1);
  CHECK(r.log_errors[0].find("took nothing for the time the run was given to end") != std::string::npos);
  std::string seq;
  for (int i = 1; i <= 10000; ++i) seq += std::to_string(i) + "\n";
  CHECK(test::read_file(dir.path / "none" / "attempt_0" / "0" / "stdout.log") == seq);
}

// Before, a shutdown signal after stop() only hurried the shutdown: the
// run's result did not name it (cohort-run, whose rendezvous had stopped
// the group, then said its run had succeeded).
TEST_CASE("a shutdown signal after stop() is named in the result") {
  test::temp_dir dir;
  const auto [r, took] = run_with_unread_console(dir.path, false, 500ms, 1500ms, 30s, [](group& g) {
    g.stop();
    g.interrupt(SIGINT);
  });
  CHECK(took < 20s);  // kill_wait for the console: long before it is read
  CHECK(r.signal == std::optional<int>(SIGINT));
  CHECK_FALSE(r.stopped);  // the rank had exited 0 before either
  REQUIRE(r.log_errors.size() == 1);
  CHECK(r.log_errors[0].find("took nothing for the time the run was given to end") != std::string::npos);
}

// Before, a group whose time to end ran out emptied the console's backlog,
// which other groups on that console shared: their lines in it were lost
// unsaid, and the rest of a line the console had taken part of was never
// written, so that the next line was joined to it.
TEST_CASE("a group that gives up a console leaves the lines other groups put in it") {
  int console[2];
  REQUIRE(::pipe2(console, O_CLOEXEC) == 0);
  REQUIRE(::fcntl(console[1], F_SETPIPE_SZ, 4096) == 4096);
  // B's lines fill the console's pipe and backlog; A, stopped while the
  // console takes nothing, gives it up; B writes more once the console is
  // read again.
  test::temp_dir dir;
  const auto go = dir.path / "go";
  const auto b_spec = on_console(console[1], "B",
                                 fmt::format("seq 1 2000; n=0; while [ ! -e '{}' ] && [ $n -lt 6000 ]; do sleep 0.01; "
                                             "n=$((n+1)); done; seq 2001 2003",
                                             go.string()));
  const auto a_spec = on_console(console[1], "A", "seq 1 20000; sleep 60");
  asio::io_context io;
  run_result a, b;
  std::atomic<bool> a_done = false;
  asio::co_spawn(io, [&]() -> asio::awaitable<void> {
    group g = co_await start_processes(b_spec);
    b = co_await g.wait();
  }, asio::detached);
  asio::co_spawn(io, [&]() -> asio::awaitable<void> {
    asio::steady_timer pause(io, 300ms);
    co_await pause.async_wait(asio::use_awaitable);
    group g = co_await start_processes(a_spec);
    pause.expires_after(700ms);
    co_await pause.async_wait(asio::use_awaitable);
    g.stop();
    a = co_await g.wait();
    a_done = true;
  }, asio::detached);
  std::string text;
  std::thread reader([&] {  // from A's end on
    const auto until = std::chrono::steady_clock::now() + 60s;
    while (!a_done && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(10ms);
    std::ofstream(go).flush();
    text = read_to_end(console[0]);
  });
  io.run();
  ::close(console[1]);
  reader.join();
  ::close(console[0]);
  CHECK(a.stopped);
  CHECK(a.log_errors.size() == 1);
  CHECK(b.ok());
  CHECK(b.log_errors.empty());
  std::istringstream lines(text);
  int next_b = 1;
  for (std::string line; std::getline(lines, line);) {
    CAPTURE(line);
    if (line.starts_with("[B0]:")) {
      CHECK(line == fmt::format("[B0]:{}", next_b));
      next_b = std::stoi(line.substr(5)) + 1;
    } else {
      CHECK(line.starts_with("[A0]:"));
    }
  }
  CHECK(next_b == 2004);
}

// Before, the next group's first line went on where the given-up line
// stopped: "[A0]:yyy...yyy[B0]:whole".
TEST_CASE("a console given up inside a line: the next group on that file starts on a line of its own") {
  int console[2];
  REQUIRE(::pipe2(console, O_CLOEXEC) == 0);
  REQUIRE(::fcntl(console[1], F_SETPIPE_SZ, 4096) == 4096);
  // A's one line is longer than the pipe holds: the console takes its
  // start, and nobody reads it until A, stopped, has given it up.
  const auto a_spec = on_console(console[1], "A", "head -c 30000 /dev/zero | tr '\\0' y; echo; exec sleep 60");
  const auto b_spec = on_console(console[1], "B", "echo whole");
  asio::io_context io;
  run_result a, b;
  std::atomic<bool> a_done = false;
  asio::co_spawn(io, [&]() -> asio::awaitable<void> {
    group g = co_await start_processes(a_spec);
    asio::steady_timer pause(io, 700ms);
    co_await pause.async_wait(asio::use_awaitable);
    g.stop();
    a = co_await g.wait();
    a_done = true;
    group next = co_await start_processes(b_spec);
    b = co_await next.wait();
  }, asio::detached);
  std::string text;
  std::thread reader([&] {  // from A's end on
    const auto until = std::chrono::steady_clock::now() + 60s;
    while (!a_done && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(10ms);
    text = read_to_end(console[0]);
  });
  io.run();
  ::close(console[1]);
  reader.join();
  ::close(console[0]);
  CHECK(a.stopped);
  REQUIRE(a.log_errors.size() == 1);
  CHECK(a.log_errors[0].find("took nothing for the time the run was given to end") != std::string::npos);
  CHECK(b.ok());
  const auto lines = lines_of(text);
  REQUIRE(lines.size() == 2);
  CHECK(lines[0].starts_with("[A0]:yyyy"));
  CHECK(lines[0].size() < 30005);  // the start of A's line only
  CHECK(lines[1] == "[B0]:whole");
}

TEST_CASE("a console that takes nothing holds up no group that writes to another console, nor its start") {
  test::temp_dir dir;
  int stuck[2];
  REQUIRE(::pipe2(stuck, O_CLOEXEC) == 0);
  // A's rank writes far more than its console's pipe holds and exits;
  // nobody reads that pipe until B has ended, or 30 s have passed. B
  // starts once A's last lines wait for the console (kill_wait has passed
  // since the rank's end), on a thread and io_context of its own.
  const auto a_ended = dir.path / "a-ended";
  auto a_spec = shell_ranks(1, "seq 1 100000; : > " + a_ended.string());
  a_spec.name = "A";
  a_spec.logs.dir = dir.path / "a";
  a_spec.logs.tee = std_streams::out;
  a_spec.logs.console_out = stuck[1];
  a_spec.shutdown.kill_wait = 200ms;
  run_result a;
  std::thread a_thread([&] { a = run_group(a_spec); });
  for (int i = 0; i < 1000 && !fs::exists(a_ended); ++i) std::this_thread::sleep_for(20ms);
  std::this_thread::sleep_for(1s);
  console_file b_console(dir.path / "b-console");
  auto b_spec = shell_ranks(1, "echo from B");
  b_spec.name = "B";
  b_spec.logs.dir = dir.path / "b";
  b_spec.logs.tee = std_streams::out;
  b_spec.logs.console_out = b_console.fd;
  run_result b;
  std::atomic<bool> b_done = false;
  std::thread b_thread([&] {
    b = run_group(b_spec);
    b_done = true;
  });
  const auto until = std::chrono::steady_clock::now() + 30s;
  while (!b_done && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(20ms);
  CHECK(b_done);  // before A's console was read
  std::string a_text;
  std::thread reader([&] { a_text = read_to_end(stuck[0]); });
  b_thread.join();
  a_thread.join();
  ::close(stuck[1]);
  reader.join();
  ::close(stuck[0]);
  CHECK(b.ok());
  CHECK(b_console.text() == "[B0]:from B\n");
  CHECK(a.ok());
  CHECK(a.log_errors.empty());
  const auto a_lines = lines_of(a_text);
  REQUIRE(a_lines.size() == 100000);
  CHECK(a_lines.back() == "[A0]:100000");
}

TEST_CASE("stdout and stderr on one pipe whose reader has gone: told once") {
  int console[2];
  REQUIRE(::pipe2(console, O_CLOEXEC) == 0);
  ::close(console[0]);
  const int again = ::fcntl(console[1], F_DUPFD_CLOEXEC, 0);  // 2>&1: another descriptor of the same pipe
  REQUIRE(again >= 0);
  auto spec = shell_ranks(2, "seq 1 1000; seq 1 1000 >&2");
  spec.logs.prefix_all = true;
  spec.logs.console_out = console[1];
  spec.logs.console_err = again;
  const auto r = run_group(spec);
  ::close(console[1]);
  ::close(again);
  CHECK(r.ok());
  REQUIRE(r.log_errors.size() == 1);
  CHECK(r.log_errors[0].find(std::strerror(EPIPE)) != std::string::npos);
}

TEST_CASE("bad logs are errors before any rank starts") {
  test::temp_dir dir;
  const auto descriptors = test::open_fd_count();
  {
    std::ofstream(dir.path / "a-file") << "x";
    auto spec = shell_ranks(2, "exit 0");
    spec.logs.dir = dir.path / "a-file" / "logs";  // a folder cannot be made under a file
    spec.logs.redirects = std_streams::all;
    try {
      run_group(spec);
      FAIL("no error");
    } catch (const fs::filesystem_error& e) {
      CHECK(e.path1().string().rfind((dir.path / "a-file").string(), 0) == 0);
    }
  }
  {
    auto spec = shell_ranks(2, "exit 0");
    spec.logs.tee = std_streams::out;  // no dir to write to
    CHECK_THROWS_AS(run_group(spec), std::invalid_argument);
  }
  {
    auto spec = shell_ranks(2, "exit 0");
    spec.logs.console_ranks = std::set<int>{0, 5};
    CHECK_THROWS_WITH_AS(run_group(spec), doctest::Contains("rank 5"), std::invalid_argument);
  }
  {
    // A console that no line could reach: not open, below -1, or read-only.
    auto spec = shell_ranks(2, "echo lost");
    spec.logs.prefix_all = true;  // lines through the console
    spec.logs.console_out = 999;
    CHECK_THROWS_WITH_AS(run_group(spec), "cohort::start_processes: logs.console_out is 999, not an open descriptor",
                         std::invalid_argument);
    spec.logs.console_out = -1;
    spec.logs.console_err = -7;
    CHECK_THROWS_WITH_AS(run_group(spec), doctest::Contains("logs.console_err is -7"), std::invalid_argument);
    int ends[2];
    REQUIRE(::pipe2(ends, O_CLOEXEC) == 0);
    spec.logs.console_err = ends[0];
    CHECK_THROWS_WITH_AS(run_group(spec), doctest::Contains("open for reading only"), std::invalid_argument);
    ::close(ends[0]);
    ::close(ends[1]);
  }
  {
    auto spec = shell_ranks(2, "exit 0");
    spec.logs.dir = dir.path;
    spec.logs.redirects = std::map<int, std_streams>{{2, std_streams::out}};
    CHECK_THROWS_WITH_AS(run_group(spec), doctest::Contains("rank 2"), std::invalid_argument);
    // torchrun's numbers are 0..3, for all ranks as for one.
    spec.logs.redirects = std_streams::none;
    spec.logs.tee = static_cast<std_streams>(7);
    CHECK_THROWS_WITH_AS(run_group(spec), "cohort::start_processes: logs.tee is 7, not 0..3", std::invalid_argument);
    spec.logs.tee = std_streams::none;
    spec.logs.redirects = static_cast<std_streams>(4);
    CHECK_THROWS_WITH_AS(run_group(spec), "cohort::start_processes: logs.redirects is 4, not 0..3",
                         std::invalid_argument);
  }
  CHECK(test::children_of_self().empty());
  CHECK(test::open_fd_count() == descriptors);
}

namespace {

// Runs `spec` with this process's descriptor `fd` (1 or 2) closed, and
// open again once the run has ended or was refused: the refusal's message,
// or nullopt and the run's result.
std::pair<std::optional<std::string>, run_result> run_with_closed(int fd, const group_spec& spec) {
  std::fflush(nullptr);
  const int saved = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
  REQUIRE(saved >= 0);
  ::close(fd);
  std::optional<std::string> refusal;
  run_result r;
  try {
    r = run_group(spec);
  } catch (const std::invalid_argument& e) {
    refusal = e.what();
  }
  ::dup2(saved, fd);
  ::close(saved);
  return {refusal, r};
}

}  // namespace

// Before, the default console was looked at only once the group had made
// its log files and pipes, one of which could then have the number of a
// closed stdout: the lines were written into it, and log_errors named
// descriptor 1.
TEST_CASE("a closed stdout or stderr that lines would reach as the console is refused before the group opens anything") {
  test::temp_dir dir;
  const auto descriptors = test::open_fd_count();
  auto spec = shell_ranks(1, "echo lost; echo lost >&2");
  spec.logs.dir = dir.path;
  SUBCASE("stdout") {
    spec.logs.tee = std_streams::out;
    const auto [refusal, r] = run_with_closed(1, spec);
    CHECK(refusal ==
          std::optional<std::string>("cohort::start_processes: logs.console_out is -1 (this process's stdout, 1), "
                                     "not an open descriptor"));
  }
  SUBCASE("stderr") {
    spec.logs.tee = std_streams::err;
    const auto [refusal, r] = run_with_closed(2, spec);
    CHECK(refusal ==
          std::optional<std::string>("cohort::start_processes: logs.console_err is -1 (this process's stderr, 2), "
                                     "not an open descriptor"));
  }
  SUBCASE("prefixed") {
    spec.logs.dir.clear();
    spec.logs.prefix_all = true;
    const auto [refusal, r] = run_with_closed(1, spec);
    CHECK(refusal.value_or("").find("logs.console_out is -1") != std::string::npos);
  }
  CHECK_FALSE(fs::exists(dir.path / "none"));  // nothing made
  CHECK(test::children_of_self().empty());
  CHECK(test::open_fd_count() == descriptors);
}

TEST_CASE("a closed stdout that no line reaches as the console stops no group") {
  test::temp_dir dir;
  auto spec = shell_ranks(1, "echo kept");
  spec.logs.dir = dir.path;
  spec.logs.redirects = std_streams::out;  // stdout to its file only
  const auto [refusal, r] = run_with_closed(1, spec);
  CHECK(refusal == std::nullopt);
  CHECK(r.ok());
  CHECK(r.log_errors.empty());
  CHECK(test::read_file(dir.path / "none" / "attempt_0" / "0" / "stdout.log") == "kept\n");
}

// Before, a second group truncated the first's log files as it started:
// and then was refused where both wrote their reports in the attempt
// folder, or went on where each had an error_dir of its own.
TEST_CASE("a group given the logs' attempt folder of a group still running is refused before it truncates its files") {
  for (const bool own_error_dirs : {false, true}) {
    CAPTURE(own_error_dirs);
    test::temp_dir dir;
    auto first = shell_ranks(1, "echo first; exec sleep 30");
    first.logs.dir = dir.path / "logs";
    first.logs.redirects = std_streams::all;
    first.logs.run_id = "job";
    if (own_error_dirs) first.error_dir = dir.path / "errors-1";
    asio::io_context io;
    group g = start_processes(io.get_executor(), first);
    std::thread runner([&io] { io.run(); });
    const auto log = dir.path / "logs" / "job" / "attempt_0" / "0" / "stdout.log";
    REQUIRE(test::within(10s, [&] { return fs::exists(log) && test::read_file(log) == "first\n"; }, 5ms));
    auto second = first;
    second.entry = command("/bin/sh", {"-c", "echo second"});
    if (own_error_dirs) second.error_dir = dir.path / "errors-2";
    CHECK_THROWS_WITH_AS(start_processes(io.get_executor(), second),
                         doctest::Contains("the logs' attempt folder"), std::invalid_argument);
    CHECK(test::read_file(log) == "first\n");
    g.stop();
    runner.join();
  }
}

// Before, the folders were made up to the NUL, and the start failed there
// with a file system error.
TEST_CASE("a logs.dir or error_dir holding NUL is refused before any folder is made") {
  test::temp_dir dir;
  for (const bool logs : {true, false}) {
    CAPTURE(logs);
    auto spec = shell_ranks(1, "exit 0");
    const std::string with_nul = (dir.path / "lo").string() + std::string("\0gs", 3);
    if (logs) {
      spec.logs.dir = with_nul;
      spec.logs.redirects = std_streams::all;
    } else {
      spec.error_dir = with_nul;
    }
    CHECK_THROWS_WITH_AS(run_group(spec),
                         logs ? "cohort::start_processes: logs.dir holds NUL"
                              : "cohort::start_processes: error_dir holds NUL",
                         std::invalid_argument);
    CHECK_FALSE(fs::exists(dir.path / "lo"));
  }
}

TEST_CASE("a run id that is not one folder's name, or a negative attempt, is refused before any folder is made") {
  test::temp_dir dir;
  const fs::path logs = dir.path / "a" / "b" / "c";
  const auto refusal = [&](const std::string& run_id, int attempt) {
    auto spec = shell_ranks(1, "exit 0");
    spec.logs.dir = logs;
    spec.logs.redirects = std_streams::all;
    spec.logs.run_id = run_id;
    spec.logs.attempt = attempt;
    try {
      run_group(spec);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("not refused");
  };
  const std::string under = "; it names a folder under logs.dir";
  CHECK(refusal("../../../escape", 0) == "cohort::start_processes: logs.run_id '../../../escape' holds '/'" + under);
  CHECK(refusal("job/1", 0) == "cohort::start_processes: logs.run_id 'job/1' holds '/'" + under);
  CHECK(refusal("..", 0) == "cohort::start_processes: logs.run_id '..' names no folder of its own" + under);
  CHECK(refusal(".", 0) == "cohort::start_processes: logs.run_id '.' names no folder of its own" + under);
  CHECK(refusal("", 0) == "cohort::start_processes: logs.run_id '' is empty" + under);
  CHECK(refusal(std::string("job\0x", 5), 0) == "cohort::start_processes: logs.run_id holds NUL" + under);
  CHECK(refusal("job", -1) == "cohort::start_processes: logs.attempt is -1, not 0 or more");
  CHECK_FALSE(fs::exists(dir.path / "escape"));
  CHECK_FALSE(fs::exists(dir.path / "a"));
  // Without logs.dir they name nothing and are not looked at.
  auto spec = shell_ranks(1, "exit 0");
  spec.logs.prefix_all = true;
  spec.logs.run_id = "../elsewhere";
  spec.logs.attempt = -1;
  CHECK(run_group(spec).ok());
}

TEST_CASE("a log file that cannot be written to the end is reported, and the console still gets every line") {
  test::temp_dir dir;
  console_file out(dir.path / "console");
  // The log file is /dev/full: every write to it fails with ENOSPC.
  const auto folder = dir.path / "none" / "attempt_0" / "0";
  fs::create_directories(folder);
  fs::create_symlink("/dev/full", folder / "stdout.log");
  auto spec = shell_ranks(1, "echo one; echo two");
  spec.logs.dir = dir.path;
  spec.logs.tee = std_streams::out;
  spec.logs.console_out = out.fd;
  const auto r = run_group(spec);
  CHECK(r.statuses[0]->success());
  REQUIRE(r.log_errors.size() == 1);
  CHECK(r.log_errors[0].find("No space left on device") != std::string::npos);
  CHECK(r.log_errors[0].find((folder / "stdout.log").string()) != std::string::npos);
  CHECK(out.text() == "[worker0]:one\n[worker0]:two\n");
}

namespace {

// The stdout.log of rank 0 under `dir` made a FIFO before the run, as a
// log collector would, and its read end opened by the test (blocking),
// or -1 with `open_reader` false.
struct fifo_log {
  fs::path path;
  int reader = -1;
  fifo_log(const fs::path& dir, bool open_reader) : path(dir / "none" / "attempt_0" / "0" / "stdout.log") {
    fs::create_directories(path.parent_path());
    REQUIRE(::mkfifo(path.c_str(), 0600) == 0);
    if (!open_reader) return;
    reader = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);  // a FIFO's read end opens without a writer so
    REQUIRE(reader >= 0);
    ::fcntl(reader, F_SETFL, ::fcntl(reader, F_GETFL) & ~O_NONBLOCK);
  }
  ~fifo_log() {
    if (reader >= 0) ::close(reader);
  }
};

std::string seq(int last) {
  std::string text;
  for (int i = 1; i <= last; ++i) text += std::to_string(i) + "\n";
  return text;
}

}  // namespace

// Before, the pump waited in its write to the FIFO for as long as nobody
// read it: the thread it held saw no exits, no signals and no stop().
TEST_CASE("a teed log file that is a FIFO nobody reads holds up neither stop() nor the end of the run") {
  int threads = 1;
  SUBCASE("one thread") {}
  SUBCASE("two threads") { threads = 2; }
  test::temp_dir dir;
  console_file out(dir.path / "console");
  fifo_log fifo(dir.path, true);
  // The rank writes far more than the FIFO holds, then waits to be
  // stopped. Nobody reads the FIFO until 30 s have passed (so that a wait
  // without end still ends).
  auto spec = shell_ranks(1, "seq 1 300000; sleep 60 & wait");
  spec.logs.dir = dir.path;
  spec.logs.tee = std_streams::out;
  spec.logs.console_out = out.fd;
  spec.shutdown.kill_wait = 500ms;
  const auto [r, took] = stop_after_a_second(spec, fifo.reader, -1, threads);
  CHECK(r.stopped);
  // 1 s, the rank's end at SIGTERM, kill_wait for the pump, and another for the file.
  CHECK(took < 20s);
  REQUIRE(r.log_errors.size() == 1);
  CHECK(r.log_errors[0].find(fifo.path.string()) != std::string::npos);
  CHECK(r.log_errors[0].find("took nothing more for the time the run was given to end") != std::string::npos);
  // The FIFO holds the start of what the rank wrote; the console its lines
  // in order, but the last, which the rank may have been stopped in.
  const std::string all = seq(300000);
  const std::string taken = read_to_end(fifo.reader);
  CHECK(taken.size() > 0);
  CHECK(all.starts_with(taken));
  const auto lines = lines_of(out.text());
  std::string out_of_order;
  for (std::size_t i = 0; i + 1 < lines.size() && out_of_order.empty(); ++i) {
    if (lines[i] != "[worker0]:" + std::to_string(i + 1)) out_of_order = lines[i];
  }
  CHECK(out_of_order == "");
  CHECK(lines.size() > 1000);
}

// Before, a FIFO read all along, only more slowly than the rank wrote,
// was said to have taken nothing more in the time the run was given to end.
TEST_CASE("a teed log file that is a FIFO read on too slowly is said to have taken some") {
  test::temp_dir dir;
  console_file out(dir.path / "console");
  fifo_log fifo(dir.path, true);
  // Far more than the reader below takes before the run ends: 4 KiB every
  // 10 ms, from the start until the group has closed the FIFO.
  auto spec = shell_ranks(1, "seq 1 1000000; sleep 60 & wait");
  spec.logs.dir = dir.path;
  spec.logs.tee = std_streams::out;
  spec.logs.console_out = out.fd;
  spec.shutdown.kill_wait = 500ms;
  std::size_t read = 0;
  std::atomic<bool> ended = false;
  std::thread reader([&] {
    std::vector<char> buffer(4096);
    for (;;) {
      const ssize_t n = ::read(fifo.reader, buffer.data(), buffer.size());
      if (n > 0) read += static_cast<std::size_t>(n);
      if (n < 0 && errno != EINTR) break;
      // The end of the FIFO, once the group has closed it; before the
      // group has opened it, a FIFO without a writer reads as ended too.
      if (n == 0 && (read > 0 || ended)) break;
      std::this_thread::sleep_for(10ms);
    }
  });
  const auto [r, took] = stop_after_a_second(spec, -1, -1);
  ended = true;
  reader.join();
  CHECK(r.stopped);
  CHECK(read > 0);
  REQUIRE(r.log_errors.size() == 1);
  CHECK(r.log_errors[0].find(fifo.path.string()) != std::string::npos);
  CHECK(r.log_errors[0].find("it had not taken every byte when the time the run was given to end ran out") !=
        std::string::npos);
  CHECK(r.log_errors[0].find("took nothing") == std::string::npos);
}

TEST_CASE("a teed log file that is a FIFO read late gets every byte") {
  test::temp_dir dir;
  console_file out(dir.path / "console");
  fifo_log fifo(dir.path, true);
  auto spec = shell_ranks(1, "seq 1 300000");
  spec.logs.dir = dir.path;
  spec.logs.tee = std_streams::out;
  spec.logs.console_out = out.fd;
  std::string taken;
  std::thread reader([&] {
    std::this_thread::sleep_for(2s);
    taken = read_to_end(fifo.reader);
  });
  const auto r = run_group(spec);
  reader.join();
  CHECK(r.ok());
  CHECK(r.log_errors.empty());
  CHECK(taken == seq(300000));
  CHECK(lines_of(out.text()).size() == 300000);
}

// Before, start_processes waited in its open of the FIFO until a reader came.
TEST_CASE("a log file that is a FIFO nobody has open for reading is refused before any rank starts") {
  test::temp_dir dir;
  fifo_log fifo(dir.path, false);
  const auto started = dir.path / "started";
  auto spec = shell_ranks(1, "touch " + started.string());
  spec.logs.dir = dir.path;
  spec.logs.tee = std_streams::out;
  // A reader that comes after 10 s, so that an open without end still ends.
  std::atomic<bool> ended = false;
  std::thread rescue([&] {
    const auto until = std::chrono::steady_clock::now() + 10s;
    while (!ended && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(20ms);
    if (ended) return;
    const int reader = ::open(fifo.path.c_str(), O_RDONLY | O_CLOEXEC);
    read_to_end(reader);
    ::close(reader);
  });
  std::optional<fs::filesystem_error> error;
  try {
    (void)run_group(spec);
  } catch (const fs::filesystem_error& e) {
    error = e;
  }
  ended = true;
  rescue.join();
  REQUIRE(error.has_value());
  CHECK(error->path1() == fifo.path);
  CHECK(error->code() == std::errc::no_such_device_or_address);
  CHECK(std::string(error->what()).find("FIFO") != std::string::npos);
  CHECK_FALSE(fs::exists(started));
}

namespace {

// What `fd` gives until its writers are gone, or nullopt when they are not
// gone within `limit`: read without waiting in the read.
std::optional<std::string> read_to_end_within(int fd, std::chrono::milliseconds limit) {
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  std::string text;
  char buffer[4096];
  const auto until = std::chrono::steady_clock::now() + limit;
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n == 0) return text;
    if (n > 0) {
      text.append(buffer, static_cast<std::size_t>(n));
      continue;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    if (errno != EAGAIN || left <= 0ms) return std::nullopt;
    pollfd p{fd, POLLIN, 0};
    ::poll(&p, 1, static_cast<int>(left.count()));
  }
}

}  // namespace

// Before, the group held its own descriptor of the console until the group
// object went and its io_context ran again: a reader that waits for the
// end of the console's pipe waited past wait().
TEST_CASE("once wait() returns, the group holds the console no more: a reader of its pipe sees the end") {
  bool through_pipes = false, files = true;
  SUBCASE("followed") {}
  SUBCASE("through pipes") { through_pipes = true; }
  SUBCASE("console only") { files = false; }
  test::temp_dir dir;
  int console[2];
  REQUIRE(::pipe2(console, O_CLOEXEC) == 0);
  auto spec = shell_ranks(2, "echo out $R; echo err $R >&2");
  tee_or_prefix(spec, dir.path, files, through_pipes);
  spec.logs.console_out = console[1];
  spec.logs.console_err = console[1];
  const int watchers_before = test::descriptors_linking_to("anon_inode:inotify");
  std::optional<std::string> text;
  int watchers_after = -1;
  asio::io_context io;
  const auto r = test::run(io, [&]() -> asio::awaitable<run_result> {
    group g = co_await start_processes(spec);
    ::close(console[1]);  // the caller's may be closed once the group has started
    auto result = co_await g.wait();
    // The group object lives on, its io_context idle.
    text = read_to_end_within(console[0], 5s);
    watchers_after = test::descriptors_linking_to("anon_inode:inotify");
    co_return result;
  }());
  ::close(console[0]);
  CHECK(r.ok());
  REQUIRE(text.has_value());
  const auto lines = lines_of(*text);
  const std::multiset<std::string> expected{"[worker0]:out 0", "[worker0]:err 0", "[worker1]:out 1",
                                            "[worker1]:err 1"};
  CHECK(std::multiset<std::string>(lines.begin(), lines.end()) == expected);
  CHECK(watchers_after == watchers_before);  // a followed file's inotify instance is closed too
}

// Before, a group object that outlived its io_context kept every log
// descriptor for good when it went: the files, the pipes' read ends, the
// inotify instance and its console's descriptor, whose reader never saw
// the end.
TEST_CASE("a group kept past its io_context closes its log descriptors when it goes") {
  bool through_pipes = false;
  SUBCASE("followed") {}
  SUBCASE("through pipes") { through_pipes = true; }
  test::temp_dir dir;
  int console[2];
  REQUIRE(::pipe2(console, O_CLOEXEC) == 0);
  auto spec = shell_ranks(2, "echo out $R; echo err $R >&2; sleep 30");
  tee_or_prefix(spec, dir.path, true, through_pipes);
  spec.logs.console_out = console[1];
  spec.logs.console_err = console[1];
  (void)run_group(shell_ranks(1, "true"));  // what the first run of a process opens for good
  const int before = test::open_fd_count();
  {
    group g;
    {
      asio::io_context io;
      g = start_processes(io.get_executor(), spec);
      io.run_for(500ms);
    }  // the io_context goes while the ranks run
  }
  CHECK(test::open_fd_count() == before);
  ::close(console[1]);
  const auto text = read_to_end_within(console[0], 5s);
  ::close(console[0]);
  CHECK(text.has_value());
}

// Before, a forked child's groups shared the parent's consoles, whose
// lock a pump of the parent could hold at the fork: the child's group on
// the same console never ended.
TEST_CASE("a plain fork while a group's pump writes to a console: the child's group on that console ends") {
  int ends[2];
  REQUIRE(::pipe2(ends, O_CLOEXEC) == 0);
  std::thread drain([read_end = ends[0]] {
    char buffer[1 << 16];
    while (::read(read_end, buffer, sizeof buffer) > 0) {
    }
  });
  const auto shell = [&ends](int nprocs, const char* script) {
    group_spec spec;
    spec.entry = command{"/bin/sh", {"-c", script}};
    spec.nprocs = nprocs;
    spec.logs.prefix_all = true;
    spec.logs.console_out = ends[1];
    return spec;
  };
  asio::io_context io;
  auto work = asio::make_work_guard(io);
  const auto writing = shell(2, "exec yes abcdefghijklmnopqrstuvwxyz");
  group g = start_processes(io.get_executor(), writing);
  std::thread first([&io] { io.run(); }), second([&io] { io.run(); });
  std::this_thread::sleep_for(200ms);
  const auto outcome = test::fork_beside(0, {}, 10, [&shell] {
    asio::io_context child_io;
    const auto echoing = shell(1, "echo child-line");
    group child_group = start_processes(child_io.get_executor(), echoing);
    std::thread runner([&child_io] { child_io.run(); });
    runner.detach();
    return child_group.join(9s) ? (child_group.result()->ok() ? 0 : 3) : 2;
  });
  g.stop();
  CHECK(g.join(30s));
  work.reset();
  first.join();
  second.join();
  ::close(ends[1]);
  drain.join();
  ::close(ends[0]);
  CHECK(outcome.hung == 0);
  CHECK(outcome.failed == 0);
}

// Before, a log file or a rank's pipe that found no descriptor failed with
// the bare "Too many open files", where spawn's own failures name the
// limit.
TEST_CASE("a group whose logs find no descriptor left fails naming the open file limit") {
  test::temp_dir dir;
  console_file out(dir.path / "console");
  std::set<std::string> failures;
  for (int free = 0; free <= 24; ++free) {
    CAPTURE(free);
    auto spec = shell_ranks(2, "echo hi $R");
    spec.logs.dir = dir.path / "logs";
    spec.logs.run_id = "free" + std::to_string(free);
    spec.logs.tee = std_streams::all;
    spec.logs.tee_through_pipes = true;
    spec.logs.console_out = out.fd;
    spec.logs.console_err = out.fd;
    std::optional<run_result> result;
    std::string failure;
    rlim_t limit = 0;
    {
      const test::descriptors_left left(free);
      limit = left.limit.current();
      try {
        result = run_group(spec);
      } catch (const std::system_error& e) {
        failure = e.what();
        CHECK(e.code() == std::error_code(EMFILE, std::system_category()));
      }
    }
    if (result) {
      CHECK(result->ok());
    } else {
      INFO(failure);
      CHECK(failure.find(fmt::format("RLIMIT_NOFILE is {}", limit)) != std::string::npos);
      failures.insert(failure.substr(0, failure.find(" (")));
    }
  }
  // The log files' and pipes' failures are among those met.
  INFO(fmt::format("{}", fmt::join(failures, " | ")));
  CHECK(std::any_of(failures.begin(), failures.end(),
                    [](const std::string& f) { return f.find("for logs") != std::string::npos || f.find("log file") != std::string::npos; }));
}

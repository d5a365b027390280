// cohort-run driven as its users drive it: shell workers, exit codes,
// signals, restarts, the environment contract and the failure summary.
#include "cohort/error_file.hpp"
#include "cohort/spawn.hpp"

#include "os/stack_trace.hpp"
#include "run/port.hpp"

#include "support/harness.hpp"
#include "support/launcher_outcome.hpp"
#include "support/process_probe.hpp"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <asio/experimental/awaitable_operators.hpp>
#include <asio/steady_timer.hpp>

#include <elf.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <array>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <vector>

using namespace cohort;
using namespace std::chrono_literals;
using namespace asio::experimental::awaitable_operators;
using test::files_appear;
using test::outcome;
using test::read_file;
using test::variables_in;
namespace fs = std::filesystem;

namespace {

const std::string launcher = COHORT_TEST_COHORT_RUN;

// The launchers' $TMPDIR: what they keep there (the error files of failed
// runs, logs without --log-dir) goes when the tests end.
const std::string& launcher_tmpdir() {
  static test::temp_dir dir;
  static const std::string path = dir.path.string();
  return path;
}

// Runs `cmd` (cohort-run, or a shell that execs it) as run_launcher does.
template <class F>
outcome run_command(const command& cmd, F during, std::map<std::string, std::string> env = {}) {
  asio::io_context io;
  return test::run(io, [&]() -> asio::awaitable<outcome> {
    spawn_options options{.out = stdio::pipe(), .err = stdio::pipe()};
    options.env.set("TMPDIR", launcher_tmpdir());
    for (const auto& [name, value] : env) options.env.set(name, value);
    child c = co_await spawn(cmd, options);
    co_await during(c);
    auto [out, err] = co_await (test::read_all(c.out()) && test::read_all(c.err()));
    auto status = co_await c.wait();
    co_return outcome{status, std::move(out), std::move(err)};
  }());
}

// The folders of the runs with id `run_id` under `log_dir`, as torchrun
// names them: the id, '_' and 8 characters of a-z, 0-9 and '_'.
std::vector<fs::path> run_folders(const fs::path& log_dir, const std::string& run_id) {
  std::vector<fs::path> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(log_dir, ec)) {
    const auto name = e.path().filename().string();
    const auto tail = name.substr(std::min(name.size(), run_id.size() + 1));
    if (name.starts_with(run_id + "_") && tail.size() == 8 &&
        tail.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") == std::string::npos) {
      found.push_back(e.path());
    }
  }
  std::sort(found.begin(), found.end());
  return found;
}

// The folder of the one run with id `run_id` under `log_dir`.
fs::path run_folder(const fs::path& log_dir, const std::string& run_id) {
  const auto found = run_folders(log_dir, run_id);
  REQUIRE_MESSAGE(found.size() == 1, fmt::format("{} runs with id {} in {}", found.size(), run_id, log_dir.string()));
  return found.front();
}

// Runs cohort-run with `args`; `during` runs once it has started, with its
// child object (to signal it).
template <class F>
outcome run_launcher(std::vector<std::string> args, F during, std::map<std::string, std::string> env = {}) {
  const command cmd(launcher, std::move(args));
  return run_command(cmd, during, std::move(env));
}

outcome run_launcher(std::vector<std::string> args, std::map<std::string, std::string> env = {}) {
  return run_launcher(std::move(args), [](child&) -> asio::awaitable<void> { co_return; }, std::move(env));
}

// Runs cohort-run with `args`, its stderr going to the file `err` (which
// the ranks find in $COHORT_TEST_ERR, to wait for what it says there); the
// outcome's err is what the file holds at the end.
outcome run_launcher_err_to(const fs::path& err, std::vector<std::string> args,
                            std::map<std::string, std::string> env = {}) {
  std::vector<std::string> shell_args{"-c", "exec \"$0\" \"$@\" 2> \"$COHORT_TEST_ERR\"", launcher};
  shell_args.insert(shell_args.end(), args.begin(), args.end());
  env["COHORT_TEST_ERR"] = err.string();
  const command cmd("/bin/sh", std::move(shell_args));
  auto r = run_command(cmd, [](child&) -> asio::awaitable<void> { co_return; }, std::move(env));
  r.err = read_file(err);
  return r;
}

// The folder of kept error files that a summary in `err` names, or empty.
fs::path kept_error_folder(const std::string& err) {
  const std::string said = "The ranks' error files are kept in ";
  const auto at = err.find(said);
  if (at == std::string::npos) return {};
  const auto begin = at + said.size();
  return err.substr(begin, err.find('\n', begin) - begin);
}

// Runs cohort-run with `args`, its stdout going to the file `out`.
outcome run_launcher_to(const fs::path& out, std::vector<std::string> args) {
  asio::io_context io;
  return test::run(io, [&]() -> asio::awaitable<outcome> {
    spawn_options options{.out = stdio::file(out), .err = stdio::pipe()};
    options.env.set("TMPDIR", launcher_tmpdir());
    child c = co_await spawn(command(launcher, std::move(args)), options);
    auto err = co_await test::read_all(c.err());
    auto status = co_await c.wait();
    co_return outcome{status, {}, std::move(err)};
  }());
}

// For run_launcher: once `n` files are in `dir` (the workers are up), sends
// `sig` to cohort-run.
// Sends `sig` once `n` files whose names begin with `prefix` are in `dir`.
// A file appears when the shell opens it, before its content is written:
// a test that reads a file's content after the signal waits for a marker
// written after it (`prefix`), not for the file itself.
auto signal_when_up(const fs::path& dir, std::size_t n, int sig, std::string prefix = {}) {
  return [dir, n, sig, prefix](child& c) -> asio::awaitable<void> {
    co_await files_appear(dir, n, prefix);
    c.signal(sig);
  };
}

// Whether `sig` is in `pid`'s signal mask `name` (test::signal_mask).
bool in_mask(pid_t pid, std::string_view name, int sig) {
  return (test::signal_mask(pid, name).value_or(0) >> (sig - 1) & 1) != 0;
}

// Waits until `c` blocks `sig`, as cohort-run does from its first
// constructor on: a signal before that ends it unrecorded, by the signal's
// default action, however late its loader runs on a loaded machine. At
// most 10 s.
asio::awaitable<void> until_blocked(child& c, int sig) {
  asio::steady_timer timer(co_await asio::this_coro::executor);
  for (int i = 0; i < 10'000 && !in_mask(c.pid(), "SigBlk", sig); ++i) {
    timer.expires_after(std::chrono::milliseconds(1));
    co_await timer.async_wait(asio::use_awaitable);
  }
}

// Whether `sig` is pending for `pid`: cohort-run reads its shutdown
// signals from a signalfd, which takes them off.
bool pending(pid_t pid, int sig) { return in_mask(pid, "SigPnd", sig) || in_mask(pid, "ShdPnd", sig); }

// A node other than node 0 run alone, with no node 0 to tell its rank
// count to: the job says every node runs as many (torchrun's fast path),
// so the ranks are numbered without the exchange.
const std::map<std::string, std::string> identical_nodes{{"TORCH_ELASTIC_WORKER_IDENTICAL", "1"}};

const char* const dump_contract =
    "for v in RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE GROUP_RANK GROUP_WORLD_SIZE ROLE_RANK ROLE_WORLD_SIZE "
    "ROLE_NAME MASTER_ADDR MASTER_PORT TORCHELASTIC_RESTART_COUNT TORCHELASTIC_MAX_RESTARTS TORCHELASTIC_RUN_ID "
    "TORCHELASTIC_ERROR_FILE COHORT_ERROR_FILE OMP_NUM_THREADS TORCHELASTIC_USE_AGENT_STORE "
    "TORCH_NCCL_ASYNC_ERROR_HANDLING; do eval echo $v=\\$$v; done > \"$0/$RANK\"; "
    "echo NCCL_ASYNC_ERROR_HANDLING=${NCCL_ASYNC_ERROR_HANDLING-unset} >> \"$0/$RANK\"";

// The shared libraries the ELF program `path` names as needed (its
// DT_NEEDED entries), in order.
std::vector<std::string> needed_libraries(const fs::path& path) {
  const std::string image = read_file(path);
  const auto at = [&]<class T>(std::size_t offset, T& out) {
    REQUIRE(offset + sizeof(T) <= image.size());
    std::memcpy(&out, image.data() + offset, sizeof(T));
  };
  Elf64_Ehdr header{};
  at(0, header);
  REQUIRE(std::memcmp(header.e_ident, ELFMAG, SELFMAG) == 0);
  REQUIRE(header.e_ident[EI_CLASS] == ELFCLASS64);
  std::vector<Elf64_Phdr> segments(header.e_phnum);
  for (std::size_t i = 0; i < segments.size(); ++i) at(header.e_phoff + i * header.e_phentsize, segments[i]);
  const auto file_offset = [&](Elf64_Addr address) {  // of a loaded address
    for (const auto& s : segments) {
      if (s.p_type == PT_LOAD && address >= s.p_vaddr && address < s.p_vaddr + s.p_filesz) return s.p_offset + (address - s.p_vaddr);
    }
    FAIL("address ", address, " is in no loaded segment");
    return Elf64_Off{};
  };
  const auto dynamic = std::find_if(segments.begin(), segments.end(), [](const auto& s) { return s.p_type == PT_DYNAMIC; });
  REQUIRE(dynamic != segments.end());
  std::vector<Elf64_Xword> names;  // offsets into the string table
  Elf64_Addr strings = 0;
  for (std::size_t offset = dynamic->p_offset;; offset += sizeof(Elf64_Dyn)) {
    Elf64_Dyn entry{};
    at(offset, entry);
    if (entry.d_tag == DT_NULL) break;
    if (entry.d_tag == DT_NEEDED) names.push_back(entry.d_un.d_val);
    if (entry.d_tag == DT_STRTAB) strings = entry.d_un.d_ptr;
  }
  std::vector<std::string> out;
  for (auto name : names) out.emplace_back(image.c_str() + file_offset(strings) + name);
  return out;
}

// Runs cohort-run (behind `runner`, which runs it as another user, when
// given) with its stdout and stderr on one pipe whose read end this test
// holds and never reads: the rank's teed lines fill it, and cohort-run's
// own lines after the signal meet it full. SIGTERM still ends the run,
// 128 + 15, its outcome recorded.
void sigterm_ends_a_run_whose_console_is_never_read(const std::vector<std::string>& runner) {
  test::temp_dir dir;
  const auto file = dir.path / "result.json";
  const auto logs = dir.path / "logs";
  const auto tmp = dir.path / "tmp";
  fs::create_directory(tmp);
  for (const auto& writable : {dir.path, tmp}) fs::permissions(writable, fs::perms::all);
  int console[2];
  REQUIRE(::pipe2(console, O_CLOEXEC) == 0);
  std::vector<std::string> args(runner.begin() + (runner.empty() ? 0 : 1), runner.end());
  if (!runner.empty()) args.push_back(launcher);
  for (std::string arg : {"--result-json", file.c_str(), "--log-dir", logs.c_str(), "-t", "3", "-n", "1", "--",
                          "/bin/sh", "-c", "seq 1 200000; : > \"$0/up\"; exec sleep 30", dir.path.c_str()}) {
    args.push_back(std::move(arg));
  }
  bool ended = false;
  asio::io_context io;
  const auto status = test::run(io, [&]() -> asio::awaitable<exit_status> {
    spawn_options options{.out = stdio::fd(console[1]), .err = stdio::same_as_stdout()};
    options.env.set("TMPDIR", tmp.string());
    const command cmd(runner.empty() ? launcher : runner.front(), args);
    child c = co_await spawn(cmd, options);
    ::close(console[1]);
    co_await files_appear(dir.path, 1, "up");
    c.signal(SIGTERM);
    asio::steady_timer timer(co_await asio::this_coro::executor, 20ms);
    for (int i = 0; i < 1500 && !ended; ++i) {  // 30 s
      ended = test::state_of(c.pid()) == 'Z';
      timer.expires_after(20ms);
      co_await timer.async_wait(asio::use_awaitable);
    }
    if (!ended) c.signal(SIGKILL);
    co_return co_await c.wait();
  }());
  ::close(console[0]);
  CHECK(ended);
  CHECK(status.code() == 128 + SIGTERM);
  REQUIRE(fs::exists(file));
  const auto j = nlohmann::json::parse(read_file(file));
  CHECK(j["outcome"] == "interrupted");
  CHECK(j["exit_code"] == 128 + SIGTERM);
  CHECK(fs::exists(run_folder(logs, j["run_id"].get<std::string>()) / "result.json"));
}

}  // namespace

TEST_SUITE("cohort-run") {
  // Before, cohort-run's line went on where the rank's stopped, on the
  // same line: "[default0]:yyy...yyycohort-run: interrupted by SIGTERM".
  TEST_CASE("cohort-run's own line after a console given up inside a rank's line starts a line of its own") {
    test::temp_dir dir;
    int console[2];
    REQUIRE(::pipe2(console, O_CLOEXEC) == 0);
    // The rank's one line (in 64 KiB pieces on the console) is longer than
    // the console's pipe holds, however large the system lets it grow: the
    // console takes its start, and nobody reads it until cohort-run has
    // given it up, 10 s after the signal (its ranks' end: kill_wait for the
    // pumps, another for the console), and waits to write its own line (at
    // most 5 s).
    const command cmd(launcher, {"-n", "1", "--log-dir", (dir.path / "logs").string(), "-t", "3", "--", "/bin/sh",
                                 "-c", "head -c 2000000 /dev/zero | tr '\\0' y; echo; : > \"$0/up\"; exec sleep 60",
                                 dir.path.string()});
    std::string text;
    asio::io_context io;
    const auto status = test::run(io, [&]() -> asio::awaitable<exit_status> {
      spawn_options options{.out = stdio::fd(console[1]), .err = stdio::same_as_stdout()};
      options.env.set("TMPDIR", launcher_tmpdir());
      child c = co_await spawn(cmd, options);
      ::close(console[1]);
      co_await files_appear(dir.path, 1, "up");
      c.signal(SIGTERM);
      asio::steady_timer pause(co_await asio::this_coro::executor, 12500ms);
      co_await pause.async_wait(asio::use_awaitable);
      asio::readable_pipe reader(co_await asio::this_coro::executor, console[0]);
      text = co_await test::read_all(reader);
      co_return co_await c.wait();
    }());
    CHECK(status.code() == 128 + SIGTERM);
    CHECK(text.find("the logs are incomplete") != std::string::npos);  // the console was given up
    CHECK(text.starts_with("[default0]:yyyy"));
    const auto said = text.find("cohort-run: interrupted by SIGTERM");
    REQUIRE(said != std::string::npos);
    CHECK(text[said - 1] == '\n');
    // Before it, the start of the rank's line's last piece: the rest was not taken.
    const auto given_up = text.substr(0, said - 1);
    const auto last_line = given_up.substr(given_up.rfind('\n') + 1);
    CHECK(last_line.starts_with("[default0]:yyyy"));
    CHECK(last_line.size() < std::string("[default0]:").size() + 64 * 1024);
  }

#if COHORT_TEST_LEAN_COHORT_RUN
  TEST_CASE("cohort-run loads no shared library but libc and the loader: it starts once per job") {
    for (const auto& name : needed_libraries(launcher)) {
      INFO(name);
      CHECK((name == "libc.so.6" || name.starts_with("ld-linux")));
    }
    // The check itself reads what a program needs: this test needs more.
    const auto own = needed_libraries("/proc/self/exe");
    CHECK(std::find(own.begin(), own.end(), "libc.so.6") != own.end());
    CHECK(own.size() > 1);
  }
#endif

  TEST_CASE("every worker gets torchrun's environment contract") {
    test::temp_dir dir;
    auto r = run_launcher({"--nproc-per-node", "3", "--role", "trainer", "--run-id", "job7", "--max-restarts", "2", "--",
                           "/bin/sh", "-c", dump_contract, dir.path.string()},
                          {{"OMP_NUM_THREADS", ""}});
    REQUIRE(r.status.code() == 0);
    std::string port;
    for (int rank = 0; rank < 3; ++rank) {
      auto v = variables_in(dir.path / std::to_string(rank));
      CHECK(v["RANK"] == std::to_string(rank));
      CHECK(v["LOCAL_RANK"] == std::to_string(rank));
      CHECK(v["WORLD_SIZE"] == "3");
      CHECK(v["LOCAL_WORLD_SIZE"] == "3");
      CHECK(v["GROUP_RANK"] == "0");
      CHECK(v["GROUP_WORLD_SIZE"] == "1");
      CHECK(v["ROLE_RANK"] == std::to_string(rank));
      CHECK(v["ROLE_WORLD_SIZE"] == "3");
      CHECK(v["ROLE_NAME"] == "trainer");
      CHECK(v["MASTER_ADDR"] == "127.0.0.1");
      CHECK(std::stoi(v["MASTER_PORT"]) > 0);
      if (rank == 0) port = v["MASTER_PORT"];
      CHECK(v["MASTER_PORT"] == port);  // one port for all
      CHECK(v["TORCHELASTIC_RESTART_COUNT"] == "0");
      CHECK(v["TORCHELASTIC_MAX_RESTARTS"] == "2");
      CHECK(v["TORCHELASTIC_RUN_ID"] == "job7");
      CHECK(!v["TORCHELASTIC_ERROR_FILE"].empty());
      CHECK(v["COHORT_ERROR_FILE"] == v["TORCHELASTIC_ERROR_FILE"]);
      CHECK(v["OMP_NUM_THREADS"] == "");  // set, even empty, by the user: left alone
      CHECK(v["TORCHELASTIC_USE_AGENT_STORE"] == "False");
      CHECK(v["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1");
      // Its deprecated name, which torch warns of, is not set (as by
      // current torchrun); one the user set is inherited as it is.
      const char* deprecated = std::getenv("NCCL_ASYNC_ERROR_HANDLING");
      CHECK(v["NCCL_ASYNC_ERROR_HANDLING"] == (deprecated != nullptr ? deprecated : "unset"));
    }
  }

  TEST_CASE("--nnodes and --node-rank, every node as many ranks: global ranks are node_rank * nproc + local_rank") {
    test::temp_dir dir;
    auto r = run_launcher({"--nnodes", "2", "--node_rank", "1", "--nproc_per_node", "2", "--master_addr", "10.0.0.1",
                           "/bin/sh", "-c", dump_contract, dir.path.string()},
                          identical_nodes);
    REQUIRE(r.status.code() == 0);
    for (int local = 0; local < 2; ++local) {
      auto v = variables_in(dir.path / std::to_string(2 + local));
      CHECK(v["LOCAL_RANK"] == std::to_string(local));
      CHECK(v["WORLD_SIZE"] == "4");
      CHECK(v["GROUP_RANK"] == "1");
      CHECK(v["GROUP_WORLD_SIZE"] == "2");
      CHECK(v["MASTER_ADDR"] == "10.0.0.1");
      CHECK(v["MASTER_PORT"] == "29500");  // several nodes must agree on it
      CHECK(v["OMP_NUM_THREADS"] == "1");  // unset and several ranks: 1
    }
    CHECK(r.err.find("OMP_NUM_THREADS") != std::string::npos);  // said once
  }

  TEST_CASE("nodes of different --nproc-per-node: node 0 gathers their counts; the ranks are 0..N-1 in node order") {
    test::temp_dir dir;
    const std::string port = std::to_string(cohort_run::free_port());
    const auto node_args = [&](const char* rank, const char* nproc) {
      return std::vector<std::string>{"--nnodes", "2", "--node-rank", rank, "-n", nproc, "--master-addr", "127.0.0.1",
                                      "--master-port", port, "--", "/bin/sh", "-c", dump_contract, dir.path.string()};
    };
    // Node 1 starts first and waits for node 0, which this starts later.
    outcome zero;
    const auto start_zero = [&](child&) -> asio::awaitable<void> {
      asio::steady_timer later(co_await asio::this_coro::executor, 300ms);
      co_await later.async_wait(asio::use_awaitable);
      spawn_options options{.out = stdio::pipe(), .err = stdio::pipe()};
      options.env.set("TMPDIR", launcher_tmpdir());
      child c = co_await spawn(command(launcher, node_args("0", "1")), options);
      auto [out, err] = co_await (test::read_all(c.out()) && test::read_all(c.err()));
      auto status = co_await c.wait();
      zero = outcome{status, std::move(out), std::move(err)};
    };
    auto one = run_launcher(node_args("1", "3"), start_zero);
    REQUIRE_MESSAGE(zero.status.code() == 0, zero.err);
    REQUIRE_MESSAGE(one.status.code() == 0, one.err);
    for (int rank = 0; rank < 4; ++rank) {
      CAPTURE(rank);
      auto v = variables_in(dir.path / std::to_string(rank));
      CHECK(v["RANK"] == std::to_string(rank));
      CHECK(v["WORLD_SIZE"] == "4");
      CHECK(v["ROLE_WORLD_SIZE"] == "4");
      CHECK(v["GROUP_RANK"] == (rank == 0 ? "0" : "1"));
      CHECK(v["LOCAL_RANK"] == std::to_string(rank == 0 ? 0 : rank - 1));
      CHECK(v["LOCAL_WORLD_SIZE"] == (rank == 0 ? "1" : "3"));
      CHECK(v["MASTER_PORT"] == port);
      // Before, each node made a run id of its own.
      CHECK(v["TORCHELASTIC_RUN_ID"] == "none");
    }
    CHECK(one.err.find("node 1 of 2: ranks 1 to 3 of 4") != std::string::npos);
  }

  TEST_CASE("a node waiting for node 0 ends at SIGTERM, interrupted; past its join_timeout, it fails saying why") {
    const std::string port = std::to_string(cohort_run::free_port());
    const std::vector<std::string> waiting{"--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1",
                                           "--master-port", port, "--", "/bin/true"};
    // The folders it makes for --log-dir go with the run's own, still empty.
    test::temp_dir logs;
    auto with_logs = waiting;
    with_logs.insert(with_logs.begin(), {"--log-dir", (logs.path / "a" / "b").string()});
    const auto started = std::chrono::steady_clock::now();
    auto r = run_launcher(with_logs, [](child& c) -> asio::awaitable<void> {
      co_await until_blocked(c, SIGTERM);
      asio::steady_timer later(co_await asio::this_coro::executor, 500ms);
      co_await later.async_wait(asio::use_awaitable);
      c.signal(SIGTERM);
    });
    CHECK(r.status.code() == 128 + SIGTERM);
    CHECK_MESSAGE(r.err.find("interrupted by SIGTERM") != std::string::npos, r.err);
    CHECK(std::chrono::steady_clock::now() - started < 20s);
    CHECK(fs::is_empty(logs.path));
    auto timed = waiting;
    timed.insert(timed.begin(), {"--rdzv-conf", "join_timeout=1"});
    r = run_launcher(timed);
    CHECK(r.status.code() == 1);
    CHECK_MESSAGE(r.err.find("node 0 did not answer at 127.0.0.1:" + port + " within 1 s") != std::string::npos, r.err);
    // A misspelt key would leave the wait at 600 s: refused.
    auto misspelt = waiting;
    misspelt.insert(misspelt.begin(), {"--rdzv-conf", "join_timout=1"});
    r = run_launcher(misspelt);
    CHECK(r.status.code() == 2);
    CHECK_MESSAGE(r.err.find("no key 'join_timout'") != std::string::npos, r.err);
  }

  TEST_CASE("${local_rank} and $local_rank in the arguments become each rank's local rank, as torchrun substitutes them") {
    test::temp_dir dir;
    auto r = run_launcher({"-n", "2", "--", "/bin/sh", "-c", "printf '%s|%s|%s' \"$1\" \"$2\" \"$3\" > \"$0/$LOCAL_RANK\"",
                           dir.path.string(), "--local_rank=${local_rank}", "$local_rank.x",
                           "$local_rankx $$ ${LOCAL_RANK}"});
    REQUIRE(r.status.code() == 0);
    for (int local = 0; local < 2; ++local) {
      const auto n = std::to_string(local);
      // Other names, `$$` (a shell's pid) and the rank's environment stay as written.
      CHECK(read_file(dir.path / n) == "--local_rank=" + n + "|" + n + ".x|$local_rankx $$ ${LOCAL_RANK}");
    }
  }

  TEST_CASE("--nproc-per-node cpu runs a rank per CPU; --standalone gives a run id of its own") {
    test::temp_dir dir;
    auto r = run_launcher({"--nproc-per-node", "cpu", "--standalone", "/bin/sh", "-c", dump_contract, dir.path.string()});
    REQUIRE(r.status.code() == 0);
    const int cpus = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    std::size_t files = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir.path)) ++files;
    CHECK(files == static_cast<std::size_t>(cpus));
    auto v = variables_in(dir.path / "0");
    CHECK(v["WORLD_SIZE"] == std::to_string(cpus));
    CHECK(v["TORCHELASTIC_RUN_ID"] != "none");
    CHECK(v["TORCHELASTIC_RUN_ID"].size() == std::string("20261125-093000-0123abcd").size());
    CHECK(v["MASTER_ADDR"] == "127.0.0.1");
  }

  TEST_CASE("cohort-run raises its own soft limit on open descriptors for the ranks it holds; the ranks get the one it was given") {
    // 80 ranks need more descriptors than a soft limit of 64 allows (a
    // pidfd each, two where exits are watched on the reactor).
    const command cmd("/bin/sh", {"-c", "ulimit -Sn 64 && exec \"$@\"", "sh", launcher, "-n", "80", "--",
                                  test::target, "print-nofile"});
    const outcome o = run_command(cmd, [](child&) -> asio::awaitable<void> { co_return; });
    INFO(o.err);
    REQUIRE(o.status.success());
    std::istringstream lines(o.out);
    std::vector<std::string> limits;
    for (std::string line; std::getline(lines, line);) limits.push_back(line);
    CHECK(limits.size() == 80);
    CHECK(std::all_of(limits.begin(), limits.end(), [](const std::string& l) { return l == "64"; }));
  }

  // Before, a few limits gave asio's bare "epoll: Too many open files", or
  // the guardian's "cohort::guardian: socketpair: ...", with no
  // "cohort-run: " before it and no limit named.
  TEST_CASE("cohort-run under a descriptor limit too small to start says so as its own, naming the limit") {
    int failed = 0;
    for (int limit = 4; limit <= 16; ++limit) {
      CAPTURE(limit);
      const command cmd("/bin/sh", {"-c", "ulimit -n \"$0\" && exec \"$@\"", std::to_string(limit), launcher, "-n",
                                    "1", "--", "/bin/true"});
      const outcome o = run_command(cmd, [](child&) -> asio::awaitable<void> { co_return; });
      if (o.status.success()) continue;
      ++failed;
      INFO(o.err);
      CHECK(o.err.starts_with("cohort-run: "));
      CHECK(o.err.find(fmt::format("(open file limit RLIMIT_NOFILE is {})", limit)) != std::string::npos);
    }
    CHECK(failed > 0);  // the smallest limit leaves no room to start
  }

  // Before, a limit that left the start its last descriptor left none for
  // reading the signals: the ranks ran, their lines reached the console,
  // and they were killed, result.json recording no attempt. (A start that
  // fails, a rank that cannot be spawned, may have spawned others, killed
  // as it unwinds; their lines are never pumped.)
  TEST_CASE("under each descriptor limit about what a start needs, cohort-run runs every rank or fails in its start") {
    int ran = 0, failed = 0;
    for (int limit = 8; limit <= 128 && ran < 3; ++limit) {
      CAPTURE(limit);
      test::temp_dir dir;
      const auto file = dir.path / "result.json";
      // The ranks live on a while, their streams' pumps waiting, as the start ends.
      const command cmd("/bin/sh", {"-c", "ulimit -n \"$0\" && exec \"$@\"", std::to_string(limit), launcher,
                                    "--result-json", file.string(), "--log-dir", (dir.path / "logs").string(),
                                    "--tee-through-pipes", "-t", "1", "-n", "8", "--", "/bin/sh", "-c",
                                    ": > \"$0/ran.$RANK\"; echo up; exec sleep 0.5", dir.path.string()});
      const outcome o = run_command(cmd, [](child&) -> asio::awaitable<void> { co_return; });
      INFO(o.err);
      std::size_t lines = 0;
      for (std::size_t at = 0; (at = o.out.find("]:up", at)) != std::string::npos; ++at) ++lines;
      if (o.status.success()) {
        ++ran;
        std::size_t marks = 0;
        for (const auto& e : fs::directory_iterator(dir.path)) marks += e.path().filename().string().starts_with("ran.");
        CHECK(marks == 8);
        CHECK(lines == 8);
        REQUIRE(fs::exists(file));
        CHECK(nlohmann::json::parse(read_file(file))["attempts"].size() == 1);
        continue;
      }
      ++failed;
      CHECK(o.err.find("Too many open files") != std::string::npos);
      CHECK(lines == 0);
    }
    CHECK(failed > 0);
    CHECK(ran == 3);  // the first limits that let the run start
  }

  TEST_CASE("teed through pipes, with log files, 120 ranks start under a soft limit of 64 descriptors") {
    // Each rank holds up to eight here while it starts (both ends of two
    // pipes, two log files, two pidfds).
    test::temp_dir dir;
    const command cmd("/bin/sh", {"-c", "ulimit -Sn 64 && exec \"$@\"", "sh", launcher, "-n", "120", "-t", "3",
                                  "--tee-through-pipes", "--log-dir", dir.path.string(), "--", "/bin/sh", "-c",
                                  "echo up $RANK"});
    const outcome o = run_command(cmd, [](child&) -> asio::awaitable<void> { co_return; });
    INFO(o.err);
    REQUIRE(o.status.success());
    std::size_t lines = 0;
    for (std::size_t at = 0; (at = o.out.find("]:up ", at)) != std::string::npos; ++at) ++lines;
    CHECK(lines == 120);
  }

  TEST_CASE("a failing rank: the others are shut down, the summary names it, the exit code is its") {
    auto r = run_launcher({"-n", "3", "--", "/bin/sh", "-c", "if [ $RANK = 1 ]; then exit 3; fi; exec sleep 30"});
    CHECK(r.status.code() == 3);
    CHECK(r.err.find("Root cause (first failure):") != std::string::npos);
    CHECK(r.err.find("rank       : 1 (local_rank: 1)") != std::string::npos);
    CHECK(r.err.find("exitcode   : 3") != std::string::npos);
    CHECK(r.err.find("Other failures:") == std::string::npos);  // the others were ended by the shutdown
  }

  TEST_CASE("a rank killed by a signal: exit code 128 + the signal, named in the summary") {
    auto r = run_launcher({"-n", "2", "--", "/bin/sh", "-c", "if [ $RANK = 0 ]; then kill -SEGV $$; fi; exec sleep 30"});
    CHECK(r.status.code() == 128 + SIGSEGV);
    CHECK(r.err.find("exitcode   : signal SIGSEGV (11)") != std::string::npos);
  }

  TEST_CASE("the error file a worker wrote reaches the summary, with its traceback") {
    const char* script =
        "printf '{\"message\": {\"message\": \"ValueError: bad batch\", \"extraInfo\": "
        "{\"py_callstack\": \"Traceback (most recent call last):\\\\n  File \\\\\"train.py\\\\\", line 3\", "
        "\"timestamp\": \"1700000000\"}}}' > \"$TORCHELASTIC_ERROR_FILE\"; exit 1";
    auto r = run_launcher({"-n", "1", "--", "/bin/sh", "-c", script});
    CHECK(r.status.code() == 1);
    CHECK(r.err.find("message    : ValueError: bad batch") != std::string::npos);
    CHECK(r.err.find("File \"train.py\", line 3") != std::string::npos);
    CHECK(r.err.find("error_file : /") != std::string::npos);
  }

  TEST_CASE("a message of several lines has its later lines indented under its first in the summary") {
    const char* script =
        "printf '{\"message\": {\"message\": \"ValueError: bad batch\\\\n  shape (3, 4)\\\\n\\\\nsee above\", "
        "\"extraInfo\": {\"py_callstack\": \"tb\", \"timestamp\": \"1700000000\"}}}' > \"$TORCHELASTIC_ERROR_FILE\"; "
        "exit 1";
    auto r = run_launcher({"-n", "1", "--", "/bin/sh", "-c", script});
    CHECK(r.status.code() == 1);
    INFO(r.err);
    CHECK(r.err.find("  message    : ValueError: bad batch\n"
                     "                 shape (3, 4)\n"
                     "\n"
                     "               see above\n") != std::string::npos);
  }

  TEST_CASE("given an error file of its own, cohort-run leaves the root cause there, as torchrun's @record does") {
    test::temp_dir dir;
    const auto own = dir.path / "launcher-error.json";
    const std::map<std::string, std::string> env{{"TORCHELASTIC_ERROR_FILE", own.string()}};
    const char* script =
        "if [ $RANK = 1 ]; then printf '{\"message\": {\"message\": \"ValueError: bad batch\", \"extraInfo\": "
        "{\"py_callstack\": \"tb\", \"timestamp\": \"1700000000\"}}}' > \"$TORCHELASTIC_ERROR_FILE\"; exit 3; fi; "
        "sleep 30";
    auto r = run_launcher({"-n", "2", "--", "/bin/sh", "-c", script}, env);
    REQUIRE(r.status.code() == 3);
    auto file = nlohmann::json::parse(read_file(own));
    CHECK(file["message"]["message"] == "ValueError: bad batch");
    CHECK(file["message"]["extraInfo"]["py_callstack"] == "tb");
    CHECK(file["message"]["errorCode"] == 3);  // the rank's exit code, as torchrun sets it
    // A file naming an undecodable file as Python's json.dump escapes it (a
    // lone surrogate) is read, and passed on, all the same.
    fs::remove(own);
    const char* undecodable =
        "if [ $RANK = 1 ]; then printf '{\"message\": {\"message\": \"OSError: caf\\\\udce9\", \"extraInfo\": "
        "{\"py_callstack\": \"tb\", \"timestamp\": \"1700000000\"}}}' > \"$TORCHELASTIC_ERROR_FILE\"; exit 3; fi; "
        "sleep 30";
    r = run_launcher({"-n", "2", "--", "/bin/sh", "-c", undecodable}, env);
    REQUIRE(r.status.code() == 3);
    CHECK(r.err.find("message    : OSError: caf\xef\xbf\xbd") != std::string::npos);
    file = nlohmann::json::parse(read_file(own));
    CHECK(file["message"]["message"] == "OSError: caf\xef\xbf\xbd");
    CHECK(file["message"]["errorCode"] == 3);
    // A rank that wrote none leaves nothing to pass on; a run that
    // succeeded writes nothing either.
    fs::remove(own);
    r = run_launcher({"-n", "1", "--", "/bin/sh", "-c", "exit 4"}, env);
    CHECK(r.status.code() == 4);
    CHECK_FALSE(fs::exists(own));
    r = run_launcher({"-n", "1", "--", "/bin/true"}, env);
    CHECK(r.status.code() == 0);
    CHECK_FALSE(fs::exists(own));
    // Ended by a signal: the error code is minus the signal.
    const char* segv =
        "printf '{\"message\": {\"message\": \"crash\", \"extraInfo\": {\"py_callstack\": \"\", "
        "\"timestamp\": \"1\"}}}' > \"$TORCHELASTIC_ERROR_FILE\"; kill -SEGV $$";
    r = run_launcher({"-n", "1", "--", "/bin/sh", "-c", segv}, env);
    CHECK(r.status.code() == 128 + SIGSEGV);
    CHECK(nlohmann::json::parse(read_file(own))["message"]["errorCode"] == -SIGSEGV);
    // Interrupted: what ended it.
    fs::remove(own);
    test::temp_dir up;
    r = run_launcher({"-n", "1", "--", "/bin/sh", "-c", "touch \"$0/up\"; exec sleep 30", up.path.string()},
                     signal_when_up(up.path, 1, SIGTERM), env);
    CHECK(r.status.code() == 128 + SIGTERM);
    CHECK(nlohmann::json::parse(read_file(own))["message"]["message"] == "cohort-run: SIGTERM received");
  }

  TEST_CASE("a C++ worker's uncaught exception reaches the summary with the function, file and line of its throw") {
    auto r = run_launcher({"-n", "1", "--", test::thrower, "uncaught"});
    CHECK(r.status.code() == 1);
    INFO(r.err);
    const std::string line = r.out.substr(0, r.out.find('\n'));  // the thrower prints it first
    CHECK(r.err.find("message    : std::runtime_error: uncaught in main") != std::string::npos);
    CHECK(r.err.find("#0 thrower::throw_uncaught() at ") != std::string::npos);
    if (os::stack_has_source_lines()) CHECK(r.err.find("support/thrower.cpp:" + line) != std::string::npos);
  }

  TEST_CASE("restarts: a group that succeeds on its third attempt, and one that runs out of them") {
    const char* third_time_lucky = "[ $TORCHELASTIC_RESTART_COUNT -ge 2 ]";
    auto ok = run_launcher({"-n", "2", "--max-restarts", "3", "/bin/sh", "-c", third_time_lucky});
    CHECK(ok.status.code() == 0);
    CHECK(ok.err.find("attempt 1 failed") != std::string::npos);
    auto out_of_restarts = run_launcher({"-n", "2", "--max-restarts", "1", "/bin/sh", "-c", third_time_lucky});
    CHECK(out_of_restarts.status.code() == 1);
    CHECK(out_of_restarts.err.find("attempt 1, 1 of 1 restarts used") != std::string::npos);
  }

  TEST_CASE("restarts with --log-dir: one folder per attempt, each with that attempt's output") {
    test::temp_dir dir;
    auto r = run_launcher({"-n", "2", "--max-restarts", "3", "--log-dir", dir.path.string(), "--run-id", "job", "-r", "1",
                           "/bin/sh", "-c", "echo attempt $TORCHELASTIC_RESTART_COUNT; [ $TORCHELASTIC_RESTART_COUNT -ge 2 ]"});
    CHECK(r.status.code() == 0);
    CHECK(r.out.empty());  // redirected: nothing on the console
    // In a failed attempt the first rank to fail may shut the other down
    // before it writes: its file is then empty, never another attempt's.
    for (int attempt = 0; attempt < 3; ++attempt) {
      const std::string expected = "attempt " + std::to_string(attempt) + "\n";
      int written = 0;
      for (int rank = 0; rank < 2; ++rank) {
        const auto attempt_folder = run_folder(dir.path, "job") / ("attempt_" + std::to_string(attempt));
        const auto text = read_file(attempt_folder / std::to_string(rank) / "stdout.log");
        CHECK((text == expected || (attempt < 2 && text.empty())));
        written += text == expected ? 1 : 0;
      }
      CHECK(written >= (attempt < 2 ? 1 : 2));
    }
    CHECK_FALSE(fs::exists(run_folder(dir.path, "job") / "attempt_3"));
  }

  TEST_CASE("a relative --log-dir: a rank that changes directory still leaves its error file, and result.json names it absolute") {
    test::temp_dir dir;
    const std::string fails =
        "cd / && printf '{\"message\": {\"message\": \"ValueError: moved\", \"extraInfo\": {\"py_callstack\": \"\", "
        "\"timestamp\": \"1\"}}}' > \"$TORCHELASTIC_ERROR_FILE\"; exit 3";
    const command cmd("/bin/sh", {"-c", "cd \"$0\" && exec \"$@\"", dir.path.string(), launcher, "--log-dir", "logs",
                                  "--run-id", "job", "-n", "1", "--", "/bin/sh", "-c", fails});
    const outcome o = run_command(cmd, [](child&) -> asio::awaitable<void> { co_return; });
    INFO(o.err);
    CHECK(o.status.code() == 3);
    CHECK(o.err.find("ValueError: moved") != std::string::npos);
    const auto folder = run_folder(dir.path / "logs", "job");
    const auto result = nlohmann::json::parse(read_file(folder / "result.json"));
    CHECK(result["log_dir"] == folder.string());
  }

  TEST_CASE("4 ranks writing 100 MB each with -r 3 -t 3: log files byte-exact, console lines whole") {
    test::temp_dir dir;
    const std::size_t size = 100'000'000;
    const std::string line = "a line of output from rank ";
    // Each rank: 100 MB of numbered-by-rank lines, the last one cut; a line on stderr.
    auto r = run_launcher_to(dir.path / "console", {"-n", "4", "--log-dir", (dir.path / "logs").string(), "-r", "3", "-t", "3",
                                                    "--run-id", "none",
                                                    "--", "/bin/sh", "-c",
                                                    "echo to stderr $LOCAL_RANK >&2; yes \"" + line +
                                                        "$LOCAL_RANK\" | head -c " + std::to_string(size)});
    REQUIRE(r.status.code() == 0);
    CHECK(r.err.find("[default2]:to stderr 2\n") != std::string::npos);
    for (int rank = 0; rank < 4; ++rank) {
      CAPTURE(rank);
      const auto folder = run_folder(dir.path / "logs", "none") / "attempt_0" / std::to_string(rank);
      const std::string file = read_file(folder / "stdout.log");
      const std::string pattern = line + std::to_string(rank) + "\n";
      REQUIRE(file.size() == size);
      bool exact = true;
      for (std::size_t at = 0; at < size && exact; at += pattern.size()) {
        exact = file.compare(at, pattern.size(), pattern, 0, std::min(pattern.size(), size - at)) == 0;
      }
      CHECK(exact);
      CHECK(read_file(folder / "stderr.log") == "to stderr " + std::to_string(rank) + "\n");
    }
    // The console: every line one rank's whole line behind its prefix; only
    // the cut last line of each rank differs, and every byte came through.
    std::ifstream console(dir.path / "console");
    std::map<int, std::size_t> bytes, cut;
    std::size_t bad = 0;
    for (std::string text; std::getline(console, text);) {
      const bool prefixed = text.size() > 11 && text.compare(0, 8, "[default") == 0 && text.compare(9, 2, "]:") == 0;
      const int rank = prefixed ? text[8] - '0' : -1;
      if (!prefixed || rank < 0 || rank > 3) {
        ++bad;
        continue;
      }
      const std::string whole = line + std::to_string(rank);
      const std::string rest = text.substr(11);
      if (rest != whole) {
        if (whole.rfind(rest, 0) == 0) ++cut[rank];
        else ++bad;
      }
      bytes[rank] += rest.size() + 1;
    }
    CHECK(bad == 0);
    for (int rank = 0; rank < 4; ++rank) {
      CHECK(cut[rank] == 1);
      CHECK(bytes[rank] == size + 1);  // the cut line gets its newline on the console
    }
  }

  TEST_CASE("--tee-through-pipes: the ranks write pipes; the files get the exact bytes, the console whole lines") {
    test::temp_dir dir;
    auto r = run_launcher({"-n", "2", "--log-dir", dir.path.string(), "-t", "3", "--tee-through-pipes", "--run-id", "none",
                           "--", "/bin/sh", "-c", "stat -L -c '%F' /proc/self/fd/1; printf 'end %s' $LOCAL_RANK; echo err >&2"});
    CHECK(r.status.code() == 0);
    for (int rank = 0; rank < 2; ++rank) {
      const auto id = std::to_string(rank);
      const auto folder = run_folder(dir.path, "none") / "attempt_0" / id;
      CHECK(read_file(folder / "stdout.log") == "fifo\nend " + id);
      CHECK(read_file(folder / "stderr.log") == "err\n");
      CHECK(r.out.find("[default" + id + "]:fifo\n") != std::string::npos);
      CHECK(r.out.find("[default" + id + "]:end " + id + "\n") != std::string::npos);
      CHECK(r.err.find("[default" + id + "]:err\n") != std::string::npos);
    }
  }

  // Before, --log-dir /dev/null was refused: "the run's folder in it could
  // not be made: Not a directory".
  TEST_CASE("--log-dir /dev/null: no folder and no file, every stream on the console, no error file, as under torchrun") {
    test::temp_dir tmp, results;
    const auto json = results.path / "result.json";
    // The folders cohort-run would make in $TMPDIR: its logs', its kept error files'.
    const auto made_in_tmp = [&tmp] {
      std::vector<std::string> made;
      for (const auto& e : fs::directory_iterator(tmp.path)) {
        if (e.path().filename().string().starts_with("cohort-run")) made.push_back(e.path().filename().string());
      }
      return made;
    };
    auto r = run_launcher({"-n", "2", "--log-dir", "/dev/null", "-r", "0:3", "-t", "1:3", "--result-json", json.string(),
                           "--", "/bin/sh", "-c",
                           "echo out $LOCAL_RANK \"<${TORCHELASTIC_ERROR_FILE-unset}>\" \"<${COHORT_ERROR_FILE-unset}>\"; "
                           "echo err $LOCAL_RANK >&2"},
                          {{"TMPDIR", tmp.path.string()}});
    CHECK_MESSAGE(r.status.code() == 0, r.err);
    // Redirected and teed streams alike reach the console as the ranks
    // wrote them: torchrun has no file to follow for a prefixed copy.
    CHECK(r.out.size() == std::string("out 0 <> <>\n").size() * 2);
    CHECK(r.out.find("out 0 <> <>\n") != std::string::npos);
    CHECK(r.out.find("out 1 <> <>\n") != std::string::npos);
    CHECK(r.err.find("err 0\n") != std::string::npos);
    CHECK(r.err.find("err 1\n") != std::string::npos);
    CHECK(r.err.find("[default") == std::string::npos);
    CHECK(r.err.find("logs in") == std::string::npos);
    CHECK(made_in_tmp().empty());
    REQUIRE(fs::exists(json));
    const auto recorded = nlohmann::json::parse(read_file(json));
    CHECK(recorded["outcome"] == "succeeded");
    CHECK_FALSE(recorded.contains("log_dir"));
    // --local-ranks-filter still holds back the other ranks' streams.
    r = run_launcher({"-n", "2", "--log-dir", "/dev/null", "--local-ranks-filter", "1", "--", "/bin/sh", "-c",
                      "echo out $LOCAL_RANK"},
                     {{"TMPDIR", tmp.path.string()}});
    CHECK_MESSAGE(r.status.code() == 0, r.err);
    CHECK(r.out == "out 1\n");
    // A rank that fails leaves no error file to keep: its exit code is the
    // run's, and nothing is made for it.
    r = run_launcher({"-n", "2", "--log-dir", "/dev/null", "--", "/bin/sh", "-c",
                      "if [ $RANK = 1 ]; then echo '{}' > \"${COHORT_ERROR_FILE:-/dev/null}\"; exit 3; fi"},
                     {{"TMPDIR", tmp.path.string()}});
    CHECK(r.status.code() == 3);
    CHECK_MESSAGE(kept_error_folder(r.err).empty(), r.err);
    CHECK(made_in_tmp().empty());
  }

  TEST_CASE("--local-ranks-filter: only those ranks reach the console") {
    test::temp_dir dir;
    auto r = run_launcher({"-n", "3", "--log-dir", dir.path.string(), "-t", "3", "--local-ranks-filter", "1", "--run-id", "none",
                           "--", "/bin/sh", "-c", "echo out $LOCAL_RANK; echo err $LOCAL_RANK >&2"});
    CHECK(r.status.code() == 0);
    CHECK(r.out == "[default1]:out 1\n");
    CHECK(r.err.find("[default1]:err 1\n") != std::string::npos);
    CHECK(r.err.find("err 0") == std::string::npos);
    CHECK(r.err.find("err 2") == std::string::npos);
    for (int rank = 0; rank < 3; ++rank) {
      const auto log = run_folder(dir.path, "none") / "attempt_0" / std::to_string(rank) / "stdout.log";
      CHECK(read_file(log) == "out " + std::to_string(rank) + "\n");
    }
    // A --log-dir that cannot be made is named as given, and no folder of
    // the run's is said or recorded.
    const auto json = dir.path / "unwritable.json";
    auto unwritable = run_launcher({"-n", "2", "--log-dir", "/proc/no-such-dir", "--run-id", "none", "-r", "3",
                                    "--result-json", json.string(), "true"});
    CHECK(unwritable.status.code() == 1);
    CHECK(unwritable.err == "cohort-run: --log-dir /proc/no-such-dir: the folder could not be made: "
                            "No such file or directory\n");
    REQUIRE(fs::exists(json));
    const auto recorded = nlohmann::json::parse(read_file(json));
    CHECK(recorded["outcome"] == "failed");
    CHECK_FALSE(recorded.contains("log_dir"));
    // Local ranks past this node's are left out, as torchrun leaves them.
    auto beyond = run_launcher({"-n", "1", "-t", "0:3,4:3", "--local-ranks-filter", "0,7", "--", "/bin/sh", "-c",
                                "echo out $LOCAL_RANK"});
    CHECK(beyond.status.code() == 0);
    CHECK(beyond.out == "[default0]:out 0\n");
    CHECK(beyond.err.find("--tee names local rank 4; there are 1 here: left out") != std::string::npos);
    CHECK(beyond.err.find("--local-ranks-filter names local rank 7") != std::string::npos);
    auto bad = run_launcher({"-n", "2", "-t", "0:3,x", "true"});
    CHECK(bad.status.code() == 2);
    CHECK(bad.err.find("--tee") != std::string::npos);
    // An empty item is refused, as torchrun's int('') and its pattern of
    // rank:streams refuse it; before, it was left out (',' filtered nothing).
    for (const std::vector<std::string>& flags :
         {std::vector<std::string>{"--local-ranks-filter", ","}, {"--local-ranks-filter", ",0"},
          {"-t", "0:3,"}, {"-t", "0:3,,1:1"}, {"-r", ",0:3"}}) {
      CAPTURE(flags[1]);
      std::vector<std::string> args{"-n", "2"};
      args.insert(args.end(), flags.begin(), flags.end());
      args.push_back("/bin/true");
      auto empty_item = run_launcher(args);
      CHECK(empty_item.status.code() == 2);
      CHECK(empty_item.err.find(flags[0] == "-t" ? "--tee: '" : flags[0] == "-r" ? "--redirects: '"
                                                                                  : "--local-ranks-filter: '") !=
            std::string::npos);
    }
    // The item as given, blanks and all.
    auto blank = run_launcher({"-n", "2", "--local-ranks-filter", "0, ", "/bin/true"});
    CHECK(blank.status.code() == 2);
    CHECK(blank.err.find("--local-ranks-filter: ' ' is not a whole number") != std::string::npos);
    // Blanks around the numbers, as torchrun's int() takes them.
    auto spaced = run_launcher({"-n", "3", "-t", "0:3, 1 : 3,2: 3", "--local-ranks-filter", "0, 2 ", "--", "/bin/sh",
                                "-c", "echo out $LOCAL_RANK"});
    CHECK(spaced.status.code() == 0);
    std::vector<std::string> lines;
    std::istringstream said(spaced.out);
    for (std::string line; std::getline(said, line);) lines.push_back(line);
    std::sort(lines.begin(), lines.end());
    CHECK(lines == std::vector<std::string>{"[default0]:out 0", "[default2]:out 2"});
  }

  TEST_CASE("SIGTERM to cohort-run shuts the workers down and exits 128 + 15") {
    test::temp_dir dir;
    // Each rank also notes its blocked signals: cohort-run blocks those it
    // handles, its ranks must start with none.
    auto r = run_launcher({"-n", "2", "--", "/bin/sh", "-c",
                           "echo $$ > \"$0/$RANK\"; grep SigBlk /proc/self/status > \"$0/blocked-$RANK\"; "
                           ": > \"$0/up-$RANK\"; exec sleep 30",
                           dir.path.string()},
                          signal_when_up(dir.path, 2, SIGTERM, "up-"));
    CHECK(r.status.code() == 128 + SIGTERM);
    for (int rank = 0; rank < 2; ++rank) {
      const pid_t pid = std::stoi(read_file(dir.path / std::to_string(rank)));
      CHECK_FALSE(test::alive(pid));
      CHECK(read_file(dir.path / ("blocked-" + std::to_string(rank))) == "SigBlk:\t0000000000000000\n");
    }
  }

  TEST_CASE("SIGTERM while a failure's shutdown runs: exit 128 + 15, and the summary still names the failure") {
    test::temp_dir dir;
    // Rank 0 fails once rank 1 has set its trap; rank 1 notes the failure's
    // SIGTERM and takes 3 s to go; cohort-run's own SIGTERM comes meanwhile.
    auto r = run_launcher({"-n", "2", "--max-restarts", "1", "--", "/bin/sh", "-c",
                           "if [ $RANK = 0 ]; then while [ ! -e \"$0/trapped\" ]; do sleep 0.01; done; "
                           "echo 'bad batch' >&2; exit 7; fi; "
                           "trap ': > \"$0/up-term\"; sleep 3; exit 0' TERM; : > \"$0/trapped\"; sleep 30 & wait",
                           dir.path.string()},
                          signal_when_up(dir.path, 1, SIGTERM, "up-"));
    CHECK(r.status.code() == 128 + SIGTERM);
    CHECK(r.err.find("the ranks were being shut down after a failure") != std::string::npos);
    CHECK(r.err.find("a rank failed before the run was interrupted") != std::string::npos);
    const auto root = r.err.find("Root cause (first failure):");
    REQUIRE(root != std::string::npos);
    CHECK(r.err.find("rank       : 0 (local_rank: 0)", root) != std::string::npos);
    CHECK(r.err.find("exitcode   : 7", root) != std::string::npos);
    // Interrupted: no restart, though one was left.
    CHECK(r.err.find("restarting") == std::string::npos);
  }

  TEST_CASE("SIGINT once the ranks have ended, while their lines wait for a console nobody reads: exit 128 + 2") {
    test::temp_dir dir;
    // The ranks' lines fill cohort-run's stdout, a pipe read only once
    // `during` has returned; SIGINT comes once both ranks have exited 0.
    // cohort-run then waits for the console at most another kill_wait
    // (5 s) after it has stopped the pumps (5 s after the ranks' end).
    bool ended_unread = false;
    auto r = run_launcher({"-n", "2", "--log-dir", (dir.path / "logs").string(), "-t", "3", "--", "/bin/sh", "-c",
                           "seq 1 100000; : > \"$0/done-$RANK\"", dir.path.string()},
                          [&](child& c) -> asio::awaitable<void> {
                            co_await files_appear(dir.path, 2, "done-");
                            asio::steady_timer timer(co_await asio::this_coro::executor, 300ms);
                            co_await timer.async_wait(asio::use_awaitable);
                            c.signal(SIGINT);
                            for (int i = 0; i < 1500 && !ended_unread; ++i) {  // 30 s
                              ended_unread = test::state_of(c.pid()) == 'Z';
                              timer.expires_after(20ms);
                              co_await timer.async_wait(asio::use_awaitable);
                            }
                          });
    INFO(r.err);
    CHECK(ended_unread);
    CHECK(r.status.code() == 128 + SIGINT);
    CHECK(r.err.find("interrupted by SIGINT") != std::string::npos);
    CHECK(r.err.find("its ranks had ended") != std::string::npos);
    CHECK(r.err.find("took nothing for the time the run was given to end") != std::string::npos);
  }

  TEST_CASE("a shutdown signal at any moment of a restarting run ends it, interrupted and recorded, before the next attempt") {
    // The ranks fail at once and the group restarts over and over: the
    // signals land in starts, shutdowns and the moments between attempts.
    for (int i = 0; i < 10; ++i) {
      CAPTURE(i);
      test::temp_dir dir;
      const auto json = dir.path / "result.json";
      const auto after = std::chrono::milliseconds(20 + 17 * i);
      auto r = run_launcher({"-n", "2", "--max-restarts", "400", "--result-json", json.string(), "--", "/bin/sh", "-c",
                             "exit 1"},
                            [after](child& c) -> asio::awaitable<void> {
                              co_await until_blocked(c, SIGTERM);
                              asio::steady_timer timer(co_await asio::this_coro::executor, after);
                              co_await timer.async_wait(asio::use_awaitable);
                              c.signal(SIGTERM);
                            });
      INFO(r.err);
      CHECK_FALSE(r.status.signaled());
      CHECK(r.status.code() == 128 + SIGTERM);
      REQUIRE(fs::exists(json));
      const auto result = nlohmann::json::parse(read_file(json));
      CHECK(result["outcome"] == "interrupted");
      CHECK(result["attempts"].size() < 400);  // not a lost signal, the run going on to its last restart
      CHECK(r.err.find("interrupted by SIGTERM") != std::string::npos);
    }
  }

  TEST_CASE("a shutdown signal while cohort-run looks for Python ends it before any rank starts, recorded") {
    test::temp_dir dir;
    // A python3 whose torch check takes a second: SIGTERM comes meanwhile.
    const auto bin = dir.path / "bin";
    fs::create_directories(bin);
    std::ofstream(bin / "python3") << "#!/bin/sh\ncase \"$*\" in *find_spec*) sleep 1; exit 0;; esac\n"
                                   << ": > \"$COHORT_TEST_OUT/ran\"\n";
    fs::permissions(bin / "python3", fs::perms::owner_all);
    const auto script = (dir.path / "train.py").string();
    std::ofstream(script) << "print('not run')\n";
    const auto json = dir.path / "result.json";
    auto r = run_launcher({"--result-json", json.string(), "-n", "1", script},
                          [](child& c) -> asio::awaitable<void> {
                            co_await until_blocked(c, SIGTERM);
                            asio::steady_timer timer(co_await asio::this_coro::executor, std::chrono::milliseconds(300));
                            co_await timer.async_wait(asio::use_awaitable);
                            c.signal(SIGTERM);
                          },
                          {{"PATH", bin.string() + ":/usr/bin:/bin"}, {"COHORT_TEST_OUT", dir.path.string()}});
    INFO(r.err);
    CHECK_FALSE(r.status.signaled());
    CHECK(r.status.code() == 128 + SIGTERM);
    CHECK_FALSE(fs::exists(dir.path / "ran"));
    REQUIRE(fs::exists(json));
    CHECK(nlohmann::json::parse(read_file(json))["outcome"] == "interrupted");
  }

  TEST_CASE("a python3 that stalls asked whether it finds torch: SIGTERM ends the run there, the check killed") {
    test::temp_dir dir, tmp;
    const auto bin = dir.path / "bin";
    fs::create_directories(bin);
    // A wrapper: it starts a child that stalls for a minute, names the
    // child's pid in `child` and its own in `check` (whole, by a rename),
    // and waits for the child.
    std::ofstream(bin / "python3") << "#!/bin/sh\nsleep 60 &\necho $! > \"$COHORT_TEST_OUT/child\"\n"
                                   << "echo $$ > \"$COHORT_TEST_OUT/pid\"\n"
                                   << "mv \"$COHORT_TEST_OUT/pid\" \"$COHORT_TEST_OUT/check\"\nwait\n";
    fs::permissions(bin / "python3", fs::perms::owner_all);
    const auto script = (dir.path / "train.py").string();
    std::ofstream(script) << "print('not run')\n";
    const auto json = dir.path / "result.json";
    const auto started = std::chrono::steady_clock::now();
    auto r = run_launcher({"--result-json", json.string(), "-r", "3", "-n", "1", script},
                          [&dir](child& c) -> asio::awaitable<void> {
                            co_await files_appear(dir.path, 1, "check");
                            c.signal(SIGTERM);
                          },
                          {{"PATH", bin.string() + ":/usr/bin:/bin"},
                           {"COHORT_TEST_OUT", dir.path.string()},
                           {"TMPDIR", tmp.path.string()}});
    INFO(r.err);
    CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(30));  // not the stall's minute
    CHECK(r.status.code() == 128 + SIGTERM);
    CHECK(r.err.find("cohort-run: interrupted by SIGTERM (run ") != std::string::npos);
    CHECK(r.err.find(") before attempt 0: no rank was running") != std::string::npos);
    CHECK(r.err.find("logs in") == std::string::npos);
    CHECK(fs::is_empty(tmp.path));
    REQUIRE(fs::exists(dir.path / "check"));
    const auto check = static_cast<pid_t>(std::stol(read_file(dir.path / "check")));
    CHECK((::kill(check, 0) != 0 && errno == ESRCH));  // killed and reaped
    // Its child too: the check's whole process group is killed.
    const auto stalled = static_cast<pid_t>(std::stol(read_file(dir.path / "child")));
    CHECK(test::within(10s, [stalled] { return !test::alive(stalled); }, 5ms));
    REQUIRE(fs::exists(json));
    CHECK(nlohmann::json::parse(read_file(json))["outcome"] == "interrupted");
  }

  // The check leads a process group of its own, which a SIGKILL sent to
  // cohort-run (or to cohort-run's group) does not reach: it dies with
  // cohort-run by its parent-death signal.
  TEST_CASE("a python3 asked whether it finds torch dies with a cohort-run killed by SIGKILL") {
    test::temp_dir dir, tmp;
    const auto bin = dir.path / "bin";
    fs::create_directories(bin);
    // Names its pid in `check` (whole, by a rename), then stalls as that
    // same process.
    std::ofstream(bin / "python3") << "#!/bin/sh\necho $$ > \"$COHORT_TEST_OUT/pid\"\n"
                                   << "mv \"$COHORT_TEST_OUT/pid\" \"$COHORT_TEST_OUT/check\"\nexec sleep 60\n";
    fs::permissions(bin / "python3", fs::perms::owner_all);
    const auto script = (dir.path / "train.py").string();
    std::ofstream(script) << "print('not run')\n";
    auto r = run_launcher({"-n", "1", script},
                          [&dir](child& c) -> asio::awaitable<void> {
                            co_await files_appear(dir.path, 1, "check");
                            c.signal(SIGKILL);
                          },
                          {{"PATH", bin.string() + ":/usr/bin:/bin"},
                           {"COHORT_TEST_OUT", dir.path.string()},
                           {"TMPDIR", tmp.path.string()}});
    CHECK(r.status.signal() == SIGKILL);
    REQUIRE(fs::exists(dir.path / "check"));
    const auto check = static_cast<pid_t>(std::stol(read_file(dir.path / "check")));
    CHECK(test::within(10s, [check] { return !test::alive(check); }, 5ms));
    if (test::alive(check)) ::kill(check, SIGKILL);
  }

  TEST_CASE("a python3 that does not say within 10 s whether it finds torch is taken as not finding it, and named") {
    test::temp_dir dir;
    // A stalls on the question, in a child of its own whose pid it names
    // in `child`; B finds torch and says what it runs.
    const auto child_file = dir.path / "child";
    for (const char* name : {"A", "B"}) {
      fs::create_directories(dir.path / name);
      std::ofstream(dir.path / name / "python3")
          << "#!/bin/sh\ncase \"$*\" in *find_spec*) "
          << (name[0] == 'A' ? "sleep 60 & echo $! > '" + child_file.string() + "'; wait" : std::string("exit 0"))
          << ";; esac\n"
          << "echo \"" << name << " $*\"\n";
      fs::permissions(dir.path / name / "python3", fs::perms::owner_all);
    }
    const auto script = (dir.path / "train.py").string();
    std::ofstream(script) << "print('not run here')\n";
    const auto a = (dir.path / "A").string(), b = (dir.path / "B").string();
    const auto started = std::chrono::steady_clock::now();
    auto r = run_launcher({"-n", "1", script}, {{"PATH", a + ":" + b + ":/usr/bin:/bin"}});
    INFO(r.err);
    CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(40));  // not the stall's minute
    CHECK(r.status.code() == 0);
    CHECK(r.out == "B -u " + script + "\n");
    CHECK(r.err.find("cohort-run: " + a + "/python3 did not say within 10 s whether it finds torch: "
                     "taken as not finding it\n") != std::string::npos);
    // Its child is killed with it: the check's whole process group.
    REQUIRE(fs::exists(child_file));
    const auto stalled = static_cast<pid_t>(std::stol(read_file(child_file)));
    CHECK(test::within(10s, [stalled] { return !test::alive(stalled); }, 5ms));
  }

  TEST_CASE("a worker that ignores SIGTERM is SIGKILLed after --grace-period") {
    auto r = run_launcher({"-n", "2", "--grace-period", "0.2", "--", "/bin/sh", "-c",
                           "if [ $RANK = 0 ]; then sleep 0.3; exit 5; fi; trap '' TERM; sleep 30"});
    CHECK(r.status.code() == 5);
  }

  TEST_CASE("SIGUSR1 and SIGUSR2 reach every worker by default, the run going on; --signals-to-forward adds others") {
    for (int sig : {SIGUSR1, SIGUSR2, SIGWINCH}) {
      CAPTURE(sig);
      test::temp_dir dir;
      std::vector<std::string> args{"-n", "2"};
      if (sig == SIGWINCH) args.insert(args.end(), {"--signals-to-forward", "SIGWINCH"});
      const std::string name = signal_name(sig).substr(3);
      args.insert(args.end(), {"--", "/bin/sh", "-c",
                               "trap 'echo got > \"$0/sig-$RANK\"; exit 0' " + name + "; echo > \"$0/$RANK\"; "
                               "while true; do sleep 0.05; done",
                               dir.path.string()});
      auto r = run_launcher(args, signal_when_up(dir.path, 2, sig));
      CHECK(r.status.code() == 0);
      CHECK(read_file(dir.path / "sig-0") == "got\n");
      CHECK(read_file(dir.path / "sig-1") == "got\n");
    }
  }

  // Before, --signals-to-handle SIGCHLD was taken: each rank's exit then
  // interrupted the run, exit 128 + 17, though every rank succeeded.
  TEST_CASE("signals cohort-run gets in its own work are refused as shutdown or forwarded signals, exit 2, saying why") {
    const std::vector<std::tuple<std::string, std::string, std::string>> refused{
        {"--signals-to-handle", "SIGTERM,SIGCHLD", "SIGCHLD is refused: cohort-run gets one each time a rank"},
        {"--signals-to-handle", "PIPE", "SIGPIPE is refused: cohort-run raises it itself"},
        {"--signals-to-handle", "SIGCONT", "SIGCONT is refused: cohort-run gets one each time it is resumed"},
        {"--signals-to-handle", std::to_string(SIGWINCH),
         "SIGWINCH is refused: cohort-run gets one each time its terminal is resized"},
        {"--signals-to-forward", "SIGUSR1,CHLD", "SIGCHLD is refused: cohort-run gets one each time a rank"},
        {"--signals-to-forward", "SIGPIPE", "SIGPIPE is refused: cohort-run raises it itself"},
        {"--signals-to-handle", "KILL", "SIGKILL is refused: no process can catch it"},
        {"--signals-to-forward", std::to_string(SIGSTOP), "SIGSTOP is refused: no process can catch it"}};
    for (const auto& [flag, list, said] : refused) {
      CAPTURE(flag);
      CAPTURE(list);
      auto r = run_launcher({flag, list, "-n", "2", "--", "/bin/sh", "-c", "echo ran"});
      INFO(r.err);
      CHECK(r.status.code() == 2);
      CHECK(r.out.empty());
      CHECK(r.err.find(flag + ": " + said) != std::string::npos);
    }
  }

  TEST_CASE("a grandchild that escaped with setsid is gone when cohort-run ends") {
    test::temp_dir dir;
    auto r = run_launcher({"-n", "1", "--", "/bin/sh", "-c", "setsid sleep 60 & echo $! > \"$0/grandchild\"; exit 0",
                           dir.path.string()});
    CHECK(r.status.code() == 0);
    const pid_t grandchild = std::stoi(read_file(dir.path / "grandchild"));
    CHECK_FALSE(test::alive(grandchild));
  }

  TEST_CASE("cohort-run killed with SIGKILL leaves no worker, no setsid grandchild and no unmarked one behind") {
    test::temp_dir dir;
    // (Nothing keeps cohort-run's output open: its end is not waited for.)
    // The fresh ones carry no marker: they are found in their rank's
    // process group, as is the sleep that one of them starts.
    auto r = run_launcher({"-n", "2", "--", "/bin/sh", "-c",
                           "exec >/dev/null 2>&1; setsid sleep 60 & echo $! > \"$0/grandchild-$RANK\"; "
                           "sleep 60 & echo $! > \"$0/child-$RANK\"; "
                           "env -i /bin/sleep 60 & echo $! > \"$0/fresh-$RANK\"; "
                           "env -i /bin/sh -c 'sleep 60 & echo $! > \"$0\"; wait' \"$0/fresh-grandchild-$RANK\" & "
                           "while [ ! -s \"$0/fresh-grandchild-$RANK\" ]; do sleep 0.01; done; "
                           "echo $$ > \"$0/$RANK\"; : > \"$0/up-$RANK\"; wait",
                           dir.path.string()},
                          signal_when_up(dir.path, 2, SIGKILL, "up-"));
    CHECK(r.status.signal() == SIGKILL);
    std::vector<pid_t> left;
    for (const char* name : {"0", "1", "child-0", "child-1", "grandchild-0", "grandchild-1", "fresh-0", "fresh-1",
                             "fresh-grandchild-0", "fresh-grandchild-1"}) {
      left.push_back(std::stoi(read_file(dir.path / name)));
    }
    // The workers die by their parent-death signal, the grandchildren by the
    // guardian: a moment after cohort-run.
    const auto none_alive = [&] { return std::none_of(left.begin(), left.end(), [](pid_t p) { return test::alive(p); }); };
    CHECK(test::within(10s, none_alive, 5ms));
  }

  TEST_CASE("each rank leads a session of its own, as torchrun's workers do: a terminal does not stop it") {
    // In cohort-run's session a rank would be a background job of its
    // terminal, stopped by SIGTTIN at its first read (a debugger's prompt).
    auto r = run_launcher({"-n", "2", "--no-python", "sh", "-c", "echo $$ $(cut -d' ' -f5,6 /proc/$$/stat)"});
    REQUIRE(r.status.code() == 0);
    std::istringstream lines(r.out);
    int seen = 0;
    for (std::string line; std::getline(lines, line); ++seen) {
      CAPTURE(line);
      std::istringstream in(line.substr(line.find_first_of("0123456789")));
      pid_t pid = 0, pgid = 0, sid = 0;
      in >> pid >> pgid >> sid;
      CHECK(pid > 0);
      CHECK(pgid == pid);
      CHECK(sid == pid);
    }
    CHECK(seen == 2);
  }

  TEST_CASE("cohort-run started with SIGCHLD ignored still sees its ranks' exits") {
    // Ignored by its starter, as an ignored signal stays across exec.
    const std::string script = "import os, signal, sys; signal.signal(signal.SIGCHLD, signal.SIG_IGN); "
                               "os.execv(sys.argv[1], sys.argv[1:])";
    auto r = run_command(command("python3", {"-c", script, launcher, "-n", "2", "--no-python", "sh", "-c", "exit 3"}),
                         [](child&) -> asio::awaitable<void> { co_return; }, {});
    CHECK(r.status.code() == 3);
    CHECK(r.err.find("exitcode   : 3") != std::string::npos);
    CHECK(r.err.find("ignores SIGCHLD") == std::string::npos);
  }

  TEST_CASE("signals cohort-run handles but was started ignoring are not ignored in its ranks") {
    // A shell ignores SIGINT and SIGQUIT for `cohort-run ... &`: its ranks
    // must still take Ctrl-C (a Python rank as KeyboardInterrupt), as
    // torchrun's do. SIGUSR1, which it forwards here, and SIGUSR2, which it
    // neither handles nor forwards, stay ignored, as torchrun, which
    // handles neither, leaves them.
    const std::string script = "trap '' INT QUIT USR1 USR2; exec \"$0\" --signals-to-forward SIGUSR1 -n 1 "
                               "--no-python sh -c 'grep SigIgn /proc/self/status'";
    auto r = run_command(command("/bin/sh", {"-c", script, launcher}),
                         [](child&) -> asio::awaitable<void> { co_return; }, {});
    REQUIRE(r.status.code() == 0);
    const auto at = r.out.find("SigIgn:");
    REQUIRE(at != std::string::npos);
    const unsigned long long ignored = std::stoull(r.out.substr(at + 7), nullptr, 16);
    CHECK((ignored & (1ULL << (SIGINT - 1))) == 0);
    CHECK((ignored & (1ULL << (SIGQUIT - 1))) == 0);
    CHECK((ignored & (1ULL << (SIGUSR1 - 1))) != 0);
    CHECK((ignored & (1ULL << (SIGUSR2 - 1))) != 0);
  }

  TEST_CASE("SIGINT reaches the workers as SIGINT first; the summary says the run was interrupted; exit 130") {
    test::temp_dir dir;
    auto r = run_launcher({"-n", "2", "--grace-period", "5", "--", "/bin/sh", "-c",
                           "trap 'echo int > \"$0/int-$RANK\"; exit 0' INT; echo > \"$0/$RANK\"; "
                           "while true; do sleep 0.05; done",
                           dir.path.string()},
                          signal_when_up(dir.path, 2, SIGINT));
    CHECK(r.status.code() == 130);
    CHECK(read_file(dir.path / "int-0") == "int\n");
    CHECK(read_file(dir.path / "int-1") == "int\n");
    CHECK(r.err.find("interrupted by SIGINT") != std::string::npos);
    CHECK(r.err.find("failed") == std::string::npos);
  }

  // Before, the same SIGINT twice (a terminal's Ctrl-C on `timeout N
  // cohort-run`, which passes it on) was a second shutdown signal: the
  // ranks were killed at once, their handlers cut short.
  TEST_CASE("the same shutdown signal again within 100 ms is one signal: the ranks' handlers run to their end") {
    test::temp_dir dir;
    auto r = run_launcher({"-n", "2", "--grace-period", "10", "--", "/bin/sh", "-c",
                           "trap 'sleep 0.3; echo int > \"$0/int-$RANK\"; exit 0' INT; echo > \"$0/$RANK\"; "
                           "while true; do sleep 0.05; done",
                           dir.path.string()},
                          [&dir](child& c) -> asio::awaitable<void> {
                            co_await files_appear(dir.path, 2);
                            c.signal(SIGINT);
                            // Again as soon as cohort-run has taken the first (a second
                            // pending one would be the same), well within its 100 ms.
                            for (int i = 0; i < 1'000'000 && pending(c.pid(), SIGINT); ++i) std::this_thread::yield();
                            c.signal(SIGINT);
                          });
    CHECK(r.status.code() == 130);
    CHECK(read_file(dir.path / "int-0") == "int\n");
    CHECK(read_file(dir.path / "int-1") == "int\n");
  }

  // Before, SIGTERM and SIGINT pending together were read as SIGINT, then
  // SIGTERM as a second signal: the ranks were killed at once, their
  // handlers cut short.
  TEST_CASE("two shutdown signals pending together are one: the lowest numbered is named, the ranks' handlers run to their end") {
    test::temp_dir dir;
    auto r = run_launcher({"-n", "2", "--grace-period", "10", "--", "/bin/sh", "-c",
                           "trap 'sleep 0.3; echo int > \"$0/int-$RANK\"; exit 0' INT; "
                           "trap 'sleep 0.3; echo term > \"$0/term-$RANK\"; exit 0' TERM; echo > \"$0/$RANK\"; "
                           "while true; do sleep 0.05; done",
                           dir.path.string()},
                          [&dir](child& c) -> asio::awaitable<void> {
                            co_await files_appear(dir.path, 2);
                            // Stopped, cohort-run reads neither until both are pending.
                            c.signal(SIGSTOP);
                            asio::steady_timer timer(co_await asio::this_coro::executor);
                            while (test::state_of(c.pid()) != 'T') {
                              timer.expires_after(5ms);
                              co_await timer.async_wait(asio::use_awaitable);
                            }
                            c.signal(SIGTERM);
                            c.signal(SIGINT);
                            c.signal(SIGCONT);
                          });
    INFO(r.err);
    CHECK(r.status.code() == 128 + SIGINT);
    CHECK(r.err.find("interrupted by SIGINT") != std::string::npos);
    CHECK(read_file(dir.path / "int-0") == "int\n");
    CHECK(read_file(dir.path / "int-1") == "int\n");
    CHECK_FALSE(fs::exists(dir.path / "term-0"));
    CHECK_FALSE(fs::exists(dir.path / "term-1"));
  }

  TEST_CASE("a Python script runs with the first python3 in PATH that finds torch, as torchrun runs it") {
    test::temp_dir dir;
    // Interpreters that say what they were asked to run; only B finds torch.
    for (const char* name : {"A", "B"}) {
      fs::create_directories(dir.path / name);
      std::ofstream(dir.path / name / "python3")
          << "#!/bin/sh\ncase \"$*\" in *find_spec*) exit " << (name[0] == 'A' ? 1 : 0) << ";; esac\n"
          << "echo \"" << name << " $*\" > \"$COHORT_TEST_OUT/$RANK\"\n";
      fs::permissions(dir.path / name / "python3", fs::perms::owner_all);
    }
    fs::create_directories(dir.path / "out");
    const auto script = (dir.path / "train.py").string();
    std::ofstream(script) << "print('not run here')\n";
    const auto a = (dir.path / "A").string(), b = (dir.path / "B").string();
    const auto ran = [&](std::vector<std::string> args, const std::string& path,
                         std::map<std::string, std::string> env = {}) {
      fs::remove_all(dir.path / "out");
      fs::create_directories(dir.path / "out");
      env["PATH"] = path;
      env["COHORT_TEST_OUT"] = (dir.path / "out").string();
      auto r = run_launcher(std::move(args), env);
      CHECK_MESSAGE(r.status.code() == 0, r.err);
      return fs::exists(dir.path / "out" / "1") ? read_file(dir.path / "out" / "1") : std::string("(not run)");
    };
    CHECK(ran({"--nproc-per-node", "2", script, "--lr", "3"}, a + ":" + b) == "B -u " + script + " --lr 3\n");
    CHECK(ran({"-n", "2", script}, a) == "A -u " + script + "\n");  // none finds torch: the first
    CHECK(ran({"-n", "2", "--python", a + "/python3", script}, a + ":" + b) == "A -u " + script + "\n");
    CHECK(ran({"-n", "2", script}, a + ":" + b, {{"COHORT_PYTHON", a + "/python3"}}) == "A -u " + script + "\n");
    CHECK(ran({"-n", "2", "-m", "pkg.train", "x"}, a + ":" + b) == "B -u -m pkg.train x\n");
    CHECK(ran({"-n", "2", "--module", "pkg.train"}, a + ":" + b, {{"PET_NO_PYTHON", "0"}}) == "B -u -m pkg.train\n");
    const auto run_path = ran({"-n", "2", "--run_path", script, "y"}, a + ":" + b);
    CHECK(run_path.rfind("B -u -c import runpy", 0) == 0);
    CHECK(run_path.find(" " + script + " y\n") != std::string::npos);
    // A program, not a script: as it is (--no-python, after --, or an executable).
    CHECK(ran({"-n", "2", "--no-python", b + "/python3", "z"}, a) == "B z\n");
    CHECK(ran({"-n", "2", "--", b + "/python3", "z"}, a) == "B z\n");
    CHECK(ran({"-n", "2", b + "/python3", "z"}, a) == "B z\n");
    // A folder (its __main__.py), and a name that PATH does not hold but
    // the current folder does, even executable: Python's, as torchrun runs them.
    const auto app = (dir.path / "app").string();
    fs::create_directories(app);
    std::ofstream(app + "/__main__.py") << "print('not run here')\n";
    CHECK(ran({"-n", "2", app, "w"}, a + ":" + b) == "B -u " + app + " w\n");
    std::ofstream(dir.path / "trainx") << "#!/bin/sh\necho not run here\n";
    fs::permissions(dir.path / "trainx", fs::perms::owner_all);
    fs::remove_all(dir.path / "out");
    fs::create_directories(dir.path / "out");
    const command in_dir("/bin/sh", {"-c", "cd \"$0\" && exec \"$1\" -n 2 trainx v", dir.path.string(), launcher});
    const auto here = run_command(in_dir, [](child&) -> asio::awaitable<void> { co_return; },
                                  {{"PATH", a + ":" + b}, {"COHORT_TEST_OUT", (dir.path / "out").string()}});
    CHECK_MESSAGE(here.status.code() == 0, here.err);
    CHECK(fs::exists(dir.path / "out" / "1"));
    if (fs::exists(dir.path / "out" / "1")) CHECK(read_file(dir.path / "out" / "1") == "B -u trainx v\n");
    auto missing = run_launcher({"-n", "2", (dir.path / "nothere.py").string()}, {{"PATH", a + ":" + b}});
    CHECK(missing.status.code() == 127);
    CHECK(missing.err.find("nothere.py: no such script") != std::string::npos);
    auto both = run_launcher({"-m", "--no-python", "mod"});
    CHECK(both.status.code() == 2);
  }

  // Before, the check ran with the current folder first in sys.path, as
  // `-c` puts it: an empty torch/ folder there was found, as a namespace
  // package, and an interpreter without torch was chosen.
  TEST_CASE("a torch folder in the current folder does not make a python3 without torch the one chosen") {
    test::temp_dir dir;
    std::string python;
    for (const char* candidate : {"/usr/bin/python3", "/bin/python3"}) {
      if (python.empty() && ::access(candidate, X_OK) == 0) python = candidate;
    }
    if (python.empty()) {
      MESSAGE("no /usr/bin/python3: skipped");
      return;
    }
    fs::create_directories(dir.path / "work" / "torch");
    // Without its site folder (-S), A's interpreter finds no installed
    // torch, only the folder; B says it finds torch.
    const std::string without_torch = python + " -S -c 'import importlib.util, sys; "
                                               "sys.exit(importlib.util.find_spec(\"torch\") is None)'";
    const std::string in_work = "cd " + (dir.path / "work").string() + " && " + without_torch;
    REQUIRE_MESSAGE(std::system(in_work.c_str()) == 0, "the trap: the folder is found from the current folder");
    for (const char* name : {"A", "B"}) {
      fs::create_directories(dir.path / name);
      std::ofstream(dir.path / name / "python3")
          << "#!/bin/sh\ncase \"$*\" in *find_spec*) "
          << (name[0] == 'A' ? "exec " + python + " -S \"$@\"" : std::string("exit 0")) << ";; esac\n"
          << "echo \"" << name << "\" > \"$COHORT_TEST_OUT\"\n";
      fs::permissions(dir.path / name / "python3", fs::perms::owner_all);
    }
    const auto script = (dir.path / "train.py").string();
    std::ofstream(script) << "print('not run here')\n";
    const auto out = dir.path / "ran";
    const command in_dir("/bin/sh", {"-c", "cd \"$0\" && exec \"$1\" -n 1 \"$2\"", (dir.path / "work").string(),
                                     launcher, script});
    const auto r = run_command(in_dir, [](child&) -> asio::awaitable<void> { co_return; },
                               {{"PATH", (dir.path / "A").string() + ":" + (dir.path / "B").string()},
                                {"COHORT_TEST_OUT", out.string()}});
    CHECK_MESSAGE(r.status.code() == 0, r.err);
    CHECK(read_file(out) == "B\n");
  }

  TEST_CASE("a venv's python3 that finds torch is chosen after its base interpreter that does not") {
    test::temp_dir dir;
    const auto venv = dir.path / "venv";
    // A venv with a torch package of its own (a stub: it is only found).
    const auto make = dir.path / "make-venv.sh";
    std::ofstream(make) << "timeout 60 python3 -m venv --without-pip \"$1\" >/dev/null 2>&1 &&\n"
                        << "site=$(\"$1/bin/python3\" -c "
                        << "'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])') &&\n"
                        << "mkdir -p \"$site/torch\" && : > \"$site/torch/__init__.py\"\n";
    const std::string made = "/bin/sh " + make.string() + " " + venv.string();
    std::error_code ec;
    const bool venv_made = std::system(made.c_str()) == 0;
    const auto base_python = fs::read_symlink(venv / "bin" / "python3", ec);
    if (!venv_made || ec || base_python.is_relative()) {
      MESSAGE("python3 -m venv made no venv whose python3 links to its base interpreter here: skipped");
      return;
    }
    const std::string base_finds = base_python.string() + " -c 'import importlib.util, sys; "
                                                          "sys.exit(importlib.util.find_spec(\"torch\") is None)'";
    if (std::system(base_finds.c_str()) == 0) {
      MESSAGE(base_python.string(), " finds torch itself: skipped");
      return;
    }
    const auto script = dir.path / "prefix.py";
    std::ofstream(script) << "import os, sys\nopen(os.environ['COHORT_TEST_OUT'], 'w').write(sys.prefix)\n";
    const auto out = dir.path / "prefix";
    // The base interpreter comes first in PATH, and finds no torch.
    const auto path = base_python.parent_path().string() + ":" + (venv / "bin").string();
    auto r = run_launcher({"-n", "1", script.string()}, {{"PATH", path}, {"COHORT_TEST_OUT", out.string()}});
    CHECK_MESSAGE(r.status.code() == 0, r.err);
    CHECK(read_file(out) == venv.string());
  }

  TEST_CASE("torchrun's flags with dashes or underscores, and from PET_ variables; the command line wins") {
    test::temp_dir dir;
    const auto files_in = [](const fs::path& d) {
      std::size_t n = 0;
      for ([[maybe_unused]] const auto& e : fs::directory_iterator(d)) ++n;
      return n;
    };
    auto r = run_launcher({"--nproc_per_node", "2", "--max_restarts", "1", "--rdzv_backend", "static", "--master_port",
                           "29877", "--", "/bin/sh", "-c", dump_contract, dir.path.string()});
    REQUIRE(r.status.code() == 0);
    auto v = variables_in(dir.path / "1");
    CHECK(v["WORLD_SIZE"] == "2");
    CHECK(v["MASTER_PORT"] == "29877");
    CHECK(v["TORCHELASTIC_MAX_RESTARTS"] == "1");
    test::temp_dir from_env;
    r = run_launcher({"--", "/bin/sh", "-c", dump_contract, from_env.path.string()},
                     {{"PET_NPROC_PER_NODE", "3"}, {"PET_ROLE", "trainer"}, {"PET_NNODES", "2"}, {"PET_NODE_RANK", "1"},
                      {"PET_MASTER_ADDR", "10.1.2.3"}, {"TORCH_ELASTIC_WORKER_IDENTICAL", "1"}});
    REQUIRE(r.status.code() == 0);
    CHECK(files_in(from_env.path) == 3);
    v = variables_in(from_env.path / "5");  // node 1 of 2, 3 ranks each
    CHECK(v["ROLE_NAME"] == "trainer");
    CHECK(v["MASTER_ADDR"] == "10.1.2.3");
    test::temp_dir wins;
    r = run_launcher({"-n", "2", "--role", "cmdline", "--", "/bin/sh", "-c", dump_contract, wins.path.string()},
                     {{"PET_NPROC_PER_NODE", "3"}, {"PET_ROLE", "trainer"}, {"PET_MAX_RESTARTS", "4"}});
    REQUIRE(r.status.code() == 0);
    CHECK(files_in(wins.path) == 2);
    CHECK(variables_in(wins.path / "0")["ROLE_NAME"] == "cmdline");
    CHECK(variables_in(wins.path / "0")["TORCHELASTIC_MAX_RESTARTS"] == "4");
    // Set but empty (PET_NPROC_PER_NODE=$NGPUS, NGPUS unset): torchrun
    // fails on the "" for a number or a switch; the default must not apply
    // unsaid. Not refused where the flag is given, or where "" is the
    // flag's own default.
    for (const char* name : {"PET_NPROC_PER_NODE", "PET_MAX_RESTARTS", "PET_STANDALONE"}) {
      CAPTURE(name);
      r = run_launcher({"--no-python", "true"}, {{name, ""}});
      CHECK(r.status.code() == 2);
      CHECK(r.err.find(std::string(name) + " is set but empty") != std::string::npos);
    }
    CHECK(run_launcher({"-n", "1", "--no-python", "true"}, {{"PET_NPROC_PER_NODE", ""}}).status.code() == 0);
    CHECK(run_launcher({"--no-python", "true"}, {{"PET_RDZV_ENDPOINT", ""}}).status.code() == 0);
  }

  // Before, both were refused as set but empty.
  TEST_CASE("PET_LOCAL_RANKS_FILTER=\"\" is no filter and PET_ROLE=\"\" the role \"\", as torchrun takes them") {
    auto r = run_launcher({"-n", "2", "--", "/bin/sh", "-c", "echo rank $LOCAL_RANK"}, {{"PET_LOCAL_RANKS_FILTER", ""}});
    CHECK_MESSAGE(r.status.code() == 0, r.err);
    CHECK(r.out.find("rank 0\n") != std::string::npos);
    CHECK(r.out.find("rank 1\n") != std::string::npos);
    test::temp_dir dir;
    r = run_launcher({"-n", "1", "--", "/bin/sh", "-c", dump_contract, dir.path.string()}, {{"PET_ROLE", ""}});
    CHECK_MESSAGE(r.status.code() == 0, r.err);
    CHECK(variables_in(dir.path / "0")["ROLE_NAME"].empty());
    // The command line still wins.
    r = run_launcher({"-n", "1", "--role", "trainer", "--", "/bin/sh", "-c", dump_contract, dir.path.string()},
                     {{"PET_ROLE", ""}});
    CHECK_MESSAGE(r.status.code() == 0, r.err);
    CHECK(variables_in(dir.path / "0")["ROLE_NAME"] == "trainer");
  }

  TEST_CASE("flags as torchrun's parser reads them: given twice, the last wins; abbreviated, when one flag is meant") {
    test::temp_dir twice;
    auto r = run_launcher({"--nproc-per-node", "3", "--nproc_per_node=2", "--role", "a", "--role", "b", "--standalone",
                           "--standalone", "--", "/bin/sh", "-c", dump_contract, twice.path.string()});
    REQUIRE_MESSAGE(r.status.code() == 0, r.err);
    CHECK_FALSE(fs::exists(twice.path / "2"));
    auto v = variables_in(twice.path / "1");
    CHECK(v["WORLD_SIZE"] == "2");
    CHECK(v["ROLE_NAME"] == "b");
    // --nproc starts only the two spellings of --nproc-per-node; --max_r
    // only --max_restarts; --nn=, with its value attached, only --nnodes.
    test::temp_dir short_forms;
    r = run_launcher({"--nproc", "2", "--max_r", "1", "--nn=1", "--ro", "c", "--", "/bin/sh", "-c", dump_contract,
                      short_forms.path.string()});
    REQUIRE_MESSAGE(r.status.code() == 0, r.err);
    v = variables_in(short_forms.path / "1");
    CHECK(v["WORLD_SIZE"] == "2");
    CHECK(v["TORCHELASTIC_MAX_RESTARTS"] == "1");
    CHECK(v["ROLE_NAME"] == "c");
    // A value that reads as a flag is refused, not taken: a value left out.
    r = run_launcher({"--role", "--standalone", "--", "/bin/true"});
    CHECK(r.status.code() == 2);
    CHECK(r.err.find("--role: expected a value, not '--standalone'") != std::string::npos);
    r = run_launcher({"--rdzv-conf", "--", "/bin/true"});
    CHECK(r.status.code() == 2);
    CHECK(r.err.find("--rdzv-conf: expected a value, not '--'") != std::string::npos);
    r = run_launcher({"--standalone=0", "--", "/bin/true"});  // a flag takes no value
    CHECK(r.status.code() == 2);
    CHECK(r.err.find("--standalone: takes no value, '0' given") != std::string::npos);
    // A prefix of several flags is refused, naming them.
    r = run_launcher({"--rdzv", "x", "--", "/bin/true"});
    CHECK(r.status.code() == 2);
    CHECK(r.err.find("ambiguous option: --rdzv could match --rdzv-backend") != std::string::npos);
    CHECK(r.err.find("--rdzv-endpoint") != std::string::npos);
    // A prefix of one of torchrun's flags and of cohort-run's own means
    // torchrun's (--te: --tee, not --tee-through-pipes), and a short flag
    // takes its value after '=' as torchrun's parser does (-n=2).
    test::temp_dir torchruns;
    r = run_launcher({"--te", "0", "-n=2", "--", "/bin/sh", "-c", dump_contract, torchruns.path.string()});
    REQUIRE_MESSAGE(r.status.code() == 0, r.err);
    CHECK(variables_in(torchruns.path / "1")["WORLD_SIZE"] == "2");
    r = run_launcher({"-m=1", "--", "/bin/true"});
    CHECK(r.status.code() == 2);
    CHECK(r.err.find("-m: takes no value, '1' given") != std::string::npos);
    // The program's own arguments are its own, after "--" or without it.
    test::temp_dir own;
    const std::string echo = "echo \"$@\" > \"$0/$RANK\"";
    r = run_launcher({"-n", "1", "--", "/bin/sh", "-c", echo, own.path.string(), "--nproc", "--rdzv"});
    REQUIRE_MESSAGE(r.status.code() == 0, r.err);
    CHECK(read_file(own.path / "0") == "--nproc --rdzv\n");
    test::temp_dir own_without;
    r = run_launcher({"-n", "1", "--max", "0", "/bin/sh", "-c", echo, own_without.path.string(), "--nn", "--stand"});
    REQUIRE_MESSAGE(r.status.code() == 0, r.err);
    CHECK(read_file(own_without.path / "0") == "--nn --stand\n");
    // A flag takes no value: what follows it is the next flag, or the program.
    test::temp_dir after_flag;
    r = run_launcher({"--standalone", "--nproc", "1", "--no-python", "/bin/sh", "-c", echo, after_flag.path.string(),
                      "--log_dir", "x", "--n", "1"});
    REQUIRE_MESSAGE(r.status.code() == 0, r.err);
    CHECK(read_file(after_flag.path / "0") == "--log_dir x --n 1\n");
    // An empty value given with "=" is the value; the next argument is not.
    test::temp_dir empty_value;
    r = run_launcher(
        {"--role=", "--nproc-per-node=2", "--", "/bin/sh", "-c", dump_contract, empty_value.path.string()});
    REQUIRE_MESSAGE(r.status.code() == 0, r.err);
    v = variables_in(empty_value.path / "1");
    CHECK(v["WORLD_SIZE"] == "2");
    CHECK(v["ROLE_NAME"].empty());
  }

  TEST_CASE("--rdzv-backend c10d with a fixed --nnodes: its endpoint is the master's address and port") {
    test::temp_dir dir;
    auto r = run_launcher({"--rdzv-backend", "c10d", "--rdzv-endpoint", "10.1.1.1:1234", "--nnodes", "2", "--node-rank",
                           "1", "-n", "1", "--", "/bin/sh", "-c", dump_contract, dir.path.string()},
                          identical_nodes);
    REQUIRE_MESSAGE(r.status.code() == 0, r.err);
    auto v = variables_in(dir.path / "1");
    CHECK(v["MASTER_ADDR"] == "10.1.1.1");
    CHECK(v["MASTER_PORT"] == "1234");
    CHECK(v["GROUP_RANK"] == "1");
    test::temp_dir default_port;
    r = run_launcher({"--rdzv_backend", "c10d", "--rdzv_endpoint", "head", "--", "/bin/sh", "-c", dump_contract,
                      default_port.path.string()});
    REQUIRE(r.status.code() == 0);
    CHECK(variables_in(default_port.path / "0")["MASTER_PORT"] == "29400");  // torchrun's c10d port
    // Port 0 on one node, as torchrun's stacked single-node form gives it:
    // a free port.
    test::temp_dir any_port;
    r = run_launcher({"--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", "--nnodes", "1", "--", "/bin/sh", "-c",
                      dump_contract, any_port.path.string()});
    REQUIRE_MESSAGE(r.status.code() == 0, r.err);
    auto picked = variables_in(any_port.path / "0");
    CHECK(picked["MASTER_ADDR"] == "localhost");
    CHECK(std::stoi(picked["MASTER_PORT"]) > 0);
    // Across nodes, torchrun's c10d line names no node rank (its
    // rendezvous hands them out): refused rather than every node being
    // node 0. Under srun, Slurm's node id is the node rank.
    r = run_launcher({"--rdzv-backend", "c10d", "--rdzv-endpoint", "10.1.1.1:1234", "--nnodes", "2", "--", "/bin/true"});
    CHECK(r.status.code() == 2);
    CHECK(r.err.find("give each node its --node-rank") != std::string::npos);
    r = run_launcher({"--rdzv-backend", "c10d", "--rdzv-endpoint", "10.1.1.1:0", "--nnodes", "2", "--node-rank", "0", "--",
                      "/bin/true"});
    CHECK(r.status.code() == 2);
    CHECK(r.err.find("port 0") != std::string::npos);
    r = run_launcher({"--rdzv-backend", "c10d", "--rdzv-endpoint", "10.1.1.1:65536", "--", "/bin/true"});
    CHECK(r.status.code() == 2);
    test::temp_dir slurm_node;
    const std::map<std::string, std::string> step{{"SLURM_STEP_ID", "0"},
                                                  {"SLURM_NODEID", "1"},
                                                  {"SLURM_NNODES", "2"},
                                                  {"SLURM_JOB_ID", "77"},
                                                  {"SLURM_JOB_NODELIST", "a,b"},
                                                  {"TORCH_ELASTIC_WORKER_IDENTICAL", "1"}};
    r = run_launcher({"--rdzv-backend", "c10d", "--rdzv-endpoint", "10.1.1.1:1234", "--nnodes", "2", "--rdzv-id", "job",
                      "--", "/bin/sh", "-c", dump_contract, slurm_node.path.string()},
                     step);
    REQUIRE_MESSAGE(r.status.code() == 0, r.err);
    auto v1 = variables_in(slurm_node.path / "1");
    CHECK(v1["GROUP_RANK"] == "1");
    CHECK(v1["MASTER_ADDR"] == "10.1.1.1");
    CHECK(v1["TORCHELASTIC_RUN_ID"] == "job");
    // One node of its own under a step of two (each node its own job):
    // Slurm's node id is not this job's node rank.
    r = run_launcher({"--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", "--nnodes", "1", "--", "/bin/true"}, step);
    CHECK_MESSAGE(r.status.code() == 0, r.err);
    // Port 0 is refused across Slurm's two nodes as across --nnodes 2 (before,
    // each node of the step took port 29500, named by no one).
    for (const std::string node_id : {"0", "1"}) {
      CAPTURE(node_id);
      auto on_node = step;
      on_node["SLURM_NODEID"] = node_id;
      r = run_launcher({"--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", "--", "/bin/true"}, on_node);
      CHECK(r.status.code() == 2);
      CHECK_MESSAGE(r.err.find("port 0 (any free port) serves one node only, and the job has 2 nodes") !=
                        std::string::npos,
                    r.err);
    }
  }

  TEST_CASE("restarts across nodes without etcd are refused, in every spelling; one node restarts as before") {
    // No rendezvous tells the other nodes: they would run on in the attempt
    // that ended, and the restarted ranks join a world that is gone.
    const auto refused = [](std::vector<std::string> args, std::map<std::string, std::string> env = {}) {
      args.insert(args.end(), {"--", "/bin/true"});
      env.insert(identical_nodes.begin(), identical_nodes.end());  // no wait for the other node where it runs
      const auto r = run_launcher(args, env);
      CHECK(r.status.code() == 2);
      CHECK_MESSAGE(r.err.find("across 2 nodes needs --rdzv-backend etcd-v3") != std::string::npos, r.err);
      return r.err;
    };
    CHECK(refused({"--nnodes", "2", "--node-rank", "0", "--max-restarts", "1"}).find("under static") !=
          std::string::npos);
    CHECK(refused({"--rdzv-backend", "c10d", "--rdzv-endpoint", "10.1.1.1:1234", "--nnodes=2", "--node_rank=1",
                   "--max_restarts=3"})
              .find("--max-restarts 3 across 2 nodes needs --rdzv-backend etcd-v3: under c10d") != std::string::npos);
    refused({"--rdzv_backend=c10d", "--rdzv-endpoint", "10.1.1.1:1234", "--nnodes", "2:2", "--node-rank", "0",
             "--max-restarts", "1"});
    refused({}, {{"PET_NNODES", "2"}, {"PET_NODE_RANK", "1"}, {"PET_MAX_RESTARTS", "1"}});
    // Slurm's node count, where the flags give none.
    refused({"--max-restarts", "1"}, {{"SLURM_STEP_ID", "0"},
                                      {"SLURM_NODEID", "1"},
                                      {"SLURM_NNODES", "2"},
                                      {"SLURM_JOB_ID", "77"},
                                      {"SLURM_JOB_NODELIST", "a,b"}});
    // One node: restarted as before, whichever backend it names.
    const char* second_time_lucky = "[ $TORCHELASTIC_RESTART_COUNT -ge 1 ]";
    for (const std::vector<std::string>& one_node :
         {std::vector<std::string>{"--nnodes", "1"}, std::vector<std::string>{"--standalone"},
          std::vector<std::string>{"--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", "--nnodes", "1:1"}}) {
      auto args = one_node;
      args.insert(args.end(), {"--max-restarts", "1", "--", "/bin/sh", "-c", second_time_lucky});
      const auto r = run_launcher(args);
      CHECK_MESSAGE(r.status.code() == 0, r.err);
      CHECK(r.err.find("attempt 0 failed") != std::string::npos);
      CHECK(r.err.find("(1 of 1 restarts)") != std::string::npos);
    }
  }

  TEST_CASE("--rdzv-backend static with --rdzv-endpoint: the endpoint is the master, before --master-addr and --master-port") {
    test::temp_dir dir;
    auto r = run_launcher({"--rdzv-endpoint", "10.1.1.2:2345", "--master-addr", "10.9.9.9", "--master-port", "9999",
                           "--nnodes", "2", "--node-rank", "1", "-n", "1", "--", "/bin/sh", "-c", dump_contract,
                           dir.path.string()},
                          identical_nodes);
    REQUIRE_MESSAGE(r.status.code() == 0, r.err);
    auto v = variables_in(dir.path / "1");
    CHECK(v["MASTER_ADDR"] == "10.1.1.2");
    CHECK(v["MASTER_PORT"] == "2345");
    // An IPv6 host in brackets, given without them to the ranks.
    test::temp_dir six;
    r = run_launcher({"--rdzv-backend", "static", "--rdzv-endpoint", "[fd00::7]:2346", "--", "/bin/sh", "-c",
                      dump_contract, six.path.string()});
    REQUIRE_MESSAGE(r.status.code() == 0, r.err);
    CHECK(variables_in(six.path / "0")["MASTER_ADDR"] == "fd00::7");
    CHECK(variables_in(six.path / "0")["MASTER_PORT"] == "2346");
    // torchrun's static rendezvous needs the port.
    r = run_launcher({"--rdzv-endpoint", "10.1.1.2", "--", "/bin/true"});
    CHECK(r.status.code() == 2);
    CHECK(r.err.find("needs the master's port") != std::string::npos);
    // Blanks around the endpoint are dropped, as torchrun drops them; a host
    // no name or address can be is refused at once, not waited for.
    test::temp_dir padded;
    r = run_launcher({"--rdzv-endpoint", " \t10.1.1.3:2347 ", "--nnodes", "2", "--node-rank", "1", "-n", "1", "--",
                      "/bin/sh", "-c", dump_contract, padded.path.string()},
                     identical_nodes);
    REQUIRE_MESSAGE(r.status.code() == 0, r.err);
    CHECK(variables_in(padded.path / "1")["MASTER_ADDR"] == "10.1.1.3");
    CHECK(variables_in(padded.path / "1")["MASTER_PORT"] == "2347");
    for (const std::string endpoint : {"bad/host:2345", "two words:2345", "host;rm:2345", "[fd00::7 ]:2346",
                                       "[host:5]:2345", "[fd00::7%]:2346", "host%eth0:2345", "[::1]x:2345",
                                       "[::1:2345"}) {
      CAPTURE(endpoint);
      r = run_launcher({"--rdzv-endpoint", endpoint, "--nnodes", "2", "--node-rank", "1", "--", "/bin/true"},
                       identical_nodes);
      CHECK(r.status.code() == 2);
      CHECK_MESSAGE(r.err.find("is not a host name, an IPv4 or an IPv6 address") != std::string::npos, r.err);
    }
    // An IPv6 address without brackets: torchrun takes its last ':' for the
    // port's (2001:db8::5 is host 2001:db8: and port 5). Refused, on one
    // node as on several, with the brackets it needs.
    for (const std::string endpoint : {"2001:db8::5", "::1", "fd00::7:2346", "fe80::1%eth0:2346"}) {
      for (const bool several : {false, true}) {
        CAPTURE(endpoint);
        CAPTURE(several);
        std::vector<std::string> args{"--rdzv-endpoint", endpoint};
        if (several) args.insert(args.end(), {"--nnodes", "2", "--node-rank", "1"});
        args.insert(args.end(), {"--", "/bin/true"});
        r = run_launcher(args, identical_nodes);
        CHECK(r.status.code() == 2);
        CHECK_MESSAGE(r.err.find("an IPv6 address goes in brackets, [addr]:port or [addr]") != std::string::npos,
                      r.err);
      }
    }
    // A port is 1 to 5 digits, as torchrun reads it: no sign, no blanks.
    for (const std::string endpoint : {"10.1.1.2:+5", "10.1.1.2: 2345", "10.1.1.2:2345 x", "10.1.1.2:",
                                       "10.1.1.2:000002345", "10.1.1.2:65536"}) {
      CAPTURE(endpoint);
      r = run_launcher({"--rdzv-endpoint", endpoint, "--", "/bin/true"});
      CHECK(r.status.code() == 2);
      CHECK_MESSAGE(r.err.find("is not 0 to 65535") != std::string::npos, r.err);
    }
    test::temp_dir leading_zero;
    r = run_launcher({"--rdzv-endpoint", "10.1.1.2:02345", "--nnodes", "2", "--node-rank", "1", "-n", "1", "--",
                      "/bin/sh", "-c", dump_contract, leading_zero.path.string()},
                     identical_nodes);
    REQUIRE_MESSAGE(r.status.code() == 0, r.err);
    CHECK(variables_in(leading_zero.path / "1")["MASTER_PORT"] == "2345");
    // The same of --master-addr, on one node as on several (before, its
    // ranks got MASTER_ADDR=two words, and node 1 waited out its join
    // timeout), and of --local-addr on every backend, under etcd-v3 before
    // etcd is asked (before, static and c10d took any).
    const std::vector<std::vector<std::string>> bad_hosts{
        {"--master-addr", "two words"},
        {"--master-addr", "two words", "--nnodes", "2", "--node-rank", "1", "--master-port", "2345"},
        {"--master-addr", ""},
        {"--rdzv-backend", "etcd-v3", "--rdzv-endpoint", "127.0.0.1:1", "--local-addr", "a/b"},
        {"--local-addr", "a/b"},
        {"--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:2345", "--local-addr", "a/b"}};
    for (const auto& flags : bad_hosts) {
      CAPTURE(flags[1]);
      std::vector<std::string> args = flags;
      args.insert(args.end(), {"--", "/bin/true"});
      r = run_launcher(args, identical_nodes);
      CHECK(r.status.code() == 2);
      CHECK(r.err.find(flags.back() == "a/b" ? "--local-addr 'a/b': the host is not a host name"
                       : flags[1].empty()    ? "--master-addr '': no host"
                                             : "--master-addr 'two words': the host is not a host name") !=
            std::string::npos);
    }
    // A ':' or a '%' is an IPv6 address's only: a host with its port, or a
    // colon that makes no IPv6 address, is refused (before, the ranks got
    // MASTER_ADDR=127.0.0.1:29500, and node 1 waited out its join timeout).
    const std::vector<std::vector<std::string>> not_addresses{
        {"--master-addr", "127.0.0.1:29500"},
        {"--master-addr", "127.0.0.1:29500", "--nnodes", "2", "--node-rank", "1", "--master-port", "2345"},
        {"--master-addr", "fd00::7::8"},
        {"--master-addr", "node%eth0"},
        {"--rdzv-backend", "etcd-v3", "--rdzv-endpoint", "127.0.0.1:1", "--local-addr", "10.0.0.1:5"},
        {"--local-addr", "127.0.0.1:29500"},
        {"--rdzv-backend", "c10d", "--local-addr", "127.0.0.1:29500"}};
    for (const auto& flags : not_addresses) {
      const auto& host = flags[0] == "--master-addr" ? flags[1] : flags.back();
      CAPTURE(host);
      std::vector<std::string> args = flags;
      args.insert(args.end(), {"--", "/bin/true"});
      r = run_launcher(args, identical_nodes);
      CHECK(r.status.code() == 2);
      CHECK_MESSAGE(r.err.find("'" + host + "': the host is not a host name, an IPv4 or an IPv6 address ('" + host +
                               "' holds ':' or '%', which only an IPv6 address does") != std::string::npos,
                    r.err);
      CHECK(r.err.find("[addr]:port") != std::string::npos);
    }
    // An IPv6 zone is a host's.
    test::temp_dir zoned;
    r = run_launcher({"--master-addr", "fe80::1%eth0", "--nnodes", "2", "--node-rank", "1", "--master-port", "2345",
                      "-n", "1", "--", "/bin/sh", "-c", dump_contract, zoned.path.string()},
                     identical_nodes);
    REQUIRE_MESSAGE(r.status.code() == 0, r.err);
    CHECK(variables_in(zoned.path / "1")["MASTER_ADDR"] == "fe80::1%eth0");
    // Brackets around an IPv6 address are taken off, as from the endpoint.
    test::temp_dir bracketed;
    r = run_launcher({"--master-addr", "[fd00::7]", "--nnodes", "2", "--node-rank", "1", "--master-port", "2345", "-n",
                      "1", "--", "/bin/sh", "-c", dump_contract, bracketed.path.string()},
                     identical_nodes);
    REQUIRE_MESSAGE(r.status.code() == 0, r.err);
    CHECK(variables_in(bracketed.path / "1")["MASTER_ADDR"] == "fd00::7");
    // --standalone is a node of its own, whatever endpoint is given.
    test::temp_dir alone;
    r = run_launcher({"--standalone", "--rdzv-endpoint", "10.1.1.2:2345", "--", "/bin/sh", "-c", dump_contract,
                      alone.path.string()});
    REQUIRE_MESSAGE(r.status.code() == 0, r.err);
    CHECK(variables_in(alone.path / "0")["MASTER_ADDR"] == "127.0.0.1");
    // And on a free port, whatever --master-port says (torchrun's localhost:0).
    test::temp_dir port_given;
    r = run_launcher({"--standalone", "--master-port", "1", "--", "/bin/sh", "-c", dump_contract,
                      port_given.path.string()});
    REQUIRE_MESSAGE(r.status.code() == 0, r.err);
    const auto port = variables_in(port_given.path / "0")["MASTER_PORT"];
    CHECK(port != "1");
    CHECK(std::stoi(port) > 1);
  }

  // torch's FileTimerClient writes one JSON line per request into the FIFO
  // (here a shell writes it): an expiry in seconds since the epoch, -1 to
  // release.
  TEST_CASE("TORCHELASTIC_ENABLE_FILE_TIMER=1: a rank whose timer expires gets its signal; a released one runs on") {
    const std::string request = "printf '{\"version\": 1, \"pid\": %s, \"scope_id\": \"%s\", \"expiration_time\": %s, "
                                "\"signal\": 9}\\n' \"$1\" \"$2\" \"$3\" > \"$TORCHELASTIC_TIMER_FILE\"";
    const auto started = std::chrono::steady_clock::now();
    auto r = run_launcher({"-n", "2", "--", "/bin/sh", "-c",
                           "r() { " + request + "; }; r $$ step $(( $(date +%s) + 2 )); "
                           "if [ $RANK = 0 ]; then r $$ step -1; fi; sleep 4; echo ran on $RANK"},
                          {{"TORCHELASTIC_ENABLE_FILE_TIMER", "1"}});
    CHECK(r.status.code() == 128 + SIGKILL);
    CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(10));
    CHECK(r.err.find("cohort-run: the file timer 'step' of pid ") != std::string::npos);
    CHECK(r.err.find("expired: it was sent SIGKILL") != std::string::npos);
    CHECK(r.err.find("rank       : 1 ") != std::string::npos);  // the root cause: the one not released
    CHECK(r.out.find("ran on 1") == std::string::npos);

    // A FIFO named by TORCHELASTIC_TIMER_FILE is made there, and goes with the run.
    test::temp_dir dir;
    const auto fifo = dir.path / "timer";
    r = run_launcher({"-n", "1", "--", "/bin/sh", "-c", "[ -p \"$TORCHELASTIC_TIMER_FILE\" ] && echo fifo"},
                     {{"TORCHELASTIC_ENABLE_FILE_TIMER", "1"}, {"TORCHELASTIC_TIMER_FILE", fifo.string()}});
    CHECK(r.status.code() == 0);
    CHECK(r.out == "fifo\n");
    CHECK_FALSE(fs::exists(fs::symlink_status(fifo)));
    // Not asked for: no FIFO, and no variable naming one.
    r = run_launcher({"-n", "1", "--", "/bin/sh", "-c", "echo \"[${TORCHELASTIC_TIMER_FILE-unset}]\""});
    CHECK(r.out == "[unset]\n");
  }

  TEST_CASE("a file timer naming a process that is neither a rank nor started by one sends it nothing") {
    asio::io_context io;
    const command sleeper("/bin/sleep", {"30"});
    child outsider = test::run(io, spawn(sleeper));
    const pid_t pid = outsider.pid();
    const auto r = run_launcher({"-n", "1", "--", "/bin/sh", "-c",
                                 "printf '{\"version\": 1, \"pid\": " + std::to_string(pid) +
                                     ", \"scope_id\": \"s\", \"expiration_time\": 1, \"signal\": 9}\\n' "
                                     "> \"$TORCHELASTIC_TIMER_FILE\"; sleep 1"},
                                {{"TORCHELASTIC_ENABLE_FILE_TIMER", "1"}});
    CHECK(r.status.code() == 0);
    CHECK(r.err.find("pid " + std::to_string(pid) + " is no rank of this run") != std::string::npos);
    CHECK(test::alive(pid));
    ::kill(pid, SIGKILL);
    (void)test::run(io, outsider.wait());
  }

  // Each rank asks at once for a timer that expired long ago: its request
  // can come before the start has returned the ranks' pids.
  TEST_CASE("a file timer that expires while the ranks are still starting reaches its rank once they are named") {
    const auto r = run_launcher({"-n", "32", "--", "/bin/sh", "-c",
                                 "printf '{\"version\": 1, \"pid\": %d, \"scope_id\": \"early\", "
                                 "\"expiration_time\": 1, \"signal\": 9}\\n' $$ > \"$TORCHELASTIC_TIMER_FILE\"; "
                                 "sleep 10; echo not killed"},
                                {{"TORCHELASTIC_ENABLE_FILE_TIMER", "1"}});
    CHECK(r.status.code() == 128 + SIGKILL);
    CHECK_MESSAGE(r.err.find("is no rank of this run") == std::string::npos, r.err);
    CHECK(r.err.find("cohort-run: the file timer 'early' of pid ") != std::string::npos);
    CHECK(r.out.find("not killed") == std::string::npos);
  }

  // Rank 0 writes half a request and ends; rank 1 waits until cohort-run has
  // said it dropped it (at most 10 s), then asks for a timer of its own.
  TEST_CASE("part of a line whose writer closed the file timer's FIFO is dropped, not joined to the next request") {
    test::temp_dir dir;
    const auto r = run_launcher_err_to(
        dir.path / "err",
        {"-n", "2", "--", "/bin/sh", "-c",
         "if [ $RANK = 0 ]; then printf '{\"version\": 1, \"pid\": 12' > \"$TORCHELASTIC_TIMER_FILE\"; exit 0; fi; "
         "i=0; until grep -q 'part of a line' \"$COHORT_TEST_ERR\" || [ $i = 100 ]; do sleep 0.1; i=$((i + 1)); done; "
         "printf '{\"version\": 1, \"pid\": %d, \"scope_id\": \"after\", \"expiration_time\": 1, "
         "\"signal\": 9}\\n' $$ > \"$TORCHELASTIC_TIMER_FILE\"; sleep 10; echo not killed"},
        {{"TORCHELASTIC_ENABLE_FILE_TIMER", "1"}});
    CHECK(r.status.code() == 128 + SIGKILL);
    CHECK_MESSAGE(r.err.find("got part of a line, which its writer closed without ending: dropped: {\"version\": 1, "
                             "\"pid\": 12\n") != std::string::npos,
                  r.err);
    CHECK(r.err.find("not a timer request") == std::string::npos);
    CHECK(r.err.find("the file timer 'after' of pid ") != std::string::npos);
    CHECK(r.out.find("not killed") == std::string::npos);
  }

  // The rank's sleep is started by a shell that ends at once: its parent is
  // then cohort-run, the run's subreaper. The rank waits for it to end (at
  // most 10 s).
  TEST_CASE("a file timer reaches an orphan of a rank's, which cohort-run adopted") {
    const auto r = run_launcher(
        {"-n", "1", "--", "/bin/sh", "-c",
         "o=$(sh -c 'sleep 30 > /dev/null 2>&1 & echo $!'); "
         "grep -q \"^PPid:[[:space:]]*$PPID\\$\" /proc/$o/status && echo adopted; "
         "printf '{\"version\": 1, \"pid\": %d, \"scope_id\": \"orphan\", \"expiration_time\": 1, "
         "\"signal\": 15}\\n' $o > \"$TORCHELASTIC_TIMER_FILE\"; "
         "alive() { [ -d /proc/$o ] && [ \"$(cut -d' ' -f3 /proc/$o/stat)\" != Z ]; }; "
         "i=0; while alive && [ $i != 100 ]; do sleep 0.1; i=$((i + 1)); done; alive && echo alive || echo ended"},
        {{"TORCHELASTIC_ENABLE_FILE_TIMER", "1"}});
    CHECK_MESSAGE(r.status.code() == 0, r.err);
    CHECK(r.out == "adopted\nended\n");
    CHECK_MESSAGE(r.err.find("the file timer 'orphan' of pid ") != std::string::npos, r.err);
    CHECK(r.err.find("expired: it was sent SIGTERM") != std::string::npos);
  }

  // The rank names every child of cohort-run but itself (its guardian
  // among them), and checks each is alive once cohort-run has refused them.
  TEST_CASE("a file timer naming a child of cohort-run that is neither a rank nor the run's orphan sends it nothing") {
    test::temp_dir dir;
    const auto r = run_launcher_err_to(
        dir.path / "err",
        {"-n", "1", "--", "/bin/sh", "-c",
         "others=$(cat /proc/$PPID/task/*/children | tr ' ' '\\n' | grep -v \"^$$\\$\" | grep .); "
         "[ -n \"$others\" ] || { echo none; exit 0; }; "
         "for c in $others; do printf '{\"version\": 1, \"pid\": %d, \"scope_id\": \"other\", "
         "\"expiration_time\": 1, \"signal\": 9}\\n' $c > \"$TORCHELASTIC_TIMER_FILE\"; done; "
         "for c in $others; do i=0; until grep -q \"pid $c is no rank\" \"$COHORT_TEST_ERR\" || [ $i = 100 ]; "
         "do sleep 0.1; i=$((i + 1)); done; [ -d /proc/$c ] && echo alive || echo gone; done"},
        {{"TORCHELASTIC_ENABLE_FILE_TIMER", "1"}});
    CHECK_MESSAGE(r.status.code() == 0, r.err);
    // cohort-run has one such child at least: its guardian.
    CHECK(r.out.find("gone") == std::string::npos);
    CHECK(r.out.find("alive") != std::string::npos);
    CHECK(r.err.find(" is no rank of this run") != std::string::npos);
    CHECK(r.err.find("was sent") == std::string::npos);
  }

  // A timer whose signal the kernel would refuse, and one of a child that
  // has ended but is not reaped (its parent, a `sleep`, never reaps).
  TEST_CASE("a file timer with a signal no process can be sent, or of a process that has ended, is said so") {
    test::temp_dir dir;
    const auto r = run_launcher_err_to(
        dir.path / "err",
        {"-n", "1", "--", "/bin/sh", "-c",
         "printf '{\"version\": 1, \"pid\": %d, \"scope_id\": \"s\", \"expiration_time\": 1, "
         "\"signal\": 65}\\n' $$ > \"$TORCHELASTIC_TIMER_FILE\"; "
         "sh -c 'sleep 0 & echo $! > \"$0/zombie\"; exec sleep 5' \"$0\" & "
         "until [ -s \"$0/zombie\" ]; do sleep 0.05; done; z=$(cat \"$0/zombie\"); "
         "until [ \"$(cut -d' ' -f3 /proc/$z/stat)\" = Z ]; do sleep 0.05; done; "
         "printf '{\"version\": 1, \"pid\": %d, \"scope_id\": \"zombie\", \"expiration_time\": 1, "
         "\"signal\": 9}\\n' $z > \"$TORCHELASTIC_TIMER_FILE\"; "
         "i=0; until grep -q \"'zombie'\" \"$COHORT_TEST_ERR\" || [ $i = 100 ]; do sleep 0.1; i=$((i + 1)); done; "
         "kill $!; echo ran on",
         dir.path.string()},
        {{"TORCHELASTIC_ENABLE_FILE_TIMER", "1"}});
    CHECK_MESSAGE(r.status.code() == 0, r.err);
    CHECK(r.out == "ran on\n");
    CHECK(r.err.find("not a timer request: {\"version\": 1, \"pid\": ") != std::string::npos);
    CHECK_MESSAGE(r.err.find("has ended (its parent has not reaped it yet): it gets no signal") != std::string::npos,
                  r.err);
    CHECK(r.err.find("was sent") == std::string::npos);
  }

  TEST_CASE("a '--' right after a script is dropped, as torchrun's parser drops it; after '-- program' it is kept") {
    test::temp_dir dir;
    const auto script = dir.path / "args.sh";
    {
      std::ofstream out(script);
      out << "#!/bin/sh\necho \"$@\" > \"$OUT/$1\"\n";
    }
    fs::permissions(script, fs::perms::owner_all);
    const std::map<std::string, std::string> env{{"OUT", dir.path.string()}};
    auto r = run_launcher({"-n", "1", "--no-python", script.string(), "--", "dropped", "--", "kept"}, env);
    REQUIRE_MESSAGE(r.status.code() == 0, r.err);
    CHECK(read_file(dir.path / "dropped") == "dropped -- kept\n");
    r = run_launcher({"-n", "1", "--", script.string(), "--", "x"}, env);
    REQUIRE_MESSAGE(r.status.code() == 0, r.err);
    CHECK(read_file(dir.path / "--") == "-- x\n");
  }

  TEST_CASE("torchrun's flags that mean nothing for programs are accepted") {
    auto r = run_launcher({"--start-method", "fork", "--monitor-interval", "5", "--event-log-handler", "null",
                           "--logs-specs", "mine", "--numa-binding", "node", "--local-addr", "10.0.0.1",
                           "--signals-to-handle", "SIGTERM,SIGINT", "--standalone", "--rdzv-id", "x", "-n", "2",
                           "--duplicate-stdout-filters", "a,b", "--duplicate_stderr_filters", "c", "--", "/bin/true"});
    CHECK_MESSAGE(r.status.code() == 0, r.err);
    CHECK(r.err.find("--logs-specs mine") != std::string::npos);  // said, since it was asked for
    CHECK(r.err.find("filters are not applied") != std::string::npos);
  }

  TEST_CASE("--virtual-local-rank: LOCAL_RANK 0 for every rank, each seeing its own GPU; --shutdown-timeout") {
    test::temp_dir dir;
    auto r = run_launcher({"-n", "2", "--virtual-local-rank", "--shutdown_timeout", "5", "--", "/bin/sh", "-c",
                           "echo $LOCAL_RANK $CUDA_VISIBLE_DEVICES > \"$0/$RANK\"", dir.path.string()},
                          {{"CUDA_VISIBLE_DEVICES", "3,GPU-ab"}});
    REQUIRE(r.status.code() == 0);
    CHECK(read_file(dir.path / "0") == "0 3\n");
    CHECK(read_file(dir.path / "1") == "0 GPU-ab\n");
    // Entries are taken as torchrun takes them, blanks off; a local rank
    // without one is a usage error rather than a rank that sees no GPU.
    test::temp_dir spaced;
    r = run_launcher({"-n", "2", "--virtual-local-rank", "--", "/bin/sh", "-c",
                      "echo \"$CUDA_VISIBLE_DEVICES\" > \"$0/$RANK\"", spaced.path.string()},
                     {{"CUDA_VISIBLE_DEVICES", "4, 5"}});
    REQUIRE(r.status.code() == 0);
    CHECK(read_file(spaced.path / "1") == "5\n");
    r = run_launcher({"-n", "2", "--virtual-local-rank", "--", "/bin/true"}, {{"CUDA_VISIBLE_DEVICES", "0"}});
    CHECK(r.status.code() == 2);
    CHECK(r.err.find("names 1 device") != std::string::npos);
    // torchrun's shutdown timeout is the grace after each signal: a rank
    // ignoring SIGTERM dies by SIGKILL after it.
    auto stubborn = run_launcher({"-n", "2", "--shutdown-timeout", "0.2", "--", "/bin/sh", "-c",
                                  "if [ $RANK = 0 ]; then sleep 0.3; exit 5; fi; trap '' TERM; sleep 30"},
                                 {{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "100"}});
    CHECK(stubborn.status.code() == 5);
  }

  // Before, a number with blanks around it was refused, which torchrun
  // (Python's int() and float()) takes: values built by a shell, say.
  TEST_CASE("numbers with blanks around them, or a plus sign, are taken as torchrun takes them") {
    auto r = run_launcher({"--nnodes", " 1 : 1 ", "--node-rank", "\t0", "--max-restarts", " +0\n", "--master-port",
                           " 29999 ", "--grace-period", " 0.5 ", "-n", "1", "--", "/bin/sh", "-c",
                           "echo $MASTER_PORT $TORCHELASTIC_MAX_RESTARTS"});
    CHECK(r.status.code() == 0);
    CHECK(r.out.find("29999 0") != std::string::npos);
  }

  // Before, both were refused: ' 127.0.0.1 ' as not a host, '2 ' as not a
  // positive number.
  TEST_CASE("blanks around --master-addr and --nproc-per-node's count are taken off, as torchrun takes them") {
    auto r = run_launcher({"--master-addr", " 127.0.0.1 ", "--nproc-per-node", "2 ", "--", "/bin/sh", "-c",
                           "echo \"[$MASTER_ADDR] $LOCAL_WORLD_SIZE\""});
    REQUIRE_MESSAGE(r.status.code() == 0, r.err);
    CHECK(r.out.find("[127.0.0.1] 2") != std::string::npos);
    // Blanks alone are no host and no count.
    r = run_launcher({"--master-addr", "  ", "--", "/bin/true"});
    CHECK(r.status.code() == 2);
    CHECK(r.err.find("--master-addr '  ': no host") != std::string::npos);
    r = run_launcher({"-n", " ", "--", "/bin/true"});
    CHECK(r.status.code() == 2);
    CHECK(r.err.find("--nproc-per-node: ' ' is not a positive number") != std::string::npos);
  }

  // Before, the endpoint's no-break space and \x1f were kept, and refused
  // as no host's; --local-addr's blanks were refused on every backend; and
  // an endpoint of blanks only was taken for none under static.
  TEST_CASE("blanks around --rdzv-endpoint and --local-addr are taken off as Python's str.strip() takes them; an "
            "endpoint of blanks only is refused under static, as torchrun refuses it") {
    test::temp_dir dir;
    auto r = run_launcher({"--rdzv-endpoint", "\xc2\xa0" "10.1.1.3:2347\x1f\t", "--local-addr", "\xe3\x80\x80 10.0.0.2\n",
                           "--nnodes", "2", "--node-rank", "1", "-n", "1", "--", "/bin/sh", "-c", dump_contract,
                           dir.path.string()},
                          identical_nodes);
    CHECK_MESSAGE(r.status.code() == 0, r.err);
    CHECK(variables_in(dir.path / "1")["MASTER_ADDR"] == "10.1.1.3");
    CHECK(variables_in(dir.path / "1")["MASTER_PORT"] == "2347");
    r = run_launcher({"--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", "--local-addr", " 10.0.0.2 ", "--",
                      "/bin/true"});
    CHECK_MESSAGE(r.status.code() == 0, r.err);
    // Blanks only: no endpoint. torchrun's static rendezvous refuses it (an
    // empty one is none given: --master-addr and --master-port), c10d takes
    // it for none given, as an empty one.
    r = run_launcher({"--rdzv-endpoint", " \t", "--", "/bin/true"});
    CHECK(r.status.code() == 2);
    CHECK_MESSAGE(r.err.find("--rdzv-endpoint ' \t': blanks only, no host:port") != std::string::npos, r.err);
    r = run_launcher({"--rdzv-endpoint", "", "--", "/bin/true"});
    CHECK_MESSAGE(r.status.code() == 0, r.err);
    r = run_launcher({"--rdzv-backend", "c10d", "--rdzv-endpoint", " ", "--", "/bin/true"});
    CHECK_MESSAGE(r.status.code() == 0, r.err);
    // --standalone takes no endpoint, whatever is given.
    r = run_launcher({"--standalone", "--rdzv-endpoint", " ", "--", "/bin/true"});
    CHECK_MESSAGE(r.status.code() == 0, r.err);
    // A --local-addr of blanks only is no host.
    r = run_launcher({"--local-addr", "\xc2\xa0 ", "--", "/bin/true"});
    CHECK(r.status.code() == 2);
    CHECK_MESSAGE(r.err.find("--local-addr '\xc2\xa0 ': no host") != std::string::npos, r.err);
  }

  // Before, "join_timeout=5, last_call_timeout=3" was refused, naming the
  // key ' last_call_timeout' (under etcd-v3, as one of those it lists).
  TEST_CASE("blanks around --rdzv-conf's keys and values are taken off, as torchrun takes them; an item with no key is refused") {
    const std::string port = std::to_string(cohort_run::free_port());
    auto r = run_launcher({"--rdzv-conf", " join_timeout = 1 , last_call_timeout=3 ", "--nnodes", "2", "--node-rank",
                           "1", "--master-addr", "127.0.0.1", "--master-port", port, "--", "/bin/true"});
    CHECK(r.status.code() == 1);
    CHECK_MESSAGE(r.err.find("node 0 did not answer at 127.0.0.1:" + port + " within 1 s") != std::string::npos, r.err);
    // Under etcd-v3, every key is read before etcd is asked: the error is
    // read_timeout's value, so the keys before it were taken.
    r = run_launcher({"--rdzv-backend", "etcd-v3", "--rdzv-endpoint", "127.0.0.1:1", "--rdzv-conf",
                      "join_timeout=5, last_call_timeout = 3, protocol = http ,\tread_timeout= 0.0001", "--",
                      "/bin/true"});
    CHECK(r.status.code() == 2);
    CHECK_MESSAGE(r.err.find("--rdzv-conf read_timeout: '0.0001' is not a number of seconds") != std::string::npos,
                  r.err);
    const std::vector<std::string> etcd{"--rdzv-backend", "etcd-v3", "--rdzv-endpoint", "127.0.0.1:1"};
    const std::vector<std::pair<std::string, std::string>> refused{
        {"join_timeout=1,,last_call_timeout=3", "an item has no key"},
        {"join_timeout=1, ", "an item has no key"},
        {"=5", "an item has no key"},
        {" = 5", "an item has no key"},
        {"join_timeout= ", "gives join_timeout no value"},
        {"join_timeout=1, bogus = 2", "no key 'bogus'"}};
    for (const bool elastic : {false, true}) {
      for (const auto& [conf, said] : refused) {
        CAPTURE(elastic);
        CAPTURE(conf);
        std::vector<std::string> args = elastic ? etcd : std::vector<std::string>{};
        args.insert(args.end(), {"--rdzv-conf", conf, "--", "/bin/true"});
        r = run_launcher(args);
        CHECK(r.status.code() == 2);
        CHECK_MESSAGE(r.err.find("--rdzv-conf") != std::string::npos, r.err);
        CHECK_MESSAGE(r.err.find(said) != std::string::npos, r.err);
      }
    }
  }

  // Before, store_type, a key of torchrun's c10d backend, was refused:
  // "no key 'store_type'".
  TEST_CASE("--rdzv-conf store_type: tcp or file is taken and left alone; another is refused under c10d, as torchrun refuses it") {
    for (const char* conf : {"store_type=tcp", "store_type = FILE, join_timeout=5"}) {
      CAPTURE(conf);
      auto r = run_launcher({"--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", "--rdzv-conf", conf, "--",
                             "/bin/sh", "-c", "echo ran"});
      CHECK_MESSAGE(r.status.code() == 0, r.err);
      CHECK(r.out == "ran\n");
    }
    auto r = run_launcher({"--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", "--rdzv-conf",
                           "store_type=redis", "--", "/bin/true"});
    CHECK(r.status.code() == 2);
    CHECK_MESSAGE(r.err.find("--rdzv-conf store_type=redis: c10d's store is tcp or file") != std::string::npos, r.err);
    // Elsewhere it is c10d's key, taken as its others are: under etcd-v3,
    // the error is read_timeout's, the key before it taken.
    r = run_launcher({"--rdzv-backend", "etcd-v3", "--rdzv-endpoint", "127.0.0.1:1", "--rdzv-conf",
                      "store_type=tcp,read_timeout=0.0001", "--", "/bin/true"});
    CHECK(r.status.code() == 2);
    CHECK_MESSAGE(r.err.find("--rdzv-conf read_timeout: '0.0001' is not a number of seconds") != std::string::npos,
                  r.err);
  }

  // Before, "SIGTERM, SIGUSR1" was refused, naming 'SIG SIGUSR1'.
  TEST_CASE("blanks around the names of --signals-to-handle and --signals-to-forward are taken off, as torchrun takes them") {
    test::temp_dir handled;
    auto r = run_launcher({"--signals-to-handle", "SIGTERM, SIGUSR1 ", "-n", "2", "--", "/bin/sh", "-c",
                           "echo > \"$0/$RANK\"; exec sleep 30", handled.path.string()},
                          signal_when_up(handled.path, 2, SIGUSR1));
    CHECK(r.status.code() == 128 + SIGUSR1);
    CHECK_MESSAGE(r.err.find("interrupted by SIGUSR1") != std::string::npos, r.err);
    test::temp_dir forwarded;
    r = run_launcher({"--signals-to-forward", " SIGUSR1,\tWINCH ", "-n", "2", "--", "/bin/sh", "-c",
                      "trap 'echo got > \"$0/sig-$RANK\"; exit 0' WINCH; echo > \"$0/$RANK\"; "
                      "while true; do sleep 0.05; done",
                      forwarded.path.string()},
                     signal_when_up(forwarded.path, 2, SIGWINCH));
    CHECK(r.status.code() == 0);
    CHECK(read_file(forwarded.path / "sig-0") == "got\n");
    CHECK(read_file(forwarded.path / "sig-1") == "got\n");
    // A name refused for what it is, not for its blanks; one that is no
    // signal is named as given.
    r = run_launcher({"--signals-to-handle", "SIGTERM, SIGCHLD", "--", "/bin/true"});
    CHECK(r.status.code() == 2);
    CHECK_MESSAGE(r.err.find("--signals-to-handle: SIGCHLD is refused") != std::string::npos, r.err);
    r = run_launcher({"--signals-to-forward", "SIGUSR1, NOPE", "--", "/bin/true"});
    CHECK(r.status.code() == 2);
    CHECK_MESSAGE(r.err.find("--signals-to-forward: ' NOPE' is not a signal") != std::string::npos, r.err);
  }

  TEST_CASE("bad numbers and --nnodes forms: one short line that says what is accepted, exit 2") {
    const auto error_of = [](std::vector<std::string> args) {
      args.insert(args.end(), {"--", "/bin/true"});
      auto r = run_launcher(args);
      CHECK(r.status.code() == 2);
      CHECK(r.err.size() < 200);  // no 300-digit bounds
      return r.err;
    };
    CHECK(error_of({"--max-restarts", "-1"}).find("--max-restarts: '-1' is not a whole number of 0 or more") !=
          std::string::npos);
    CHECK(error_of({"--max_restarts", "1e400"}).find("whole number") != std::string::npos);
    CHECK(error_of({"--nnodes", "1:x"}).find("N or MIN:MAX") != std::string::npos);
    CHECK(error_of({"--nnodes", "3:2"}).find("N or MIN:MAX") != std::string::npos);
    CHECK(error_of({"--nnodes", "1:2"}).find("etcd-v3") != std::string::npos);
    CHECK(error_of({"--grace-period", "abc"}).find("not a number of seconds") != std::string::npos);
    // Before, a wait this long overflowed into none: the ranks were killed at once.
    CHECK(error_of({"--grace-period", "1e16"}).find("from 0 to 1e9") != std::string::npos);
    // Before, a value that was no number, or a negative one, was said to need 0 to 1e9.
    for (const std::string value : {"abc", "-1", "nan", "0.0001", "1e7"}) {
      CAPTURE(value);
      CHECK(error_of({"--rdzv-conf", "join_timeout=" + value})
                .find("--rdzv-conf join_timeout: '" + value + "' is not a number of seconds from 0.001 to 1e6") !=
            std::string::npos);
    }
    CHECK(error_of({"--master-port", "70000"}).find("1 to 65535") != std::string::npos);
    CHECK(error_of({"--start-method", "thread"}).find("spawn, fork, forkserver") != std::string::npos);
    CHECK(error_of({"--rdzv-backend", "zookeeper"}).find("etcd-v3") != std::string::npos);
    CHECK(error_of({"--rdzv-backend", "c10d", "--nnodes", "1:2"}).find("etcd-v3") != std::string::npos);
    CHECK(error_of({"--rdzv-backend", "etcd-v3", "--nnodes", "1:2"}).find("--rdzv-endpoint") != std::string::npos);
    // Not spoken to in the clear when it asks for TLS.
    CHECK(error_of({"--rdzv-backend", "etcd-v3", "--rdzv-endpoint", "https://127.0.0.1:2379", "--nnodes", "1:2"})
              .find("TLS (https) is not supported") != std::string::npos);
    // A host or port no endpoint has: not taken for an unreachable etcd and tried until join_timeout.
    for (const char* endpoint : {"127.0.0.1:abc", "127.0.0.1:99999", "etcd host:2379", "127.0.0.1:", "127.0.0.1:0"}) {
      CAPTURE(endpoint);
      CHECK(error_of({"--rdzv-backend", "etcd-v3", "--rdzv-endpoint", endpoint, "--rdzv-conf", "join_timeout=1"})
                .find("--rdzv-endpoint") != std::string::npos);
    }
    CHECK(error_of({"--signals-to-handle", "SIGNOPE"}).find("SIGUSR1") != std::string::npos);
    CHECK(error_of({"--nnodes", "2", "--node-rank", "2"}).find("not below") != std::string::npos);
    // More ranks than pids: refused as the flag's error before any rank's
    // environment is made (a billion of them took gigabytes first).
    long pid_max = 0;
    REQUIRE(static_cast<bool>(std::ifstream("/proc/sys/kernel/pid_max") >> pid_max));
    for (const std::string& count : {std::to_string(pid_max + 1), std::string("99999999999999999999999")}) {
      CHECK(error_of({"--nproc-per-node", count}).find("more than this system can run (pid_max") != std::string::npos);
    }
    CHECK(error_of({"--nproc-per-node", "-3"}).find("not a positive number") != std::string::npos);
    auto help = run_launcher({"--help"});
    CHECK(help.status.code() == 0);
    for (const char* form : {"script.py [args...]", "-m module", "--run-path", "--no-python program", "-- program",
                             "python3 in PATH that finds the torch", "PET_"}) {
      CHECK_MESSAGE(help.out.find(form) != std::string::npos, form);
    }
  }

  TEST_CASE("--standalone is one node even inside a Slurm step of several") {
    test::temp_dir dir;
    auto r = run_launcher({"--standalone", "-n", "2", "--", "/bin/sh", "-c", dump_contract, dir.path.string()},
                          {{"SLURM_STEP_ID", "0"},
                           {"SLURM_NODEID", "1"},
                           {"SLURM_STEP_NUM_NODES", "2"},
                           {"SLURM_JOB_ID", "7"},
                           {"SLURM_STEP_NODELIST", "n[1-2]"}});
    REQUIRE_MESSAGE(r.status.code() == 0, r.err);
    auto v = variables_in(dir.path / "1");
    CHECK(v["GROUP_RANK"] == "0");
    CHECK(v["WORLD_SIZE"] == "2");
    CHECK(v["MASTER_ADDR"] == "127.0.0.1");
    CHECK(v["TORCHELASTIC_RUN_ID"] != "7");
  }

  TEST_CASE("torchrun's TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE, with its ${role_name}, prefixes the teed lines") {
    auto r = run_launcher({"-n", "2", "-t", "1", "--role", "trainer", "--", "/bin/sh", "-c", "echo hi"},
                          {{"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "[${role_name}:${rank}/${local_rank}]"}});
    REQUIRE(r.status.code() == 0);
    CHECK((r.out == "[trainer:0/0]hi\n[trainer:1/1]hi\n" || r.out == "[trainer:1/1]hi\n[trainer:0/0]hi\n"));
    // Only in place of the flag: given, even as the default, the flag wins.
    r = run_launcher({"-n", "1", "-t", "1", "--log-line-prefix-template", "[${role}${local_rank}]:", "--", "/bin/sh",
                      "-c", "echo hi"},
                     {{"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "ENV${rank}:"}});
    REQUIRE(r.status.code() == 0);
    CHECK(r.out == "[default0]:hi\n");
  }

  TEST_CASE("Slurm: node rank, node count, run id and master address come from srun's variables") {
    test::temp_dir dir;
    std::map<std::string, std::string> slurm{{"SLURM_STEP_ID", "0"},
                                             {"SLURM_NODEID", "1"},
                                             {"SLURM_NNODES", "2"},
                                             {"SLURM_JOB_ID", "4242"},
                                             {"SLURM_JOB_NODELIST", "gpu[07-08],cpu1"},
                                             {"TORCH_ELASTIC_WORKER_IDENTICAL", "1"}};
    auto r = run_launcher({"-n", "2", "--", "/bin/sh", "-c", dump_contract, dir.path.string()}, slurm);
    REQUIRE_MESSAGE(r.status.code() == 0, r.err);
    auto v = variables_in(dir.path / "3");
    CHECK(v["GROUP_RANK"] == "1");
    CHECK(v["WORLD_SIZE"] == "4");
    CHECK(v["MASTER_ADDR"] == "gpu07");
    CHECK(v["MASTER_PORT"] == "29500");
    CHECK(v["TORCHELASTIC_RUN_ID"] == "4242");
    // The flags win; a node list Slurm would not write is named.
    test::temp_dir flags;
    r = run_launcher({"-n", "1", "--nnodes", "3", "--node-rank", "2", "--master-addr", "m", "--", "/bin/sh", "-c",
                      dump_contract, flags.path.string()},
                     slurm);
    REQUIRE(r.status.code() == 0);
    v = variables_in(flags.path / "2");
    CHECK(v["GROUP_WORLD_SIZE"] == "3");
    CHECK(v["MASTER_ADDR"] == "m");
    // A job id that could not name the logs' folder, as --run-id could not.
    for (const char* id : {"../x", ".."}) {
      CAPTURE(id);
      auto odd = slurm;
      odd["SLURM_JOB_ID"] = id;
      r = run_launcher({"-n", "1", "--", "/bin/true"}, odd);
      CHECK(r.status.code() == 2);
      CHECK_MESSAGE(r.err.find(fmt::format("SLURM_JOB_ID '{}'", id)) != std::string::npos, r.err);
    }
    slurm["SLURM_JOB_NODELIST"] = "gpu[1-";
    r = run_launcher({"-n", "1", "--", "/bin/true"}, slurm);
    CHECK(r.status.code() == 2);
    CHECK(r.err.find("SLURM_JOB_NODELIST") != std::string::npos);
    // The master's host from the node list is checked as --master-addr is
    // (the join would wait for it to its timeout).
    slurm["SLURM_JOB_NODELIST"] = "a/b,n2";
    r = run_launcher({"-n", "1", "--rdzv-conf", "join_timeout=5", "--", "/bin/true"}, slurm);
    CHECK(r.status.code() == 2);
    CHECK_MESSAGE(r.err.find("under Slurm: SLURM_JOB_NODELIST 'a/b': the host is not a host name") != std::string::npos,
                  r.err);
    // --nproc-per-node gpu: the GPUs CUDA_VISIBLE_DEVICES leaves.
    test::temp_dir gpus;
    r = run_launcher({"--nproc-per-node", "gpu", "--", "/bin/sh", "-c", dump_contract, gpus.path.string()},
                     {{"CUDA_VISIBLE_DEVICES", "0,1,3"}});
    REQUIRE(r.status.code() == 0);
    CHECK(variables_in(gpus.path / "0")["LOCAL_WORLD_SIZE"] == "3");
    // A trailing comma names nothing, blanks around an entry are not part
    // of it, and the list stops at the first entry that names no device.
    for (const auto& [visible, count] :
         std::map<std::string, std::string>{{"0,1,", "2"}, {"GPU-ab,2,-1,3", "2"}, {"0, 1", "2"}}) {
      CAPTURE(visible);
      test::temp_dir listed;
      r = run_launcher({"--nproc-per-node", "gpu", "--", "/bin/sh", "-c", dump_contract, listed.path.string()},
                       {{"CUDA_VISIBLE_DEVICES", visible}});
      REQUIRE(r.status.code() == 0);
      CHECK(variables_in(listed.path / "0")["LOCAL_WORLD_SIZE"] == count);
    }
    r = run_launcher({"--nproc-per-node", "gpu", "--", "/bin/true"}, {{"CUDA_VISIBLE_DEVICES", "-1"}});
    CHECK(r.status.code() == 2);
    CHECK(r.err.find("no GPU is visible") != std::string::npos);
  }

  TEST_CASE("fresh default run ids keep two runs apart; a run's folder is <id>_ and 8 random characters") {
    test::temp_dir logs;
    const std::vector<std::string> args{"--log-dir", logs.path.string(), "-r", "3", "-n", "1", "--", "/bin/sh", "-c",
                                        "echo $TORCHELASTIC_RUN_ID"};
    REQUIRE(run_launcher(args).status.code() == 0);
    REQUIRE(run_launcher(args).status.code() == 0);
    std::vector<fs::path> runs;
    for (const auto& e : fs::directory_iterator(logs.path)) runs.push_back(e.path());
    REQUIRE(runs.size() == 2);
    for (const auto& run : runs) {
      const auto id = read_file(run / "attempt_0" / "0" / "stdout.log");
      REQUIRE(id.ends_with("\n"));
      CHECK(run_folders(logs.path, id.substr(0, id.size() - 1)) == std::vector<fs::path>{run});
      CHECK(fs::exists(run / "result.json"));
    }
    test::temp_dir named;
    auto same = args;
    same[1] = named.path.string();
    same.insert(same.begin(), {"--run-id", "job"});
    REQUIRE(run_launcher(same).status.code() == 0);
    REQUIRE(run_launcher(same).status.code() == 0);
    const auto folders = run_folders(named.path, "job");
    REQUIRE(folders.size() == 2);
    for (const auto& folder : folders) CHECK(read_file(folder / "attempt_0" / "0" / "stdout.log") == "job\n");
  }

  TEST_CASE("a --run-id that is not one folder's name is a usage error, exit 2, and no folder is made") {
    test::temp_dir logs;
    for (const std::string id : {"../../escape", "job/1", "..", "."}) {
      CAPTURE(id);
      const auto r = run_launcher({"--run-id", id, "--log-dir", (logs.path / "a" / "b").string(), "-r", "3", "-n", "1",
                                   "--", "/bin/true"});
      CHECK(r.status.code() == 2);
      CHECK(r.err.find("cohort-run: --run-id '" + id + "': a run id names the logs' folder, so it may not hold '/' nor "
                       "be '.' or '..'\n") != std::string::npos);
    }
    CHECK(fs::is_empty(logs.path));
  }

  // Before, an id too long for a folder's name was blamed on --log-dir:
  // "--log-dir L: the run's folder in it could not be made: File name too
  // long".
  TEST_CASE("a --run-id too long to name the logs' folder is a usage error, exit 2; the longest that can, works") {
    test::temp_dir logs;
    const std::string too_long(247, 'j');
    auto r = run_launcher({"--run-id", too_long, "--log-dir", logs.path.string(), "-n", "1", "--", "/bin/true"});
    CHECK(r.status.code() == 2);
    CHECK(r.err.find("cohort-run: --run-id 'jjjjjjjjjjjjjjjj...': a run id names the logs' folder, with 9 bytes after "
                     "it, so it may be 246 bytes long at most; this one is 247\n") != std::string::npos);
    CHECK(fs::is_empty(logs.path));
    const std::string longest(246, 'j');
    r = run_launcher({"--run-id", longest, "--log-dir", logs.path.string(), "-n", "1", "--", "/bin/true"});
    CHECK(r.status.code() == 0);
    CHECK(run_folders(logs.path, longest).size() == 1);
  }

  TEST_CASE("a usage error found after the flags are read comes before any folder is made or logs are named") {
    test::temp_dir logs, tmp;
    const std::vector<std::vector<std::string>> bad{
        {"--rdzv-backend", "etcd-v3", "--rdzv-endpoint", "127.0.0.1:abc"},
        {"--rdzv-backend", "etcd-v3", "--rdzv-endpoint", "127.0.0.1:1", "--rdzv-conf", "read_timeout=0.0001"},
        {"--nnodes", "2", "--node-rank", "1", "--rdzv-conf", "join_timout=1"},
        // One node checks --rdzv-conf as a job of many does, so a typo
        // shows before the line runs on every node.
        {"--rdzv-conf", "join_timout=1"},
        {"--rdzv-conf", "garbage"},
        {"--rdzv-conf", "join_timeout=abc"},
        {"--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", "--rdzv-conf", "bogus=1"},
        {"--redirects", "9"}};
    for (const auto& flags : bad) {
      for (const bool log_dir : {true, false}) {
        auto args = flags;
        CAPTURE(args.back());
        CAPTURE(log_dir);
        if (log_dir) args.insert(args.end(), {"--log-dir", (logs.path / "a").string()});
        args.insert(args.end(), {"-t", "3", "--", "/bin/true"});
        const auto r = run_launcher(args, {{"TMPDIR", tmp.path.string()}});
        CHECK(r.status.code() == 2);
        CHECK_MESSAGE(r.err.find("logs in") == std::string::npos, r.err);
      }
    }
    CHECK(fs::is_empty(logs.path));
    CHECK(fs::is_empty(tmp.path));
  }

  TEST_CASE("a set-up that fails before any rank starts removes the log folders it made, and names none") {
    test::temp_dir logs, tmp, dir;
    const auto json = dir.path / "result.json";
    // The file timer's FIFO in a folder that is not there; node 0 of a job not answering.
    const std::vector<std::pair<std::vector<std::string>, std::map<std::string, std::string>>> failing{
        {{}, {{"TORCHELASTIC_ENABLE_FILE_TIMER", "1"}, {"TORCHELASTIC_TIMER_FILE", "/nonexistent/cohort-test/fifo"}}},
        {{"--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1", "--master-port", "1", "--rdzv-conf",
          "join_timeout=1"},
         {}}};
    for (const auto& [flags, env] : failing) {
      for (const bool log_dir : {true, false}) {
        auto args = flags;
        const bool timer = !env.empty();
        CAPTURE(timer);
        CAPTURE(log_dir);
        // `kept` was there before: it stays; `a` and `b` are made, and go.
        fs::create_directories(logs.path / "kept");
        if (log_dir) args.insert(args.end(), {"--log-dir", (logs.path / "kept" / "a" / "b").string()});
        args.insert(args.end(), {"--result-json", json.string(), "-t", "3", "-n", "1", "--", "/bin/true"});
        auto with_tmp = env;
        with_tmp["TMPDIR"] = tmp.path.string();
        const auto r = run_launcher(args, with_tmp);
        INFO(r.err);
        CHECK(r.status.code() == 1);
        CHECK(r.err.find("logs in") == std::string::npos);
        CHECK(fs::is_empty(tmp.path));
        CHECK(fs::is_empty(logs.path / "kept"));
        REQUIRE(fs::exists(json));
        const auto result = nlohmann::json::parse(read_file(json));
        CHECK(result["outcome"] == "failed");
        CHECK_FALSE(result.contains("log_dir"));
      }
    }
  }

  TEST_CASE("runs started together with one --run-id and --log-dir each get a folder of their own") {
    for (int round = 0; round < 5; ++round) {
      CAPTURE(round);
      test::temp_dir logs;
      asio::io_context io;
      const auto codes = test::run(io, [&]() -> asio::awaitable<std::vector<int>> {
        std::vector<child> runs;
        for (int i = 0; i < 3; ++i) {
          spawn_options options{.out = stdio::null(), .err = stdio::null()};
          options.env.set("TMPDIR", launcher_tmpdir());
          const command cmd(launcher, {"--run-id", "job", "--log-dir", logs.path.string(), "-r", "3", "-n", "1", "--",
                                         "/bin/sh", "-c", "echo " + std::to_string(i)});
          runs.push_back(co_await spawn(cmd, options));
        }
        std::vector<int> out;
        for (auto& c : runs) out.push_back((co_await c.wait()).code());
        co_return out;
      }());
      CHECK(codes == std::vector<int>{0, 0, 0});
      std::set<std::string> lines;
      const auto folders = run_folders(logs.path, "job");
      REQUIRE(folders.size() == 3);
      for (const auto& folder : folders) lines.insert(read_file(folder / "attempt_0" / "0" / "stdout.log"));
      CHECK(lines == std::set<std::string>{"0\n", "1\n", "2\n"});
    }
  }

  TEST_CASE("$TMPDIR empty, missing or not writable: cohort-run runs, its folders where torchrun's would be") {
    for (const char* tmpdir : {"", "/nonexistent/cohort-test", "/proc"}) {
      CAPTURE(tmpdir);
      const auto r = run_launcher({"-n", "1", "--no-python", "sh", "-c", "echo ran"}, {{"TMPDIR", tmpdir}});
      CHECK(r.status.code() == 0);
      CHECK(r.out == "ran\n");
    }
    // A log folder goes to $TEMP then, the next place Python's tempfile looks.
    const auto r = run_launcher({"--run-id", "job", "-r", "3", "-n", "1", "--", "/bin/sh", "-c", "echo logged"},
                                {{"TMPDIR", "/nonexistent/cohort-test"}, {"TEMP", launcher_tmpdir()}});
    CHECK(r.status.code() == 0);
    const std::string said = "cohort-run: logs in ";
    const auto at = r.err.find(said + launcher_tmpdir() + "/cohort-run-");
    REQUIRE(at != std::string::npos);
    const fs::path folder = r.err.substr(at + said.size(), r.err.find('\n', at) - at - said.size());
    CHECK(read_file(run_folder(folder, "job") / "attempt_0" / "0" / "stdout.log") == "logged\n");
  }

  TEST_CASE("--result-json: the outcome, every attempt, each rank's status, usage and error file; failures in the summary") {
    test::temp_dir dir;
    const auto file = dir.path / "result.json";
    auto r = run_launcher({"--result-json", file.string(), "--max-restarts", "1", "-n", "2", "--", "/bin/sh", "-c",
                           "if [ $RANK = 1 ]; then printf '{\"message\": {\"message\": \"ValueError: bad batch\", "
                           "\"extraInfo\": {\"timestamp\": \"1700000000\"}}}' > \"$TORCHELASTIC_ERROR_FILE\"; exit 3; fi; "
                           "sleep 30"});
    CHECK(r.status.code() == 3);
    const auto j = nlohmann::json::parse(read_file(file));
    CHECK(j["outcome"] == "failed");
    CHECK(j["exit_code"] == 3);
    CHECK(j["restarts"] == 1);
    REQUIRE(j["attempts"].size() == 2);
    for (const auto& attempt : j["attempts"]) {
      CHECK(attempt["outcome"] == "failed");
      const auto& ranks = attempt["ranks"];
      REQUIRE(ranks.size() == 2);
      CHECK(ranks[1]["status"]["exit_code"] == 3);
      CHECK(ranks[1]["failed"] == true);
      CHECK(ranks[1]["root_cause"] == true);
      CHECK(ranks[0]["status"]["signal"] == "SIGTERM");  // shut down, not failed
      CHECK(ranks[0]["failed"] == false);
      CHECK(ranks[0]["pid"].get<int>() > 0);
      CHECK(ranks[0]["status"]["max_rss_kib"].get<long>() > 0);
      CHECK(ranks[0]["status"]["cpu_user_s"].is_number());
    }
    CHECK(j["attempts"][0]["reason"].get<std::string>().find("rank 1 (local 1, pid") == 0);
    // The error files are kept, and the summary names where.
    REQUIRE(j.contains("error_dir"));
    const fs::path errors = j["error_dir"].get<std::string>();
    CHECK(r.err.find("kept in " + errors.string()) != std::string::npos);
    const auto kept = errors / "attempt_1" / "1" / "error.json";
    CHECK(j["attempts"][1]["ranks"][1]["error_file"] == kept.string());
    CHECK(read_file(kept).find("ValueError: bad batch") != std::string::npos);
    CHECK(r.err.find("error_file : " + kept.string()) != std::string::npos);
    CHECK(r.err.find("message    : ValueError: bad batch") != std::string::npos);
    fs::remove_all(errors);
    // One line per restart naming the rank and why; each failure's usage in the summary.
    CHECK(r.err.find("attempt 0 failed: rank 1 (local 1, pid") != std::string::npos);
    CHECK(r.err.find("exited with code 3: ValueError: bad batch; restarting the group (1 of 1 restarts)") != std::string::npos);
    CHECK(r.err.find("cpu time") != std::string::npos);
    CHECK(r.err.find("peak rss") != std::string::npos);
    // A run that succeeds keeps nothing of them.
    auto ok = run_launcher({"--result-json", file.string(), "-n", "1", "--", "/bin/true"});
    CHECK(ok.status.code() == 0);
    const auto k = nlohmann::json::parse(read_file(file));
    CHECK(k["outcome"] == "succeeded");
    CHECK_FALSE(k.contains("error_dir"));
    // A rank that fails without writing one names no error file.
    auto plain = run_launcher({"--result-json", file.string(), "-n", "1", "--", "/bin/sh", "-c", "exit 4"});
    CHECK(plain.status.code() == 4);
    const auto p = nlohmann::json::parse(read_file(file));
    REQUIRE(p["attempts"].size() == 1);
    const auto& rank = p["attempts"][0]["ranks"][0];
    CHECK(rank["failed"] == true);
    CHECK_FALSE(rank.contains("error_file"));
    CHECK_FALSE(rank.contains("message"));
  }

  TEST_CASE("--result-json past RLIMIT_FSIZE: no part of it is left, nor an earlier run's, and the message says why") {
    test::temp_dir dir;
    const auto file = dir.path / "result.json";
    std::ofstream(file) << "{\"from\": \"an earlier run\"}\n";
    // 512 bytes a file (dash counts 512-byte blocks), well below the record
    // of four ranks.
    const command cmd("/bin/sh", {"-c", "ulimit -f 1 && exec \"$0\" \"$@\"", launcher, "--result-json", file.string(),
                                  "-n", "4", "--", "/bin/true"});
    auto r = run_command(cmd, [](child&) -> asio::awaitable<void> { co_return; });
    CHECK(r.status.code() == 0);  // the ranks' outcome
    const std::string left = fs::exists(file) ? read_file(file) : std::string();
    CHECK_MESSAGE(!fs::exists(file), "left: ", left);
    CHECK(r.err.find("cohort-run: writing " + file.string() + " failed: File too large (longer than RLIMIT_FSIZE allows") !=
          std::string::npos);
    CHECK(r.err.find("the earlier file there was removed") != std::string::npos);
    std::size_t others = 0;
    for (const auto& e : fs::directory_iterator(dir.path)) others += e.path() != file;
    CHECK(others == 0);  // no unfinished file beside it
  }

  TEST_CASE("a console whose reader has gone: cohort-run runs on, exits with the ranks' code and records the outcome") {
    test::temp_dir dir;
    const auto file = dir.path / "result.json";
    const auto marker = dir.path / "closed";
    // The ranks write teed lines until the console is gone; then rank 0
    // writes one more and fails, and the other waits to be shut down: the
    // pump's writes and the summary's both meet a pipe nobody reads.
    const std::vector<std::string> args{"--result-json", file.string(), "--log-dir", (dir.path / "logs").string(),
                                        "-t", "3", "-n", "2", "--", "/bin/sh", "-c",
                                        "while [ ! -e \"$0\" ]; do echo line; sleep 0.01; done; "
                                        "if [ $RANK = 0 ]; then echo after; exit 3; fi; exec sleep 30",
                                        marker.string()};
    asio::io_context io;
    const auto status = test::run(io, [&]() -> asio::awaitable<exit_status> {
      spawn_options options{.out = stdio::pipe(), .err = stdio::pipe()};
      options.env.set("TMPDIR", launcher_tmpdir());
      const command cmd(launcher, args);
      child c = co_await spawn(cmd, options);
      std::array<char, 64> some{};
      co_await c.out().async_read_some(asio::buffer(some), asio::use_awaitable);  // a teed line: the ranks are up
      c.out().close();
      c.err().close();
      std::ofstream{marker};
      co_return co_await c.wait();
    }());
    CHECK(status.exited());
    CHECK(status.code() == 3);
    const auto j = nlohmann::json::parse(read_file(file));
    CHECK(j["outcome"] == "failed");
    CHECK(j["exit_code"] == 3);
    // The log files have every line, the ones written after the console went too.
    const auto run_folders = std::vector<fs::directory_entry>(fs::directory_iterator(dir.path / "logs"), {});
    REQUIRE(run_folders.size() == 1);
    CHECK(fs::exists(run_folders[0].path() / "result.json"));
    const auto log = read_file(run_folders[0].path() / "attempt_0" / "0" / "stdout.log");
    CHECK(log.ends_with("after\n"));
    if (j.contains("error_dir")) fs::remove_all(j["error_dir"].get<std::string>());
  }

  TEST_CASE("a console held open but never read: SIGTERM still ends cohort-run, 128 + 15, its outcome recorded") {
    sigterm_ends_a_run_whose_console_is_never_read({});
  }

  TEST_CASE("another user's console held open but never read: SIGTERM still ends cohort-run, its outcome recorded") {
    // cohort-run as nobody on this test's pipe, which it cannot open again
    // non-blocking through /proc: it writes the descriptor as it is.
    const std::vector<std::string> as_nobody{"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"};
    std::string probe;
    for (const auto& word : as_nobody) probe += word + " ";
    probe += launcher + " --help >/dev/null 2>&1";
    if (::geteuid() != 0 || std::system(probe.c_str()) != 0) {
      MESSAGE("not root, no setpriv, or cohort-run out of nobody's reach: skipped");
      return;
    }
    sigterm_ends_a_run_whose_console_is_never_read(as_nobody);
  }

  // Before, the first log write past the limit raised SIGXFSZ, whose
  // default action ended cohort-run: no summary, no result.json, exit 153.
  TEST_CASE("log files past RLIMIT_FSIZE are named in the summary, and the run ends as its ranks did") {
    test::temp_dir logs;
    const std::string script =
        "ulimit -f 100 && exec \"$1\" --log-dir \"$0\" --run-id fsize --tee-through-pipes -t 3 -n 2 -- "
        "/bin/sh -c 'head -c 300000 /dev/zero; exit 0'";
    const command cmd("/bin/sh", {"-c", script, logs.path.string(), launcher});
    auto r = run_command(cmd, [](child&) -> asio::awaitable<void> { co_return; });
    CHECK(r.status.code() == 0);
    CHECK(r.err.find(std::string("(") + std::strerror(EFBIG) + ")") != std::string::npos);
    const auto folder = run_folder(logs.path, "fsize");
    CHECK(fs::exists(folder / "result.json"));
    // Cut at the limit: 100 blocks, of 512 bytes in dash's ulimit, 1024 in bash's.
    for (int rank = 0; rank < 2; ++rank) {
      const auto size = fs::file_size(folder / "attempt_0" / std::to_string(rank) / "stdout.log");
      CHECK((size == 100 * 512 || size == 100 * 1024));
    }
  }

  // Before, a copy cut short was kept, the summary named the group's file
  // (removed with the group), and cohort-run's own error file was left
  // unwritten.
  TEST_CASE("an error file that cannot be kept is named as none, and cohort-run's own error file still gets the "
            "report") {
    if (std::system("unshare -Urm true 2>/dev/null") != 0) {
      MESSAGE("no user and mount namespaces here: skipped");
      return;
    }
    test::temp_dir tmp, outer;
    const auto outer_file = outer.path / "error.json";
    // A 64 KiB tmpfs as $TMPDIR, 45,000 bytes of it taken: the rank's 12 KB
    // report fits in the group's folder there, and its copy does not.
    const std::string script =
        "mount -t tmpfs -o size=64k tmpfs \"$1\" && head -c 45000 /dev/zero > \"$1/filler\" && "
        "TMPDIR=\"$1\" TORCHELASTIC_ERROR_FILE=\"$3\" \"$2\" -n 1 -- /bin/sh -c \"$4\"; rc=$?; ls \"$1\" >&2; exit $rc";
    const std::string rank =
        "tb=$(head -c 12000 /dev/zero | tr '\\0' y); printf '{\"message\":{\"message\":\"boom\",\"extraInfo\":"
        "{\"py_callstack\":\"%s\",\"timestamp\":\"1\"}}}' \"$tb\" > \"$TORCHELASTIC_ERROR_FILE\"; exit 5";
    const command cmd("unshare", {"-Urm", "/bin/sh", "-c", script, "sh", tmp.path.string(), launcher,
                                  outer_file.string(), rank});
    auto r = run_command(cmd, [](child&) -> asio::awaitable<void> { co_return; });
    CHECK(r.status.code() == 5);
    CHECK(r.err.find("rank 0's error file could not be kept") != std::string::npos);
    CHECK(r.err.find("error_file : <N/A>") != std::string::npos);
    CHECK(r.err.find("error files are kept") == std::string::npos);
    // $TMPDIR afterwards (`ls`): no folder of kept error files left there.
    CHECK(r.err.ends_with("\ncohort-errors-0\nfiller\n"));
    const auto report = read_error_file(outer_file);
    REQUIRE(report);
    CHECK(report->message == "boom");
    CHECK(report->trace.size() >= 12000);
    CHECK(nlohmann::json::parse(read_file(outer_file))["message"]["errorCode"] == 5);  // as when it is kept
  }

  // Before, each was given to a copy, which failed with "Invalid argument"
  // (a FIFO, a directory, a device), or copied what a link named.
  TEST_CASE("anything but a regular file at a rank's error file is passed over: no copy, and no line about one") {
    const std::vector<std::string> leave = {"mkfifo \"$TORCHELASTIC_ERROR_FILE\"", "mkdir \"$TORCHELASTIC_ERROR_FILE\"",
                                            "ln -s /dev/zero \"$TORCHELASTIC_ERROR_FILE\"",
                                            "ln -s /nonexistent \"$TORCHELASTIC_ERROR_FILE\""};
    for (const auto& what : leave) {
      CAPTURE(what);
      auto r = run_launcher({"-n", "1", "--", "/bin/sh", "-c", what + "; exit 6"});
      CHECK(r.status.code() == 6);
      CHECK(r.err.find("exitcode   : 6") != std::string::npos);
      CHECK(r.err.find("error_file : <N/A>") != std::string::npos);
      CHECK(r.err.find("could not be kept") == std::string::npos);
      CHECK(r.err.find("error files are kept") == std::string::npos);
    }
  }

  // Before, the summary said <N/A> for a kept file that was no report, as
  // for one that could not be kept.
  TEST_CASE("an error file that is no report is kept, and the summary names it and says why it was not read") {
    test::temp_dir dir;
    const auto result = dir.path / "result.json";
    // A link is followed to the regular file it names, as the group reads it.
    const auto half = dir.path / "half.json";
    std::ofstream(half) << "{\"message\": {\"message\": \"RuntimeError: half";
    const std::vector<std::pair<std::string, std::string>> files = {
        {"printf '{\"message\": {\"message\": \"RuntimeError: half' > \"$TORCHELASTIC_ERROR_FILE\"",
         "(not read as a report: not JSON in torchelastic's shape)"},
        {"ln -s " + half.string() + " \"$TORCHELASTIC_ERROR_FILE\"",
         "(not read as a report: not JSON in torchelastic's shape)"},
        {"truncate -s 17M \"$TORCHELASTIC_ERROR_FILE\"",
         "(not read as a report: 17825792 bytes, over the 16 MiB limit)"}};
    for (const auto& [write, why] : files) {
      CAPTURE(write);
      auto r = run_launcher({"--result-json", result.string(), "-n", "1", "--", "/bin/sh", "-c", write + "; exit 3"});
      CHECK(r.status.code() == 3);
      const fs::path errors = kept_error_folder(r.err);
      REQUIRE_FALSE(errors.empty());
      const auto kept = errors / "attempt_0" / "0" / "error.json";
      CHECK(fs::is_regular_file(kept));
      CHECK(r.err.find("error_file : " + kept.string() + " " + why) != std::string::npos);
      CHECK(nlohmann::json::parse(read_file(result))["attempts"][0]["ranks"][0]["error_file"] == kept.string());
      fs::remove_all(errors);
    }
  }

  TEST_CASE("a log dir that fills up is named in the summary with the cause") {
    // A 64 KiB tmpfs of its own, in a mount namespace of its own.
    if (std::system("unshare -Urm true 2>/dev/null") != 0) {
      MESSAGE("no user and mount namespaces here: skipped");
      return;
    }
    const auto run_on_full_disk = [](const std::string& streams) {
      test::temp_dir logs;
      const std::string script = "mount -t tmpfs -o size=64k tmpfs \"$1\" && exec \"$2\" --log-dir \"$1\" " + streams +
                                 " -n 1 -- /bin/sh -c 'head -c 1000000 /dev/zero'";
      asio::io_context io;
      return test::run(io, [&]() -> asio::awaitable<outcome> {
        spawn_options options{.out = stdio::null(), .err = stdio::pipe()};
        options.env.set("TMPDIR", launcher_tmpdir());
        child c = co_await spawn(
            command("unshare", {"-Urm", "/bin/sh", "-c", script, "sh", logs.path.string(), launcher}), options);
        auto err = co_await test::read_all(c.err());
        auto status = co_await c.wait();
        co_return outcome{status, {}, std::move(err)};
      }());
    };
    // Redirected or teed, the rank writes its file itself, and fails; the
    // summary says why.
    for (const char* streams : {"-r 3", "-t 3"}) {
      CAPTURE(streams);
      auto r = run_on_full_disk(streams);
      CHECK(r.status.code() == 1);
      CHECK(r.err.find("the run failed") != std::string::npos);
      CHECK(r.err.find("on a full file system (No space left on device)") != std::string::npos);
    }
  }

  TEST_CASE("a standard stream cohort-run starts without is /dev/null for it and its ranks, not its own descriptor") {
    const std::pair<int, std::string> cases[] = {{0, "0<&-"}, {1, "1>&-"}, {2, "2>&-"}};
    for (const auto& [fd, closed] : cases) {
      CAPTURE(closed);
      // The rank, with cohort-run's streams, says where each of its three
      // leads (or "none"), on a stream left open: read from /proc before
      // any redirection of its own.
      const char* report = fd == 2 ? "" : ">&2";
      const std::string rank = fmt::format(
          "a=$(readlink /proc/$$/fd/0 || echo none); b=$(readlink /proc/$$/fd/1 || echo none); "
          "c=$(readlink /proc/$$/fd/2 || echo none); echo $a $b $c {}",
          report);
      const command cmd("/bin/sh", {"-c", fmt::format("exec \"$0\" -n 1 -- /bin/sh -c \"$1\" {}", closed), launcher,
                                    rank});
      const outcome o = run_command(cmd, [](child&) -> asio::awaitable<void> { co_return; });
      CHECK(o.status.code() == 0);
      std::istringstream said(fd == 2 ? o.out : o.err);
      std::vector<std::string> leads;
      for (std::string line; std::getline(said, line);) {
        if (line.rfind("cohort-run:", 0) == 0) continue;
        std::istringstream words(line);
        for (std::string w; words >> w;) leads.push_back(w);
      }
      REQUIRE(leads.size() == 3);
      CHECK(leads[static_cast<std::size_t>(fd)] == "/dev/null");
    }
  }

  TEST_CASE("a missing program is one line naming it, exit 127; a bad flag is a usage error, exit 2") {
    auto missing = run_launcher({"-n", "2", "no-such-program-here"});
    CHECK(missing.status.code() == 127);
    CHECK(missing.err == "cohort-run: no-such-program-here: not found in PATH\n");
    auto bad = run_launcher({"--no-such-flag", "--", "true"});
    CHECK(bad.status.code() == 2);
    CHECK(bad.err.find("--no-such-flag") != std::string::npos);
    auto none = run_launcher({"-n", "2"});
    CHECK(none.status.code() == 2);
    auto bad_count = run_launcher({"-n", "zero", "true"});
    CHECK(bad_count.status.code() == 2);
    auto version = run_launcher({"--version"});
    CHECK(version.status.code() == 0);
    CHECK(version.out.rfind("cohort-run ", 0) == 0);
  }
}

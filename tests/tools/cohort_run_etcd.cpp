// cohort-run nodes meeting through a real etcd (--rdzv-backend etcd-v3):
// several cohort-run processes on loopback, each its own node, as jobs run
// across machines. Skipped (77) where etcd is not installed.
#include "cohort/spawn.hpp"

#include "support/etcd_server.hpp"
#include "support/harness.hpp"
#include "support/launcher_outcome.hpp"
#include "support/process_probe.hpp"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/steady_timer.hpp>

#include <signal.h>

#include <chrono>
#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

using namespace cohort;
using namespace std::chrono_literals;
using namespace asio::experimental::awaitable_operators;
using test::etcd;
using test::files_appear;
using test::outcome;
using test::read_file;
using test::variables_in;
namespace fs = std::filesystem;

namespace {

const std::string cohort_run = COHORT_TEST_COHORT_RUN;
const test::needs_device needs{"etcd server", test::etcd_missing};

// One cohort-run node: its flags after the rendezvous ones, and what must
// happen before it starts.
struct node {
  std::vector<std::string> args;
  std::function<asio::awaitable<void>()> before{};
};

// The flags every node of job `id` gives, with short timeouts: MIN:MAX
// nodes, a last call of 1 s, leases that lapse after 1 s of silence.
std::vector<std::string> rendezvous(const std::string& id, const std::string& nnodes, const std::string& extra_conf = "") {
  return {"--rdzv-backend", "etcd-v3", "--rdzv-endpoint", etcd().endpoint(), "--rdzv-id", id, "--nnodes", nnodes,
          "--rdzv-conf", "last_call_timeout=1,keep_alive_interval=0.5,keep_alive_max_attempt=2,join_timeout=30" + extra_conf,
          "--local-addr", "127.0.0.1", "--monitor-interval", "0.05", "--grace-period", "2"};
}

// This host's name as Python's socket.getfqdn() gives it: what torchrun
// publishes for a node given no --local-addr.
std::string python_fqdn() {
  asio::io_context io;
  return test::run(io, []() -> asio::awaitable<std::string> {
    const command ask(COHORT_TEST_PYTHON, {"-c", "import socket; print(socket.getfqdn())"});
    spawn_options options{.out = stdio::pipe()};
    child python = co_await spawn(ask, options);
    const std::string out = co_await test::read_all(python.out());
    const auto status = co_await python.wait();
    REQUIRE_MESSAGE(status.code() == 0, out);
    co_return out.substr(0, out.find('\n'));
  }());
}

std::string fresh_id() {
  static int count = 0;
  return "e2e" + std::to_string(++count) + "-" + std::to_string(::getpid());
}

// Runs every node's cohort-run at once (each after its `before`), and
// `during` meanwhile, with the nodes' children (null until started).
std::vector<outcome> run_nodes(std::vector<node> nodes,
                               std::function<asio::awaitable<void>(std::vector<std::optional<child>>&)> during = {}) {
  asio::io_context io;
  test::temp_dir tmpdir;
  std::vector<outcome> results(nodes.size());
  std::vector<std::optional<child>> children(nodes.size());
  std::exception_ptr failure;
  const auto keep = [&](std::exception_ptr e) {
    if (e && !failure) failure = e;
  };
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    asio::co_spawn(io, [&, i]() -> asio::awaitable<void> {
      if (nodes[i].before) co_await nodes[i].before();
      spawn_options options{.out = stdio::pipe(), .err = stdio::pipe()};
      options.env.set("TMPDIR", tmpdir.path.string());  // what a failed node keeps goes with the test
      children[i].emplace(co_await spawn(command(cohort_run, nodes[i].args), options));
      auto [out, err] = co_await (test::read_all(children[i]->out()) && test::read_all(children[i]->err()));
      auto status = co_await children[i]->wait();
      results[i] = outcome{status, std::move(out), std::move(err)};
    }, keep);
  }
  if (during) asio::co_spawn(io, during(children), keep);
  io.run();
  if (failure) std::rethrow_exception(failure);
  return results;
}

// A worker that writes its contract to $0/<GROUP_WORLD_SIZE>-<RANK>, then
// runs `then`.
std::vector<std::string> worker(const fs::path& dir, const std::string& then) {
  return {"--", "/bin/sh", "-c",
          "for v in RANK LOCAL_RANK WORLD_SIZE GROUP_RANK GROUP_WORLD_SIZE MASTER_ADDR MASTER_PORT "
          "TORCHELASTIC_RESTART_COUNT TORCHELASTIC_RUN_ID; do eval echo $v=\\$$v; done > \"$0/tmp-$RANK\"; "
          "mv \"$0/tmp-$RANK\" \"$0/$GROUP_WORLD_SIZE-$RANK\"; " + then,
          dir.string()};
}

std::vector<std::string> joined(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// What a node does before it starts: waits `wait`.
std::function<asio::awaitable<void>()> after(std::chrono::milliseconds wait) {
  return [wait]() -> asio::awaitable<void> {
    asio::steady_timer timer(co_await asio::this_coro::executor, wait);
    co_await timer.async_wait(asio::use_awaitable);
  };
}

// Every rank of a world of three ran, in a round of three nodes, with no
// restart used: each wrote its contract to `dir` (worker()).
void check_world_of_three_ran(const fs::path& dir) {
  for (int rank = 0; rank < 3; ++rank) {
    CAPTURE(rank);
    const auto contract = dir / ("3-" + std::to_string(rank));
    REQUIRE(fs::exists(contract));
    auto v = variables_in(contract);
    CHECK(v["WORLD_SIZE"] == "3");
    CHECK(v["TORCHELASTIC_RESTART_COUNT"] == "0");
  }
}

}  // namespace

TEST_SUITE("cohort-run over etcd") {
  TEST_CASE("three nodes of 2:3 form one job: distinct node ranks, one world, one master") {
    test::temp_dir dir;
    const auto id = fresh_id();
    std::vector<node> nodes;
    for (const char* nproc : {"1", "2", "3"}) {
      auto args = joined(rendezvous(id, "2:3"), {"-n", nproc});
      if (nproc[0] == '2') args[1] = "etcd";  // torchrun's name for it
      nodes.push_back({joined(args, worker(dir.path, "exit 0"))});
    }
    auto results = run_nodes(nodes);
    for (const auto& r : results) CHECK_MESSAGE(r.status.code() == 0, r.err);
    std::set<std::string> groups, masters;
    for (int rank = 0; rank < 6; ++rank) {
      CAPTURE(rank);
      const auto file = dir.path / ("3-" + std::to_string(rank));
      REQUIRE(fs::exists(file));
      auto v = variables_in(file);
      CHECK(v["WORLD_SIZE"] == "6");
      CHECK(v["GROUP_WORLD_SIZE"] == "3");
      CHECK(v["TORCHELASTIC_RUN_ID"] == id);
      CHECK(v["MASTER_ADDR"] == "127.0.0.1");
      groups.insert(v["GROUP_RANK"]);
      masters.insert(v["MASTER_ADDR"] + ":" + v["MASTER_PORT"]);
      CHECK(std::stoi(v["RANK"]) - std::stoi(v["LOCAL_RANK"]) >= 0);
    }
    CHECK(groups == std::set<std::string>{"0", "1", "2"});
    CHECK(masters.size() == 1);
  }

  TEST_CASE("a node SIGKILLed mid-run: the others stop their ranks, re-form without it and finish") {
    test::temp_dir dir;
    const auto id = fresh_id();
    // Ranks wait while three nodes run, and succeed once two do. The up-
    // marker follows the pid file: a file shows when the shell opens it,
    // before its pid is written.
    const auto then = "if [ $GROUP_WORLD_SIZE = 3 ]; then echo $$ > \"$0/pid-$RANK\"; : > \"$0/up-$RANK\"; sleep 60; fi";
    std::vector<node> nodes;
    for (int n = 0; n < 3; ++n) {
      nodes.push_back({joined(joined(rendezvous(id, "2:3"), {"-n", "2", "--max-restarts", "1"}), worker(dir.path, then))});
    }
    auto results = run_nodes(nodes, [&](std::vector<std::optional<child>>& children) -> asio::awaitable<void> {
      co_await files_appear(dir.path, 6, "up-", 10ms, 60s);
      children[2]->signal(SIGKILL);
    });
    CHECK(results[2].status.signal() == SIGKILL);
    for (int n = 0; n < 2; ++n) {
      CHECK_MESSAGE(results[n].status.code() == 0, results[n].err);
      CHECK(results[n].err.find("left without finishing") != std::string::npos);
      CHECK(results[n].err.find("(1 of 1 restarts)") != std::string::npos);
    }
    for (int rank = 0; rank < 4; ++rank) {
      auto v = variables_in(dir.path / ("2-" + std::to_string(rank)));
      CHECK(v["WORLD_SIZE"] == "4");
      CHECK(v["TORCHELASTIC_RESTART_COUNT"] == "1");
    }
    for (int rank = 0; rank < 6; ++rank) {  // nothing of the first round is left
      CHECK_FALSE(test::alive(std::stoi(read_file(dir.path / ("pid-" + std::to_string(rank))))));
    }
  }

  TEST_CASE("a node that joins later makes a new round with it; that is no restart") {
    test::temp_dir dir;
    const auto id = fresh_id();
    const auto then = "if [ $GROUP_WORLD_SIZE = 2 ]; then sleep 60; fi";
    const auto args = joined(joined(rendezvous(id, "2:3"), {"-n", "1", "--max-restarts", "0"}), worker(dir.path, then));
    std::vector<node> nodes{{args}, {args}};
    nodes.push_back({args, [&]() -> asio::awaitable<void> { co_await files_appear(dir.path, 2, "2-", 10ms, 60s); }});
    auto results = run_nodes(nodes);
    for (const auto& r : results) CHECK_MESSAGE(r.status.code() == 0, r.err);
    CHECK(results[0].err.find("waiting to join") != std::string::npos);
    for (int rank = 0; rank < 3; ++rank) {
      auto v = variables_in(dir.path / ("3-" + std::to_string(rank)));
      CHECK(v["WORLD_SIZE"] == "3");
      CHECK(v["TORCHELASTIC_RESTART_COUNT"] == "0");
    }
  }

  TEST_CASE("a node SIGKILLed as it joins is in no round that runs: a replacement takes its place, and no restart "
            "is used") {
    test::temp_dir dir;
    const auto id = fresh_id();
    // Leases of 3 s: node 1 is killed once it has joined the open round
    // (two of three in), its key outlives it, and node 2 closes the round
    // with it. Node 3 comes as the replacement.
    const auto args =
        joined(joined(rendezvous(id, "3", ",keep_alive_max_attempt=6"), {"-n", "1"}), worker(dir.path, "exit 0"));
    std::vector<node> nodes{{args}, {args}, {args, after(1500ms)}, {args, after(1700ms)}};
    auto results = run_nodes(nodes, [&](std::vector<std::optional<child>>& children) -> asio::awaitable<void> {
      co_await after(1400ms)();
      children[1]->signal(SIGKILL);
    });
    CHECK(results[1].status.signal() == SIGKILL);
    for (int n : {0, 2, 3}) {
      CAPTURE(n);
      CHECK_MESSAGE(results[n].status.code() == 0, results[n].err);
      CHECK_MESSAGE(results[n].err.find("restarts") == std::string::npos, results[n].err);
    }
    check_world_of_three_ran(dir.path);  // in a round of the three alive
  }

  TEST_CASE("nodes of different --monitor-interval form one round: a long interval does not slow the rendezvous") {
    test::temp_dir dir;
    const auto id = fresh_id();
    // Two nodes read a running round every 30 s, one every 0.05 s; a round
    // that waited on the slow ones' polls would start over until
    // join_timeout (20 s) ended it.
    const auto args = joined(rendezvous(id, "3", ",join_timeout=20"), {"-n", "1"});
    auto slow = args;
    *std::find(slow.begin(), slow.end(), "0.05") = "30";
    const auto exits = worker(dir.path, "exit 0");
    std::vector<node> nodes{{joined(slow, exits)}, {joined(args, exits), after(300ms)},
                            {joined(slow, exits), after(600ms)}};
    auto results = run_nodes(nodes);
    for (int n = 0; n < 3; ++n) {
      CAPTURE(n);
      CHECK_MESSAGE(results[n].status.code() == 0, results[n].err);
      CHECK_MESSAGE(results[n].err.find("did not confirm") == std::string::npos, results[n].err);
    }
    check_world_of_three_ran(dir.path);
  }

  TEST_CASE("a node that comes once the job's round is full and then finished exits 1, the job not run again") {
    test::temp_dir dir;
    const auto id = fresh_id();
    const auto args = joined(joined(rendezvous(id, "1:2"), {"-n", "1"}), worker(dir.path, "sleep 2"));
    std::vector<node> nodes{{args}, {args}};
    nodes.push_back({args, [&]() -> asio::awaitable<void> { co_await files_appear(dir.path, 2, "2-", 10ms, 60s); }});
    auto results = run_nodes(nodes);
    for (int n = 0; n < 2; ++n) CHECK_MESSAGE(results[n].status.code() == 0, results[n].err);
    CHECK(results[2].status.code() == 1);
    CHECK_MESSAGE(results[2].err.find("the job has finished: node ") != std::string::npos, results[2].err);
    CHECK_FALSE(fs::exists(dir.path / "1-0"));  // no world of one node ran
  }

  TEST_CASE("a node whose ranks fail for good closes the job: the others stop, naming it") {
    test::temp_dir dir;
    const auto id = fresh_id();
    const auto args = joined(joined(rendezvous(id, "2"), {"-n", "1"}), worker(dir.path, "[ $RANK = 1 ] && exit 3; exec sleep 60"));
    auto results = run_nodes({{args}, {args}});
    const auto& failed = results[0].status.code() == 3 ? results[0] : results[1];
    const auto& other = results[0].status.code() == 3 ? results[1] : results[0];
    CHECK(failed.status.code() == 3);
    CHECK(other.status.code() == 1);
    CHECK(other.err.find("the job was closed") != std::string::npos);
    CHECK(other.err.find("exited with code 3") != std::string::npos);
    // It took part: no next round is promised, nor is its id called stale.
    CHECK_MESSAGE(other.err.find("joining the next round") == std::string::npos, other.err);
    CHECK_MESSAGE(other.err.find("needs a --rdzv-id of its own") == std::string::npos, other.err);
    // A node started later with the closed job's id is told that its id is an old job's.
    auto late = run_nodes({{args}});
    CHECK(late[0].status.code() == 1);
    CHECK_MESSAGE(late[0].err.find("needs a --rdzv-id of its own") != std::string::npos, late[0].err);
  }

  TEST_CASE("a restart whose next round cannot form: the summary names the attempt it was joining") {
    test::temp_dir dir;
    const auto id = fresh_id();
    // Rank 0 succeeds, which finishes the job; rank 1 fails after it, and
    // its node's restart finds no round to join.
    const auto args = joined(joined(rendezvous(id, "2"), {"-n", "1", "--max-restarts", "1"}),
                             worker(dir.path, "[ $RANK = 1 ] && { sleep 1; exit 3; }; exit 0"));
    auto results = run_nodes({{args}, {args}});
    const auto& failed = results[0].status.code() == 0 ? results[1] : results[0];
    CHECK(results[0].status.code() + results[1].status.code() == 1);
    CHECK(failed.status.code() == 1);
    CHECK_MESSAGE(failed.err.find("the run failed joining attempt 1 (role default, run " + id +
                                  ", 1 of 1 restarts used)\n  rendezvous of job '" + id) != std::string::npos,
                  failed.err);
    CHECK(failed.err.find("the job has finished") != std::string::npos);
    // What it had restarted after, told as the attempt before.
    CHECK(failed.err.find("Attempt 0 failed before it:\nRoot cause (first failure):") != std::string::npos);
    CHECK(failed.err.find("exited with code 3") != std::string::npos);
    CHECK(failed.err.find("attempt 0, 1 of 1 restarts used") == std::string::npos);
  }

  // Before, a node given no --local-addr published its host name as
  // gethostname() gives it, where torchrun publishes socket.getfqdn()'s
  // (they differ where the host name's address is named otherwise, as
  // localhost for a host name that /etc/hosts gives 127.0.0.1), and blanks
  // around --local-addr were refused.
  TEST_CASE("a node's address for the others is --local-addr, blanks around it taken off, else Python's "
            "socket.getfqdn(), as torchrun's") {
    const std::string fqdn = python_fqdn();
    for (const bool given : {false, true}) {
      CAPTURE(given);
      test::temp_dir dir;
      auto args = rendezvous(fresh_id(), "1");
      const auto flag = std::ranges::find(args, "--local-addr");
      REQUIRE(flag != args.end());
      if (given) {
        flag[1] = "\xc2\xa0 127.0.0.1\t";  // a no-break space, as Python's str.strip() takes it
      } else {
        args.erase(flag, flag + 2);
      }
      auto results = run_nodes({{joined(args, worker(dir.path, "exit 0"))}});
      REQUIRE_MESSAGE(results[0].status.code() == 0, results[0].err);
      CHECK(variables_in(dir.path / "1-0")["MASTER_ADDR"] == (given ? "127.0.0.1" : fqdn));
    }
  }

  TEST_CASE("etcd unreachable: a clear error within the rendezvous timeout") {
    const auto start = std::chrono::steady_clock::now();
    auto args = rendezvous(fresh_id(), "1:2", ",join_timeout=1");
    args[3] = "127.0.0.1:" + std::to_string(cohort_run::free_port());
    auto results = run_nodes({{joined(args, {"--", "/bin/true"})}});
    CHECK(results[0].status.code() == 1);
    CHECK(results[0].err.find("etcd unreachable") != std::string::npos);
    CHECK(results[0].err.find(args[3]) != std::string::npos);
    CHECK(std::chrono::steady_clock::now() - start < 10s);
    // A host alone is etcd's client port, 2379, as torchrun takes it: not
    // HTTP's 80.
    for (const char* given : {"127.0.0.1", "http://127.0.0.1", "[::1]"}) {
      const std::string host = given;
      CAPTURE(host);
      args[3] = host;
      results = run_nodes({{joined(args, {"--", "/bin/true"})}});
      CHECK(results[0].status.code() == 1);
      CHECK(results[0].err.find("etcd at " + host.substr(host.find('/') == std::string::npos ? 0 : 7) + ":2379") !=
            std::string::npos);
    }
  }

  TEST_CASE("SIGTERM to a node waiting for a round ends it before join_timeout, interrupted and recorded, its lease revoked") {
    test::temp_dir dir;
    const auto json = dir.path / "result.json";
    const auto id = fresh_id();
    // One node comes and waits for a second until its last call ends (20 s);
    // join_timeout is 30 s.
    auto args =
        joined(rendezvous(id, "1:2", ",last_call_timeout=20"), {"--result-json", json.string(), "--", "/bin/true"});
    std::chrono::steady_clock::time_point signalled;
    auto results = run_nodes({{args}}, [&](std::vector<std::optional<child>>& nodes) -> asio::awaitable<void> {
      asio::steady_timer timer(co_await asio::this_coro::executor, 1500ms);  // in the wait by then
      co_await timer.async_wait(asio::use_awaitable);
      nodes[0]->signal(SIGTERM);
      signalled = std::chrono::steady_clock::now();
    });
    CHECK(std::chrono::steady_clock::now() - signalled < 15s);  // not at join_timeout
    CAPTURE(results[0].err);
    CHECK_FALSE(results[0].status.signaled());
    CHECK(results[0].status.code() == 128 + SIGTERM);
    CHECK(results[0].err.find("interrupted by SIGTERM") != std::string::npos);
    REQUIRE(std::filesystem::exists(json));
    CHECK(nlohmann::json::parse(read_file(json))["outcome"] == "interrupted");
    // Its lease went with it: a node of the job that comes now is the
    // round's only one (else the round would close at once, with two).
    auto lone = run_nodes({{joined(rendezvous(id, "1:2"), {"--", "/bin/true"})}});
    CHECK(lone[0].status.code() == 0);
    CHECK(lone[0].err.find("node 0 of 1") != std::string::npos);
  }

  TEST_CASE("etcd gone once the ranks have succeeded: the node still succeeds, and says what it could not record") {
    test::etcd_server own;  // this test's to stop
    test::temp_dir dir;
    auto args = rendezvous(fresh_id(), "1:2");
    args[3] = own.endpoint();
    const auto started = dir.path / "started";  // the worker is up
    const auto go = dir.path / "go";            // it may end
    auto results = run_nodes(
        {{joined(args, {"--", "/bin/sh", "-c",
                        "touch \"$0\"; while [ ! -e \"$1\" ]; do sleep 0.02; done", started.string(), go.string()})}},
        [&](std::vector<std::optional<child>>&) -> asio::awaitable<void> {
          co_await files_appear(dir.path, 1, "started", 5ms, 30s);
          own.stop();
          std::ofstream{go};
        });
    CAPTURE(results[0].err);
    CHECK(results[0].status.code() == 0);
    CHECK(results[0].err.find("could not record this node's success at the rendezvous") != std::string::npos);
  }

  TEST_CASE("PyTorch workers: a gloo all_reduce across the nodes after they re-formed without a killed one") {
    if (std::system("/usr/bin/python3 -c 'import torch.distributed' >/dev/null 2>&1") != 0) {
      MESSAGE("torch is not importable by /usr/bin/python3: skipped");
      return;
    }
    test::temp_dir dir;
    const auto script = dir.path / "all_reduce.py";
    std::ofstream(script) << "import os, sys, time\n"
                             "out = sys.argv[1]\n"
                             "if os.environ['GROUP_WORLD_SIZE'] == '3':\n"
                             "    open(os.path.join(out, 'up-' + os.environ['RANK']), 'w').close()\n"
                             "    time.sleep(60)\n"
                             "import torch, torch.distributed as dist\n"
                             "dist.init_process_group('gloo')\n"
                             "t = torch.tensor([float(dist.get_rank() + 1)])\n"
                             "dist.all_reduce(t)\n"
                             "os.write(1, f'rank {dist.get_rank()} of {dist.get_world_size()}: {t.item()}\\n'.encode())\n"
                             "dist.destroy_process_group()\n";
    const auto id = fresh_id();
    const auto args = joined(rendezvous(id, "2:3"), {"-n", "2", "--max-restarts", "1", "--python", "/usr/bin/python3",
                                                     script.string(), dir.path.string()});
    auto results = run_nodes({{args}, {args}, {args}}, [&](std::vector<std::optional<child>>& children) -> asio::awaitable<void> {
      co_await files_appear(dir.path, 6, "up-", 10ms, 60s);
      children[1]->signal(SIGKILL);
    });
    std::vector<std::string> lines;
    for (int n : {0, 2}) {
      CHECK_MESSAGE(results[n].status.code() == 0, results[n].err);
      std::istringstream in(results[n].out);
      for (std::string line; std::getline(in, line);) lines.push_back(line);
    }
    std::sort(lines.begin(), lines.end());
    CHECK(lines == std::vector<std::string>{"rank 0 of 4: 10.0", "rank 1 of 4: 10.0", "rank 2 of 4: 10.0",
                                            "rank 3 of 4: 10.0"});
  }
}

// The etcd rendezvous against a real etcd, with threads (and a child process
// for a node that is killed) as nodes: rounds form and stay consistent,
// watches fire for what ends a round and only for that, and failures say why.
#include "run/rendezvous.hpp"

#include "support/etcd_server.hpp"

#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

using namespace cohort_run;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

using cohort::test::etcd;

namespace {

const cohort::test::needs_device needs{"etcd server", cohort::test::etcd_missing};

// A job of its own for each test.
std::string fresh_run_id() {
  static int count = 0;
  return "job" + std::to_string(++count) + "-" + std::to_string(::getpid());
}

// A node of job `run_id` at 10.0.0.<n>, port 29500 + n, with short timeouts.
rendezvous_config node(const std::string& run_id, int n, int min_nodes, int max_nodes, int nproc = 1) {
  rendezvous_config c;
  c.endpoint = etcd().endpoint();
  c.run_id = run_id;
  c.min_nodes = min_nodes;
  c.max_nodes = max_nodes;
  c.nproc = nproc;
  c.local_addr = "10.0.0." + std::to_string(n);
  c.local_port = 29500 + n;
  c.join_timeout = 15s;
  c.last_call_timeout = 300ms;
  c.lease_ttl = 1s;
  c.poll_interval = 50ms;
  return c;
}

using nodes = std::vector<std::unique_ptr<etcd_rendezvous>>;

nodes make_nodes(const std::vector<rendezvous_config>& configs) {
  nodes made;
  for (const auto& c : configs) made.push_back(std::make_unique<etcd_rendezvous>(c));
  return made;
}

// next_round of every node at once.
std::vector<assignment> next_rounds(const nodes& all) {
  std::vector<std::future<assignment>> pending;
  for (const auto& n : all) pending.push_back(std::async(std::launch::async, [&n] { return n->next_round(); }));
  std::vector<assignment> placed;
  for (auto& p : pending) placed.push_back(p.get());
  return placed;
}

// Checks that `placed` (one per node, nodes of `configs`) is one round:
// the same round, size and master, node ranks 0..n-1, and each node's first
// rank the sum of nproc of the nodes ranked before it.
void check_one_round(const std::vector<assignment>& placed, const std::vector<rendezvous_config>& configs) {
  REQUIRE(placed.size() == configs.size());
  const int n = static_cast<int>(placed.size());
  std::vector<int> nproc_by_rank(placed.size(), -1);
  int world = 0;
  for (std::size_t i = 0; i < placed.size(); ++i) {
    CHECK(placed[i].round == placed[0].round);
    CHECK(placed[i].nnodes == n);
    REQUIRE(placed[i].node_rank >= 0);
    REQUIRE(placed[i].node_rank < n);
    CHECK(nproc_by_rank[static_cast<std::size_t>(placed[i].node_rank)] == -1);  // ranks are distinct
    nproc_by_rank[static_cast<std::size_t>(placed[i].node_rank)] = configs[i].nproc;
    world += configs[i].nproc;
  }
  for (std::size_t i = 0; i < placed.size(); ++i) {
    CHECK(placed[i].world_size == world);
    int before = 0;
    for (int r = 0; r < placed[i].node_rank; ++r) before += nproc_by_rank[static_cast<std::size_t>(r)];
    CHECK(placed[i].first_rank == before);
    CHECK(placed[i].master_addr == placed[0].master_addr);
    CHECK(placed[i].master_port == placed[0].master_port);
    if (placed[i].node_rank == 0) {
      CHECK(placed[i].master_addr == configs[i].local_addr);
      CHECK(placed[i].master_port == configs[i].local_port);
    }
  }
}

// A child process, killed and reaped when this goes.
struct killed_at_end {
  pid_t pid;
  ~killed_at_end() {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
};

// Nodes 1 and 2 of job `run_id`, placed in one round.
struct two_placed {
  nodes all;
  std::vector<assignment> placed;
};
two_placed place_two(const std::string& run_id, int min_nodes, int max_nodes) {
  const std::vector<rendezvous_config> configs{node(run_id, 1, min_nodes, max_nodes),
                                               node(run_id, 2, min_nodes, max_nodes)};
  two_placed two{make_nodes(configs), {}};
  two.placed = next_rounds(two.all);
  check_one_round(two.placed, configs);
  return two;
}

// What a watch reported, for a test to wait on.
class watch_log {
 public:
  std::function<void(const round_change&)> callback() {
    return [this](const round_change& change) {
      std::lock_guard lock(mutex_);
      changes_.push_back(change);
      changed_.notify_all();
    };
  }
  /// The first change, once reported within `limit`.
  std::optional<round_change> wait(std::chrono::milliseconds limit) {
    std::unique_lock lock(mutex_);
    if (!changed_.wait_for(lock, limit, [this] { return !changes_.empty(); })) return std::nullopt;
    return changes_.front();
  }
  std::size_t count() {
    std::lock_guard lock(mutex_);
    return changes_.size();
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<round_change> changes_;
};

// Nodes 1 and 2 of a fresh job placed in one round, node `watching` (0 or
// 1) watching it, and a third node (10.0.0.3) of `third_min`:`third_max`
// nodes that gives up after `join_timeout`, not yet started.
struct round_and_third {
  std::string job = fresh_run_id();
  two_placed two;
  watch_log watched;
  etcd_rendezvous third;

  round_and_third(int min_nodes, int max_nodes, std::size_t watching, int third_min, int third_max,
                  std::chrono::milliseconds join_timeout)
      : two(place_two(job, min_nodes, max_nodes)), third([&] {
          auto c = node(job, 3, third_min, third_max);
          c.join_timeout = join_timeout;
          return c;
        }()) {
    two.all[watching]->watch(watched.callback());
  }
};

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// What the rendezvous_error of `r`'s next round says; "returned" when it
// returned.
std::string next_round_error(etcd_rendezvous& r) {
  try {
    r.next_round();
    return "returned";
  } catch (const rendezvous_error& e) {
    return e.what();
  }
}

// A TCP proxy on a loopback port to etcd at `target_port` that, once told,
// cuts every connection, old and new, for a while from the next range
// request it sees (a watch's read): etcd unreachable for one node alone,
// from a known moment, for a known time. Told to hold the requests to one
// path, it passes each on to etcd that much later: etcd slow to answer
// them, yet taking every one.
class etcd_proxy {
 public:
  explicit etcd_proxy(int target_port) : target_port_(target_port) {
    REQUIRE(::pipe2(stop_, O_CLOEXEC) == 0);
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr = loopback(0);
    socklen_t size = sizeof addr;
    REQUIRE(::bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    REQUIRE(::listen(listener_, 64) == 0);
    REQUIRE(::getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &size) == 0);
    port_ = ntohs(addr.sin_port);
    acceptor_ = std::thread([this] { accept_all(); });
  }
  etcd_proxy(const etcd_proxy&) = delete;
  etcd_proxy& operator=(const etcd_proxy&) = delete;
  ~etcd_proxy() {
    const char byte = 0;
    static_cast<void>(::write(stop_[1], &byte, 1));  // never read: every thread's poll sees it
    acceptor_.join();  // first: it adds the relays
    for (auto& t : relays_) t.join();
    for (int fd : {listener_, stop_[0], stop_[1]}) ::close(fd);
  }

  std::string endpoint() const { return "127.0.0.1:" + std::to_string(port_); }

  /// From the next range request on, every connection is cut for `length`.
  void cut_at_next_read(std::chrono::milliseconds length) {
    std::lock_guard lock(mutex_);
    armed_ = length;
    cut_began_.reset();
    reads_after_cut_ = 0;
  }
  /// From now on, each request to `path` ("/v3/lease/grant") reaches etcd
  /// `length` after it came, on a connection that passes nothing else
  /// meanwhile.
  void hold(std::string path, std::chrono::milliseconds length) {
    std::lock_guard lock(mutex_);
    held_path_ = std::move(path);
    hold_ = length;
  }
  /// How many requests were held.
  int held() {
    std::lock_guard lock(mutex_);
    return held_;
  }
  /// When the cut began; nullopt before the read that began it.
  std::optional<clock_type::time_point> cut_began() {
    std::lock_guard lock(mutex_);
    return cut_began_;
  }
  /// Whether a range request reached etcd after the cut ended, within `limit`.
  bool wait_read_after_cut(std::chrono::milliseconds limit) {
    std::unique_lock lock(mutex_);
    return read_.wait_for(lock, limit, [this] { return reads_after_cut_ > 0; });
  }

 private:
  static sockaddr_in loopback(int port) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<std::uint16_t>(port));
    return addr;
  }

  // Whether connections are cut now, given that `request` (possibly empty)
  // came from a client; counts the reads that pass after a cut.
  bool cut(std::string_view request) {
    std::lock_guard lock(mutex_);
    const auto now = clock_type::now();
    const bool read = request.find("/v3/kv/range") != std::string_view::npos;
    if (cut_began_ && now < cut_ends_) return true;
    if (read && armed_) {
      cut_began_ = now;
      cut_ends_ = now + *armed_;
      armed_.reset();
      return true;
    }
    if (read && cut_began_) {
      ++reads_after_cut_;
      read_.notify_all();
    }
    return false;
  }

  void accept_all() {
    for (;;) {
      pollfd fds[2] = {{listener_, POLLIN, 0}, {stop_[0], POLLIN, 0}};
      if (::poll(fds, 2, -1) < 0 || fds[1].revents != 0) return;
      const int client = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0) continue;
      const int upstream = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      const sockaddr_in to = loopback(target_port_);
      if (cut({}) || ::connect(upstream, reinterpret_cast<const sockaddr*>(&to), sizeof to) != 0) {
        ::close(client);
        ::close(upstream);
        continue;
      }
      relays_.emplace_back([this, client, upstream] { relay(client, upstream); });
    }
  }

  // How long to hold `request` before it goes on to etcd; counts the held.
  std::chrono::milliseconds hold_for(std::string_view request) {
    std::lock_guard lock(mutex_);
    if (held_path_.empty() || request.find(held_path_) == std::string_view::npos) return {};
    ++held_;
    return hold_;
  }

  // Copies both ways until either side closes, the cut comes, or the proxy goes.
  void relay(int client, int upstream) {
    char buf[65536];
    for (bool open = true; open;) {
      pollfd fds[3] = {{client, POLLIN, 0}, {upstream, POLLIN, 0}, {stop_[0], POLLIN, 0}};
      if (::poll(fds, 3, -1) < 0 || fds[2].revents != 0) break;
      for (int from = 0; from < 2 && open; ++from) {
        if (fds[from].revents == 0) continue;
        const ssize_t n = ::recv(fds[from].fd, buf, sizeof buf, 0);
        const auto data = std::string_view(buf, n > 0 ? static_cast<std::size_t>(n) : 0);
        if (from == 0) std::this_thread::sleep_for(hold_for(data));
        open = n > 0 && !cut(from == 0 ? data : std::string_view()) &&
               ::send(fds[1 - from].fd, buf, data.size(), MSG_NOSIGNAL) == n;
      }
    }
    ::close(client);
    ::close(upstream);
  }

  int target_port_;
  int port_ = 0;
  int listener_ = -1;
  int stop_[2] = {-1, -1};
  std::thread acceptor_;
  std::vector<std::thread> relays_;  // one per connection, added by the acceptor alone
  std::mutex mutex_;
  std::condition_variable read_;
  std::optional<std::chrono::milliseconds> armed_;
  std::optional<clock_type::time_point> cut_began_;
  clock_type::time_point cut_ends_;
  int reads_after_cut_ = 0;
  std::string held_path_;  // empty: none held
  std::chrono::milliseconds hold_{0};
  int held_ = 0;
};

// The seconds a watch's "etcd unreachable for <seconds> s: ..." says; -1 when it says none.
double unreachable_seconds(const std::string& reason) {
  static const std::string head = "etcd unreachable for ";
  if (!reason.starts_with(head)) return -1;
  return std::stod(reason.substr(head.size()));
}

// The job's state key, as JSON.
nlohmann::json state_of(const std::string& run_id) {
  etcd_client client(etcd().endpoint());
  const auto read = client.range("/cohort/rdzv/" + run_id + "/state");
  REQUIRE(read.kvs.size() == 1);
  return nlohmann::json::parse(read.kvs[0].value);
}

}  // namespace

TEST_SUITE("etcd rendezvous") {
  TEST_CASE("three nodes of 2:3 form one round as soon as all are in, with consistent assignments") {
    const auto job = fresh_run_id();
    std::vector<rendezvous_config> configs{node(job, 1, 2, 3, 1), node(job, 2, 2, 3, 2), node(job, 3, 2, 3, 3)};
    for (auto& c : configs) c.last_call_timeout = 60s;  // max_nodes closes the round, not the last call
    const auto all = make_nodes(configs);
    const auto start = clock_type::now();
    const auto placed = next_rounds(all);
    CHECK(clock_type::now() - start < 10s);
    check_one_round(placed, configs);
    CHECK(placed[0].nnodes == 3);
    CHECK(placed[0].world_size == 6);
  }

  // Before, a port of 0 was published as it was: MASTER_PORT 0.
  TEST_CASE("a node given no port offers one free here as it joins the round") {
    const auto job = fresh_run_id();
    std::vector<rendezvous_config> configs{node(job, 1, 1, 1)};
    configs[0].local_port = 0;
    const auto all = make_nodes(configs);
    const auto placed = next_rounds(all);
    REQUIRE(placed.size() == 1);
    CHECK(placed[0].master_port > 0);
    // Free: this process can listen on it.
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<std::uint16_t>(placed[0].master_port));
    CHECK(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    ::close(fd);
  }

  TEST_CASE("two nodes of 2:4 form a round once the last call has passed") {
    const auto job = fresh_run_id();
    std::vector<rendezvous_config> configs{node(job, 1, 2, 4, 4), node(job, 2, 2, 4, 4)};
    for (auto& c : configs) c.last_call_timeout = 700ms;
    const auto all = make_nodes(configs);
    const auto start = clock_type::now();
    const auto placed = next_rounds(all);
    CHECK(clock_type::now() - start >= 700ms);
    check_one_round(placed, configs);
    CHECK(placed[0].world_size == 8);
  }

  TEST_CASE("nodes whose last calls end together agree on one round") {
    const auto job = fresh_run_id();
    std::vector<rendezvous_config> configs;
    for (int n = 1; n <= 4; ++n) configs.push_back(node(job, n, 4, 8));
    for (auto& c : configs) c.last_call_timeout = 200ms;
    const auto all = make_nodes(configs);
    check_one_round(next_rounds(all), configs);
  }

  TEST_CASE("a killed node's lease expires: the others' watch fires and they form a round without it") {
    const auto job = fresh_run_id();
    // A second's last call: the three close the first round together, at max_nodes.
    auto with_last_call = [](rendezvous_config c) {
      c.last_call_timeout = 1s;
      return c;
    };
    const auto doomed_config = with_last_call(node(job, 3, 2, 3));
    int ends[2];
    REQUIRE(::pipe(ends) == 0);
    // The node to kill: a child process, forked while this one runs no other thread.
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      ::close(ends[0]);
      try {
        etcd_rendezvous doomed(doomed_config);
        const int rank = doomed.next_round().node_rank;
        if (::write(ends[1], &rank, sizeof rank) != sizeof rank) ::_exit(1);
        for (;;) ::pause();
      } catch (...) {
        ::_exit(2);
      }
    }
    ::close(ends[1]);
    const killed_at_end reap{child};
    // The others start once it has joined.
    etcd_client client(etcd().endpoint());
    for (int i = 0; i < 200 && client.range_prefix("/cohort/rdzv/" + job + "/r/").kvs.empty(); ++i) {
      std::this_thread::sleep_for(50ms);
    }
    watch_log watched[2];
    std::vector<rendezvous_config> configs{with_last_call(node(job, 1, 2, 3)), with_last_call(node(job, 2, 2, 3))};
    const auto all = make_nodes(configs);
    const auto first = next_rounds(all);
    int child_rank = -1;
    REQUIRE(::read(ends[0], &child_rank, sizeof child_rank) == sizeof child_rank);
    ::close(ends[0]);
    CHECK(first[0].nnodes == 3);
    CHECK(first[0].world_size == 3);
    CHECK(child_rank != first[0].node_rank);
    CHECK(child_rank != first[1].node_rank);

    all[0]->watch(watched[0].callback());
    all[1]->watch(watched[1].callback());
    std::this_thread::sleep_for(300ms);
    CHECK(watched[0].count() == 0);  // a running round stays quiet
    ::kill(child, SIGKILL);
    for (auto& w : watched) {
      const auto change = w.wait(10s);
      REQUIRE(change);
      CHECK(change->what == round_change::cause::member_lost);
      CHECK(change->reason ==
            "node " + std::to_string(child_rank) + " (10.0.0.3) left without finishing: its lease ended (the node was stopped, or etcd stopped hearing from it)");
    }
    const auto second = next_rounds(all);
    check_one_round(second, configs);
    CHECK(second[0].round > first[0].round);
    CHECK(second[0].nnodes == 2);
    CHECK(second[0].master_addr != "10.0.0.3");
  }

  TEST_CASE("a node killed as the round forms is placed with nobody: the round starts over, and a replacement takes "
            "its place") {
    const auto job = fresh_run_id();
    auto with_short_wait = [](rendezvous_config c) {
      c.join_timeout = 10s;
      return c;
    };
    const auto doomed_config = with_short_wait(node(job, 4, 3, 3));
    // The node to kill: a child process, forked while this one runs no
    // other thread, that joins and waits for two more.
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      try {
        etcd_rendezvous doomed(doomed_config);
        doomed.next_round();
        ::_exit(0);
      } catch (...) {
        ::_exit(2);
      }
    }
    const killed_at_end reap{child};
    std::vector<rendezvous_config> configs{with_short_wait(node(job, 1, 3, 3)), with_short_wait(node(job, 2, 3, 3)),
                                           with_short_wait(node(job, 3, 3, 3))};
    const auto all = make_nodes(configs);
    auto first = std::async(std::launch::async, [&] { return all[0]->next_round(); });
    // Killed once it and node 1 have joined: its key outlives it by its
    // lease, and node 2 closes the round with it.
    etcd_client client(etcd().endpoint());
    for (int i = 0; i < 200 && client.range_prefix("/cohort/rdzv/" + job + "/r/0/m/").kvs.size() < 2; ++i) {
      std::this_thread::sleep_for(20ms);
    }
    REQUIRE(client.range_prefix("/cohort/rdzv/" + job + "/r/0/m/").kvs.size() == 2);
    ::kill(child, SIGKILL);
    auto second = std::async(std::launch::async, [&] { return all[1]->next_round(); });
    std::this_thread::sleep_for(200ms);  // the round closes with the killed node
    auto replacement = std::async(std::launch::async, [&] { return all[2]->next_round(); });
    const std::vector<assignment> placed{first.get(), second.get(), replacement.get()};
    check_one_round(placed, configs);
    CHECK(placed[0].world_size == 3);
    CHECK(placed[0].round > 0);
    CHECK(contains(state_of(job)["why"].get<std::string>(), "(10.0.0.4) left before round 0 began: its lease ended"));
  }

  TEST_CASE("a member that does not confirm the round in time makes it start over without it") {
    const auto job = fresh_run_id();
    std::vector<rendezvous_config> configs{node(job, 1, 2, 3), node(job, 2, 2, 3)};
    for (auto& c : configs) c.request_timeout = 500ms;
    const auto all = make_nodes(configs);
    auto first = std::async(std::launch::async, [&] { return all[0]->next_round(); });
    // A member that joins round 0 under a lease it keeps alive, and never
    // confirms: a node stuck between its join and its confirmation.
    etcd_client client(etcd().endpoint());
    for (int i = 0; i < 200 && client.range_prefix("/cohort/rdzv/" + job + "/r/0/m/").kvs.empty(); ++i) {
      std::this_thread::sleep_for(20ms);
    }
    const auto stuck = client.grant_lease(1s);
    const nlohmann::json member{{"addr", "10.0.0.9"}, {"port", 29509}, {"nproc", 1}};
    client.put("/cohort/rdzv/" + job + "/r/0/m/stuck", member.dump(), stuck.id);
    std::jthread keeper([id = stuck.id](std::stop_token stop) {
      etcd_client renewing(etcd().endpoint());
      while (!stop.stop_requested()) {
        renewing.keep_alive(id);
        std::this_thread::sleep_for(200ms);
      }
    });
    const auto second = all[1]->next_round();
    const auto placed = std::vector<assignment>{first.get(), second};
    keeper.request_stop();
    check_one_round(placed, configs);
    CHECK(placed[0].nnodes == 2);
    CHECK(placed[0].round == 1);
    CHECK(contains(state_of(job)["why"].get<std::string>(), "(10.0.0.9) did not confirm round 0 within 1.7 s"));
  }

  TEST_CASE("nodes of different poll_intervals form their first round together: while a round forms and is "
            "confirmed, a node reads at the rendezvous's pace, however long its poll_interval") {
    for (const bool slow_first : {true, false}) {
      // Joining first, the slow node is the one the other waits for; joining
      // last, it closes the round and waits for the other's confirmation.
      CAPTURE(slow_first);
      const auto job = fresh_run_id();
      auto slow_config = node(job, 1, 2, 2);
      slow_config.poll_interval = 60s;  // longer than any wait of the test
      auto fast_config = node(job, 2, 2, 2);
      for (auto* c : {&slow_config, &fast_config}) c->join_timeout = 8s;
      const std::vector<rendezvous_config> configs{slow_config, fast_config};
      const auto all = make_nodes(configs);
      etcd_rendezvous* const early = all[slow_first ? 0 : 1].get();
      etcd_rendezvous* const later = all[slow_first ? 1 : 0].get();
      auto first = std::async(std::launch::async, [early] { return early->next_round(); });
      etcd_client client(etcd().endpoint());
      for (int i = 0; i < 200 && client.range_prefix("/cohort/rdzv/" + job + "/r/0/m/").kvs.empty(); ++i) {
        std::this_thread::sleep_for(20ms);
      }
      auto second = std::async(std::launch::async, [later] { return later->next_round(); });
      const auto early_placed = first.get();
      const auto later_placed = second.get();
      const auto placed = slow_first ? std::vector<assignment>{early_placed, later_placed}
                                     : std::vector<assignment>{later_placed, early_placed};
      check_one_round(placed, configs);
      CHECK(placed[0].round == 0);  // never started over for want of a confirmation
      CHECK(placed[0].nnodes == 2);
    }
  }

  TEST_CASE("a node that leaves without finishing makes the watch fire at once") {
    const auto job = fresh_run_id();
    watch_log watched;
    std::vector<rendezvous_config> configs{node(job, 1, 2, 2), node(job, 2, 2, 2)};
    auto all = make_nodes(configs);
    const auto placed = next_rounds(all);
    all[0]->watch(watched.callback());
    const int gone_rank = placed[1].node_rank;
    all[1].reset();  // revokes its lease
    const auto change = watched.wait(5s);
    REQUIRE(change);
    CHECK(change->what == round_change::cause::member_lost);
    CHECK(contains(change->reason, "node " + std::to_string(gone_rank) + " (10.0.0.2) left without finishing"));
  }

  TEST_CASE("a late joiner makes the watch fire, and the next round includes it") {
    const auto job = fresh_run_id();
    watch_log watched[2];
    std::vector<rendezvous_config> configs{node(job, 1, 2, 3, 2), node(job, 2, 2, 3, 2), node(job, 3, 2, 3, 1)};
    auto all = make_nodes(configs);
    const nodes early = [&] {
      nodes two;
      two.push_back(std::move(all[0]));
      two.push_back(std::move(all[1]));
      return two;
    }();
    const auto first = next_rounds(early);
    check_one_round(first, {configs[0], configs[1]});
    early[0]->watch(watched[0].callback());
    early[1]->watch(watched[1].callback());

    auto late = std::async(std::launch::async, [&] { return all[2]->next_round(); });
    for (auto& w : watched) {
      const auto change = w.wait(10s);
      REQUIRE(change);
      CHECK(change->what == round_change::cause::node_waiting);
      CHECK(change->reason == "1 node waiting to join");
    }
    auto again = next_rounds(early);
    again.push_back(late.get());
    check_one_round(again, configs);
    CHECK(again[0].round > first[0].round);
    CHECK(again[0].nnodes == 3);
    CHECK(again[0].world_size == 5);
  }

  TEST_CASE("a node waiting while the round is full does not end it") {
    const auto job = fresh_run_id();
    std::vector<rendezvous_config> configs{node(job, 1, 1, 2), node(job, 2, 1, 2)};
    for (auto& c : configs) c.last_call_timeout = 10s;
    watch_log watched;
    const auto all = make_nodes(configs);
    const auto placed = next_rounds(all);
    check_one_round(placed, configs);
    all[0]->watch(watched.callback());
    auto extra_config = node(job, 3, 1, 2);
    extra_config.join_timeout = 1s;
    etcd_rendezvous extra(extra_config);
    const auto full =
        "round " + std::to_string(placed[0].round) + " is full, with 2 nodes (--nnodes 1:2), and did not end";
    CHECK_THROWS_WITH_AS(extra.next_round(), doctest::Contains(full.c_str()), rendezvous_error);
    CHECK(watched.count() == 0);
  }

  TEST_CASE("finished nodes leave without making the watch fire, and a round whose nodes all finish ends there") {
    const auto job = fresh_run_id();
    watch_log watched[2];
    std::vector<rendezvous_config> configs{node(job, 1, 2, 3), node(job, 2, 2, 3), node(job, 3, 2, 3)};
    auto all = make_nodes(configs);
    const auto placed = next_rounds(all);
    check_one_round(placed, configs);
    all[0]->watch(watched[0].callback());
    all[1]->watch(watched[1].callback());
    all[2]->finished();
    all[2].reset();
    std::this_thread::sleep_for(300ms);
    all[1]->finished();
    all[1].reset();
    std::this_thread::sleep_for(1500ms);  // past the lease's time to live, many polls
    CHECK(watched[0].count() == 0);
    CHECK(watched[1].count() == 0);
    all[0]->finished();
    all[0].reset();
    const auto state = state_of(job);
    CHECK(state["round"] == placed[0].round);
    CHECK(state["phase"] == "running");
  }

  TEST_CASE("once a node's ranks succeeded the job has finished: a late node and a restarting one are told so") {
    // The third node comes while the round is full: it waits for the next one.
    round_and_third r(1, 2, 1, 1, 2, 5s);
    const auto& placed = r.two.placed;
    auto waiting = std::async(std::launch::async, [&] { return r.third.next_round(); });
    etcd_client client(etcd().endpoint());
    for (int i = 0; i < 200 && client.range_prefix("/cohort/rdzv/" + r.job + "/w/").kvs.empty(); ++i) {
      std::this_thread::sleep_for(50ms);
    }
    r.two.all[0]->finished();
    const std::string finished = "rendezvous of job '" + r.job + "' at " + etcd().endpoint() +
                                 ": the job has finished: node " + std::to_string(placed[0].node_rank) +
                                 " (10.0.0.1) succeeded in round " + std::to_string(placed[0].round);
    // It is told why it was in no round, and not that its id is an old job's.
    const auto late_told =
        finished + " (this node had no place: round " + std::to_string(placed[0].round) + " is full, with 2 nodes " +
        "(--nnodes 1:2))";
    CHECK_THROWS_WITH_AS(waiting.get(), late_told.c_str(), rendezvous_error);
    // The round's other node runs on; its ranks failing, it asks for a new
    // round, and is told instead: no round opens.
    CHECK(r.watched.count() == 0);
    r.two.all[1]->restart("node 1 restarts: rank 1 exited with code 4");
    CHECK_THROWS_WITH_AS(r.two.all[1]->next_round(), finished.c_str(), rendezvous_error);
    CHECK(state_of(r.job)["round"] == placed[0].round);
  }

  TEST_CASE("a member that sees its round formed only after another member's ranks succeeded still runs it") {
    const auto job = fresh_run_id();
    auto slow_config = node(job, 2, 2, 2);
    slow_config.poll_interval = 500ms;  // the other node closes the round, and sees it first
    etcd_rendezvous fast(node(job, 1, 2, 2)), slow(slow_config);
    std::promise<void> go;
    const auto gate = go.get_future().share();
    auto late = std::async(std::launch::async, [&] {
      etcd_client reader(etcd().endpoint());
      return slow.next_round([&](std::chrono::milliseconds d) {
        std::this_thread::sleep_for(d);
        // Once both confirmed the round, until the other node's ranks have
        // succeeded: it sees every confirmation only then.
        if (reader.range_prefix("/cohort/rdzv/" + job + "/r/0/ok/").kvs.size() == 2) gate.wait();
        return true;
      });
    });
    etcd_client client(etcd().endpoint());
    for (int i = 0; i < 200 && client.range_prefix("/cohort/rdzv/" + job + "/r/").kvs.empty(); ++i) {
      std::this_thread::sleep_for(50ms);
    }
    const auto first = fast.next_round();
    fast.finished();
    go.set_value();
    const auto second = late.get();
    CHECK(second.round == first.round);
    CHECK(second.nnodes == 2);
    CHECK(second.node_rank != first.node_rank);
  }

  TEST_CASE("a member lost after another member's ranks succeeded in the round counts as done: a member that had not "
            "seen every confirmation still runs the round") {
    const auto job = fresh_run_id();
    const std::string keys = "/cohort/rdzv/" + job + "/";
    auto slow_config = node(job, 2, 3, 3);
    slow_config.join_timeout = 5s;
    etcd_rendezvous fast(node(job, 1, 3, 3)), slow(slow_config);
    etcd_client client(etcd().endpoint());
    auto first = std::async(std::launch::async, [&] { return fast.next_round(); });
    for (int i = 0; i < 200 && client.range_prefix(keys + "r/0/m/").kvs.empty(); ++i) {
      std::this_thread::sleep_for(20ms);
    }
    // The third member: joined under a lease this test keeps alive, it
    // confirms when told, and is lost once the fast node's ranks succeeded.
    const auto third = client.grant_lease(1s);
    const nlohmann::json member{{"addr", "10.0.0.3"}, {"port", 29503}, {"nproc", 1}};
    client.put(keys + "r/0/m/third", member.dump(), third.id);
    std::jthread keeper([id = third.id](std::stop_token stop) {
      etcd_client renewing(etcd().endpoint());
      while (!stop.stop_requested()) {
        renewing.keep_alive(id);
        std::this_thread::sleep_for(200ms);
      }
    });
    std::promise<void> confirmed, go;
    auto slow_confirmed = confirmed.get_future();
    const auto gate = go.get_future().share();
    auto late = std::async(std::launch::async, [&] {
      etcd_client reader(etcd().endpoint());
      bool told = false;
      return slow.next_round([&](std::chrono::milliseconds d) {
        std::this_thread::sleep_for(d);
        // Once it and the fast node confirmed the round, until the third
        // node confirmed, the fast node's ranks succeeded and the third is
        // lost: it sees the round again only then.
        if (reader.range_prefix(keys + "r/0/ok/").kvs.size() >= 2) {
          if (!std::exchange(told, true)) confirmed.set_value();
          gate.wait();
        }
        return true;
      });
    });
    const bool both_confirmed = slow_confirmed.wait_for(10s) == std::future_status::ready;
    CHECK(both_confirmed);
    client.put(keys + "r/0/ok/third", "ok", third.id);
    const auto placed = first.get();
    fast.finished();
    keeper.request_stop();
    keeper.join();
    client.revoke_lease(third.id);
    go.set_value();
    const auto second = late.get();  // neither a round started over nor join_timeout's end
    CHECK(second.round == placed.round);
    CHECK(second.nnodes == 3);
    CHECK(second.world_size == 3);
    CHECK(second.node_rank != placed.node_rank);
    CHECK(state_of(job)["round"] == placed.round);
    // Its ranks then run: the watch of the round does not end it for the
    // member lost after the job finished.
    watch_log watched;
    slow.watch(watched.callback());
    const auto change = watched.wait(1500ms);
    slow.unwatch();
    INFO((change ? change->reason : std::string()));
    CHECK_FALSE(change.has_value());
  }

  // Before, a member read its running round only every poll_interval: one
  // longer than the last call saw a round reopened for a waiting node only
  // once it had closed without it, and reopened it in its turn, leaving
  // out another member as slow, round after round.
  TEST_CASE("a member of a long poll_interval sees a node waiting to join within half the last call") {
    const auto job = fresh_run_id();
    auto slow = node(job, 2, 2, 3);
    slow.poll_interval = 20s;
    const std::vector<rendezvous_config> configs{node(job, 1, 2, 3), slow};
    auto all = make_nodes(configs);
    check_one_round(next_rounds(all), configs);
    watch_log watched;
    all[1]->watch(watched.callback());
    auto third_config = node(job, 3, 2, 3);
    third_config.join_timeout = 4s;
    etcd_rendezvous third(third_config);
    auto waiting = std::async(std::launch::async, [&] { return next_round_error(third); });
    const auto change = watched.wait(3s);
    all[1]->unwatch();
    REQUIRE(change);
    CHECK(change->what == round_change::cause::node_waiting);
    (void)waiting.get();
  }

  TEST_CASE("a round opened as another node's ranks succeeded ends once that node says so: the job has finished") {
    const auto [all, first] = place_two(fresh_run_id(), 1, 2);
    // Node 2's ranks failed: it opens round 1 and runs it alone, while node
    // 1's ranks succeed in round 0.
    all[1]->restart("node 1 restarts: rank 1 exited with code 4");
    const auto second = all[1]->next_round();
    CHECK(second.round == first[1].round + 1);
    CHECK(second.nnodes == 1);
    watch_log watched;
    all[1]->watch(watched.callback());
    all[0]->finished();
    const auto change = watched.wait(5s);
    REQUIRE(change);
    CHECK(change->what == round_change::cause::closed);
    CHECK(change->reason == "the job has finished: node " + std::to_string(first[0].node_rank) +
                                " (10.0.0.1) succeeded in round " + std::to_string(first[0].round));
    CHECK_THROWS_AS(all[1]->next_round(), rendezvous_error);
  }

  TEST_CASE("a node that gives another --nnodes than the job's is refused, and the running round goes on") {
    round_and_third r(2, 3, 0, 2, 2, 3s);
    const std::string refused = "rendezvous of job '" + r.job + "' at " + etcd().endpoint() +
                                ": this node runs with --nnodes 2 and the job with --nnodes 2:3 (every node of a job "
                                "gives the same)";
    CHECK_THROWS_WITH_AS(r.third.next_round(), refused.c_str(), rendezvous_error);
    std::this_thread::sleep_for(300ms);  // many polls
    CHECK(r.watched.count() == 0);
    CHECK(state_of(r.job)["round"] == r.two.placed[0].round);
  }

  TEST_CASE("close makes the others' watch fire, and their next round fail, with the reason") {
    const auto job = fresh_run_id();
    watch_log watched;
    std::vector<rendezvous_config> configs{node(job, 1, 2, 2), node(job, 2, 2, 2)};
    auto all = make_nodes(configs);
    next_rounds(all);
    all[0]->watch(watched.callback());
    all[1]->close("rank 3 ran out of memory");
    const auto change = watched.wait(5s);
    REQUIRE(change);
    CHECK(change->what == round_change::cause::closed);
    CHECK(change->reason == "the job was closed: rank 3 ran out of memory");
    const std::string closed = "rendezvous of job '" + job + "' at " + etcd().endpoint() +
                               ": the job was closed: rank 3 ran out of memory";
    // A node of the job learns why. One that comes while the job's nodes
    // are still there came late; one that comes once they are gone, or
    // with another --nnodes, is told its id may be an old job's.
    CHECK_THROWS_WITH_AS(all[0]->next_round(), closed.c_str(), rendezvous_error);
    const std::string late = closed + " (it ended before this node came)";
    CHECK_THROWS_WITH_AS(etcd_rendezvous(node(job, 3, 2, 2)).next_round(), late.c_str(), rendezvous_error);
    const std::string other_size = closed + " (the job ran with --nnodes 2, this node with 3: a run id names one job: "
                                            "a new job needs a --rdzv-id of its own)";
    CHECK_THROWS_WITH_AS(etcd_rendezvous(node(job, 4, 3, 3)).next_round(), other_size.c_str(), rendezvous_error);
    for (auto& n : all) n.reset();  // their leases revoked: nothing of the job is left
    const std::string stale =
        closed + " (no node of the job is left: a run id names one job: a new job needs a --rdzv-id of its own)";
    CHECK_THROWS_WITH_AS(etcd_rendezvous(node(job, 5, 2, 2)).next_round(), stale.c_str(), rendezvous_error);
  }

  TEST_CASE("restart starts a new round for every node, saying why") {
    const auto job = fresh_run_id();
    watch_log watched;
    std::vector<rendezvous_config> configs{node(job, 1, 2, 2, 3), node(job, 2, 2, 2, 1)};
    const auto all = make_nodes(configs);
    const auto first = next_rounds(all);
    all[0]->watch(watched.callback());
    all[1]->restart("node 1 restarts: rank 1 exited with code 3");
    const auto change = watched.wait(5s);
    REQUIRE(change);
    CHECK(change->what == round_change::cause::new_round);
    CHECK(change->reason ==
          "round " + std::to_string(first[0].round + 1) + " was started: node 1 restarts: rank 1 exited with code 3");
    const auto second = next_rounds(all);
    check_one_round(second, configs);
    CHECK(second[0].round == first[0].round + 1);
  }

  TEST_CASE("the watch fires when etcd stops answering for a lease's time to live") {
    cohort::test::etcd_server own;  // to freeze without freezing the other tests' etcd
    watch_log watched;
    auto config = node(fresh_run_id(), 1, 1, 1);
    config.endpoint = own.endpoint();
    config.request_timeout = 300ms;
    etcd_rendezvous lone(config);
    CHECK(lone.next_round().nnodes == 1);
    lone.watch(watched.callback());
    own.pause();
    const auto change = watched.wait(5s);
    own.resume();
    REQUIRE(change);
    CHECK(change->what == round_change::cause::etcd_unreachable);
    CHECK(unreachable_seconds(change->reason) >= 1);
    CHECK(contains(change->reason, " s: etcd at " + own.endpoint() + ": range: "));
  }

  // Before, a renewal etcd left unanswered was tried again a third of the
  // lease later: the lease expired as that try was sent, whatever the
  // outage's length past two thirds of the lease.
  TEST_CASE("etcd frozen for four fifths of the lease leaves this node's lease, and its round, alive") {
    cohort::test::etcd_server own;  // to freeze without freezing the other tests' etcd
    watch_log watched;
    const auto job = fresh_run_id();
    auto config = node(job, 1, 1, 1);
    config.endpoint = own.endpoint();
    config.lease_ttl = 4s;  // renewals tried a third of a second apart: the lease outlives 3.3 s of outage
    etcd_rendezvous lone(config);
    REQUIRE(lone.next_round().nnodes == 1);
    lone.watch(watched.callback());
    // Twice, each outage at another point between two renewals.
    for (int outage = 0; outage < 2; ++outage) {
      own.pause();
      std::this_thread::sleep_for(3200ms);
      own.resume();
      // Past the lease of the renewal before the outage.
      const auto change = watched.wait(2500ms);
      CHECK_MESSAGE(!change, (change ? change->reason : std::string()));
    }
    etcd_client client(own.endpoint());
    CHECK(client.range_prefix("/cohort/rdzv/" + job + "/r/0/m/").kvs.size() == 1);
  }

  // A one-node round whose requests to `path` etcd answers `late`: no
  // change is watched for `watching`, and its member stays in etcd.
  // Returns how many requests were answered late.
  int round_alive_answered_late(const std::string& path, std::chrono::milliseconds late,
                                std::chrono::milliseconds watching) {
    etcd_proxy proxy(etcd().port());
    watch_log watched;
    const auto job = fresh_run_id();
    auto config = node(job, 1, 1, 1);
    config.endpoint = proxy.endpoint();
    config.lease_ttl = 2s;  // renewed a sixth of a second apart
    proxy.hold(path, late);
    etcd_rendezvous lone(config);
    REQUIRE(lone.next_round().nnodes == 1);
    lone.watch(watched.callback());
    const auto change = watched.wait(watching);
    CHECK_MESSAGE(!change, (change ? change->reason : std::string()));
    etcd_client client(etcd().endpoint());
    CHECK(client.range_prefix("/cohort/rdzv/" + job + "/r/0/m/").kvs.size() == 1);
    return proxy.held();
  }

  // Before, the lease was counted from the grant's request: one etcd
  // answered later than the lease less a step was given up before its
  // first renewal, and the round ended "this node's lease expired" though
  // etcd had granted it as the request came and kept it.
  TEST_CASE("a lease grant that etcd answers late leaves the lease, and the round, alive") {
    // Past twice the lease, counted from the grant's request; one lease,
    // never given up.
    CHECK(round_alive_answered_late("/v3/lease/grant", 1900ms, 4s) == 1);
  }

  // Before, a renewal etcd had not answered within a step was given up: a
  // lease whose every renewal etcd answered a little late was counted lost,
  // "etcd did not answer its renewals for 1.8 s".
  TEST_CASE("renewals that etcd answers later than their step leave the lease, and the round, alive") {
    CHECK(round_alive_answered_late("/v3/lease/keepalive", 500ms, 5s) >= 2);
  }

  TEST_CASE("etcd frozen past the lease loses it, and the watch says etcd did not answer its renewals, and for how "
            "long") {
    cohort::test::etcd_server own;
    watch_log watched;
    auto config = node(fresh_run_id(), 1, 1, 1);
    config.endpoint = own.endpoint();
    config.lease_ttl = 2s;
    config.request_timeout = 10s;  // the watch's read waits out the outage, and then sees the lease gone
    etcd_rendezvous lone(config);
    REQUIRE(lone.next_round().nnodes == 1);
    lone.watch(watched.callback());
    own.pause();
    std::this_thread::sleep_for(3500ms);
    own.resume();
    const auto change = watched.wait(10s);
    REQUIRE(change);
    CHECK(change->what == round_change::cause::lease_lost);
    const std::string head = "this node's lease expired: etcd did not answer its renewals for ";
    REQUIRE_MESSAGE(change->reason.starts_with(head), change->reason);
    // From the first renewal that went unanswered to the lease's end: most of a lease.
    const double said = std::stod(change->reason.substr(head.size()));
    CHECK(said >= 1.5);
    CHECK(said <= 3);
    CHECK(change->reason.ends_with(" s"));
  }

  TEST_CASE("an etcd outage shorter than the lease leaves the round running, however long the poll; a longer one "
            "ends it, saying how long it lasted") {
    etcd_proxy proxy(etcd().port());
    watch_log watched;
    auto config = node(fresh_run_id(), 1, 1, 1);
    config.endpoint = proxy.endpoint();
    config.lease_ttl = 2s;
    // Longer than the lease: the first read that fails comes more than a
    // lease after the last that succeeded.
    config.poll_interval = 2500ms;
    etcd_rendezvous lone(config);
    REQUIRE(lone.next_round().nnodes == 1);
    lone.watch(watched.callback());
    proxy.cut_at_next_read(600ms);
    // Read again within the lease: the watch went on, and it stays quiet.
    CHECK(proxy.wait_read_after_cut(10s));
    CHECK(watched.count() == 0);
    proxy.cut_at_next_read(std::chrono::hours(1));
    const auto change = watched.wait(15s);
    const auto seen = clock_type::now();
    REQUIRE(change);
    CHECK(change->what == round_change::cause::etcd_unreachable);
    CHECK(contains(change->reason, " s: etcd at " + proxy.endpoint() + ": range: "));
    // At least the lease, and no longer than the cut had lasted.
    const auto began = proxy.cut_began();
    REQUIRE(began);
    const double said = unreachable_seconds(change->reason);
    CHECK(said >= 2);
    CHECK(said <= std::chrono::duration<double>(seen - *began).count() + 0.01);
  }

  TEST_CASE("an unreachable etcd makes next_round fail within join_timeout, naming the endpoint and the cause") {
    auto config = node("unreachable", 1, 1, 1);
    config.endpoint = "127.0.0.1:" + std::to_string(cohort_run::free_port());
    config.join_timeout = 500ms;
    etcd_rendezvous lone(config);
    const auto start = clock_type::now();
    const std::string what = next_round_error(lone);
    CHECK(what.starts_with("rendezvous of job 'unreachable' at " + config.endpoint +
                           ": etcd unreachable until join_timeout (0.5 s): etcd at " + config.endpoint +
                           ": lease grant: "));
    CHECK(contains(what, "Couldn't connect to server"));
    const auto took = clock_type::now() - start;
    CHECK(took >= 500ms);
    CHECK(took < 10s);  // not a hang: a generous bound on a loaded machine
  }

  TEST_CASE("a request cut short by join_timeout's end does not replace the cause etcd was unreachable for") {
    // The first connection is dropped unanswered; the later ones are never
    // accepted, so their requests take until join_timeout's end.
    const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t size = sizeof addr;
    REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    REQUIRE(::listen(listener, 16) == 0);
    REQUIRE(::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &size) == 0);
    std::thread dropper([listener] { ::close(::accept(listener, nullptr, nullptr)); });
    auto config = node("dropped", 1, 1, 1);
    config.endpoint = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
    config.join_timeout = 1s;  // shorter than a request may take: every request is cut to what is left
    etcd_rendezvous lone(config);
    const std::string what = next_round_error(lone);
    dropper.join();
    ::close(listener);
    CHECK(what.starts_with("rendezvous of job 'dropped' at " + config.endpoint +
                           ": etcd unreachable until join_timeout (1 s): etcd at " + config.endpoint +
                           ": lease grant: "));
    CHECK_MESSAGE(!contains(what, "timed out"), what);
  }

  TEST_CASE("an endpoint that speaks no HTTP makes next_round fail at once, not at join_timeout") {
    cohort::test::ssh_like_server ssh;
    auto config = node("not-etcd", 1, 1, 1);
    config.endpoint = ssh.endpoint();
    config.join_timeout = 20s;
    etcd_rendezvous lone(config);
    const auto start = clock_type::now();
    const std::string what = next_round_error(lone);
    CHECK(what.starts_with("rendezvous of job 'not-etcd' at " + config.endpoint + ": etcd at " + config.endpoint +
                           ": lease grant: "));
    CHECK(contains(what, "the endpoint does not speak etcd's HTTP API"));
    CHECK(clock_type::now() - start < 10s);  // not join_timeout's 20 s
  }

  TEST_CASE("too few nodes make next_round fail at join_timeout, and a node that gave up is not counted") {
    const auto job = fresh_run_id();
    auto config = node(job, 1, 2, 3);
    config.join_timeout = 600ms;
    {
      etcd_rendezvous alone(config);
      const auto start = clock_type::now();
      CHECK_THROWS_WITH_AS(alone.next_round(),
                           ("rendezvous of job '" + job + "' at " + etcd().endpoint() +
                            ": no round formed within join_timeout (0.6 s): 1 of at least 2 nodes had joined round 0")
                               .c_str(),
                           rendezvous_error);
      const auto took = clock_type::now() - start;
      CHECK(took >= 600ms);
      CHECK(took < 10s);
      // Still there, but out: two others form a round of two.
      std::vector<rendezvous_config> configs{node(job, 2, 2, 3), node(job, 3, 2, 3)};
      const auto others = make_nodes(configs);
      const auto placed = next_rounds(others);
      check_one_round(placed, configs);
      CHECK(placed[0].nnodes == 2);
    }
  }
}

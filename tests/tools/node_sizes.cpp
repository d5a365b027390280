// The exchange of rank counts between the nodes of a static job, each node
// a thread here, over loopback.
#include "run/node_sizes.hpp"
#include "run/port.hpp"

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <variant>
#include <vector>

using namespace std::chrono_literals;
using cohort_run::gather_node_sizes;
using cohort_run::node_sizes_config;
using sizes = std::vector<int>;

namespace {

node_sizes_config node(int port, int nnodes, int node_rank, int nproc, std::chrono::milliseconds timeout = 20s) {
  node_sizes_config c;
  c.master_addr = "127.0.0.1";
  c.master_port = port;
  c.nnodes = nnodes;
  c.node_rank = node_rank;
  c.nproc = nproc;
  c.timeout = timeout;
  return c;
}

// A pause that sleeps as asked and says a shutdown signal came once
// `after` has passed from now.
std::function<bool(std::chrono::milliseconds)> signal_after(std::chrono::milliseconds after) {
  const auto until = std::chrono::steady_clock::now() + after;
  return [until](std::chrono::milliseconds d) {
    std::this_thread::sleep_for(d);
    return std::chrono::steady_clock::now() < until;
  };
}

// What one node came to: its sizes, nothing (interrupted), or its error.
using ending = std::variant<std::optional<sizes>, std::string>;

// Runs each node on a thread of its own, each after its delay.
std::vector<ending> run_nodes(const std::vector<node_sizes_config>& nodes,
                              const std::vector<std::chrono::milliseconds>& delays = {}) {
  std::vector<ending> endings(nodes.size());
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    threads.emplace_back([&, i] {
      if (i < delays.size()) std::this_thread::sleep_for(delays[i]);
      try {
        endings[i] = gather_node_sizes(nodes[i]);
      } catch (const std::exception& e) {
        endings[i] = std::string(e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  return endings;
}

std::optional<sizes> sizes_of(const ending& e) {
  if (const auto* s = std::get_if<std::optional<sizes>>(&e)) return *s;
  FAIL_CHECK("the node failed: " << std::get<std::string>(e));
  return std::nullopt;
}

std::string error_of(const ending& e) {
  if (const auto* s = std::get_if<std::string>(&e)) return *s;
  FAIL_CHECK("the node did not fail");
  return {};
}

// 127.0.0.1 (or another IPv4 `host`) at `port`.
sockaddr_in ipv4(int port, std::uint32_t host = INADDR_LOOPBACK) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(host);
  return a;
}

// A plain TCP connection to 127.0.0.1:`port`, retried while nothing listens.
int connect_to(int port) {
  for (int i = 0; i < 200; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    const sockaddr_in a = ipv4(port);
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0) return fd;
    ::close(fd);
    std::this_thread::sleep_for(20ms);
  }
  FAIL("nothing listens on port " << port);
  return -1;
}

void send_text(int fd, const std::string& text) {
  REQUIRE(::send(fd, text.data(), text.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(text.size()));
}

// Node 0's sizes; none when it failed (said as a failed check).
std::optional<sizes> node_zero(const node_sizes_config& c) {
  try {
    return gather_node_sizes(c);
  } catch (const std::exception& e) {
    FAIL_CHECK("node 0 failed: " << std::string(e.what()));
    return std::nullopt;
  }
}

// Whether a socket binds `port` on every IPv4 address without
// SO_REUSEADDR, as a store that does not set it binds: nothing of node 0's
// connections stays on the port.
bool binds_plainly(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  const sockaddr_in a = ipv4(port, INADDR_ANY);
  const bool bound = ::bind(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return bound;
}

// A socket listening on every IPv4 address at `port`, as a program other
// than node 0 would; with SO_REUSEADDR, as node 0 listens.
int listening_on(int port, bool reuse_address = false) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  const int one = 1;
  if (reuse_address) REQUIRE(::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0);
  const sockaddr_in a = ipv4(port, INADDR_ANY);
  REQUIRE(::bind(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::listen(fd, 4) == 0);
  return fd;
}

// Takes connections on `listener` in turn, at most `at_most`, until it is
// shut down or none comes for 5 s: reads each one's first line and ends it
// without a word, with a reset, as torch's TCPStore does with bytes it does
// not know, or with an orderly close. How many it took.
int take_and_hang_up(int listener, bool reset, int at_most = 1000) {
  const timeval wait{5, 0};
  REQUIRE(::setsockopt(listener, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait) == 0);
  int taken = 0;
  for (; taken < at_most; ++taken) {
    const int fd = ::accept(listener, nullptr, nullptr);
    if (fd < 0) break;
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait);
    char buffer[256];
    (void)::recv(fd, buffer, sizeof buffer, 0);
    if (reset) {
      const linger now{1, 0};
      ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &now, sizeof now);
    }
    ::close(fd);
  }
  return taken;
}

// Fake nodes first..last of `nnodes`, each `nproc` ranks, greeting node 0
// at `port` from this thread; their sockets, to close.
std::vector<int> fake_nodes(int port, int nnodes, int first, int last, int nproc) {
  std::vector<int> fds;
  for (int k = first; k <= last; ++k) {
    fds.push_back(connect_to(port));
    send_text(fds.back(), cohort_run::greeting_of(nnodes, k, nproc));
  }
  return fds;
}

}  // namespace

TEST_SUITE("node sizes") {
  TEST_CASE("greetings: a node's line reads back as itself; anything else is not one") {
    auto line = cohort_run::greeting_of(4, 3, 8);
    REQUIRE(line.back() == '\n');
    line.pop_back();  // as node 0 reads it
    const auto g = cohort_run::parse_greeting(line);
    REQUIRE(g);
    CHECK(g->nnodes == 4);
    CHECK(g->node_rank == 3);
    CHECK(g->nproc == 8);
    for (const char* bad : {"", "GET / HTTP/1.1", "cohort-run nodes 1 4 3", "cohort-run nodes 1 4 3 8 9",
                            "cohort-run nodes 1 4 4 8", "cohort-run nodes 1 4 -1 8", "cohort-run nodes 1 4 1 0",
                            "cohort-run nodes 2 4 1 8", "cohort-run nodes 1 4 1 x", "cohort-run nodes 1  4 1 8"}) {
      CAPTURE(bad);
      CHECK_FALSE(cohort_run::parse_greeting(bad));
    }
  }

  TEST_CASE("three nodes of 2, 1 and 4 ranks: each learns every count, whichever starts first") {
    for (const bool zero_last : {false, true}) {
      CAPTURE(zero_last);
      const int port = cohort_run::free_port();
      const auto delay = zero_last ? std::vector{400ms, 0ms, 0ms} : std::vector{0ms, 200ms, 0ms};
      // Node 2 names node 0's address, which is looked up on a thread of
      // its own; node 1 gives it as numbers, read at once.
      auto named = node(port, 3, 2, 4);
      named.master_addr = "localhost";
      const auto endings = run_nodes({node(port, 3, 0, 2), node(port, 3, 1, 1), named}, delay);
      for (const auto& e : endings) CHECK(sizes_of(e) == sizes{2, 1, 4});
    }
  }

  TEST_CASE("one node alone needs no exchange") {
    CHECK(gather_node_sizes(node(1, 1, 0, 3)) == sizes{3});
  }

  TEST_CASE("a node with another --nnodes, or a node rank given twice, ends the job on every node, saying why") {
    int port = cohort_run::free_port();
    auto endings = run_nodes({node(port, 3, 0, 1), node(port, 3, 1, 1), node(port, 4, 2, 1)}, {0ms, 0ms, 300ms});
    for (const auto& e : endings) {
      const auto why = error_of(e);
      CHECK_MESSAGE(why.find("node 2 runs with --nnodes 4 and node 0 with --nnodes 3") != std::string::npos, why);
    }
    // Each node closed first once told: nothing of the failed job stays on
    // the port for the next one's store.
    CHECK(binds_plainly(port));
    port = cohort_run::free_port();
    endings = run_nodes({node(port, 3, 0, 1), node(port, 3, 1, 1), node(port, 3, 1, 2)}, {0ms, 0ms, 300ms});
    for (const auto& e : endings) {
      const auto why = error_of(e);
      CHECK_MESSAGE(why.find("two nodes of the job say they are node 1") != std::string::npos, why);
    }
    CHECK(binds_plainly(port));
  }

  TEST_CASE("node 0 drops what is not a node, and a node that left before the answer makes room for its restart") {
    const int port = cohort_run::free_port();
    auto zero = node(port, 3, 0, 3);
    zero.greeting_timeout = 300ms;
    std::optional<sizes> got;
    std::thread server([&] { got = node_zero(zero); });
    const int stranger = connect_to(port);
    send_text(stranger, "GET / HTTP/1.1\r\n\r\n");
    const int silent = connect_to(port);  // says nothing: dropped after greeting_timeout
    const int left = connect_to(port);
    send_text(left, cohort_run::greeting_of(3, 1, 9));
    std::this_thread::sleep_for(400ms);
    ::close(left);  // its cohort-run ended; node 1 starts again with another count
    std::this_thread::sleep_for(300ms);
    const auto endings = run_nodes({node(port, 3, 1, 5), node(port, 3, 2, 2)});
    server.join();
    CHECK(got == sizes{3, 5, 2});
    for (const auto& e : endings) CHECK(sizes_of(e) == sizes{3, 5, 2});
    // Node 0 answered neither of the others.
    char byte;
    CHECK(::recv(stranger, &byte, 1, MSG_DONTWAIT) <= 0);
    CHECK(::recv(silent, &byte, 1, MSG_DONTWAIT) <= 0);
    ::close(stranger);
    ::close(silent);
    // Node 0 reset what it dropped, and each node closed first: the port
    // binds without SO_REUSEADDR.
    CHECK(binds_plainly(port));
  }

  TEST_CASE("a node that sends more than its greeting is dropped; the real node takes its place") {
    const int port = cohort_run::free_port();
    std::optional<sizes> got;
    std::thread server([&] { got = node_zero(node(port, 3, 0, 1)); });
    const int chatty = connect_to(port);
    send_text(chatty, cohort_run::greeting_of(3, 1, 7));
    std::this_thread::sleep_for(300ms);
    send_text(chatty, "more\n");
    std::this_thread::sleep_for(300ms);
    const auto endings = run_nodes({node(port, 3, 1, 4), node(port, 3, 2, 2)});
    server.join();
    ::close(chatty);
    CHECK(got == sizes{1, 4, 2});
    for (const auto& e : endings) CHECK(sizes_of(e) == sizes{1, 4, 2});
  }

  TEST_CASE("a connection that floods node 0 once it has node 0's last line is reset, and node 0 ends in time") {
    // Reads node 0's line on `fd`, then sends until node 0 resets it.
    const auto flood = [](int fd) {
      return std::thread([fd] {
        char byte;
        while (::recv(fd, &byte, 1, 0) == 1 && byte != '\n') {
        }
        const std::string chunk(4096, 'x');
        while (::send(fd, chunk.data(), chunk.size(), MSG_NOSIGNAL) > 0) {
        }
        ::close(fd);
      });
    };
    for (const bool fails : {false, true}) {
      CAPTURE(fails);
      const int port = cohort_run::free_port();
      std::vector<ending> zero;
      std::thread server([&] { zero = run_nodes({node(port, 3, 0, 1)}); });
      std::vector<int> fds = fake_nodes(port, 3, 1, 1, 2);
      if (fails) fds.push_back(connect_to(port));  // says nothing until told the job ends
      std::vector<std::thread> flooders;
      for (const int fd : fds) flooders.push_back(flood(fd));
      std::this_thread::sleep_for(200ms);
      const auto last = std::chrono::steady_clock::now();
      auto other = node(port, fails ? 4 : 3, 2, 1);
      const auto endings = run_nodes({other});
      server.join();
      CHECK(std::chrono::steady_clock::now() - last < 4s);
      for (auto& t : flooders) t.join();
      if (fails) {
        const auto why = error_of(zero[0]);
        CHECK_MESSAGE(why.find("node 2 runs with --nnodes 4") != std::string::npos, why);
      } else {
        CHECK(sizes_of(zero[0]) == sizes{1, 2, 1});
        CHECK(sizes_of(endings[0]) == sizes{1, 2, 1});
      }
      CHECK(binds_plainly(port));
    }
  }

  TEST_CASE("600 nodes of 7-digit counts: node 0's long answer reaches every node whole") {
    const int nnodes = 600;
    const int port = cohort_run::free_port();
    std::optional<sizes> got;
    std::thread server([&] { got = node_zero(node(port, nnodes, 0, 1)); });
    auto fds = fake_nodes(port, nnodes, 2, nnodes - 1, 1'000'000);
    const auto endings = run_nodes({node(port, nnodes, 1, 1'000'000)});
    server.join();
    for (const int fd : fds) ::close(fd);
    REQUIRE(got);
    sizes expected(nnodes, 1'000'000);
    expected[0] = 1;
    CHECK(*got == expected);
    CHECK(sizes_of(endings[0]) == expected);
  }

  TEST_CASE("node 0 out of descriptors for its nodes fails at once, naming the limit") {
    const int port = cohort_run::free_port();
    int report[2];
    REQUIRE(::pipe2(report, O_CLOEXEC) == 0);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {  // node 0, with room for few descriptors more than it has open
      rlim_t open = 0;
      for (int fd = 0; fd < 4096; ++fd) open += ::fcntl(fd, F_GETFD) >= 0 ? 1 : 0;
      const rlimit few{open + 30, open + 30};  // room for 60 more at most, wherever the open ones are
      std::string said = "no error";
      if (::setrlimit(RLIMIT_NOFILE, &few) == 0) {
        try {
          (void)gather_node_sizes(node(port, 100, 0, 1, 10s));
        } catch (const std::exception& e) {
          said = e.what();
        }
      }
      (void)!::write(report[1], said.data(), said.size());
      ::_exit(0);
    }
    ::close(report[1]);
    const auto started = std::chrono::steady_clock::now();
    // As many as the backlog takes before node 0 fails: once it has, the
    // rest find nothing listening, and are not tried further.
    std::vector<int> fds{connect_to(port)};
    send_text(fds.back(), cohort_run::greeting_of(100, 1, 1));
    for (int k = 2; k < 100; ++k) {
      const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      const sockaddr_in a = ipv4(port);
      fds.push_back(fd);
      if (fd < 0 || ::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) break;
      const auto greeting = cohort_run::greeting_of(100, k, 1);
      (void)::send(fd, greeting.data(), greeting.size(), MSG_NOSIGNAL);
    }
    std::string said;
    char buffer[512];
    for (ssize_t n; (n = ::read(report[0], buffer, sizeof buffer)) > 0;) {
      said.append(buffer, static_cast<std::size_t>(n));
    }
    ::close(report[0]);
    for (const int fd : fds) {
      if (fd >= 0) ::close(fd);
    }
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK_MESSAGE(said.find("node 0 ran out of file descriptors") != std::string::npos, said);
    CHECK(said.find("--nnodes 100") != std::string::npos);
    CHECK(std::chrono::steady_clock::now() - started < 8s);
  }

  TEST_CASE("a node that reaches no node 0, and a node 0 that no node reaches, give up at their timeout, saying why") {
    const int port = cohort_run::free_port();
    const auto started = std::chrono::steady_clock::now();
    auto endings = run_nodes({node(port, 2, 1, 1, 600ms)});
    const auto why = error_of(endings[0]);
    CHECK_MESSAGE(why.find("node 0 did not answer at 127.0.0.1:" + std::to_string(port) + " within 0.6 s") !=
                      std::string::npos,
                  why);
    CHECK(why.find("TORCH_ELASTIC_WORKER_IDENTICAL=1") != std::string::npos);
    CHECK(std::chrono::steady_clock::now() - started < 10s);
    endings = run_nodes({node(port, 3, 0, 1, 600ms), node(port, 3, 2, 1)});
    const auto waited = error_of(endings[0]);
    CHECK_MESSAGE(waited.find("for node 1 of 3") != std::string::npos, waited);
    // Node 2 had joined: told why the job ended.
    CHECK_MESSAGE(error_of(endings[1]).find("node 0 ") != std::string::npos, error_of(endings[1]));
    CHECK(binds_plainly(port));
  }

  TEST_CASE("a node that greeted node 0 but whose wait ended before every node joined is told so, not that node 0 did "
            "not answer") {
    // Node 2 never comes: node 1's wait ends first, with its greeting taken.
    const int port = cohort_run::free_port();
    const auto endings = run_nodes({node(port, 3, 0, 1, 4s), node(port, 3, 1, 1, 1500ms)});
    const auto why = error_of(endings[1]);
    CHECK_MESSAGE(why.find("what listens at 127.0.0.1:" + std::to_string(port) +
                           " took this node's greeting but gave no answer within 1.5 s. cohort-run's node 0 answers "
                           "once every node of the 3 has greeted it, so a node has likely not joined yet") !=
                      std::string::npos,
                  why);
    CHECK(why.find("node 0 did not answer") == std::string::npos);
    CHECK(why.find("a node started again after that cannot join") == std::string::npos);
    // Node 0 names the nodes missing: node 1 left at its own timeout.
    const auto waited = error_of(endings[0]);
    CHECK_MESSAGE(waited.find("for nodes 1, 2 of 3") != std::string::npos, waited);
  }

  TEST_CASE("a shutdown signal (pause says false) ends either side's wait with no sizes") {
    const int port = cohort_run::free_port();
    for (const int rank : {0, 1}) {
      CAPTURE(rank);
      auto c = node(port, 2, rank, 1);
      c.pause = signal_after(300ms);
      const auto started = std::chrono::steady_clock::now();
      const auto endings = run_nodes({c});
      CHECK(sizes_of(endings[0]) == std::nullopt);
      CHECK(std::chrono::steady_clock::now() - started < 5s);
    }
    // Node 0 stopped with a node joined: that node is told, and the port is
    // left free.
    auto zero = node(port, 3, 0, 1);
    zero.pause = signal_after(500ms);
    const auto endings = run_nodes({zero, node(port, 3, 1, 1)});
    CHECK(sizes_of(endings[0]) == std::nullopt);
    const auto why = error_of(endings[1]);
    CHECK_MESSAGE(why.find("node 0 was stopped by a signal") != std::string::npos, why);
    CHECK(binds_plainly(port));
  }

  TEST_CASE("a resolver that does not answer holds a node no longer than its timeout, or a signal") {
    // Answers after 8 s at most (so that a node that waits for it cannot
    // hang the test), or once released; it owns what it shares, since it
    // may outlive the node's wait on its thread.
    const auto released = std::make_shared<std::atomic<bool>>(false);
    const auto slow = [released](const char* host, const char* service, const addrinfo* hints, addrinfo** found) {
      const auto until = std::chrono::steady_clock::now() + 8s;
      while (!released->load() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(10ms);
      return ::getaddrinfo(host, service, hints, found);
    };
    const int port = cohort_run::free_port();
    auto c = node(port, 2, 1, 1, 1s);
    c.resolve = slow;
    auto started = std::chrono::steady_clock::now();
    auto endings = run_nodes({c});
    const auto why = error_of(endings[0]);
    const std::string said =
        "node 0's address was not found within 1 s (resolving 127.0.0.1 took longer than the wait)";
    CHECK_MESSAGE(why.find(said) != std::string::npos, why);
    CHECK(std::chrono::steady_clock::now() - started < 4s);
    c.timeout = 20s;
    c.pause = signal_after(300ms);
    started = std::chrono::steady_clock::now();
    endings = run_nodes({c});
    CHECK(sizes_of(endings[0]) == std::nullopt);
    CHECK(std::chrono::steady_clock::now() - started < 4s);
    released->store(true);
    // A name that does not resolve is said as such.
    c = node(port, 2, 1, 1, 600ms);
    c.resolve = [](const char*, const char*, const addrinfo*, addrinfo**) { return EAI_NONAME; };
    endings = run_nodes({c});
    CHECK_MESSAGE(error_of(endings[0]).find("127.0.0.1 does not resolve") != std::string::npos, error_of(endings[0]));
  }

  TEST_CASE("node 0's port taken, and something else answering there: clear errors") {
    const int port = cohort_run::free_port();
    const int taken = listening_on(port);
    auto endings = run_nodes({node(port, 2, 0, 1)});
    CHECK_MESSAGE(error_of(endings[0]).find("cannot listen on port " + std::to_string(port)) != std::string::npos,
                  error_of(endings[0]));
    std::thread other([&] {
      const int fd = ::accept(taken, nullptr, nullptr);
      if (fd < 0) return;
      const std::string line = "HTTP/1.1 400 Bad Request\r\n";
      (void)::send(fd, line.data(), line.size(), MSG_NOSIGNAL);
      ::close(fd);
    });
    endings = run_nodes({node(port, 2, 1, 1)});
    other.join();
    ::close(taken);
    CHECK_MESSAGE(error_of(endings[0]).find("something other than cohort-run's node 0 answers") != std::string::npos,
                  error_of(endings[0]));
  }

  TEST_CASE("a node whose greeting is taken and left unanswered, try after try, gives up after unanswered_for") {
    for (const bool reset : {true, false}) {
      CAPTURE(reset);
      const int port = cohort_run::free_port();
      const int other = listening_on(port);  // a store of a job already running, say
      int taken = 0;
      std::thread hanging_up([&] { taken = take_and_hang_up(other, reset); });
      auto c = node(port, 2, 1, 1, 20s);
      c.unanswered_for = 1s;
      const auto started = std::chrono::steady_clock::now();
      const auto endings = run_nodes({c});
      const auto took = std::chrono::steady_clock::now() - started;
      ::shutdown(other, SHUT_RDWR);  // ends the accept
      hanging_up.join();
      ::close(other);
      const auto why = error_of(endings[0]);
      const auto said = "something other than cohort-run's node 0 seems to listen at 127.0.0.1:" + std::to_string(port);
      CHECK_MESSAGE(why.find(said) != std::string::npos, why);
      CHECK_MESSAGE(why.find(std::to_string(taken) + " times in a row") != std::string::npos, why);
      CHECK(taken >= 3);
      CHECK(took >= 1s);
      CHECK(took < 5s);  // not its 20 s join_timeout
    }
    // A join_timeout shorter than unanswered_for ends the wait first, with
    // the same reason.
    const int port = cohort_run::free_port();
    const int other = listening_on(port);
    std::thread hanging_up([&] { take_and_hang_up(other, true); });
    const auto endings = run_nodes({node(port, 2, 1, 1, 1500ms)});
    ::shutdown(other, SHUT_RDWR);
    hanging_up.join();
    ::close(other);
    const auto why = error_of(endings[0]);
    CHECK_MESSAGE(why.find("something other than cohort-run's node 0 seems to listen") != std::string::npos, why);
  }

  TEST_CASE("unanswered tries count only in a row: a try that finds nothing listening starts the count again") {
    const int port = cohort_run::free_port();
    std::optional<sizes> got;
    std::thread hang_ups_then_zero([&] {
      // Twice two unanswered tries, as node 0 killed outright and started
      // again leaves them, with tries that find nothing listening between.
      for (int round = 0; round < 2; ++round) {
        const int other = listening_on(port, true);
        CHECK(take_and_hang_up(other, false, 2) == 2);
        ::close(other);
        std::this_thread::sleep_for(700ms);
      }
      got = node_zero(node(port, 2, 0, 3, 5s));
    });
    auto c = node(port, 2, 1, 2);
    c.unanswered_for = 0ms;  // two in a row are not yet enough, however long
    const auto endings = run_nodes({c});
    hang_ups_then_zero.join();
    CHECK(got == sizes{3, 2});
    CHECK(sizes_of(endings[0]) == sizes{3, 2});
  }
}

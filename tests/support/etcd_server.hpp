// A real etcd for the tests: one member on free loopback ports, its data in
// a fresh temporary folder, stopped by its pid and removed with the object.
// A program whose tests need it declares, at namespace scope,
//
//     const test::needs_device needs{"etcd server", test::etcd_missing};
//
// and main skips the program (exit 77) where etcd is not installed; etcd()
// is the program's one server.
#pragma once

#include "support/harness.hpp"

#include "run/port.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

extern char** environ;

namespace cohort::test {

/// Debian's etcd-server installs it there.
inline const std::string etcd_program = "/usr/bin/etcd";

/// Why etcd cannot run here; empty when it can.
inline std::string etcd_missing() {
  return ::access(etcd_program.c_str(), X_OK) == 0 ? std::string() : etcd_program + " is not installed (etcd-server)";
}

/// The answer (status line, headers and body) to GET `path` from
/// 127.0.0.1:`port`; empty when nothing answered within `limit`.
inline std::string http_get(int port, const std::string& path,
                            std::chrono::milliseconds limit = std::chrono::milliseconds(1000)) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return {};
  timeval tv{static_cast<time_t>(limit.count() / 1000), static_cast<suseconds_t>(limit.count() % 1000 * 1000)};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  std::string answer;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    const std::string request = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size())) {
      char buf[4096];
      for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) answer.append(buf, static_cast<std::size_t>(n));
    }
  }
  ::close(fd);
  return answer;
}

/// A server on a free loopback port that answers every connection with
/// `answer`, whatever it is sent, and closes it.
class canned_server {
 public:
  explicit canned_server(std::string answer) : answer_(std::move(answer)) {
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t size = sizeof addr;
    if (::bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(listener_, 16) != 0 ||
        ::getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &size) != 0) {
      throw std::system_error(errno, std::system_category(), "listening on a loopback port");
    }
    port_ = ntohs(addr.sin_port);
    server_ = std::thread([this] {
      // Until shutdown() in the destructor makes accept fail.
      for (int fd; (fd = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC)) >= 0;) {
        char request[4096];
        static_cast<void>(::recv(fd, request, sizeof request, 0));
        static_cast<void>(::send(fd, answer_.data(), answer_.size(), MSG_NOSIGNAL));
        ::close(fd);
      }
    });
  }
  canned_server(const canned_server&) = delete;
  canned_server& operator=(const canned_server&) = delete;
  ~canned_server() {
    ::shutdown(listener_, SHUT_RDWR);
    server_.join();
    ::close(listener_);
  }

  /// "127.0.0.1:port".
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  std::string answer_;
  int listener_ = -1;
  int port_ = 0;
  std::thread server_;
};

/// Something that listens where etcd was expected and speaks no HTTP at
/// all: an SSH server's greeting.
class ssh_like_server : public canned_server {
 public:
  ssh_like_server() : canned_server("SSH-2.0-OpenSSH_9.0\r\n") {}
};

/// An HTTP server that answers every request with status 200 and `json`:
/// something that speaks HTTP and JSON, but not etcd's.
class json_server : public canned_server {
 public:
  explicit json_server(const std::string& json)
      : canned_server("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: " +
                      std::to_string(json.size()) + "\r\n\r\n" + json) {}
};

/// One etcd member, started by the constructor and stopped by the
/// destructor. Its client URL is http://endpoint(). Leases may be as short
/// as one second: its election timeout is short.
class etcd_server {
 public:
  /// Starts etcd and waits until it is healthy (at most 30 s); throws
  /// std::runtime_error, with the end of its log, when it does not become so.
  etcd_server() {
    std::string last_log;
    for (int attempt = 0; attempt < 3; ++attempt) {  // a port taken meanwhile: other ports
      client_port_ = cohort_run::free_port();
      peer_port_ = cohort_run::free_port();
      std::filesystem::remove_all(dir_.path / "data");
      start();
      if (wait_healthy()) return;
      last_log = log();
      stop();
    }
    throw std::runtime_error("etcd did not start; its log ends:\n" + last_log.substr(last_log.size() > 4000 ? last_log.size() - 4000 : 0));
  }
  etcd_server(const etcd_server&) = delete;
  etcd_server& operator=(const etcd_server&) = delete;
  ~etcd_server() { stop(); }

  /// "127.0.0.1:port" of its client URL.
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(client_port_); }
  int port() const { return client_port_; }
  pid_t pid() const { return pid_; }
  /// What it wrote to stdout and stderr so far.
  std::string log() const { return read_file(dir_.path / "etcd.log"); }

  /// Freezes it (SIGSTOP): connections open but nothing answers, as across
  /// a partition.
  void pause() { ::kill(pid_, SIGSTOP); }
  void resume() { ::kill(pid_, SIGCONT); }

  /// Stops it (SIGTERM, SIGKILL after 5 s) and waits for it; its data stays
  /// until the object goes.
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGCONT);
    ::kill(pid_, SIGTERM);
    int status = 0;
    for (int i = 0; i < 500; ++i) {
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }

 private:
  void start() {
    const auto url = [](int port) { return "http://127.0.0.1:" + std::to_string(port); };
    std::vector<std::string> args{etcd_program,
                                  "--name=test",
                                  "--data-dir=" + (dir_.path / "data").string(),
                                  "--listen-client-urls=" + url(client_port_),
                                  "--advertise-client-urls=" + url(client_port_),
                                  "--listen-peer-urls=" + url(peer_port_),
                                  "--initial-advertise-peer-urls=" + url(peer_port_),
                                  "--initial-cluster=test=" + url(peer_port_),
                                  "--initial-cluster-state=new",
                                  // No wait for the disk, whose stalls on a loaded machine
                                  // could outlast the tests' 1 s leases.
                                  "--unsafe-no-fsync",
                                  // A lease's least time to live is 1.5 election timeouts.
                                  "--heartbeat-interval=20",
                                  "--election-timeout=200"};
    // It dies with this process, however this process ends (util-linux's
    // setpriv sets the parent-death signal, then becomes etcd).
    const std::string setpriv = "/usr/bin/setpriv";
    if (::access(setpriv.c_str(), X_OK) == 0) args.insert(args.begin(), {setpriv, "--pdeathsig", "KILL"});
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t files;
    posix_spawn_file_actions_init(&files);
    const auto log_path = (dir_.path / "etcd.log").string();
    posix_spawn_file_actions_addopen(&files, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&files, 1, 2);
    posix_spawn_file_actions_addopen(&files, 0, "/dev/null", O_RDONLY, 0);
    const int error = ::posix_spawn(&pid_, argv[0], &files, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&files);
    if (error != 0) {
      pid_ = -1;
      throw std::system_error(error, std::system_category(), "posix_spawn " + etcd_program);
    }
  }

  bool wait_healthy() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {  // it ended: a port was taken, or worse
        pid_ = -1;
        return false;
      }
      if (http_get(client_port_, "/health").find("\"health\":\"true\"") != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

  temp_dir dir_;
  int client_port_ = 0;
  int peer_port_ = 0;
  pid_t pid_ = -1;
};

/// The program's one etcd server, started at its first use, stopped when
/// the program ends.
inline etcd_server& etcd() {
  static etcd_server server;
  return server;
}

}  // namespace cohort::test

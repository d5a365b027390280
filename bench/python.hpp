// Runs a Python baseline script: Debian's interpreter first (python3-torch
// is installed for it), or $COHORT_BENCH_PYTHON. run_python runs it to its
// end and returns its stdout lines; python_peer keeps it running and asks
// it for one measurement at a time, so that its measurements take turns
// with cohort's, round by round. Both say why it failed where it did.
#pragma once

#include <fmt/format.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

extern char** environ;

namespace cohort::bench {

/// The interpreter the baselines run on.
inline std::string python_interpreter() {
  const char* python = std::getenv("COHORT_BENCH_PYTHON");
  if (python != nullptr) return python;
  return ::access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
}

/// What a script printed on stdout, line by line (each whole, however
/// long, without its newline), and, where it did not exit 0, why: its
/// status and the last line of its stderr.
struct python_output {
  std::vector<std::string> lines;
  std::string failure;
};

/// Why `python` ended as `status` (a wait status; negative where it could
/// not be run), with the last line of words its stderr (in `err_path`) has.
inline std::string python_failure(const std::string& python, int status, const char* err_path) {
  // The shell's 127 and 126: the interpreter was not found or would not run.
  std::string failure = status < 0             ? fmt::format("{} could not be run", python)
                        : WIFSIGNALED(status) ? fmt::format("{} killed by signal {}", python, WTERMSIG(status))
                                              : fmt::format("{} exited with {}", python, WEXITSTATUS(status));
  std::string last;
  if (FILE* e = std::fopen(err_path, "r")) {
    char line[1024];
    while (std::fgets(line, sizeof line, e) != nullptr) {
      std::string text(line);
      while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
      if (std::any_of(text.begin(), text.end(), [](unsigned char c) { return std::isalpha(c); })) last = text;
    }
    std::fclose(e);
  }
  if (!last.empty()) failure += ": " + last;
  return failure;
}

inline python_output run_python(const char* script, const std::string& args) {
  python_output out;
  char path[] = "/tmp/cohort-bench-XXXXXX.py";
  char err_path[] = "/tmp/cohort-bench-stderr-XXXXXX";
  const int fd = ::mkstemps(path, 3);
  const int err = ::mkstemp(err_path);
  if (fd < 0 || err < 0) {
    out.failure = "cannot write its script";
  } else {
    FILE* f = ::fdopen(fd, "w");
    std::fputs(script, f);
    std::fclose(f);
    const std::string python = python_interpreter();
    int status = -1;
    if (FILE* pipe = ::popen(fmt::format("{} {} {} 2>{}", python, path, args, err_path).c_str(), "r")) {
      char chunk[4096];
      std::string line;
      while (std::fgets(chunk, sizeof chunk, pipe) != nullptr) {
        line += chunk;
        if (line.back() != '\n') continue;  // the rest of a long line follows
        line.pop_back();
        out.lines.push_back(std::move(line));
        line.clear();
      }
      if (!line.empty()) out.lines.push_back(std::move(line));  // the last, with no newline
      status = ::pclose(pipe);
    }
    if (status != 0) out.failure = python_failure(python, status, err_path);
  }
  if (fd >= 0) std::remove(path);
  if (err >= 0) {
    ::close(err);
    std::remove(err_path);
  }
  return out;
}

/// Seconds a python_peer waits for a line before it gives up on the
/// script: 300, or $COHORT_BENCH_PEER_TIMEOUT.
inline int python_peer_timeout_s() {
  const char* limit = std::getenv("COHORT_BENCH_PEER_TIMEOUT");
  const int seconds = limit != nullptr ? std::atoi(limit) : 0;
  return seconds > 0 ? seconds : 300;
}

/// A Python script kept running and asked for one measurement at a time:
/// it reads one request a line on its stdin and answers each with one line
/// on its stdout. It is started at construction (with `args`), which
/// returns once it has printed its first line, "ready", saying its imports
/// and whatever else it does first are done: its start weighs on no
/// measurement. Its stdin and stdout are one socket, so that asking a
/// script that has exited fails with EPIPE and not SIGPIPE. A line is
/// waited for python_peer_timeout_s() at most, and no longer than the
/// script lives (watched through its pidfd: a process it left holding its
/// stdout does not keep the wait going); a script that fails so is killed
/// with its process group, which it leads. The destructor ends its input
/// and waits for it to exit. Not to be copied or moved.
class python_peer {
 public:
  python_peer(const char* script, const std::vector<std::string>& args) : python_(python_interpreter()) {
    const int fd = ::mkstemps(path_, 3);
    err_ = ::mkostemp(err_path_, O_CLOEXEC);
    if (fd >= 0) {
      FILE* f = ::fdopen(fd, "w");
      std::fputs(script, f);
      std::fclose(f);
    }
    if (fd < 0 || err_ < 0) {
      failure_ = "cannot write its script";
      return;
    }
    int ends[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ends) != 0) {
      failure_ = "cannot make its socket";
      return;
    }
    posix_spawn_file_actions_t actions;
    ::posix_spawn_file_actions_init(&actions);
    ::posix_spawn_file_actions_adddup2(&actions, ends[1], 0);
    ::posix_spawn_file_actions_adddup2(&actions, ends[1], 1);
    ::posix_spawn_file_actions_adddup2(&actions, err_, 2);
    posix_spawnattr_t attributes;
    ::posix_spawnattr_init(&attributes);
    ::posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
    std::vector<std::string> words{python_, path_};
    words.insert(words.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& w : words) argv.push_back(w.data());
    argv.push_back(nullptr);
    const int error = ::posix_spawnp(&pid_, python_.c_str(), &actions, &attributes, argv.data(), environ);
    ::posix_spawn_file_actions_destroy(&actions);
    ::posix_spawnattr_destroy(&attributes);
    ::close(ends[1]);
    if (error != 0) {
      ::close(ends[0]);
      pid_ = -1;
      failure_ = python_failure(python_, -1, err_path_);
      return;
    }
    socket_ = ends[0];
    pidfd_ = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
    if (const auto first = read_line(); first && *first != "ready") end(fmt::format("it began with \"{}\"", *first));
  }
  python_peer(const python_peer&) = delete;
  python_peer& operator=(const python_peer&) = delete;
  ~python_peer() {
    end("");
    std::remove(path_);
    if (err_ >= 0) {
      ::close(err_);
      std::remove(err_path_);
    }
  }

  /// Sends `request` (one line, without its newline) and returns the line
  /// the script answers, without its newline; or, where it has exited (or
  /// never started), or not answered in time, nothing, and failure() says
  /// why. Once it has failed, every later request answers nothing at once.
  std::optional<std::string> ask(std::string_view request) {
    if (socket_ < 0) return std::nullopt;
    const std::string line = std::string(request) + "\n";
    for (std::size_t sent = 0; sent < line.size();) {
      const ssize_t n = ::send(socket_, line.data() + sent, line.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) {
        end("", true);
        return std::nullopt;
      }
      sent += static_cast<std::size_t>(n);
    }
    return read_line();
  }

  /// Why it answers nothing; empty while it answers.
  const std::string& failure() const { return failure_; }

 private:
  // A line from its stdout; or, at its end, its death or its time limit,
  // nothing after end().
  std::optional<std::string> read_line() {
    const int limit_s = python_peer_timeout_s();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(limit_s);
    bool exited = false;
    for (;;) {
      if (const auto at = buffer_.find('\n'); at != std::string::npos) {
        std::string line = buffer_.substr(0, at);
        buffer_.erase(0, at + 1);
        return line;
      }
      // Once it has exited, what it wrote before is all there will be
      // from it: read without waiting.
      if (!exited) {
        pollfd ready[2] = {{socket_, POLLIN, 0}, {pidfd_, POLLIN, 0}};
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline -
                                                                                 std::chrono::steady_clock::now());
        const int n = ::poll(ready, pidfd_ >= 0 ? 2 : 1, static_cast<int>(std::max<long long>(0, left.count())));
        if (n < 0 && errno == EINTR) continue;
        if (n == 0) {
          end(fmt::format("{} answered nothing within {} s (COHORT_BENCH_PEER_TIMEOUT)", python_, limit_s), true);
          return std::nullopt;
        }
        exited = (ready[1].revents & POLLIN) != 0;
        if (exited && (ready[0].revents & POLLIN) == 0) {
          end("", true);
          return std::nullopt;
        }
      }
      char chunk[4096];
      const ssize_t got = ::recv(socket_, chunk, sizeof chunk, exited ? MSG_DONTWAIT : 0);
      if (got <= 0) {
        end("", true);
        return std::nullopt;
      }
      buffer_.append(chunk, static_cast<std::size_t>(got));
    }
  }

  // Ends its input, waits for it to exit and, unless one is noted already,
  // notes why it failed: `why`, or else how it exited. Where it `failed`,
  // its process group is killed first: what it left running, or itself
  // where it answers nothing.
  void end(const std::string& why, bool failed = false) {
    if (socket_ >= 0) {
      // Its input ends even where a process forked from this one holds the
      // socket too.
      ::shutdown(socket_, SHUT_WR);
      ::close(socket_);
      socket_ = -1;
    }
    if (pid_ < 0) return;
    // Its group is still its own while it is not reaped. A script that
    // does not end within 10 s of its input's end is ended with its group.
    if (failed) ::kill(-pid_, SIGKILL);
    if (!failed && pidfd_ >= 0) {
      pollfd exited{pidfd_, POLLIN, 0};
      int n;
      while ((n = ::poll(&exited, 1, 10'000)) < 0 && errno == EINTR) {
      }
      if (n == 0) ::kill(-pid_, SIGKILL);
    }
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    if (pidfd_ >= 0) ::close(pidfd_);
    pidfd_ = -1;
    if (failure_.empty()) {
      failure_ = !why.empty() ? why
                 : status == 0 ? fmt::format("{} exited before it answered", python_)
                               : python_failure(python_, status, err_path_);
    }
  }

  std::string python_;
  char path_[32] = "/tmp/cohort-bench-XXXXXX.py";
  char err_path_[40] = "/tmp/cohort-bench-stderr-XXXXXX";
  int err_ = -1;
  pid_t pid_ = -1;
  int pidfd_ = -1;
  int socket_ = -1;
  std::string buffer_;  // what it wrote past the last line read
  std::string failure_;
};

}  // namespace cohort::bench

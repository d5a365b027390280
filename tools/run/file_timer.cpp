// torchrun's file-timer watchdog: the FIFO, its requests, and the thread
// that sends the signals of the timers that expire.
#include "run/file_timer.hpp"

#include "run/say.hpp"

#include "process/owned_pids.hpp"

#include <cohort/exit_status.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <system_error>

namespace cohort_run {

namespace {

double seconds_since_epoch() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// What /proc/<pid>/stat says of a process: its state ('Z': ended, not yet
// reaped), parent, process group and start time (in clock ticks since
// boot); nullopt when it is gone.
struct process_stat {
  char state = 0;
  pid_t parent = 0;
  pid_t process_group = 0;
  unsigned long long start_time = 0;
};
std::optional<process_stat> stat_of(pid_t pid) {
  std::ifstream stat(fmt::format("/proc/{}/stat", pid));
  std::string text;
  if (!std::getline(stat, text)) return std::nullopt;
  // "pid (comm) state ppid ... starttime (the 22nd field)": comm may hold
  // spaces and parentheses.
  const auto close = text.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  process_stat s;
  int parent = 0;
  int process_group = 0;
  if (std::sscanf(text.c_str() + close + 1,
                  " %c %d %d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu", &s.state,
                  &parent, &process_group, &s.start_time) != 4) {
    return std::nullopt;
  }
  s.parent = parent;
  s.process_group = process_group;
  return s;
}

// A version 4 UUID's text, as Python's uuid4() writes it.
std::string fresh_uuid() {
  std::uint8_t b[16] = {};
  if (::getrandom(b, sizeof b, 0) != static_cast<ssize_t>(sizeof b)) {
    throw std::system_error(errno, std::system_category(), "random bytes for the file timer's FIFO");
  }
  b[6] = static_cast<std::uint8_t>((b[6] & 0x0f) | 0x40);
  b[8] = static_cast<std::uint8_t>((b[8] & 0x3f) | 0x80);
  std::string text;
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) text += '-';
    text += fmt::format("{:02x}", b[i]);
  }
  return text;
}

}  // namespace

std::optional<timer_request> parse_timer_request(std::string_view line) {
  const auto j = nlohmann::json::parse(line, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  const auto pid = j.find("pid");
  const auto scope = j.find("scope_id");
  const auto expires = j.find("expiration_time");
  const auto signal = j.find("signal");
  if (pid == j.end() || !pid->is_number_integer() || scope == j.end() || !scope->is_string() ||
      expires == j.end() || !expires->is_number() || signal == j.end() || !signal->is_number_integer()) {
    return std::nullopt;
  }
  timer_request r;
  const auto p = pid->get<long long>();
  const auto s = signal->get<long long>();
  // A signal at or below 0 asks for none (torch's server sends none); one
  // above the last the kernel knows (SIGRTMAX, NSIG - 1) reaches no process.
  if (p <= 0 || p > 0x3fffffff || s < -1024 || s >= NSIG) return std::nullopt;
  r.pid = static_cast<pid_t>(p);
  r.scope = scope->get<std::string>();
  r.expires = expires->get<double>();
  if (!std::isfinite(r.expires)) return std::nullopt;
  r.signal = static_cast<int>(s);
  return r;
}

void timer_table::apply(const timer_request& r) {
  const auto key = std::pair{r.pid, r.scope};
  if (r.expires < 0) {
    timers_.erase(key);
  } else {
    timers_[key] = {r.expires, r.signal};
  }
}

std::vector<std::pair<pid_t, std::pair<int, std::string>>> timer_table::take_expired(double now) {
  // By process: its expired timers, earliest first.
  std::map<pid_t, std::vector<std::pair<double, std::pair<int, std::string>>>> expired;
  for (const auto& [key, timer] : timers_) {
    if (timer.first < now) expired[key.first].push_back({timer.first, {timer.second, key.second}});
  }
  std::vector<std::pair<pid_t, std::pair<int, std::string>>> out;
  for (auto& [pid, timers] : expired) {
    std::sort(timers.begin(), timers.end());
    std::pair<int, std::string> chosen{0, timers.front().second.second};
    for (const auto& t : timers) {
      if (t.second.first > 0) {
        chosen = t.second;
        break;
      }
    }
    out.emplace_back(pid, std::move(chosen));
    clear(pid);
  }
  return out;
}

void timer_table::clear(pid_t pid) {
  std::erase_if(timers_, [pid](const auto& entry) { return entry.first.first == pid; });
}

std::optional<double> timer_table::next_expiry() const {
  std::optional<double> next;
  for (const auto& [key, timer] : timers_) {
    if (!next || timer.first < *next) next = timer.first;
  }
  return next;
}

file_timer_server::file_timer_server(std::string path) : path_(std::move(path)) {
  const auto fail = [this](const char* what) {
    const int error = errno;
    for (int fd : {fifo_, keep_open_, wake_}) {
      if (fd >= 0) ::close(fd);
    }
    throw std::system_error(error, std::system_category(), fmt::format("{} {}", what, path_));
  };
  ::unlink(path_.c_str());
  if (::mkfifo(path_.c_str(), 0666) != 0) fail("making the file timer's FIFO");
  fifo_ = ::open(path_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fifo_ < 0) fail("opening the file timer's FIFO");
  keep_open_ = ::open(path_.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
  if (keep_open_ < 0) fail("opening the file timer's FIFO");
  wake_ = ::eventfd(0, EFD_CLOEXEC);
  if (wake_ < 0) fail("an eventfd for the file timer of");
  thread_ = std::thread([this] { serve(); });
}

file_timer_server::~file_timer_server() {
  const std::uint64_t one = 1;
  (void)!::write(wake_, &one, sizeof one);
  thread_.join();
  ::close(fifo_);
  if (keep_open_ >= 0) ::close(keep_open_);
  ::close(wake_);
  ::unlink(path_.c_str());
}

void file_timer_server::starting() {
  std::lock_guard lock(mutex_);
  ranks_.clear();
  ranks_known_ = false;
}

void file_timer_server::watch(std::vector<pid_t> ranks) {
  std::lock_guard lock(mutex_);
  ranks_ = std::move(ranks);
  ranks_known_ = true;
}

file_timer_server::membership file_timer_server::of_the_run(pid_t pid) {
  std::vector<pid_t> ranks;
  bool known = false;
  {
    std::lock_guard lock(mutex_);
    ranks = ranks_;
    known = ranks_known_;
  }
  // The process, or an ancestor of it below this one, is a rank, or an
  // orphan of the run that this process adopted.
  const pid_t self = ::getpid();
  for (int depth = 0; pid > 1 && pid != self && depth < 64; ++depth) {
    if (std::find(ranks.begin(), ranks.end(), pid) != ranks.end()) return membership::of_the_run;
    const auto stat = stat_of(pid);
    if (!stat) return membership::not_of_it;
    if (stat->parent == self) {
      // A child of this process that is no rank named: a rank being
      // started, an orphan the run handed to this process (its
      // subreaper), or a process cohort started itself (the guardian, which
      // is owned; the look for torch has been reaped before any rank
      // starts). Those in this process's process group are no orphan of the
      // run: a rank leads a group of its own, and what it starts stays
      // there or leaves it.
      if (!known) return membership::not_known_yet;
      if (stat->process_group == ::getpgrp()) return membership::not_of_it;
      std::optional<bool> owned;
      if (!cohort::detail::with_owned_pids([&](const std::set<pid_t>& pids) { owned = pids.contains(pid); })) {
        return membership::not_known_yet;  // a start is under way: it may be a child not yet owned
      }
      return *owned ? membership::not_of_it : membership::of_the_run;
    }
    pid = stat->parent;
  }
  return membership::not_of_it;
}

bool file_timer_server::send(const expired_timer& t) {
  const auto now = stat_of(t.pid);
  if (!now || now->start_time != t.start_time) return true;  // it has ended
  switch (of_the_run(t.pid)) {
    case membership::not_known_yet:
      return false;
    case membership::not_of_it:
      say("cohort-run: the file timer '{}' of pid {} expired; pid {} is no rank of this run, nor started by one: it "
          "gets no signal\n", t.scope, t.pid, t.pid);
      return true;
    case membership::of_the_run:
      break;
  }
  if (now->state == 'Z') {
    say("cohort-run: the file timer '{}' of pid {} expired; pid {} has ended (its parent has not reaped it yet): "
        "it gets no signal\n", t.scope, t.pid, t.pid);
    return true;
  }
  if (::kill(t.pid, t.signal) == 0) {
    say("cohort-run: the file timer '{}' of pid {} expired: it was sent {}\n", t.scope, t.pid,
        cohort::signal_name(t.signal));
  } else if (errno != ESRCH) {  // ESRCH: it has ended since
    say("cohort-run: the file timer '{}' of pid {} expired, but {} could not be sent to it: {}\n", t.scope, t.pid,
        cohort::signal_name(t.signal), std::strerror(errno));
  }
  return true;
}

void file_timer_server::serve() noexcept {
  timer_table timers;
  // The start time of each process with a timer, read as its request came:
  // a process that has ended since, its pid taken by another, gets nothing.
  std::map<pid_t, unsigned long long> started;
  // Expired while the ranks were being started: sent once they are named.
  std::vector<expired_timer> waiting;
  std::string pending;  // a line not yet whole
  bool skip_to_line = false;
  for (;;) {
    int timeout = 100;  // ms; as torch's agent looks, at the least (and for the timers that wait)
    if (const auto next = timers.next_expiry()) {
      const double left = (*next - seconds_since_epoch()) * 1000;  // may be far past what an int holds
      timeout = static_cast<int>(std::clamp(std::ceil(left), 0.0, static_cast<double>(timeout)));
    }
    // With a line partly read, this server's own write end is closed, so
    // that the read sees the end of the file once every writer has closed
    // it. Without one otherwise (it could not be opened again), the FIFO
    // would be reported hung up at every look: it waits for the next.
    const bool in_line = !pending.empty() || skip_to_line;
    pollfd fds[2] = {{in_line || keep_open_ >= 0 ? fifo_ : -1, POLLIN, 0}, {wake_, POLLIN, 0}};
    if (::poll(fds, 2, timeout) < 0 && errno != EINTR) {
      say("cohort-run: the file timer stops: poll failed: {}\n", std::strerror(errno));
      return;
    }
    if ((fds[1].revents & POLLIN) != 0) return;
    if ((fds[0].revents & (POLLIN | POLLHUP)) != 0) {
      // One read a look: a writer that never stops does not hold the expiries up.
      char buffer[4096];
      const ssize_t n = ::read(fifo_, buffer, sizeof buffer);
      if (n > 0) pending.append(buffer, static_cast<std::size_t>(n));
      if (n == 0 && in_line) {  // the end of the file: every writer closed it in the middle of this line
        if (!pending.empty()) {
          say("cohort-run: the file timer's FIFO got part of a line, which its writer closed without ending: "
              "dropped: {}\n", std::string_view(pending).substr(0, 200));
        }
        pending.clear();
        skip_to_line = false;
      }
      if (skip_to_line) {  // the rest of a line too long to be a request
        const auto end = pending.find('\n');
        skip_to_line = end == std::string::npos;
        pending.erase(0, skip_to_line ? pending.size() : end + 1);
      }
      for (std::size_t end; (end = pending.find('\n')) != std::string::npos; pending.erase(0, end + 1)) {
        const std::string_view line(pending.data(), end);
        if (line.empty()) continue;
        if (const auto request = parse_timer_request(line)) {
          if (request->expires >= 0) {
            const auto stat = stat_of(request->pid);
            if (!stat) continue;  // gone already: nothing to time
            // Timers of an ended process whose pid this one took go.
            if (const auto it = started.find(request->pid); it != started.end() && it->second != stat->start_time) {
              timers.clear(request->pid);
            }
            started[request->pid] = stat->start_time;
          }
          timers.apply(*request);
        } else {
          say("cohort-run: the file timer's FIFO got a line that is not a timer request: {}\n", line.substr(0, 200));
        }
      }
      // No request is that long (torch's are at most PIPE_BUF): what is
      // there goes, up to the next line.
      if (pending.size() > 65536) {
        say("cohort-run: the file timer's FIFO got a line longer than 65536 bytes, which is no timer request: "
            "dropped: {}\n", std::string_view(pending).substr(0, 200));
        pending.clear();
        skip_to_line = true;
      }
    }
    if (const bool now_in_line = !pending.empty() || skip_to_line; now_in_line && keep_open_ >= 0) {
      ::close(keep_open_);
      keep_open_ = -1;
    } else if (!now_in_line && keep_open_ < 0) {
      // The FIFO this server reads, even where its path now names another.
      keep_open_ = ::open(fmt::format("/proc/self/fd/{}", fifo_).c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    }
    std::vector<expired_timer> due = std::move(waiting);
    waiting.clear();
    for (auto& [pid, why] : timers.take_expired(seconds_since_epoch())) {
      auto& [signal, scope] = why;
      const auto start = started.extract(pid);
      if (signal <= 0) continue;  // torch's server clears them without a signal
      if (start.empty()) continue;
      due.push_back({pid, signal, std::move(scope), start.mapped()});
    }
    for (auto& t : due) {
      if (!send(t)) waiting.push_back(std::move(t));
    }
  }
}

std::optional<std::string> file_timer_path_from_environment() {
  const char* enabled = std::getenv("TORCHELASTIC_ENABLE_FILE_TIMER");
  if (enabled == nullptr || std::string_view(enabled) != "1") return std::nullopt;
  const char* named = std::getenv("TORCHELASTIC_TIMER_FILE");
  return named != nullptr ? std::string(named) : "/tmp/watchdog_timer_" + fresh_uuid();
}

}  // namespace cohort_run

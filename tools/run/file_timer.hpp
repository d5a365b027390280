// torchrun's file-timer watchdog, which a run asks for with
// TORCHELASTIC_ENABLE_FILE_TIMER=1: a FIFO at TORCHELASTIC_TIMER_FILE (or
// /tmp/watchdog_timer_<uuid>, then named to the ranks in that variable),
// into which torch's FileTimerClient writes one JSON line per request:
//   {"version": 1, "pid": P, "scope_id": S, "expiration_time": T, "signal": N}
// T in seconds since the epoch, a negative T releasing the timer (P, S).
// When a timer expires, its process gets the signal of its earliest expired
// timer that names one (above 0), as torch's FileTimerServer sends it, and
// every timer of that process is cleared.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace cohort_run {

/// One timer request as a line of the FIFO holds it; nullopt for a line
/// that is not one (not JSON, a field missing or of another type, a signal
/// the kernel would refuse: above SIGRTMAX).
struct timer_request {
  pid_t pid = 0;
  std::string scope;
  double expires = 0;  ///< seconds since the epoch; below 0: a release
  int signal = 0;
};
std::optional<timer_request> parse_timer_request(std::string_view line);

/// The timers, by process and scope: what the server's thread keeps.
class timer_table {
 public:
  void apply(const timer_request& r);
  /// The processes with a timer expired at `now` (seconds since the epoch),
  /// each with the signal to send it (0: none named) and the scope of the
  /// timer that names it; their timers are cleared.
  std::vector<std::pair<pid_t, std::pair<int, std::string>>> take_expired(double now);
  /// Drops every timer of `pid`.
  void clear(pid_t pid);
  /// The earliest expiry of any timer; nullopt when there is none.
  std::optional<double> next_expiry() const;

 private:
  std::map<std::pair<pid_t, std::string>, std::pair<double, int>> timers_;  // (pid, scope) -> (expires, signal)
};

/// Serves the timers at a FIFO on a thread of its own until destroyed.
/// Only the ranks of the attempt that runs (watch()) and what they started
/// are sent signals: a request naming another process is refused, with a
/// line on stderr. What they started includes the orphans this process, the
/// run's subreaper, adopted from them: a child of this process that cohort
/// did not start and that left its process group. A process is told by its
/// pid and start time: the timers of one that ended never reach another
/// that took its pid.
///
/// A line is read as torch's readline() reads it: where every writer has
/// closed the FIFO in the middle of a line, the part written is dropped
/// (with a line on stderr), and the next writer starts a line of its own.
/// A writer that holds the FIFO open meanwhile continues the line, as it
/// would under torch.
class file_timer_server {
 public:
  /// Makes the FIFO at `path` (what was there is removed first, as torch
  /// does) and starts serving. Throws std::system_error when it cannot.
  explicit file_timer_server(std::string path);
  /// Stops serving and removes the FIFO.
  ~file_timer_server();
  file_timer_server(const file_timer_server&) = delete;
  file_timer_server& operator=(const file_timer_server&) = delete;

  const std::string& path() const noexcept { return path_; }
  /// The ranks of an attempt are being started: until watch() names them,
  /// a timer that expires for a process that may be one of them, or one
  /// they started, waits, and its signal is sent (or refused) then. A rank
  /// may write its request before the start has returned its pid.
  void starting();
  /// The ranks whose processes (and their descendants) may be signalled:
  /// those of the attempt that runs now; none between attempts.
  void watch(std::vector<pid_t> ranks);

 private:
  enum class membership { of_the_run, not_of_it, not_known_yet };
  struct expired_timer {
    pid_t pid = 0;
    int signal = 0;
    std::string scope;
    unsigned long long start_time = 0;  // of the process, as its request came
  };

  void serve() noexcept;
  membership of_the_run(pid_t pid);
  /// Sends an expired timer's signal, or says why none is sent; false when
  /// it must wait for the ranks to be named.
  bool send(const expired_timer& t);

  std::string path_;
  int fifo_ = -1;       // read end
  int keep_open_ = -1;  // a write end of its own while no line is partly read: no end of the file is seen then
  int wake_ = -1;       // an eventfd: the destructor's call to stop
  std::mutex mutex_;
  std::vector<pid_t> ranks_;  // under mutex_
  bool ranks_known_ = true;   // under mutex_; false from starting() to watch()
  std::thread thread_;
};

/// Where TORCHELASTIC_ENABLE_FILE_TIMER asks for a server (its value "1",
/// as torch reads it): the FIFO TORCHELASTIC_TIMER_FILE names, or a fresh
/// /tmp/watchdog_timer_<uuid>; nullopt when it asks for none.
std::optional<std::string> file_timer_path_from_environment();

}  // namespace cohort_run

// The one taker of cohort-run's shutdown and forwarded signals, for the
// whole run: across its attempts, the rendezvous between them and the
// starts and ends of their groups. The signals stay blocked in every thread
// and wait on a signalfd, which an attempt's io_context reads while its
// group runs, and which is read at once between attempts. So a signal that
// comes while no group runs is kept, not lost: a shutdown signal then ends
// the run before its next attempt (or its wait for a round), with the
// outcome recorded. (No thread of its own: one cost a launch of one rank
// 4 to 9 %.)
#pragma once

#include <cohort/group.hpp>

#include "group/signal_echo.hpp"
#include "os/owned_fd.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/posix/stream_descriptor.hpp>

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

namespace cohort_run {

/// Blocks the signals cohort-run handles and forwards unless its options
/// say otherwise (SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2), from
/// before main (a constructor), before its options are read: one sent meanwhile
/// waits, pending, for the signal_owner, which then takes it or, where the
/// options leave it out, unblocks it to its own action. Call in the
/// process's only thread.
void hold_signals_from_start() noexcept;
/// The mask the process started with, back (hold_signals_from_start's
/// undone), for an exit before any signal_owner: a signal held meanwhile
/// then takes its own action.
void release_signals_held_from_start() noexcept;

class signal_owner {
 public:
  /// Blocks `shutdown` and `passed_on` in the calling thread, which must be
  /// the process's only one (threads made later inherit the mask; ranks
  /// start with none blocked), and opens the signalfd. Those that
  /// hold_signals_from_start() blocked and neither list holds are unblocked
  /// (unless the process started with them blocked). Throws
  /// std::system_error when it cannot be had.
  signal_owner(std::vector<int> shutdown, std::vector<int> passed_on);
  /// The signals stay blocked: one that comes later changes nothing of a
  /// run whose outcome is decided, and goes with the process.
  ~signal_owner();
  signal_owner(const signal_owner&) = delete;
  signal_owner& operator=(const signal_owner&) = delete;

  /// Until detach(), the signals are read on `ex` as they come: a shutdown
  /// signal goes to `g` as group::interrupt, a passed-on one as
  /// group::send_signal. A shutdown signal that came before goes to it at
  /// once. detach() must come before `ex`'s io_context goes.
  void attach(cohort::group& g, const asio::any_io_executor& ex);
  /// Takes the descriptor that the next attach() reads the signals from,
  /// before the group starts: where the descriptor limit leaves none for
  /// it, the start fails here, before any rank runs, rather than once the
  /// ranks run. Kept until attach() or detach(); attach() takes one itself
  /// where none was taken. Throws std::system_error.
  void prepare_attach();
  void detach();
  /// The first shutdown signal, once one came (reading those waiting).
  std::optional<int> interrupted();
  /// Waits at most `limit` for a shutdown signal, or for `fd` to be readable
  /// or hung up where it is not -1; false once a shutdown signal came. For
  /// the rendezvous' waits between its polls, and the checks' waits for the
  /// programs they run.
  bool pause(std::chrono::milliseconds limit, int fd = -1);

 private:
  /// Takes every signal waiting on the signalfd, the shutdown signals among
  /// them as one; mutex_ held.
  void take_waiting();
  void take(int sig);
  void wait_next();

  std::vector<int> shutdown_, passed_on_;
  int signals_fd_ = -1;  // a non-blocking signalfd of both lists
  std::mutex mutex_;     // guards what follows
  cohort::group* group_ = nullptr;
  std::unique_ptr<asio::posix::stream_descriptor> readable_;  // a dup of signals_fd_, while attached
  cohort::os::owned_fd prepared_;  // a dup of signals_fd_ for the next attach()
  cohort::detail::first_shutdown_signal first_;
};

}  // namespace cohort_run

#include "run/say.hpp"

#include "logs/logs.hpp"
#include "os/unwaiting_write.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <mutex>
#include <string>

namespace cohort_run {
namespace {

using clock = std::chrono::steady_clock;

// How long cohort-run's own lines wait in all, once a shutdown signal came,
// for a console that does not take them: the group's kill_wait, which
// bounds the wait for the ranks' last lines as well.
constexpr std::chrono::milliseconds patience_after_signal{5000};
// How often a write waiting for the console looks for a shutdown signal
// that is still pending (no thread reads the signalfd meanwhile).
constexpr std::chrono::milliseconds look_for_signals{50};

// signal_owner's shutdown signals, written once before any thread is made
// and published by `shutdown_set_given` (release there, acquire where a
// write reads the set), and whether one was read (relaxed: a flag that
// publishes nothing else).
sigset_t shutdown_set;
std::atomic<bool> shutdown_set_given = false;
std::atomic<bool> shutdown_read = false;

bool shutdown_came() noexcept {
  if (shutdown_read.load(std::memory_order_relaxed)) return true;
  if (!shutdown_set_given.load(std::memory_order_acquire)) return false;
  sigset_t pending;
  sigemptyset(&pending);
  if (::sigpending(&pending) != 0) return false;
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sigismember(&shutdown_set, sig) == 1 && sigismember(&pending, sig) == 1) return true;
  }
  return false;
}

// One of cohort-run's standard streams, written so that a write can wait
// for it with a limit (os::make_unwaiting; the flags of the descriptor the
// ranks share stay as they are).
struct console {
  std::once_flag opened;
  int given = -1;  // 1 or 2
  int fd = -1;
  cohort::os::write_way way = cohort::os::write_way::plain;
  cohort::os::owned_fd reopened;
  std::mutex mutex;   // one line at a time; guards what follows
  // What goes before the next line: the rest of one the console took only
  // part of, or a newline that ends a group's (cohort::detail::take_open_line).
  std::string tail;
  std::size_t dropped = 0;  // lines it did not take since it last took one
  clock::duration waited{};  // waited for it since a shutdown signal came

  void open(int number) {
    given = fd = number;
    struct stat st {};
    if (::fstat(number, &st) != 0) return;
    auto out = cohort::os::make_unwaiting(number, st);
    way = out.way;
    reopened = std::move(out.reopened);
    if (reopened.get() >= 0) fd = reopened.get();
  }

  // Writes as much of `text` as the console takes; what is left is the
  // part it did not. Waits for it without a limit until a shutdown signal
  // came, then for what is left of patience_after_signal.
  std::string_view put(std::string_view text) {
    while (!text.empty()) {
      const ssize_t n = cohort::os::write_unwaiting(fd, way, text.data(), text.size());
      if (n >= 0) {
        text.remove_prefix(static_cast<std::size_t>(n));
        continue;
      }
      if (errno == EINTR) continue;
      if (errno != EAGAIN) return text;  // refused (its reader has gone): forgotten
      auto slice = look_for_signals;
      const bool ending = shutdown_came();
      if (ending) {
        if (waited >= patience_after_signal) return text;
        slice = std::min(slice, std::chrono::ceil<std::chrono::milliseconds>(patience_after_signal - waited));
      }
      pollfd p{fd, POLLOUT, 0};
      const auto began = clock::now();
      ::poll(&p, 1, static_cast<int>(slice.count()));
      if (ending) waited += clock::now() - began;
    }
    return text;
  }

  void write(std::string_view text) {
    std::lock_guard lock(mutex);
    // A group's console on this file left part of a rank's line there (it
    // was given up, or still waits for the rest): this line starts anew.
    if (cohort::detail::take_open_line(given)) tail.insert(0, 1, '\n');
    if (!tail.empty()) {  // a line's rest comes before any other line
      const auto left = put(tail);
      tail.erase(0, tail.size() - left.size());
      if (!tail.empty()) {
        ++dropped;
        return;
      }
    }
    std::string with_note;
    if (dropped > 0) {
      with_note = dropped == 1 ? "cohort-run: 1 line of its own was dropped: the console did not take it\n"
                               : fmt::format("cohort-run: {} lines of its own were dropped: the console did not "
                                             "take them\n",
                                             dropped);
      with_note += text;
      text = with_note;
    }
    const auto left = put(text);
    if (left.size() == text.size()) {
      ++dropped;
      return;
    }
    dropped = 0;
    tail = left;
  }
};

console own[3];

}  // namespace

void write_out(std::FILE* stream, std::string_view text) noexcept {
  std::fflush(stream);  // nothing of cohort-run's waits there; were it so, it goes first
  const int fd = ::fileno(stream);
  if (fd < 1 || fd > 2) {
    const bool written = std::fwrite(text.data(), 1, text.size(), stream) == text.size();
    if (!written || std::fflush(stream) != 0) std::clearerr(stream);
    return;
  }
  try {
    auto& c = own[fd];
    std::call_once(c.opened, [&] { c.open(fd); });
    c.write(text);
  } catch (...) {
    // Out of memory for the line's rest: it is left out, as a line that cannot be written.
  }
}

void end_console_waits_on(const sigset_t& shutdown) noexcept {
  shutdown_set = shutdown;
  shutdown_set_given.store(true, std::memory_order_release);
}

void shutdown_began() noexcept { shutdown_read.store(true, std::memory_order_relaxed); }

}  // namespace cohort_run

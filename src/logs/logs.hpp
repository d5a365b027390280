// The ranks' logs of one group: their files, and the pumps that carry
// teed and prefixed streams to the console: from the log file the rank
// writes, followed as it grows, or from a pipe.
#pragma once

#include "cohort/logs.hpp"
#include "cohort/spawn.hpp"
#include "os/owned_fd.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/steady_timer.hpp>

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace cohort::detail {

struct console_out;

/// One stream of one rank that reaches the console through this process.
struct log_stream {
  /// What is read: the rank's log file, which the rank writes itself
  /// (`followed`), or the read end of the rank's pipe.
  os::owned_fd source;
  bool followed = false;
  off_t read_to = 0;      ///< followed: how far the file has been read
  /// Followed: cancelled when the file was written (on the stream's
  /// strand, with `kicked` set, which says so when no wait was pending).
  std::unique_ptr<asio::steady_timer> wake;
  bool kicked = false;
  /// Followed: the inotify watch on the file. While the file keeps
  /// growing, the follower reads it on a timer instead, with the watch
  /// told to report nothing: a watch that reports writes costs the rank
  /// something on every write. Only a watch that no other stream shares
  /// is ever told so.
  int watch = -1;
  os::owned_fd file;     ///< a pipe's log file, written here, or none
  /// What the file (a pipe or a device, non-blocking) has not taken yet,
  /// from `file_taken` on: the stream reads no more until it has.
  std::string file_backlog;
  std::size_t file_taken = 0;
  /// When the file last took bytes (a pipe or a device written here).
  std::chrono::steady_clock::time_point file_last_took{};
  std::string file_path;  ///< for messages
  int console = -1;  ///< where its lines go, or -1
  console_out* out = nullptr;  ///< how they are written there (logs.cpp)
  bool file_is_pipe = false;
  std::string prefix;
  std::string pending;  ///< the start of a line whose newline has not come yet
  bool after_return = false;  ///< the last read ended in a '\r', a line's end on the console
  /// A read this long took all the source held at its fullest: the
  /// smaller of the read's buffer and the pipe's size (which stays smaller
  /// when the system refuses to grow it); the buffer for a followed file.
  std::size_t full_read = 0;
};

/// Throws std::invalid_argument for a console of `spec` that is not open
/// for writing: one the caller gave, or this process's stdout or stderr
/// where lines go to it through this process. Call before the group opens
/// anything, which could take the number of a closed stdout: its lines
/// would go there.
void check_consoles(const logs_spec& spec, const spawn_options& options, int nprocs);

/// Everything a group's logs need, made before any rank starts.
class group_logs {
 public:
  /// Checks `spec` (its consoles were checked before: check_consoles),
  /// makes the folders, opens (and truncates) the files and makes the
  /// pipes. Throws std::invalid_argument for a bad spec and
  /// std::filesystem::filesystem_error with the path that cannot be made or
  /// written.
  group_logs(const logs_spec& spec, const spawn_options& options, const std::string& role, int nprocs);
  group_logs(const group_logs&) = delete;
  group_logs& operator=(const group_logs&) = delete;

  /// Sets rank `rank`'s stdout and stderr in `options`.
  void apply(int rank, spawn_options& options) const;
  /// The ranks have started: closes this process's copies of their ends.
  void started();
  /// Starts pumping every stream that passes through this process, each on
  /// a strand of `io` of its own; the end is told on `group_strand`, where
  /// drain() runs. Call once, after started().
  void start(const asio::any_io_executor& io, const asio::any_io_executor& group_strand);
  /// Waits for every pump to reach the end of its stream, at most `limit`;
  /// then reads what is left without waiting, writes the partial lines and
  /// closes everything. Those last writes wait for a console that does not
  /// take them (a paused terminal, an unread pipe), and so for a log file
  /// that is a pipe or a device, as a plain program's do, on the io context
  /// (its threads stay free for the group's signals and stop()); once the
  /// run is asked to end, at most the time ask_to_end() gives them: what is
  /// left then reaches only the files (a file given up, nothing more), and
  /// errors() says so. Runs on the group's strand.
  asio::awaitable<void> drain(std::chrono::milliseconds limit);
  /// The run was asked to end (stop(), a shutdown signal): drain()'s last
  /// writes wait for the consoles at most `limit` from now, or from when
  /// they begin if that is later. The first call counts; it may come at any
  /// time, before or during drain(). Call on the group's strand.
  void ask_to_end(std::chrono::milliseconds limit);
  /// Closes every descriptor no io object owns: the streams' sources and
  /// files, the inotify instance, the ends meant for the ranks, and this
  /// group's hold on its consoles (a console's own descriptor closes with
  /// the last group that writes to it). drain() does so once every stream
  /// has ended; a group_logs that must never be destroyed (its io_context
  /// is gone, and with it the services its io objects would reach) is
  /// closed so before it is let go. No pump may run after.
  void close_descriptors() noexcept;
  /// Log files that could not be written (a full disk), one line each.
  std::vector<std::string> errors() const;
  /// How many descriptors the pumps will open once started on `io`: a
  /// piped stream's wait on asio's reactor holds an epoll set while it
  /// waits; on the ring it holds none, nor does a follower.
  std::size_t descriptors_to_come(const asio::any_io_executor& io) const;

  struct state;

 private:
  std::shared_ptr<state> state_;
};

/// For a writer of lines of its own to a file that consoles of this
/// process's groups may be too (cohort-run's on its stderr): whether such a
/// console wrote there the start of a line and not its end, which then
/// waits for the console to take it, or never comes (the console was given
/// up, or its groups have gone). The caller starts its text with a newline,
/// so that a line of its own begins, and the line counts as ended: the
/// next caller hears nothing of it, and the rest, if it comes, starts a
/// line too. Takes the console's lock for a moment; any thread may call it.
bool take_open_line(int fd);

/// Expands ${role} (also ${role_name}), ${rank} and ${local_rank} in `pattern`.
std::string expand_prefix(const std::string& pattern, const std::string& role, int rank, int local_rank);

}  // namespace cohort::detail

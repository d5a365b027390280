// Where the ranks' standard output and error go: files per rank, the
// console with a line prefix, or both.
#pragma once

#include "cohort/export.hpp"

#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>

COHORT_API_BEGIN

namespace cohort {

/// A set of standard streams, with torchrun's numbers (0-3).
enum class std_streams : unsigned { none = 0, out = 1, err = 2, all = 3 };

constexpr bool has(std_streams set, std_streams one) noexcept {
  return (static_cast<unsigned>(set) & static_cast<unsigned>(one)) != 0;
}

/// A choice of streams for every rank, or per rank (ranks missing from the
/// map get `all_ranks`).
struct streams_per_rank {
  std_streams all_ranks = std_streams::none;
  std::map<int, std_streams> ranks{};

  streams_per_rank() = default;
  streams_per_rank(std_streams all) : all_ranks(all) {}  // NOLINT: implicit by design
  streams_per_rank(std::map<int, std_streams> per_rank) : ranks(std::move(per_rank)) {}  // NOLINT

  std_streams of(int rank) const {
    auto it = ranks.find(rank);
    return it != ranks.end() ? it->second : all_ranks;
  }
  /// Nothing given: no stream for all ranks and no per-rank entry.
  bool empty() const noexcept { return all_ranks == std_streams::none && ranks.empty(); }
};

/// Per-rank logs of a group (torch elastic's LogsSpecs). A rank's stream
/// goes to
/// - its log file only, when `redirects` names it: the rank writes the file
///   itself, nothing passes through this process;
/// - its log file and the console, when `tee` names it;
/// - the console only, otherwise.
/// Ranks outside `console_ranks` never reach the console: their streams go
/// to their files when `dir` is set, to /dev/null otherwise. A stream that
/// group_spec::options sends anywhere but this process's own (a file, a
/// descriptor, /dev/null, stdout's for stderr) reaches no console and stays
/// where the options send it, unless `redirects` or `tee` name it.
///
/// A teed stream whose log file is a plain file is that file in the rank,
/// as a redirected one is: the rank writes it itself (a full disk fails the
/// rank's writes, as with `redirects`), and this process follows it, woken
/// by inotify as it grows (one instance per group), reading what it gained.
/// Any other stream that reaches the console through this process (teed to
/// a device or a pipe, where inotify is refused, teed under
/// `tee_through_pipes`, or untouched under `prefix_all`) is a pipe, read as
/// data arrives (io_uring) and written whole to the file. Either way the
/// console gets a line at a time, each line whole and behind the rank's
/// prefix: lines of different ranks never mix. A line longer than 64 KiB
/// is cut into 64 KiB pieces, and a last line without its newline is
/// written when the rank's stream ends, each ended by a newline on the
/// console. The files hold exactly the bytes the rank wrote. A followed
/// file is read to its end once every rank has ended: what a process left
/// behind writes there later is in the file only, and a rank that cuts its
/// own log file short can make the console read it again from its start.
/// A console that does not take its lines holds a thread at most about a
/// millisecond at a time, and only of the groups that write to it; what it
/// has not taken waits in memory, and the streams on it read no more until
/// it has (README, "Logs"). A log file that is a pipe or a device is
/// written the same way: what it does not take within about a millisecond
/// waits in memory (one read's worth) and its stream reads no more, the
/// rank then waiting on its pipe as it would on the file. Once the run is
/// asked to end, such a file (a FIFO nobody reads) is waited for at most
/// as long as a console is: then it gets no more, and
/// run_result::log_errors says so. A log file that is a FIFO must be open
/// for reading when the group starts.
///
/// Files: <dir>/<run_id>/attempt_<attempt>/<rank>/{stdout.log,stderr.log,
/// error.json}; the group's error files go there too (unless
/// group_spec::error_dir is set). Folders and files are made before any
/// rank starts (a file an earlier run left is replaced by a new one, not
/// truncated): a directory that cannot be made or
/// written, or a FIFO that no process has open for reading (ENXIO: the open
/// does not wait for one), is a std::filesystem::filesystem_error of
/// start_processes, with the path, and nothing started.
struct logs_spec {
  /// Empty: no files; `redirects` and `tee` then have nowhere to write
  /// (std::invalid_argument at start).
  std::filesystem::path dir{};
  /// The run's folder in `dir`: one folder's name, not empty, "." or "..",
  /// and without '/' or NUL (with `dir` set, anything else is a
  /// std::invalid_argument at start, before any folder is made: a run id
  /// from a user could lead the logs out of `dir`).
  std::string run_id = "none";
  /// The attempt's folder's number, 0 or more (with `dir` set, a negative
  /// one is a std::invalid_argument at start).
  int attempt = 0;
  streams_per_rank redirects{};
  streams_per_rank tee{};
  /// The ranks whose output reaches the console; nullopt: all of them.
  std::optional<std::set<int>> console_ranks{};
  /// Pump every stream that reaches the console, prefixed, not only teed
  /// ones; otherwise a stream that is neither redirected nor teed is the
  /// rank's own stdout/stderr, inherited from this process.
  bool prefix_all = false;
  /// Teed streams through pipes that this process reads and writes to the
  /// files, rather than files the ranks write and this process follows.
  /// Ranks that write in small pieces run faster so, since the files are
  /// written in large ones (bench/log_pump, 4 KiB a write: teed at 0.89
  /// times the speed of the same ranks writing only files, against 0.58
  /// times followed); at 1 MiB a write, no faster (0.47 against 0.48).
  /// What a rank wrote last is in its file only once this process has
  /// pumped it: killed outright, it loses what the pipes held. And a rank
  /// waits while the console does not take lines and its pipe is full.
  bool tee_through_pipes = false;
  /// Put before each console line: ${role} or ${role_name}, as torchrun's
  /// templates say it (group_spec::name), ${rank} (first_rank + the rank),
  /// ${local_rank} (the rank in the group). Expanded as torchrun expands
  /// its template (Python's string.Template.safe_substitute): $rank and
  /// the like without braces too, $$ as $, and anything else kept as
  /// written.
  std::string prefix = "[${role}${local_rank}]:";
  int first_rank = 0;
  /// Where console lines go; -1: this process's stdout (1) and stderr (2).
  /// Another value must be a descriptor open for writing when the group
  /// starts (std::invalid_argument otherwise), and so must this process's
  /// stdout or stderr where lines go to it through this process (teed or
  /// prefixed ones): checked before the group opens anything, which could
  /// otherwise take the number of a closed one. The group writes through a
  /// descriptor of its own, so the caller's may be closed once the group
  /// has started. It lets go of that one once every stream has ended,
  /// before wait() returns: closed then, unless another group of this
  /// process still writes to the same console, so that a reader of the
  /// pipe sees its end. Groups whose consoles are one file share the
  /// writes, a line at a time. A console that refuses a
  /// write (a pipe whose reader has gone, as under `| head`) takes no more
  /// lines: the ranks run on, their log files get every byte, and
  /// run_result::log_errors says so. Such a write raises no SIGPIPE in
  /// this process, whatever its disposition.
  int console_out = -1;
  int console_err = -1;
  /// Called at most once per group, on a thread running the io_context,
  /// when a read of a pump or a follower first takes a whole buffer
  /// (256 KiB), or all of a full pipe where the system kept the pipe
  /// smaller: the ranks write faster than one thread turns their bytes into
  /// lines. Each stream is read on a strand of its own, on every thread the
  /// io_context runs on, so a caller that runs it
  /// on one thread, for the lowest console latency, may add threads then
  /// (cohort-run does). A second thread costs every line a wake-up of the
  /// other thread (in bench/log_pump a teed line's p50 read 3.3 times the
  /// minimal pump's on two threads, 2.4 times on one) and gives the copies
  /// a second core. It must not block; what it throws is ignored.
  std::function<void()> on_busy{};

  /// Whether anything of this is in use (else the ranks' streams are as
  /// group_spec::options says).
  bool active() const noexcept {
    return !dir.empty() || !redirects.empty() || !tee.empty() || console_ranks.has_value() || prefix_all;
  }
  /// The folder of one attempt: <dir>/<run_id>/attempt_<attempt>.
  std::filesystem::path attempt_dir() const {
    return dir / run_id / ("attempt_" + std::to_string(attempt));
  }
};

}  // namespace cohort

COHORT_API_END

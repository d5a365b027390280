// Per-rank log files and what carries streams to the console. A stream
// that goes to a plain file is the file itself in the rank; when it is
// teed, its follower reads what the file gains, woken through the group's
// inotify watcher, and writes it line by line, prefixed, to the console,
// so the files' bytes never pass through this process. Any other stream
// that reaches the console (to no file, or to a file that is not a plain
// one) is a pipe, pumped as data arrives: whole to the file and line by
// line to the console.
#include "logs/logs.hpp"

#include "os/descriptor_limit.hpp"
#include "os/per_process.hpp"
#include "os/quiet_sigpipe.hpp"
#include "os/unwaiting_write.hpp"
#include "uring/poll.hpp"

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/post.hpp>
#include <asio/strand.hpp>
#include <asio/redirect_error.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <fmt/format.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

namespace cohort::detail {
namespace {

// What one read takes from a pipe: small enough to stay in a core's L2
// cache between the read that copies it in, the console's pass over its
// lines and the write that copies it to the file. With 1 MiB reads each
// pass went to memory, and a teed 4 x 256 MB run moved half as much a
// second.
constexpr std::size_t read_size = 256 * 1024;
constexpr std::size_t max_line = 64 * 1024;  // longer lines reach the console in pieces
constexpr int pipe_size = 1024 * 1024;       // fewer wake-ups for ranks that write a lot
// A followed file that grew by busy_bytes between two looks is busy: its
// follower then reads it every busy_poll, for as long as it grows between
// looks, its watch quiet meanwhile. busy_poll is the most a line of a busy
// rank waits for the console; its watch would have woken the follower at
// least as often. A rank that writes now and then stays under its watch.
constexpr std::size_t busy_bytes = 32 * 1024;
constexpr std::chrono::microseconds busy_poll{500};

void check_ranks(const char* what, const streams_per_rank& per_rank, int nprocs) {
  if (static_cast<unsigned>(per_rank.all_ranks) > 3) {
    throw std::invalid_argument(fmt::format("cohort::start_processes: logs.{} is {}, not 0..3", what,
                                            static_cast<unsigned>(per_rank.all_ranks)));
  }
  for (const auto& [rank, streams] : per_rank.ranks) {
    if (rank < 0 || rank >= nprocs) {
      throw std::invalid_argument(fmt::format("cohort::start_processes: logs.{} names rank {}, not in 0..{}", what, rank, nprocs - 1));
    }
    if (static_cast<unsigned>(streams) > 3) {
      throw std::invalid_argument(fmt::format("cohort::start_processes: logs.{} for rank {} is {}, not 0..3", what, rank,
                                              static_cast<unsigned>(streams)));
    }
  }
}

// The run id and the attempt name folders under logs.dir: the run id must
// be one folder's name there, never a path that leads out of it.
void check_folder_names(const logs_spec& spec) {
  // The system's calls would take the path up to its NUL: folders made
  // there, and files of another name.
  if (spec.dir.native().find('\0') != std::string::npos) {
    throw std::invalid_argument("cohort::start_processes: logs.dir holds NUL");
  }
  const std::string& id = spec.run_id;
  if (id.find('\0') != std::string::npos) {
    throw std::invalid_argument("cohort::start_processes: logs.run_id holds NUL; it names a folder under logs.dir");
  }
  const char* why = nullptr;
  if (id.empty()) why = "is empty";
  else if (id == "." || id == "..") why = "names no folder of its own";
  else if (id.find('/') != std::string::npos) why = "holds '/'";
  if (why != nullptr) {
    throw std::invalid_argument(
        fmt::format("cohort::start_processes: logs.run_id '{}' {}; it names a folder under logs.dir", id, why));
  }
  if (spec.attempt < 0) {
    throw std::invalid_argument(
        fmt::format("cohort::start_processes: logs.attempt is {}, not 0 or more", spec.attempt));
  }
}

// Where stream `i` (0: stdout, 1: stderr) of `rank` goes.
struct route {
  bool named;       // redirected or teed: to its file
  bool to_file;
  bool to_console;
  // Sent elsewhere than this process's own stream by the options: no
  // console's, so left there unless named.
  bool kept;
};
route route_of(const logs_spec& spec, const spawn_options& options, int rank, int i) {
  const std_streams which = i == 0 ? std_streams::out : std_streams::err;
  const std_streams redirect = spec.redirects.of(rank), tee = spec.tee.of(rank);
  const bool shown = !spec.console_ranks || spec.console_ranks->contains(rank);
  const bool named = has(redirect, which) || has(tee, which);
  return {.named = named,
          .to_file = named || (!shown && !spec.dir.empty()),
          .to_console = shown && (!has(redirect, which) || has(tee, which)),
          .kept = !named && !std::holds_alternative<stdio::inherit_t>((i == 0 ? options.out : options.err).get())};
}

// Whether stream `i` of some rank reaches the console through this
// process (followed, or through a pipe), rather than as the rank's own.
bool reaches_console(const logs_spec& spec, const spawn_options& options, int nprocs, int i) {
  for (int rank = 0; rank < nprocs; ++rank) {
    const route r = route_of(spec, options, rank, i);
    if (!r.kept && r.to_console && (r.to_file || spec.prefix_all)) return true;
  }
  return false;
}

// A log file left by an earlier run (the same run id) is replaced, not
// truncated: ext4 flushes a file truncated to nothing when it is closed
// (its auto_da_alloc guard for rewritten files), which would hold up the
// end of the run for as long as the disk takes to write everything. Only a
// plain file with one name is replaced; a link or a device is opened as it
// is. The open never waits: a FIFO that no process has open for reading is
// refused (ENXIO) rather than holding up the start until one does. What
// the open returns blocks, as the rank expects of its stdout; a pump makes
// its own file non-blocking where that matters (group_logs's constructor).
os::owned_fd open_log(const std::filesystem::path& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_nlink == 1 && st.st_size > 0) {
    ::unlink(path.c_str());  // whatever stops this stops the open below, which says why
  }
  os::owned_fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NONBLOCK, 0644));
  if (fd.get() < 0) {
    const std::error_code ec(errno, std::system_category());
    const bool unread_fifo =
        ec == std::errc::no_such_device_or_address && ::stat(path.c_str(), &st) == 0 && S_ISFIFO(st.st_mode);
    throw std::filesystem::filesystem_error(
        unread_fifo ? "cohort::start_processes: log file (a FIFO that no process has open for reading)"
                    : "cohort::start_processes: log file" + os::descriptor_limit_note(ec.value()),
        path, ec);
  }
  ::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) & ~O_NONBLOCK);
  return fd;
}

// Whether a write to `fd` can raise SIGPIPE: a pipe's or a socket's.
bool is_pipe(int fd) {
  struct stat st {};
  return ::fstat(fd, &st) == 0 && (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode));
}

// What a pump reads into, and the console lines it makes of it.
struct scratch {
  std::unique_ptr<char[]> data = std::make_unique_for_overwrite<char[]>(read_size);
  std::string lines;
};

}  // namespace

// A console of the streams of this process's groups, one for each file the
// consoles are (stdout and stderr that are one pipe share one, and so do
// two groups on one terminal): its lock lets one writer at a time at it,
// and its backlog keeps each write a run of whole lines. A pump waits for
// it in a write at most inline_wait_ms: what it does not take stays in its
// backlog, and the streams stop reading until it has taken that, waiting
// on the io context; the group meanwhile goes on seeing exits and signals,
// whoever stops reading the console (a paused terminal, `| less`), and the
// other consoles are written on. Once the pumps are stopped (drain's
// limit) the streams go on waiting for it so, as a plain program's last
// writes wait: until it takes them, or until a deadline once the run is
// asked to end.
struct console_out {
  int given = -1;         // the caller's descriptor, as the first group to share this console had it
  int fd = -1;            // what is written: `own`
  // A pipe or terminal opened again non-blocking, its flags our own; else a
  // duplicate of `given`: the groups that share the console outlive the
  // caller's descriptor, which may be closed, its number reused, once the
  // first of them ends.
  os::owned_fd own;
  os::write_way way = os::write_way::plain;  // how `fd` is written so that no write waits
  bool pipe = false;      // a write can raise SIGPIPE: see os/quiet_sigpipe.hpp
  bool terminal = false;  // a lone '\r' redraws the line there; elsewhere it is written as '\n'
  dev_t device = 0;
  ino_t inode = 0;
  std::mutex mutex;       // one writer at a time; guards what follows
  std::string backlog;    // lines it has not taken, from `taken` on
  std::size_t taken = 0;
  // When it last took bytes: whether it took any while a group waited for
  // it to take the rest, in the time its run was given to end.
  std::chrono::steady_clock::time_point last_took{};
  int error = 0;          // why it refused a write; it is then lost
  std::atomic<bool> full = false;  // a backlog waits: the streams read no more
  // The last byte it wrote ended no line (ends_line): the line's rest
  // waits in the backlog, or never comes once the console is given up.
  // Another writer of the file then starts a line of its own
  // (take_open_line), and so does a console opened on it after this one
  // has gone.
  bool mid_line = false;

  console_out() = default;
  console_out(const console_out&) = delete;
  console_out& operator=(const console_out&) = delete;
  ~console_out();
};

namespace {

// The files that a console of this process left inside a line when it
// went: the next writer there (a console opened on it again, or
// take_open_line's caller) starts with a newline. A lock of its own: a
// console goes with its last holder, who may hold the list of consoles'.
struct open_line_list {
  std::mutex mutex;
  std::vector<std::pair<dev_t, ino_t>> files;
};

// Whether a console left the file (`device`, `inode`) inside a line; the
// record goes, so only one writer hears it.
bool take_left_open(dev_t device, ino_t inode) {
  auto& left = os::of_this_process<open_line_list>();
  std::lock_guard lock(left.mutex);
  return std::erase(left.files, std::pair{device, inode}) > 0;
}

}  // namespace

console_out::~console_out() {
  if (!mid_line || (device == 0 && inode == 0)) return;  // a line's end, or a file that fstat did not name
  try {
    auto& left = os::of_this_process<open_line_list>();
    std::lock_guard lock(left.mutex);
    left.files.emplace_back(device, inode);
  } catch (...) {  // out of memory: the next writer may start inside the line
  }
}

namespace {

// The console at `fd`, whose fstat is `st` (nullptr: it failed), made
// ready for writes that do not wait (os::make_unwaiting). What is not
// opened again is written through a duplicate of `fd`.
std::shared_ptr<console_out> open_console(int fd, const struct stat* found) {
  auto c = std::make_shared<console_out>();
  c->given = fd;
  c->own = os::owned_fd(::fcntl(fd, F_DUPFD_CLOEXEC, 3));
  c->fd = c->own.get() >= 0 ? c->own.get() : fd;  // out of descriptors: the caller's, as it is
  if (found == nullptr) return c;
  const struct stat& st = *found;
  c->device = st.st_dev;
  c->inode = st.st_ino;
  c->pipe = S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode);
  c->terminal = ::isatty(fd) == 1;
  auto out = os::make_unwaiting(fd, st);
  c->way = out.way;
  if (out.reopened.get() >= 0) {
    c->fd = out.reopened.get();
    c->own = std::move(out.reopened);
  }
  // A line left open there ends before its first line; should it go
  // before writing one, the line is still open.
  if (take_left_open(c->device, c->inode)) {
    c->backlog = "\n";
    c->mid_line = true;
  }
  return c;
}

// The consoles the groups of this process write to, under the list's
// mutex, which no write to any of them holds. Each process's own: a child
// forked while a pump of its parent wrote to a console (its lock held)
// opens that console again for its groups, never sharing the parent's.
struct console_list {
  std::mutex mutex;
  std::vector<std::weak_ptr<console_out>> consoles;
};
console_list& open_consoles() { return os::of_this_process<console_list>(); }

enum class offered { all, later, refused };
// How long a write waits in the pump's thread for a console that took
// part of it, before the rest goes to the backlog.
constexpr int inline_wait_ms = 1;
// How often a stream looks again at a console whose POLLOUT wait failed.
constexpr std::chrono::milliseconds room_retry{10};

// Writes the `left` bytes at `at` to `fd` the `way` it is written
// (os::write_unwaiting), moving both past what it took: 0 once all is written,
// else the errno that stopped it, EAGAIN when a descriptor that does not
// wait took nothing more within inline_wait_ms. Where `fd` can raise
// SIGPIPE (or SIGXFSZ), the caller holds an os::quiet_signal.
int write_out(int fd, os::write_way way, const char*& at, std::size_t& left) {
  while (left > 0) {
    const ssize_t n = os::write_unwaiting(fd, way, at, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN) return errno;
      // A reader that reads on (`| cat`) takes more within a moment:
      // waiting for it here costs a wake-up in the kernel, where a wait on
      // the io_context costs a round through it for every pipeful.
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, inline_wait_ms) == 0) return EAGAIN;
      continue;
    }
    at += n;
    left -= static_cast<std::size_t>(n);
  }
  return 0;
}

// Whether a console line may end with `last`: '\n', or on a terminal a
// lone '\r', drawn over by the next line as the rank meant.
bool ends_line(char last) { return last == '\n' || last == '\r'; }

// Writes `c`'s backlog, then `size` bytes of `data`, under c.mutex. What
// the console does not take within inline_wait_ms is kept in the backlog
// (`later`); `refused` with c.error set when the console refuses it (its
// reader has gone: EPIPE, never SIGPIPE).
offered put(console_out& c, bool size_limited, const char* data, std::size_t size) {
  std::optional<os::quiet_signal> quiet;
  if (c.pipe && c.way != os::write_way::send) quiet.emplace(SIGPIPE);
  else if (size_limited && !c.pipe) quiet.emplace(SIGXFSZ);
  const char* old = c.backlog.data() + c.taken;
  std::size_t old_left = c.backlog.size() - c.taken;
  const std::size_t offered_bytes = old_left + size;
  const char* const old_from = old;
  int error = write_out(c.fd, c.way, old, old_left);
  if (old != old_from) c.mid_line = !ends_line(old[-1]);
  c.taken = c.backlog.size() - old_left;
  if (error == 0) {
    c.backlog.clear();
    c.taken = 0;
    const char* const data_from = data;
    error = write_out(c.fd, c.way, data, size);
    if (data != data_from) c.mid_line = !ends_line(data[-1]);
  }
  if (old_left + size < offered_bytes) c.last_took = std::chrono::steady_clock::now();
  if (error == EAGAIN) {
    c.backlog.append(data, size);
    c.full = true;
    return offered::later;
  }
  c.backlog.clear();
  c.taken = 0;
  c.full = false;
  if (error == 0) return offered::all;
  c.error = error;
  return offered::refused;
}

}  // namespace

struct group_logs::state {
  std::vector<log_stream> streams;
  // RLIMIT_FSIZE was finite when the group started: a write to a file past
  // it raises SIGXFSZ, which is kept off the process as SIGPIPE is (and
  // only then: that costs four system calls a write).
  bool size_limited = false;
  // A read is delivered before its pump waits again, so the streams share
  // the scratches: as many as threads read at the same time, whatever the
  // number of streams, and warm in the cache of the thread that reuses one.
  std::mutex scratch_mutex;
  std::vector<std::unique_ptr<scratch>> scratches;
  std::vector<scratch*> spare;  // its capacity holds every scratch
  // The followed files: one inotify instance for the group (the system
  // allows a user few of them, and many watches), and which stream each
  // watch is on.
  os::owned_fd inotify;
  bool inotify_refused = false;
  std::unordered_multimap<int, std::size_t> watched;
  struct rank_ends {
    std::optional<stdio> out, err;  // nullopt: as the options say
    std::vector<os::owned_fd> held;      // this process's copies of what the rank gets
  };
  std::vector<rank_ends> ranks;
  std::mutex errors_mutex;  // pumps run on strands of their own
  std::vector<std::string> errors;
  std::vector<const console_out*> lost_consoles;  // told in `errors` once each, under errors_mutex
  // Per stream, then the watcher when any stream is followed: the strand
  // its coroutine runs on, and the signal that stops it (emitted there).
  std::vector<asio::strand<asio::any_io_executor>> strands;
  std::vector<std::unique_ptr<asio::cancellation_signal>> cancels;
  std::optional<asio::steady_timer> all_done;  // on the group's strand: cancelled when the last pump ends
  std::atomic<int> running = 0;
  // Set before the coroutines are told to stop (the followers and the
  // watcher at the start of drain(), the pumps after its limit), and when
  // the time the run was given to end has passed (console_time_up: a
  // console that still holds lines back is given up, and so is a log file
  // that still holds bytes back). A signal emitted after the wait it was
  // meant for completed, before the coroutine resumed, cancels nothing: the
  // coroutine sees its flag before it waits again.
  std::atomic<bool> stop_followers = false, stop_pumps = false, console_time_up = false;
  // On the group's strand: when the pumps were stopped, and when the run
  // was first asked to end (ask_to_end), with the time it gives the
  // consoles from the later of the two.
  std::optional<std::chrono::steady_clock::time_point> pumps_stopped_at, asked_at;
  std::chrono::milliseconds end_limit{0};
  // Once console_time_up is set (and read only after it is seen set): when
  // that time began, to tell a console or file that took nothing in it
  // from one that took some of what waited, not all.
  std::chrono::steady_clock::time_point end_wait_from{};
  std::function<void()> on_busy;  // logs_spec::on_busy
  std::atomic<bool> told_busy = false;
  std::vector<std::shared_ptr<console_out>> consoles;  // the streams' `out`
};

namespace {

// A followed file, open again to be read, and its inotify watch.
struct followed_file {
  os::owned_fd reader;
  int watch;
};

// Follows the log file at `path`, open for the rank as `written`: adds an
// inotify watch for stream `index` and opens the file again to read it.
// None where the file is not a plain file (a device or a pipe cannot be
// read back) or inotify refuses (too many instances or watches): the
// stream then goes through a pipe.
std::optional<followed_file> watch_log(group_logs::state& s, const std::filesystem::path& path, int written, std::size_t index) {
  struct stat file {};
  if (::fstat(written, &file) != 0 || !S_ISREG(file.st_mode)) return std::nullopt;
  if (s.inotify.get() < 0 && !s.inotify_refused) {
    s.inotify = os::owned_fd(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC));
    s.inotify_refused = s.inotify.get() < 0;
  }
  if (s.inotify_refused) return std::nullopt;
  os::owned_fd reader(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  struct stat read {};
  if (reader.get() < 0 || ::fstat(reader.get(), &read) != 0 || read.st_ino != file.st_ino || read.st_dev != file.st_dev) {
    return std::nullopt;
  }
  const int watch = ::inotify_add_watch(s.inotify.get(), path.c_str(), IN_MODIFY);
  if (watch < 0) return std::nullopt;
  s.watched.emplace(watch, index);
  return followed_file{std::move(reader), watch};
}

}  // namespace

// As torchrun expands its template (Python's string.Template, with
// safe_substitute): $$ is $, $name and ${name} are the name's value when it
// is one of ours, and anything else stays as written.
std::string expand_prefix(const std::string& pattern, const std::string& role, int rank, int local_rank) {
  const auto value = [&](std::string_view name) -> std::optional<std::string> {
    if (name == "role" || name == "role_name") return role;  // torchrun's templates say role_name
    if (name == "rank") return std::to_string(rank);
    if (name == "local_rank") return std::to_string(local_rank);
    return std::nullopt;
  };
  const auto starts_name = [](char c) { return c == '_' || std::isalpha(static_cast<unsigned char>(c)) != 0; };
  const auto in_name = [&](char c) { return starts_name(c) || std::isdigit(static_cast<unsigned char>(c)) != 0; };
  std::string out;
  std::size_t at = 0;
  for (std::size_t dollar; (dollar = pattern.find('$', at)) != std::string::npos;) {
    out.append(pattern, at, dollar - at);
    std::size_t from = dollar + 1, to = from, after = from;  // the name [from, to), and where the text goes on
    if (from < pattern.size() && pattern[from] == '$') {
      out += '$';
      at = from + 1;
      continue;
    }
    if (from < pattern.size() && pattern[from] == '{') {
      from = to = from + 1;
      while (to < pattern.size() && in_name(pattern[to])) ++to;
      after = to < pattern.size() && pattern[to] == '}' && to > from && starts_name(pattern[from]) ? to + 1 : from;
    } else {
      while (to < pattern.size() && in_name(pattern[to])) ++to;
      after = to > from && starts_name(pattern[from]) ? to : from;
    }
    const auto expanded = after != from ? value(std::string_view(pattern).substr(from, to - from)) : std::nullopt;
    if (expanded) {
      out += *expanded;
      at = after;
    } else {
      out += '$';  // not ours, or no name: kept as written
      at = dollar + 1;
    }
  }
  out.append(pattern, at);
  return out;
}

void check_consoles(const logs_spec& spec, const spawn_options& options, int nprocs) {
  // A console the lines could never reach is refused here, where they
  // would otherwise be lost with no error to show for it. This process's
  // own stdout or stderr is looked at only where lines go to it through
  // this process: a program that closed it may still start groups whose
  // ranks do not write there.
  const std::pair<const char*, int> consoles[] = {{"console_out", spec.console_out}, {"console_err", spec.console_err}};
  for (int i = 0; i < 2; ++i) {
    const auto [what, given] = consoles[i];
    if (given == -1 && !reaches_console(spec, options, nprocs, i)) continue;
    const int fd = given == -1 ? i + 1 : given;
    const int flags = fd < 0 ? -1 : ::fcntl(fd, F_GETFL);
    if (flags < 0 || (flags & O_ACCMODE) == O_RDONLY) {
      const std::string value =
          given == -1 ? fmt::format("-1 (this process's {}, {})", i == 0 ? "stdout" : "stderr", fd) : std::to_string(fd);
      throw std::invalid_argument(fmt::format("cohort::start_processes: logs.{} is {}, {}", what, value,
                                              flags < 0 ? "not an open descriptor" : "open for reading only"));
    }
  }
}

group_logs::group_logs(const logs_spec& spec, const spawn_options& options, const std::string& role, int nprocs)
    : state_(std::make_shared<state>()) {
  if (rlimit limit{}; ::getrlimit(RLIMIT_FSIZE, &limit) == 0) state_->size_limited = limit.rlim_cur != RLIM_INFINITY;
  if (!spec.dir.empty()) check_folder_names(spec);
  check_ranks("redirects", spec.redirects, nprocs);
  check_ranks("tee", spec.tee, nprocs);
  if (spec.console_ranks) {
    for (int rank : *spec.console_ranks) {
      if (rank < 0 || rank >= nprocs) {
        throw std::invalid_argument(fmt::format("cohort::start_processes: logs.console_ranks names rank {}, not in 0..{}", rank, nprocs - 1));
      }
    }
  }
  const int console[2] = {spec.console_out >= 0 ? spec.console_out : 1, spec.console_err >= 0 ? spec.console_err : 2};
  const char* file_names[2] = {"stdout.log", "stderr.log"};
  auto& s = *state_;
  s.on_busy = spec.on_busy;
  // The console at `fd`: one for each file in this process, shared with
  // the groups that write to it at the same time (and by stdout and
  // stderr when they are one file).
  const auto console_of = [&s](int fd) {
    struct stat st {};
    const bool known = ::fstat(fd, &st) == 0;
    auto& list = open_consoles();
    std::lock_guard lock(list.mutex);
    auto& open = list.consoles;
    std::erase_if(open, [](const std::weak_ptr<console_out>& c) { return c.expired(); });
    for (const auto& weak : open) {
      auto c = weak.lock();
      if (c && (known ? c->device == st.st_dev && c->inode == st.st_ino : c->given == fd)) {
        return s.consoles.emplace_back(std::move(c)).get();
      }
    }
    auto made = open_console(fd, known ? &st : nullptr);
    open.push_back(made);
    return s.consoles.emplace_back(std::move(made)).get();
  };
  console_out* outs[2] = {nullptr, nullptr};  // opened for the first stream that reaches each
  s.ranks.resize(static_cast<std::size_t>(nprocs));
  s.streams.reserve(static_cast<std::size_t>(nprocs) * 2);
  for (int rank = 0; rank < nprocs; ++rank) {
    std::filesystem::path folder;
    if (!spec.dir.empty()) {
      folder = spec.attempt_dir() / std::to_string(rank);
      std::error_code ec;
      std::filesystem::create_directories(folder, ec);
      if (ec) throw std::filesystem::filesystem_error("cohort::start_processes: log folder", folder, ec);
    }
    auto& ends = s.ranks[static_cast<std::size_t>(rank)];
    for (int i = 0; i < 2; ++i) {
      const route r = route_of(spec, options, rank, i);
      if (r.named && spec.dir.empty()) {
        throw std::invalid_argument("cohort::start_processes: logs.redirects and logs.tee need logs.dir");
      }
      if (r.kept) continue;
      const bool to_file = r.to_file, to_console = r.to_console;
      std::optional<stdio>& target = i == 0 ? ends.out : ends.err;
      os::owned_fd file = to_file ? open_log(folder / file_names[i]) : os::owned_fd();
      // A stream of this rank that reaches the console through this process.
      const auto add_stream = [&]() -> log_stream& {
        auto& stream = s.streams.emplace_back();
        if (to_file) stream.file_path = (folder / file_names[i]).string();
        stream.console = console[i];
        if (outs[i] == nullptr) outs[i] = console_of(console[i]);
        stream.out = outs[i];
        stream.prefix = expand_prefix(spec.prefix, role, spec.first_rank + rank, rank);
        return stream;
      };
      std::optional<followed_file> followed;
      if (to_console && to_file && !spec.tee_through_pipes) {
        followed = watch_log(s, folder / file_names[i], file.get(), s.streams.size());
      }
      if (followed) {
        auto& stream = add_stream();
        stream.source = std::move(followed->reader);
        stream.watch = followed->watch;
        stream.followed = true;
        stream.full_read = read_size;
        target = stdio::fd(file.get());
        ends.held.push_back(std::move(file));
      } else if (to_console && (to_file || spec.prefix_all)) {
        int p[2];
        if (::pipe2(p, O_CLOEXEC) != 0) {
          const int error = errno;
          throw std::system_error(error, std::system_category(),
                                  "cohort::start_processes: pipe2 for logs" + os::descriptor_limit_note(error));
        }
        // A smaller pipe only costs wake-ups. F_SETPIPE_SZ answers the size
        // it set; where it is refused, the pipe keeps the size it has.
        int size = ::fcntl(p[0], F_SETPIPE_SZ, pipe_size);
        if (size < 0) size = ::fcntl(p[0], F_GETPIPE_SZ);
        auto& stream = add_stream();
        stream.full_read = size > 0 ? std::min(read_size, static_cast<std::size_t>(size)) : read_size;
        stream.source = os::owned_fd(p[0]);
        stream.file_is_pipe = is_pipe(file.get());
        struct stat kind {};
        if (file.get() >= 0 && ::fstat(file.get(), &kind) == 0 && !S_ISREG(kind.st_mode)) {
          // A pipe or device that does not take the bytes holds back the
          // stream (write_file), never the pump's thread.
          ::fcntl(file.get(), F_SETFL, ::fcntl(file.get(), F_GETFL) | O_NONBLOCK);
        }
        stream.file = std::move(file);
        target = stdio::fd(p[1]);
        ends.held.emplace_back(p[1]);
      } else if (to_file) {
        target = stdio::fd(file.get());
        ends.held.push_back(std::move(file));
      } else if (!to_console) {
        target = stdio::null();
      }
    }
  }
}

void group_logs::apply(int rank, spawn_options& options) const {
  const auto& ends = state_->ranks[static_cast<std::size_t>(rank)];
  if (ends.out) options.out = *ends.out;
  if (ends.err) options.err = *ends.err;
}

void group_logs::started() {
  for (auto& ends : state_->ranks) ends.held.clear();
}

namespace {

void add_error(group_logs::state& st, std::string message) {
  std::lock_guard lock(st.errors_mutex);
  st.errors.push_back(std::move(message));
}

// Why a console or file that still held bytes back was given up once the
// time the run was given to end had passed, by whether it took any in that
// time: it may read on, only more slowly than the ranks wrote.
const char* why_given_up(const group_logs::state& st, std::chrono::steady_clock::time_point last_took,
                         const char* nothing, const char* some) {
  return last_took >= st.end_wait_from ? some : nothing;
}

// The console of `s` refused a write (its reader has gone: `why` is the
// error's text) or had not taken its lines by the deadline: its streams go
// on to their files only. Told once for each console. Under the console's
// lock.
void lose_console(group_logs::state& st, log_stream& s, const char* why) {
  const int console = s.console;
  s.console = -1;
  std::lock_guard lock(st.errors_mutex);
  if (std::ranges::find(st.lost_consoles, s.out) != st.lost_consoles.end()) return;
  st.lost_consoles.push_back(s.out);
  st.errors.push_back(fmt::format("cohort: writing to the console (descriptor {}) failed ({}); "
                                  "what the ranks wrote after reached only their log files, where they have them",
                                  console, why));
}

// The stream's file refused a write (a full disk, a FIFO whose reader has
// gone: `why` is the error's text) or had not taken its bytes by the
// deadline: it is closed, and log_errors says so.
void lose_file(group_logs::state& st, log_stream& s, const char* why) {
  add_error(st,
            fmt::format("cohort: writing {} failed ({}); what the rank wrote after is not in it", s.file_path, why));
  s.file.reset();
  s.file_backlog.clear();
  s.file_taken = 0;
}

// Writes the file's backlog, then `size` bytes of `data`, to the stream's
// file. A plain file takes all of it (its writes wait in the kernel, for
// the disk); what a pipe or device does not take within inline_wait_ms
// waits in the backlog, and the stream reads no more until the file has
// taken it (file_room).
void write_file(group_logs::state& st, log_stream& s, const char* data, std::size_t size) {
  if (s.file.get() < 0) return;
  std::optional<os::quiet_signal> quiet;
  if (s.file_is_pipe) quiet.emplace(SIGPIPE);
  else if (st.size_limited) quiet.emplace(SIGXFSZ);
  const char* old = s.file_backlog.data() + s.file_taken;
  std::size_t old_left = s.file_backlog.size() - s.file_taken;
  const std::size_t offered_bytes = old_left + size;
  int error = write_out(s.file.get(), os::write_way::plain, old, old_left);
  s.file_taken = s.file_backlog.size() - old_left;
  if (error == 0) {
    s.file_backlog.clear();
    s.file_taken = 0;
    error = write_out(s.file.get(), os::write_way::plain, data, size);
  }
  if (old_left + size < offered_bytes) s.file_last_took = std::chrono::steady_clock::now();
  if (error == EAGAIN) {
    if (size > 0) s.file_backlog.append(data, size);
  } else if (error != 0) {
    lose_file(st, s, std::strerror(error));
  }
}

// A scratch of the group's, for one read and its delivery.
class borrowed_scratch {
 public:
  explicit borrowed_scratch(group_logs::state& st) : st_(st) {
    std::lock_guard lock(st.scratch_mutex);
    if (st.spare.empty()) {
      st.scratches.push_back(std::make_unique<scratch>());
      st.spare.reserve(st.scratches.size());  // so that giving it back cannot fail
      s_ = st.scratches.back().get();
    } else {
      s_ = st.spare.back();
      st.spare.pop_back();
    }
  }
  borrowed_scratch(const borrowed_scratch&) = delete;
  borrowed_scratch& operator=(const borrowed_scratch&) = delete;
  ~borrowed_scratch() {
    std::lock_guard lock(st_.scratch_mutex);
    st_.spare.push_back(s_);
  }
  scratch* operator->() const noexcept { return s_; }

 private:
  group_logs::state& st_;
  scratch* s_;
};

// Where console lines end in one read: after a '\n', or after a '\r' that
// no '\n' follows, so that a progress bar's redraws ("step 2\r") reach the
// console as they come, each behind the prefix and ending where the
// terminal goes back to the line's start. Each character is looked for
// with memchr, its next place kept until passed.
class line_ends {
 public:
  explicit line_ends(const char* end) : end_(end) {}
  /// One past the end of the line that starts at `from`; nullptr when the
  /// rest waits for more. A '\r' last in the read ends a line: a '\n'
  /// that comes first in the next read ends it again (write_console).
  const char* after(const char* from) {
    const char* newline = next(from, '\n', newline_);
    const char* ret = next(from, '\r', return_);
    if (ret < newline) return ret + 1 < end_ && ret[1] == '\n' ? ret + 2 : ret + 1;
    return newline == end_ ? nullptr : newline + 1;
  }

 private:
  const char* next(const char* from, char c, const char*& kept) {
    if (kept == nullptr || kept < from) {
      const void* at = std::memchr(from, c, static_cast<std::size_t>(end_ - from));
      kept = at != nullptr ? static_cast<const char*>(at) : end_;
    }
    return kept;
  }
  const char* end_;
  const char* newline_ = nullptr;
  const char* return_ = nullptr;
};

// Appends the line [from, to) (its end, "\n", "\r\n" or "\r", included)
// to `lines` behind `prefix`: its text cut every max_line bytes, each piece
// ended by '\n', and the rest with the line's own end. A line whose text
// waited in pieces is cut the same way (below), so however it was read.
void append_line(std::string& lines, const std::string& prefix, const char* from, const char* to) {
  const char* text_end = to;
  if (text_end > from && text_end[-1] == '\n') --text_end;
  if (text_end > from && text_end[-1] == '\r') --text_end;
  for (; static_cast<std::size_t>(text_end - from) > max_line; from += max_line) {  // the last piece takes the end
    lines += prefix;
    lines.append(from, max_line);
    lines += '\n';
  }
  lines += prefix;
  lines.append(from, to);
}

// Writes the whole lines of what came in to the console, each behind the
// prefix, in one write: they are copied into `lines` first. (Gathered as
// an iovec for the prefix and one for each line, the kernel's walk over
// the iovecs and the calls that IOV_MAX splits them into took more than
// the copy.) The rest of a line waits in `pending`.
void write_console(group_logs::state& st, log_stream& s, std::string& lines, const char* data, std::size_t size) {
  if (s.console < 0 || size == 0) return;
  lines.clear();
  const char* end = data + size;
  if (s.after_return) {  // the read before ended in a lone '\r': a '\n' now makes it "\r\n"
    if (*data == '\n') {
      if (s.out->terminal) lines += '\n';  // elsewhere the '\r' went out as the '\n'
      ++data;
    }
    s.after_return = false;
  }
  // A lone '\r' ends a line: on a terminal as it is, to be drawn over;
  // elsewhere as '\n', so that each line there is one rank's. "\r\n"
  // goes out as "\n" there too, as it does when a read ends between the
  // two (above): the same however the pipe's reads were cut.
  const auto ended = [&] {
    if (s.out->terminal) return;
    if (lines.back() == '\r') {
      lines.back() = '\n';
    } else if (lines.size() >= 2 && lines[lines.size() - 2] == '\r') {  // a line's "\r\n"
      lines.erase(lines.size() - 2, 1);
    }
  };
  line_ends ends(end);
  const char* line_end = ends.after(data);
  if (line_end != nullptr && !s.pending.empty()) {  // the line begun in an earlier read
    s.pending.append(data, line_end);
    append_line(lines, s.prefix, s.pending.data(), s.pending.data() + s.pending.size());
    ended();
    s.pending.clear();
    data = line_end;
    line_end = ends.after(data);
  }
  while (line_end != nullptr) {
    append_line(lines, s.prefix, data, line_end);
    ended();
    data = line_end;
    line_end = ends.after(data);
  }
  s.after_return = data == end && end[-1] == '\r';
  s.pending.append(data, end);
  while (s.pending.size() > max_line) {  // a line too long to wait for: in pieces (one of 64 KiB may end yet)
    lines += s.prefix;
    lines.append(s.pending, 0, max_line);
    lines += '\n';
    s.pending.erase(0, max_line);
  }
  if (!lines.empty()) {
    std::lock_guard lock(s.out->mutex);
    if (put(*s.out, st.size_limited, lines.data(), lines.size()) == offered::refused) {
      lose_console(st, s, std::strerror(s.out->error));
    }
  }
}

// Whether the console of `s` holds lines back: the stream then reads no
// more until console_room.
bool console_full(const log_stream& s) { return s.console >= 0 && s.out->full; }

// Whether the console or the file of `s` holds bytes back: the stream then
// reads no more until room().
bool held_back(const log_stream& s) { return console_full(s) || s.file_taken < s.file_backlog.size(); }

// The time the run was given to end has passed: what the console of `s`
// still holds back, and what its streams write after, reach only the
// files.
// The backlog stays: other groups may share the console, and their lines
// in it, with the rest of a line it took part of, are still written as it
// takes them.
void give_up_console(group_logs::state& st, log_stream& s) {
  std::lock_guard lock(s.out->mutex);
  if (s.console < 0 || !s.out->full) return;  // it took the lines meanwhile
  lose_console(st, s,
               why_given_up(st, s.out->last_took, "it took nothing for the time the run was given to end",
                            "it had not taken every line when the time the run was given to end ran out"));
}

// Waits until the console of `s` has taken its backlog, on the io context,
// never holding the thread: its threads stay free for the group's exits,
// signals and stop(), which can bound this wait (drain()).
asio::awaitable<void> console_room(group_logs::state& st, log_stream& s, const asio::any_io_executor& executor) {
  while (console_full(s)) {
    if (st.console_time_up) {
      give_up_console(st, s);
      co_return;
    }
    std::error_code ec;
    co_await uring::async_poll(executor, s.out->fd, POLLOUT, asio::redirect_error(asio::use_awaitable, ec));
    if (ec && ec != std::errc::interrupted && ec != asio::error::operation_aborted) {
      // The wait itself failed (past the reactor's 500 watches of one
      // descriptor): look again after a pause, never waiting in a write.
      asio::steady_timer pause(executor, room_retry);
      co_await pause.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    }
    std::lock_guard lock(s.out->mutex);
    if (s.console >= 0 && put(*s.out, st.size_limited, nullptr, 0) == offered::refused) {
      lose_console(st, s, std::strerror(s.out->error));
    }
  }
}

// Waits until the file of `s` has taken its backlog, as console_room
// waits for the console: on the io context, and given up once the time
// the run was given to end has passed, so that a FIFO nobody reads holds
// up neither the group nor the end of its run.
asio::awaitable<void> file_room(group_logs::state& st, log_stream& s, const asio::any_io_executor& executor) {
  while (s.file_taken < s.file_backlog.size()) {
    if (st.console_time_up) {
      lose_file(st, s,
                why_given_up(st, s.file_last_took, "it took nothing more for the time the run was given to end",
                             "it had not taken every byte when the time the run was given to end ran out"));
      co_return;
    }
    std::error_code ec;
    co_await uring::async_poll(executor, s.file.get(), POLLOUT, asio::redirect_error(asio::use_awaitable, ec));
    if (ec && ec != std::errc::interrupted && ec != asio::error::operation_aborted) {
      asio::steady_timer pause(executor, room_retry);
      co_await pause.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    }
    write_file(st, s, nullptr, 0);
  }
}

// Waits until neither the console nor the file of `s` holds bytes back.
// Nothing is written meanwhile, so neither fills again while the other is
// waited for.
asio::awaitable<void> room(group_logs::state& st, log_stream& s, const asio::any_io_executor& executor) {
  co_await console_room(st, s, executor);
  co_await file_room(st, s, executor);
}

// What came in goes to the console first: a file write can wait on the
// disk, and the console is where someone is watching.
void deliver(group_logs::state& st, log_stream& s, std::string& lines, const char* data, std::size_t size) {
  write_console(st, s, lines, data, size);
  write_file(st, s, data, size);
}

// A read took all a full pipe holds: tells logs_spec::on_busy, the first time.
void tell_busy(group_logs::state& st) noexcept {
  if (!st.on_busy || st.told_busy.exchange(true)) return;
  try {
    st.on_busy();
  } catch (...) {  // without another thread the pumps only copy more slowly
  }
}

// Delivers what the pipe holds now, without waiting for more: reads until
// one comes back short (the pipe was emptied). False once the stream has
// ended (or cannot be read), true while it is open.
bool read_available(group_logs::state& st, log_stream& s) {
  for (;;) {
    if (held_back(s)) return true;  // read on once the console and the file have room
    const borrowed_scratch scratch(st);
    const ssize_t n = ::read(s.source.get(), scratch->data.get(), read_size);
    if (n > 0) {
      deliver(st, s, scratch->lines, scratch->data.get(), static_cast<std::size_t>(n));
      if (static_cast<std::size_t>(n) >= s.full_read) tell_busy(st);
      if (static_cast<std::size_t>(n) < read_size) return true;
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      return n < 0 && errno == EAGAIN;
    }
  }
}

// Delivers the next buffer of a followed file; whether it was full (the
// file may hold more). Adds to `took` what it read. A file that became
// shorter than what was read (a rank cut its own log) is read again from
// its start.
bool read_followed(group_logs::state& st, log_stream& s, std::size_t& took) {
  if (s.source.get() < 0 || s.console < 0) return false;  // a console that is gone needs nothing more
  const borrowed_scratch scratch(st);
  char* const data = scratch->data.get();
  ssize_t n = ::pread(s.source.get(), data, read_size, s.read_to);
  struct stat file {};
  if (n == 0 && ::fstat(s.source.get(), &file) == 0 && file.st_size < s.read_to) {
    s.read_to = 0;
    n = ::pread(s.source.get(), data, read_size, 0);
  }
  if (n < 0) {
    add_error(st, fmt::format("cohort: reading {} for the console failed ({}); what the rank wrote after is only in the file",
                              s.file_path, std::strerror(errno)));
    s.source.reset();
    return false;
  }
  s.read_to += n;
  took += static_cast<std::size_t>(n);
  write_console(st, s, scratch->lines, data, static_cast<std::size_t>(n));
  if (static_cast<std::size_t>(n) >= s.full_read) tell_busy(st);
  return static_cast<std::size_t>(n) == read_size;
}

// The partial last line of a stream, ended by a newline on the console;
// then lets go of its descriptors.
void end_stream(group_logs::state& st, log_stream& s) {
  if (!s.pending.empty() && s.console >= 0) {
    const std::string out = s.prefix + s.pending + '\n';
    std::lock_guard lock(s.out->mutex);
    if (put(*s.out, st.size_limited, out.data(), out.size()) == offered::refused) {
      lose_console(st, s, std::strerror(s.out->error));
    }
  }
  s.pending.clear();
  s.source.reset();
  s.file.reset();
}

// A pump, follower or watcher has ended; the last one tells drain().
void ended(const std::shared_ptr<group_logs::state>& state, const asio::any_io_executor& group_strand) {
  if (--state->running == 0) asio::post(group_strand, [state] { state->all_done->cancel(); });
}

// Waits for data with a poll on the ring and reads it in this thread:
// io_uring would copy it inside the submission, under the ring's lock,
// one stream at a time; this way the pumps of several streams copy on as
// many threads as the io_context runs on.
asio::awaitable<void> pump(std::shared_ptr<group_logs::state> state, std::size_t index, asio::any_io_executor group_strand) {
  auto& st = *state;
  auto& s = st.streams[index];
  auto executor = co_await asio::this_coro::executor;
  co_await asio::this_coro::throw_if_cancelled(false);  // a late signal must not throw past the end below
  for (bool open = true; open;) {
    co_await room(st, s, executor);
    if (st.stop_pumps) break;  // looked at after each wait: the signal that tells it may have come between them
    std::error_code ec;
    co_await uring::async_poll(executor, s.source.get(), POLLIN, asio::redirect_error(asio::use_awaitable, ec));
    if (ec == std::errc::interrupted) continue;
    if (ec) break;
    open = read_available(st, s);
  }
  // What is left in the pipe, then the partial line; the console and the
  // file take all of it before the pump ends.
  do co_await room(st, s, executor);
  while (read_available(st, s) && held_back(s));
  end_stream(st, s);
  co_await console_room(st, s, executor);
  ended(state, group_strand);
}

// Marks in `changed` the followed streams whose files inotify says were
// written; all of them when its queue overflowed.
void take_changes(group_logs::state& st, std::vector<char>& changed) {
  alignas(inotify_event) char events[4096];
  for (;;) {
    const ssize_t n = ::read(st.inotify.get(), events, sizeof events);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // EAGAIN: every event taken
    for (const char* at = events; at < events + n;) {
      const auto* event = reinterpret_cast<const inotify_event*>(at);
      if ((event->mask & IN_Q_OVERFLOW) != 0) std::fill(changed.begin(), changed.end(), 1);
      const auto [first, last] = st.watched.equal_range(event->wd);
      for (auto it = first; it != last; ++it) changed[it->second] = 1;
      at += sizeof(inotify_event) + event->len;
    }
  }
}

// Wakes the follower of stream `index` on its strand.
void kick(const std::shared_ptr<group_logs::state>& state, std::size_t index) {
  asio::post(state->strands[index], [state, index] {
    auto& s = state->streams[index];
    s.kicked = true;
    s.wake->cancel();
  });
}

// Tells a followed file's own watch to report its writes, or (`writes`
// false) only its deletion, which a run does not do; whether it took. The
// watch is named through the descriptor the follower reads, which stays
// the same file whatever the rank renames.
bool report_writes(group_logs::state& st, const log_stream& s, bool writes) {
  char path[48];
  std::snprintf(path, sizeof path, "/proc/self/fd/%d", s.source.get());
  return ::inotify_add_watch(st.inotify.get(), path, writes ? IN_MODIFY : IN_DELETE_SELF) == s.watch;
}

// Follows one file: reads what it gained whenever the watcher says it was
// written, a buffer at a time with the other streams' turns between; once
// stopped (every rank has ended), reads it to its end. While the file is
// busy (see busy_bytes), it is read every busy_poll, its watch quiet.
asio::awaitable<void> follow(std::shared_ptr<group_logs::state> state, std::size_t index, asio::any_io_executor group_strand) {
  auto& st = *state;
  auto& s = st.streams[index];
  auto executor = co_await asio::this_coro::executor;
  co_await asio::this_coro::throw_if_cancelled(false);  // a late signal must not throw past the end below
  const bool own_watch = st.watched.count(s.watch) == 1;
  bool armed = true;         // the watch reports writes
  bool polled_only = false;  // the watch could not be told to report writes again
  for (;;) {
    s.kicked = false;
    const bool last = st.stop_followers;  // taken before the reads: they then see all the ranks wrote
    std::size_t took = 0;
    for (;;) {
      co_await console_room(st, s, executor);
      if (!read_followed(st, s, took)) break;
      co_await asio::post(executor, asio::use_awaitable);
    }
    co_await console_room(st, s, executor);  // what the last read left in the backlog, before the wait
    if (last) break;
    const bool busy = own_watch && took >= (armed ? busy_bytes : 1);
    if (busy || polled_only) {
      if (armed) armed = !report_writes(st, s, false);
      s.wake->expires_after(busy_poll);
    } else if (!armed) {
      armed = report_writes(st, s, true);
      polled_only = !armed;
      continue;  // what was written before the watch reported it
    } else {
      s.wake->expires_at(std::chrono::steady_clock::time_point::max());
    }
    if (!s.kicked) {
      std::error_code ec;
      co_await s.wake->async_wait(asio::redirect_error(asio::use_awaitable, ec));
    }
  }
  end_stream(st, s);
  co_await console_room(st, s, executor);
  ended(state, group_strand);
}

// The watcher of the followed files: wakes the follower of each file
// inotify says was written, until stopped.
asio::awaitable<void> watch_files(std::shared_ptr<group_logs::state> state, asio::any_io_executor group_strand) {
  auto& st = *state;
  auto executor = co_await asio::this_coro::executor;
  co_await asio::this_coro::throw_if_cancelled(false);
  std::vector<char> changed(st.streams.size(), 0);
  while (!st.stop_followers) {
    std::error_code ec;
    co_await uring::async_poll(executor, st.inotify.get(), POLLIN, asio::redirect_error(asio::use_awaitable, ec));
    if (ec == std::errc::interrupted) continue;
    if (ec) break;
    take_changes(st, changed);
    for (std::size_t i = 0; i < changed.size(); ++i) {
      if (changed[i] != 0 && st.streams[i].followed) kick(state, i);
      changed[i] = 0;
    }
  }
  ended(state, group_strand);
}

}  // namespace

void group_logs::start(const asio::any_io_executor& io, const asio::any_io_executor& group_strand) {
  auto& st = *state_;
  st.all_done.emplace(group_strand, std::chrono::steady_clock::time_point::max());
  const std::size_t coroutines = st.streams.size() + (st.watched.empty() ? 0 : 1);  // the watcher last
  st.running = static_cast<int>(coroutines);
  for (std::size_t i = 0; i < coroutines; ++i) {
    st.strands.emplace_back(asio::make_strand(io));
    st.cancels.emplace_back(std::make_unique<asio::cancellation_signal>());
  }
  const auto spawn = [&](std::size_t i, asio::awaitable<void> coroutine) {
    asio::co_spawn(st.strands[i], std::move(coroutine), asio::bind_cancellation_slot(st.cancels[i]->slot(), asio::detached));
  };
  for (std::size_t i = 0; i < st.streams.size(); ++i) {
    auto& s = st.streams[i];
    if (s.followed) {
      s.wake = std::make_unique<asio::steady_timer>(st.strands[i], std::chrono::steady_clock::time_point::max());
      spawn(i, follow(state_, i, group_strand));
    } else {
      ::fcntl(s.source.get(), F_SETFL, ::fcntl(s.source.get(), F_GETFL) | O_NONBLOCK);
      spawn(i, pump(state_, i, group_strand));
    }
  }
  if (!st.watched.empty()) spawn(st.streams.size(), watch_files(state_, group_strand));
}

namespace {

// Tells every coroutine to look at its flags again, on its strand.
void wake_all(const std::shared_ptr<group_logs::state>& state) {
  for (std::size_t i = 0; i < state->cancels.size(); ++i) {
    asio::post(state->strands[i], [state, i] { state->cancels[i]->emit(asio::cancellation_type::terminal); });
  }
}

// Until when the stopped pumps' last writes wait for the consoles: for
// good, unless the run was asked to end; then `end_limit` from that or
// from when the pumps were stopped, whichever came later.
std::chrono::steady_clock::time_point console_deadline(const group_logs::state& st) {
  if (!st.asked_at || !st.pumps_stopped_at) return std::chrono::steady_clock::time_point::max();
  return std::max(*st.asked_at, *st.pumps_stopped_at) + st.end_limit;
}

// Waits on the group's strand until every coroutine has ended or
// `until()` has passed; ask_to_end() wakes it to look at `until()` again.
template <class Until>
asio::awaitable<void> await_ends(group_logs::state& st, Until until) {
  for (;;) {
    const auto deadline = until();
    if (st.running == 0 || std::chrono::steady_clock::now() >= deadline) co_return;
    std::error_code ec;
    st.all_done->expires_at(deadline);
    co_await st.all_done->async_wait(asio::redirect_error(asio::use_awaitable, ec));
  }
}

}  // namespace

void group_logs::ask_to_end(std::chrono::milliseconds limit) {
  auto& st = *state_;
  if (st.asked_at) return;  // the first request bounds the wait
  st.asked_at = std::chrono::steady_clock::now();
  st.end_limit = limit;
  if (st.all_done) st.all_done->cancel();
}

namespace {

// What drain() waits for: the end of every coroutine of `state`, within
// the bounds drain() gives.
asio::awaitable<void> end_streams(std::shared_ptr<group_logs::state> state, std::chrono::milliseconds limit) {
  auto& st = *state;
  if (!st.watched.empty()) {  // the files hold all the ranks wrote: read them to their ends
    st.stop_followers = true;
    for (std::size_t i = 0; i < st.streams.size(); ++i) {
      if (st.streams[i].followed) kick(state, i);
    }
    const auto last = st.cancels.size() - 1;
    asio::post(st.strands[last], [state, last] { state->cancels[last]->emit(asio::cancellation_type::terminal); });
  }
  const auto pumped_until = std::chrono::steady_clock::now() + limit;
  co_await await_ends(st, [&] { return pumped_until; });
  if (st.running == 0) co_return;
  // A writer outlived the run, or a console takes no more: the pumps take
  // what is there and stop, and the last lines wait for the consoles.
  st.pumps_stopped_at = std::chrono::steady_clock::now();
  st.stop_pumps = true;
  wake_all(state);
  co_await await_ends(st, [&] { return console_deadline(st); });
  if (st.running == 0) co_return;
  st.end_wait_from = std::max(*st.asked_at, *st.pumps_stopped_at);
  st.console_time_up = true;  // before the wake-up, which a coroutine between waits misses
  wake_all(state);
  co_await await_ends(st, [] { return std::chrono::steady_clock::time_point::max(); });
}

}  // namespace

asio::awaitable<void> group_logs::drain(std::chrono::milliseconds limit) {
  co_await end_streams(state_, limit);
  // Every stream has ended: a reader of the console sees its end once the
  // caller's descriptors are closed too, not only once the group is gone.
  close_descriptors();
}

void group_logs::close_descriptors() noexcept {
  auto& st = *state_;
  for (auto& s : st.streams) {
    s.source.reset();
    s.file.reset();
    s.console = -1;
    s.out = nullptr;
  }
  st.inotify.reset();
  for (auto& ends : st.ranks) ends.held.clear();
  st.consoles.clear();  // a console's own descriptor closes with the last group that writes to it
}

bool take_open_line(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return false;
  bool open = false;
  {
    auto& list = open_consoles();
    std::lock_guard lock(list.mutex);
    for (const auto& weak : list.consoles) {
      const auto c = weak.lock();
      if (!c || c->device != st.st_dev || c->inode != st.st_ino) continue;
      std::lock_guard line(c->mutex);
      open = std::exchange(c->mid_line, false) || open;
    }
  }
  return take_left_open(st.st_dev, st.st_ino) || open;
}

std::vector<std::string> group_logs::errors() const {
  std::lock_guard lock(state_->errors_mutex);
  return state_->errors;
}

std::size_t group_logs::descriptors_to_come(const asio::any_io_executor& io) const {
  if (uring::service_of(io).caps().poll) return 0;
  return static_cast<std::size_t>(
      std::count_if(state_->streams.begin(), state_->streams.end(), [](const log_stream& s) { return !s.followed; }));
}

}  // namespace cohort::detail

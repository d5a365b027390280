// Per-rank log files and the pumps from the ranks' pipes. A stream that
// only goes to a file is the file itself in the rank; a stream that reaches
// the console through this process is a pipe, read as data arrives, written
// whole to the file and line by line, prefixed, to the console.
#include "logs/logs.hpp"

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
#include <limits.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <functional>
#include <mutex>
#include <span>
#include <stdexcept>
#include <system_error>

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

// One writer at a time on the console, across the groups of this process:
// each write is a run of whole lines.
std::mutex console_mutex;

void check_ranks(const char* what, const std::map<int, std_streams>& ranks, int nprocs) {
  for (const auto& [rank, streams] : ranks) {
    if (rank < 0 || rank >= nprocs) {
      throw std::invalid_argument(fmt::format("cohort::start_processes: logs.{} names rank {}, not in 0..{}", what, rank, nprocs - 1));
    }
    if (static_cast<unsigned>(streams) > 3) {
      throw std::invalid_argument(fmt::format("cohort::start_processes: logs.{} for rank {} is {}, not 0..3", what, rank,
                                              static_cast<unsigned>(streams)));
    }
  }
}

// A log file left by an earlier run (the same run id) is replaced, not
// truncated: ext4 flushes a file truncated to nothing when it is closed
// (its auto_da_alloc guard for rewritten files), which would hold up the
// end of the run for as long as the disk takes to write everything. Only a
// plain file with one name is replaced; a link or a device is opened as it
// is.
os::owned_fd open_log(const std::filesystem::path& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_nlink == 1 && st.st_size > 0) {
    ::unlink(path.c_str());  // whatever stops this stops the open below, which says why
  }
  os::owned_fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0) {
    throw std::filesystem::filesystem_error("cohort::start_processes: log file", path, std::error_code(errno, std::system_category()));
  }
  return fd;
}

}  // namespace

struct group_logs::state {
  std::vector<log_stream> streams;
  struct rank_ends {
    std::optional<stdio> out, err;  // nullopt: as the options say
    std::vector<os::owned_fd> held;      // this process's copies of what the rank gets
  };
  std::vector<rank_ends> ranks;
  std::mutex errors_mutex;  // pumps run on strands of their own
  std::vector<std::string> errors;
  // Per pump: its strand, and the signal that stops it (emitted there).
  std::vector<asio::strand<asio::any_io_executor>> strands;
  std::vector<std::unique_ptr<asio::cancellation_signal>> cancels;
  std::optional<asio::steady_timer> all_done;  // on the group's strand: cancelled when the last pump ends
  std::atomic<int> running = 0;
  std::function<void()> on_busy;  // logs_spec::on_busy
  std::atomic<bool> told_busy = false;
};

std::string expand_prefix(const std::string& pattern, const std::string& role, int rank, int local_rank) {
  std::string out;
  std::size_t at = 0;
  while (at < pattern.size()) {
    const auto open = pattern.find("${", at);
    const auto close = open == std::string::npos ? std::string::npos : pattern.find('}', open);
    if (close == std::string::npos) break;
    const std::string_view name(pattern.data() + open + 2, close - open - 2);
    out.append(pattern, at, open - at);
    if (name == "role") out += role;
    else if (name == "rank") out += std::to_string(rank);
    else if (name == "local_rank") out += std::to_string(local_rank);
    else out.append(pattern, open, close + 1 - open);  // not ours: kept as written
    at = close + 1;
  }
  out.append(pattern, at);
  return out;
}

group_logs::group_logs(const logs_spec& spec, const std::string& role, int nprocs) : state_(std::make_shared<state>()) {
  check_ranks("redirects", spec.redirects.ranks, nprocs);
  check_ranks("tee", spec.tee.ranks, nprocs);
  if (spec.console_ranks) {
    for (int rank : *spec.console_ranks) {
      if (rank < 0 || rank >= nprocs) {
        throw std::invalid_argument(fmt::format("cohort::start_processes: logs.console_ranks names rank {}, not in 0..{}", rank, nprocs - 1));
      }
    }
  }
  const int console[2] = {spec.console_out >= 0 ? spec.console_out : 1, spec.console_err >= 0 ? spec.console_err : 2};
  const std_streams which[2] = {std_streams::out, std_streams::err};
  const char* file_names[2] = {"stdout.log", "stderr.log"};
  auto& s = *state_;
  s.on_busy = spec.on_busy;
  s.ranks.resize(static_cast<std::size_t>(nprocs));
  s.streams.reserve(static_cast<std::size_t>(nprocs) * 2);
  for (int rank = 0; rank < nprocs; ++rank) {
    const std_streams redirect = spec.redirects.of(rank), tee = spec.tee.of(rank);
    const bool shown = !spec.console_ranks || spec.console_ranks->contains(rank);
    std::filesystem::path folder;
    if (!spec.dir.empty()) {
      folder = spec.attempt_dir() / std::to_string(rank);
      std::error_code ec;
      std::filesystem::create_directories(folder, ec);
      if (ec) throw std::filesystem::filesystem_error("cohort::start_processes: log folder", folder, ec);
    }
    auto& ends = s.ranks[static_cast<std::size_t>(rank)];
    for (int i = 0; i < 2; ++i) {
      const bool named = has(redirect, which[i]) || has(tee, which[i]);
      if (named && spec.dir.empty()) {
        throw std::invalid_argument("cohort::start_processes: logs.redirects and logs.tee need logs.dir");
      }
      const bool to_file = named || (!shown && !spec.dir.empty());
      const bool to_console = shown && (!has(redirect, which[i]) || has(tee, which[i]));
      std::optional<stdio>& target = i == 0 ? ends.out : ends.err;
      os::owned_fd file = to_file ? open_log(folder / file_names[i]) : os::owned_fd();
      if (to_console && (to_file || spec.prefix_all)) {
        int p[2];
        if (::pipe2(p, O_CLOEXEC) != 0) throw std::system_error(errno, std::system_category(), "cohort::start_processes: pipe2 for logs");
        // A smaller pipe only costs wake-ups. F_SETPIPE_SZ answers the size
        // it set; where it is refused, the pipe keeps the size it has.
        int size = ::fcntl(p[0], F_SETPIPE_SZ, pipe_size);
        if (size < 0) size = ::fcntl(p[0], F_GETPIPE_SZ);
        auto& stream = s.streams.emplace_back();
        stream.full_read = size > 0 ? std::min(read_size, static_cast<std::size_t>(size)) : read_size;
        stream.pipe = os::owned_fd(p[0]);
        stream.file = std::move(file);
        if (to_file) stream.file_path = (folder / file_names[i]).string();
        stream.console = console[i];
        stream.prefix = expand_prefix(spec.prefix, role, spec.first_rank + rank, rank);
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

// Writes `parts` in order, in as few writev calls as IOV_MAX allows; false
// with errno set when the descriptor refuses them (EAGAIN on a
// non-blocking console is waited out). Advances the parts as it goes.
bool write_parts(int fd, std::span<iovec> parts) {
  std::size_t first = 0;
  while (first < parts.size()) {
    const int count = static_cast<int>(std::min<std::size_t>(parts.size() - first, IOV_MAX));
    const ssize_t n = ::writev(fd, &parts[first], count);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN) return false;
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, -1);
      continue;
    }
    // Past what was written; a part written in part keeps its rest.
    auto left = static_cast<std::size_t>(n);
    while (first < parts.size() && left >= parts[first].iov_len) left -= parts[first++].iov_len;
    if (left > 0) {
      parts[first].iov_base = static_cast<char*>(parts[first].iov_base) + left;
      parts[first].iov_len -= left;
    }
  }
  return true;
}

bool write_all(int fd, const char* data, std::size_t size) {
  iovec whole{const_cast<char*>(data), size};
  return write_parts(fd, {&whole, 1});
}

// Writes what came in to the stream's file whole.
void write_file(group_logs::state& st, log_stream& s, const char* data, std::size_t size) {
  if (s.file.get() >= 0 && !write_all(s.file.get(), data, size)) {
    auto message = fmt::format("cohort: writing {} failed ({}); what the rank wrote after is not in it", s.file_path,
                               std::strerror(errno));
    s.file.reset();
    std::lock_guard lock(st.errors_mutex);
    st.errors.push_back(std::move(message));
  }
}

// Writes the whole lines of what came in, prefixed, to the console
// (gathered, not copied: one writev per run of lines). The rest of a line
// waits in `pending`.
void write_console(log_stream& s, const char* data, std::size_t size, std::vector<iovec>& parts) {
  if (s.console < 0) return;
  parts.clear();
  const auto add = [&](const char* p, std::size_t n) { parts.push_back({const_cast<char*>(p), n}); };
  const char* end = data + size;
  const char* newline = static_cast<const char*>(std::memchr(data, '\n', size));
  const bool ends_pending = newline != nullptr && !s.pending.empty();
  if (ends_pending) {  // the line begun in an earlier read
    s.pending.append(data, newline + 1);
    add(s.prefix.data(), s.prefix.size());
    add(s.pending.data(), s.pending.size());
    data = newline + 1;
    newline = static_cast<const char*>(std::memchr(data, '\n', static_cast<std::size_t>(end - data)));
  }
  while (newline != nullptr) {
    add(s.prefix.data(), s.prefix.size());
    add(data, static_cast<std::size_t>(newline + 1 - data));
    data = newline + 1;
    newline = static_cast<const char*>(std::memchr(data, '\n', static_cast<std::size_t>(end - data)));
  }
  if (!parts.empty()) {
    std::lock_guard lock(console_mutex);
    if (!write_parts(s.console, parts)) s.console = -1;  // the console is gone: files only from here
  }
  if (ends_pending) s.pending.clear();
  s.pending.append(data, end);
  std::string pieces;
  while (s.pending.size() >= max_line) {  // a line too long to wait for: in pieces
    pieces += s.prefix;
    pieces.append(s.pending, 0, max_line);
    pieces += '\n';
    s.pending.erase(0, max_line);
  }
  if (!pieces.empty() && s.console >= 0) {
    std::lock_guard lock(console_mutex);
    if (!write_all(s.console, pieces.data(), pieces.size())) s.console = -1;
  }
}

// What came in goes to the console first: a file write can wait on the
// disk, and the console is where someone is watching.
void deliver(group_logs::state& st, log_stream& s, const char* data, std::size_t size, std::vector<iovec>& parts) {
  write_console(s, data, size, parts);
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
bool read_available(group_logs::state& st, log_stream& s, char* buffer, std::vector<iovec>& parts) {
  for (;;) {
    const ssize_t n = ::read(s.pipe.get(), buffer, read_size);
    if (n > 0) {
      deliver(st, s, buffer, static_cast<std::size_t>(n), parts);
      if (static_cast<std::size_t>(n) >= s.full_read) tell_busy(st);
      if (static_cast<std::size_t>(n) < read_size) return true;
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      return n < 0 && errno == EAGAIN;
    }
  }
}

// The end of a stream: what is left in the pipe, then the partial last
// line, ended by a newline on the console.
void finish_stream(group_logs::state& st, log_stream& s, char* buffer, std::vector<iovec>& parts) {
  read_available(st, s, buffer, parts);
  if (!s.pending.empty() && s.console >= 0) {
    const std::string out = s.prefix + s.pending + '\n';
    std::lock_guard lock(console_mutex);
    write_all(s.console, out.data(), out.size());
  }
  s.pending.clear();
  s.pipe.reset();
  s.file.reset();
}

// Waits for data with a poll on the ring and reads it in this thread:
// io_uring would copy it inside the submission, under the ring's lock,
// one stream at a time; this way the pumps of several streams copy on as
// many threads as the io_context runs on.
asio::awaitable<void> pump(std::shared_ptr<group_logs::state> state, std::size_t index, asio::any_io_executor group_strand) {
  auto& st = *state;
  auto& s = st.streams[index];
  auto executor = co_await asio::this_coro::executor;
  auto buffer = std::make_unique<char[]>(read_size);
  std::vector<iovec> parts;
  for (bool open = true; open;) {
    std::error_code ec;
    co_await uring::async_poll(executor, s.pipe.get(), POLLIN, asio::redirect_error(asio::use_awaitable, ec));
    if (ec == std::errc::interrupted) continue;
    if (ec) break;
    open = read_available(st, s, buffer.get(), parts);
  }
  finish_stream(st, s, buffer.get(), parts);
  if (--st.running == 0) asio::post(group_strand, [state] { state->all_done->cancel(); });
}

}  // namespace

void group_logs::start(const asio::any_io_executor& io, const asio::any_io_executor& group_strand) {
  auto& st = *state_;
  st.all_done.emplace(group_strand, std::chrono::steady_clock::time_point::max());
  st.running = static_cast<int>(st.streams.size());
  for (std::size_t i = 0; i < st.streams.size(); ++i) {
    ::fcntl(st.streams[i].pipe.get(), F_SETFL, ::fcntl(st.streams[i].pipe.get(), F_GETFL) | O_NONBLOCK);
    auto& strand = st.strands.emplace_back(asio::make_strand(io));
    auto& cancel = *st.cancels.emplace_back(std::make_unique<asio::cancellation_signal>());
    asio::co_spawn(strand, pump(state_, i, group_strand), asio::bind_cancellation_slot(cancel.slot(), asio::detached));
  }
}

asio::awaitable<void> group_logs::drain(std::chrono::milliseconds limit) {
  auto& st = *state_;
  if (st.running > 0) {
    std::error_code ec;
    st.all_done->expires_after(limit);
    co_await st.all_done->async_wait(asio::redirect_error(asio::use_awaitable, ec));
  }
  if (st.running > 0) {  // a writer outlived the run: take what is there and stop
    for (std::size_t i = 0; i < st.cancels.size(); ++i) {
      asio::post(st.strands[i], [state = state_, i] { state->cancels[i]->emit(asio::cancellation_type::terminal); });
    }
    std::error_code ec;
    st.all_done->expires_at(std::chrono::steady_clock::time_point::max());
    if (st.running > 0) co_await st.all_done->async_wait(asio::redirect_error(asio::use_awaitable, ec));
  }
}

std::vector<std::string> group_logs::errors() const {
  std::lock_guard lock(state_->errors_mutex);
  return state_->errors;
}

}  // namespace cohort::detail

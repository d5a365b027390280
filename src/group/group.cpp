// Starting the ranks of a group and supervising them. Supervision is a race
// (when_any) between the ranks' exits and a stop request; the first failure,
// the last exit or stop() decides it. The shutdown sequence follows, and the
// run ends with nothing of it left.
#include "cohort/group.hpp"

#include "cohort/error_file.hpp"
#include "cohort/when_any.hpp"
#include "launch/entry.hpp"
#include "group/descendants.hpp"
#include "group/error_dir.hpp"
#include "group/rank_groups.hpp"
#include "group/signal_echo.hpp"
#include "logs/logs.hpp"
#include "os/deadline.hpp"
#include "os/demangle.hpp"
#include "os/descriptor_limit.hpp"
#include "os/descriptor_table.hpp"
#include "os/fork_safe_mutex.hpp"
#include "os/owned_fd.hpp"
#include "os/process_identity.hpp"
#include "os/replace_file.hpp"
#include "process/child_state.hpp"
#include "process/launch.hpp"
#include "process/owned_pids.hpp"
#include "process/parallel.hpp"
#include "shm/keeper.hpp"
#include "shm/segment.hpp"

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/dispatch.hpp>
#include <asio/post.hpp>
#include <asio/experimental/concurrent_channel.hpp>
#include <asio/redirect_error.hpp>
#include <asio/signal_set.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <fmt/format.h>

#include <signal.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <string_view>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <utility>

namespace cohort {
namespace detail {

using steady = std::chrono::steady_clock;
/// Wakes one wait() when the run ends; thread-safe, as waits run on any
/// executor. (The int is unused: Asio 1.22 cannot build a channel of
/// void(error_code) alone.)
using run_end = asio::experimental::concurrent_channel<void(std::error_code, int)>;

// The actions a set of signals had before an asio::signal_set caught them.
// asio gives a signal back as SIG_DFL when its last set lets go of it, so a
// handler (or SIG_IGN) the program had set would be gone after the run.
// restore() puts each back, unless something else (another asio set, or
// the program itself since) handles the signal now. Runs that overlap
// share one note per signal, taken by the first: a later one would find
// asio's own handler there, and, ending last, put it back after asio had
// let go of the signal (which it would then swallow).
class caught_signals {
 public:
  caught_signals() = default;
  caught_signals(const caught_signals&) = delete;
  caught_signals& operator=(const caught_signals&) = delete;
  caught_signals(caught_signals&& other) noexcept : noted_(std::exchange(other.noted_, {})) {}
  caught_signals& operator=(caught_signals&& other) noexcept {
    if (this != &other) {
      restore();
      noted_ = std::exchange(other.noted_, {});
    }
    return *this;
  }
  ~caught_signals() { restore(); }

  void note(int sig) {
    if (std::find(noted_.begin(), noted_.end(), sig) != noted_.end()) return;
    auto& [mutex, notes] = shared();
    std::lock_guard lock(mutex);
    auto it = notes.find(sig);
    if (it == notes.end()) {
      struct sigaction action {};
      if (::sigaction(sig, nullptr, &action) != 0) return;
      it = notes.emplace(sig, std::pair{action, 0}).first;
    }
    ++it->second.second;
    noted_.push_back(sig);
  }
  void restore() noexcept {
    auto& [mutex, notes] = shared();
    std::lock_guard lock(mutex);
    for (int sig : noted_) {
      auto it = notes.find(sig);
      if (it == notes.end() || --it->second.second > 0) continue;
      struct sigaction now {};
      if (::sigaction(sig, nullptr, &now) == 0 && (now.sa_flags & SA_SIGINFO) == 0 && now.sa_handler == SIG_DFL) {
        ::sigaction(sig, &it->second.first, nullptr);
      }
      notes.erase(it);
    }
    noted_.clear();
  }

 private:
  // Per signal: the action before the first run that caught it, and how
  // many runs catch it now.
  // Fork-safe: a child, which inherits the actions, notes them in turn.
  using notes_t = std::map<int, std::pair<struct sigaction, int>>;
  static std::pair<os::fork_safe_mutex, notes_t>& shared() {
    static auto& s = *new std::pair<os::fork_safe_mutex, notes_t>;  // never destroyed: a group may end as statics go
    return s;
  }
  std::vector<int> noted_;
};

struct group_state;
void end_unfinished(group_state& state) noexcept;
void forget_guardian_notes(group_state& state) noexcept;
void release_folders(group_state& state) noexcept;

/// The state's objects of the io_context: the strand, its timers, and the
/// signals that end the shutdown's waits for ranks SIGKILL did not end.
struct io_objects {
  io_objects(const asio::any_io_executor& ex, int nprocs)
      : strand(asio::make_strand(ex)), drain_ends(std::make_unique<asio::cancellation_signal[]>(nprocs)) {}
  asio::strand<asio::any_io_executor> strand;
  asio::steady_timer wake{strand};  // the shutdown sleeps on it; exits and stop() cancel it
  asio::steady_timer stop_requested{strand, std::chrono::steady_clock::time_point::max()};  // stop() cancels it
  asio::steady_timer orphan_look{strand};  // reap_orphans_while_running sleeps on it; finish() cancels it
  std::unique_ptr<asio::cancellation_signal[]> drain_ends;  // by rank
};

/// Shared by the group object and the supervision coroutines. All of
/// it but `finished`/`result` (guarded by `mutex`) is touched only on `strand`.
struct group_state {
  group_state(asio::any_io_executor ex, const group_spec& s)
      : context(context_lifetime(ex)),
        io(std::make_unique<io_objects>(ex, s.nprocs)),
        strand(io->strand),
        nprocs(s.nprocs),
        shutdown(s.shutdown),
        error_dir(s.error_dir) {}
  group_state(const group_state&) = delete;
  group_state& operator=(const group_state&) = delete;
  ~group_state() {
    // Kept by a group object past its io_context: what belongs to the
    // io_context is left as it is, never destroyed (its services, which
    // those objects' destructors would reach, are gone).
    if (context.expired()) {
      (void)io.release();
      if (logs) logs->close_descriptors();  // its files and pipes are plain descriptors: closed, not left open
      (void)logs.release();
      (void)new std::shared_ptr<asio::signal_set>(std::move(signals));
      (void)new std::vector<std::shared_ptr<run_end>>(std::move(waiters));
    }
    // A copy that fork() made (a process forked while the run went on, and
    // ending): the run, its ranks, their process groups and the files they
    // write are the starting process's, which still supervises them. Only
    // the copy's own descriptors go.
    if (owner != os::this_process()) {
      for (int fd : result_fds) {
        if (fd >= 0) ::close(fd);
      }
      return;
    }
    // A start that failed, or a run whose supervision went with its
    // io_context: nothing of it may outlive it.
    if (subreaper) {
      end_unfinished(*this);
      end_subreaper();
    }
    forget_guardian_notes(*this);
    release_folders(*this);
    for (int fd : result_fds) {
      if (fd >= 0) ::close(fd);
    }
    // Files in the user's directory: those the ranks wrote go when the run
    // ends.
    if (!error_file_prefix.empty()) release_group_files(error_files.front().parent_path(), error_file_prefix);
  }

  std::weak_ptr<const void> context;  // expires with the io_context the group runs on
  pid_t owner = os::this_process();  // the process that started the run
  std::unique_ptr<io_objects> io;
  asio::strand<asio::any_io_executor>& strand;
  // What supervision reads of the spec; the rest serves the start alone.
  int nprocs;
  shutdown_policy shutdown;
  std::filesystem::path error_dir;  // the spec's, or the logs' attempt folder
  // error_dir and the logs' attempt folder, as claim_folders holds them
  std::vector<std::filesystem::path> held_folders;
  // "COHORT_GROUP_<id>=1", in every rank's environment, and recorded in each
  // segment a process of the run makes (shm::segment_header::run_markers).
  std::string marker;
  std::vector<std::filesystem::path> error_files;  // per rank
  std::string error_file_prefix;  // of this group's files in the user's directory; empty when error_dir is set
  std::vector<child> children;
  std::vector<pid_t> pids;
  std::vector<int> result_fds;  // per rank, for function entries: the memfd its result lands in
  // A function's arguments, held for the group's life: a spawn or
  // forkserver rank takes its own hold on the shared memory they name only
  // as it decodes them, after the start has returned and the caller may
  // have dropped its own.
  std::optional<encoded> args;
  bool counted_as_keeper = false;  // its function ranks are counted by shm::note_ranks_running
  std::unique_ptr<group_logs> logs;  // when spec.logs is in use
  run_result partial;
  int running = 0;
  std::vector<bool> recorded;  // by rank: its end is in `partial` (its wait may have failed, unreaped)
  // By rank: its process group is noted for the guardian (rank_groups.hpp).
  // Bytes, not bits: the launching threads set their ranks' at once.
  std::vector<char> group_noted;
  // By rank: its note_rank() for the guardian, kept until the run has swept
  // the segments the rank made; 0 for none.
  std::vector<std::uint64_t> rank_notes;
  // The run's marker as noted for the guardian (note_run), kept as long as
  // the rank notes; 0 for none.
  std::uint64_t run_note = 0;
  // By rank: a shutdown signal went to its process group, which has not
  // been seen empty since. What is left in it once the rank has ended (a
  // shell's program, say) is given the same grace as the rank.
  std::vector<bool> group_signalled;
  bool failed = false;
  bool stopping = false;
  bool signalled = false;  // the shutdown's first signal went out: later non-zero exits are its doing
  // When the shutdown's first signal went out: a report dated before it
  // was not written because of it.
  std::chrono::system_clock::time_point first_signal_at;
  bool hurry = false;      // a second shutdown signal: no more grace
  first_shutdown_signal first_caught;  // by forward_signals
  bool subreaper = false;  // holds a become_subreaper(), until the run ends
  bool adoption_scan_posted = false;  // a take_adopted() is queued on the strand
  bool nothing_left = false;  // the sweep found every rank reaped and no descendant alive
  tracked_processes descendants;  // the group's processes besides its ranks, held for the sweep
  pid_window pids_since_start;     // opened before the first rank starts
  std::shared_ptr<asio::signal_set> signals;
  caught_signals signals_before;  // how the process handled them before forward_signals
  asio::steady_timer& wake = io->wake;
  asio::steady_timer& stop_requested = io->stop_requested;

  mutable std::mutex mutex;  // guards what follows: waits and join() read it from any thread
  std::condition_variable finished_cv;
  bool finished = false;
  run_result result;
  std::vector<std::shared_ptr<run_end>> waiters;  // each wait() in flight, told when the run ends
};

namespace {

// The folders held by this process's groups, as claim_folders made them:
// their states have not gone yet.
struct held_folder_paths {
  os::fork_safe_mutex mutex;
  std::set<std::filesystem::path> paths;
};
held_folder_paths& folders_held() {
  static auto* held = new held_folder_paths;  // never destroyed: groups may end after static destruction begins
  return *held;
}

// The path of the folder `dir` names, as the folders are held by.
std::filesystem::path folder_key(const std::filesystem::path& dir) {
  std::error_code ec;
  // Of a folder not made yet, weakly_canonical keeps a trailing separator
  // ("ed/", also from "ed/x/.."): the folder by no path to it would then be
  // held as "ed" once made.
  auto key = std::filesystem::weakly_canonical(std::filesystem::absolute(dir, ec), ec).lexically_normal();
  if (ec || key.empty()) key = dir.lexically_normal();
  if (!key.has_filename() && key.has_relative_path()) key = key.parent_path();
  return key;
}

// `dir` held for `state` (state.held_folders), by the path of the folder it
// names, unless the state holds it already; throws std::invalid_argument,
// naming it as `what`, when another group holds it.
void claim_folder(group_state& state, const std::filesystem::path& dir, std::string_view what) {
  auto key = folder_key(dir);
  if (std::find(state.held_folders.begin(), state.held_folders.end(), key) != state.held_folders.end()) return;
  auto& held = folders_held();
  const std::lock_guard lock(held.mutex);
  if (!held.paths.insert(key).second) {
    throw std::invalid_argument(fmt::format(
        "cohort::start_processes: {} {} is another group's of this process, which has not ended; the ranks' "
        "reports and logs would overwrite each other's: give each group its own",
        what, dir.string()));
  }
  state.held_folders.push_back(std::move(key));
}

}  // namespace

// The folders the run writes its ranks' reports and logs in, held for it
// before anything is made there: a start given another group's (the same
// folder by any path) is refused before it truncates a file of that group.
void claim_folders(group_state& state, const group_spec& spec) {
  constexpr std::string_view attempt_folder = "the logs' attempt folder";
  if (!state.error_dir.empty()) {
    claim_folder(state, state.error_dir, spec.error_dir.empty() ? attempt_folder : "error_dir");
  }
  if (spec.logs.active() && !spec.logs.dir.empty()) claim_folder(state, spec.logs.attempt_dir(), attempt_folder);
}

void release_folders(group_state& state) noexcept {
  if (state.held_folders.empty()) return;
  auto& held = folders_held();
  const std::lock_guard lock(held.mutex);
  for (const auto& key : state.held_folders) held.paths.erase(key);
}

namespace {

// Removes from `folder` the unfinished reports (os::unfinished_file)
// that ranks killed while writing their error files left there.
void remove_unfinished_reports(const std::filesystem::path& folder) {
  std::error_code ec;
  std::vector<std::filesystem::path> unfinished;
  for (std::filesystem::directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (os::is_unfinished_file(name, "error.json")) unfinished.push_back(it->path());
  }
  for (const auto& path : unfinished) std::filesystem::remove(path, ec);
}

// The ranks' error files. In the spec's directory: <dir>/<rank>/error.json,
// with a folder per rank made now, and a stale error.json from an earlier
// run removed with what ranks killed while writing theirs left. Otherwise
// in the user's directory, as
// <this process>-<group>-<rank>.json: nothing to make, as a rank that fails
// creates it, and no name an earlier process used.
void prepare_error_files(group_state& state, unsigned group_number) {
  if (state.error_dir.empty()) {
    const auto& user_dir = error_dir_of_user();
    state.error_file_prefix = claim_group_files(group_number);
    for (int rank = 0; rank < state.nprocs; ++rank) {
      state.error_files.push_back(user_dir / fmt::format("{}{}.json", state.error_file_prefix, rank));
    }
    return;
  }
  // This group's alone while it lives (claim_folders).
  // Absolute where that path can be used: a rank given a relative one
  // would write it under its own working directory (options.cwd, or one it
  // moved to), and the report would be lost. A path over PATH_MAX, or one
  // through a directory this process may not search, stays as given.
  const auto& given = state.error_dir;
  std::error_code ec;
  auto dir = std::filesystem::absolute(given, ec);
  for (int rank = 0; rank < state.nprocs; ++rank) {
    const auto folder = given / std::to_string(rank);
    std::filesystem::create_directories(folder, ec);
    if (!ec) std::filesystem::remove(folder / "error.json", ec);
    if (!ec) remove_unfinished_reports(folder);
    if (ec) throw std::system_error(ec, "cohort::start_processes: error file " + (folder / "error.json").string());
  }
  if (dir.empty() || ::access(dir.c_str(), W_OK | X_OK) != 0) dir = given;
  for (int rank = 0; rank < state.nprocs; ++rank) {
    state.error_files.push_back(dir / std::to_string(rank) / "error.json");
  }
}

// A variable of its own per group, so a rank that starts a group of its own
// keeps the outer marker too: every level's sweep finds what is below.
// The random part tells this group from one of an earlier process that had
// the same pid, whose processes may still be alive.
std::string marker_of(unsigned group_number) {
  std::uint32_t random = 0;
  if (::getrandom(&random, sizeof random, GRND_NONBLOCK) != static_cast<ssize_t>(sizeof random)) {
    random = static_cast<std::uint32_t>(steady::now().time_since_epoch().count());
  }
  return fmt::format("{}{}_{:08x}=1", group_marker_prefix(::getpid()), group_number, random);
}

void check_rank_keys(const char* what, const std::set<int>& keys, int nprocs) {
  if (keys.empty()) return;
  std::vector<int> missing, extra;
  for (int r = 0; r < nprocs; ++r) {
    if (!keys.contains(r)) missing.push_back(r);
  }
  for (int k : keys) {
    if (k < 0 || k >= nprocs) extra.push_back(k);
  }
  if (missing.empty() && extra.empty()) return;
  std::string message = fmt::format("cohort::start_processes: {} must name every rank 0..{}", what, nprocs - 1);
  if (!missing.empty()) message += fmt::format("; missing {}", fmt::join(missing, ", "));
  if (!extra.empty()) message += fmt::format("; no such rank {}", fmt::join(extra, ", "));
  throw std::invalid_argument(message);
}

template <class Map>
std::set<int> keys_of(const Map& map) {
  std::set<int> keys;
  for (const auto& [k, v] : map) keys.insert(k);
  return keys;
}

void validate(const group_spec& spec) {
  if (spec.nprocs < 1) throw std::invalid_argument(fmt::format("cohort::start_processes: nprocs is {}", spec.nprocs));
  // A negative wait would be none. And with no wait after SIGKILL, a rank
  // it ends a moment later would be reported unreaped, as one stuck in
  // the kernel: kill_wait is never 0 either (no grace, or no term_grace,
  // is a choice; no wait for SIGKILL to act is none).
  const auto& policy = spec.shutdown;
  for (const auto& [wait, name] : {std::pair{policy.grace, "grace"}, std::pair{policy.term_grace, "term_grace"},
                                   std::pair{policy.kill_wait, "kill_wait"}}) {
    if (wait.count() < 0) {
      throw std::invalid_argument(
          fmt::format("cohort::start_processes: shutdown.{} is {} ms; a wait is never negative", name, wait.count()));
    }
  }
  if (policy.kill_wait.count() == 0) {
    throw std::invalid_argument("cohort::start_processes: shutdown.kill_wait is 0 ms; SIGKILL takes a moment to end a "
                                "process, and with no wait every rank it ends would be reported unreaped");
  }
  // No rank's end could be told: each would be reaped by the kernel as it
  // exits (and a forkserver rank's pid could be another process's by the
  // time its pidfd is opened).
  if (kernel_reaps_children()) {
    throw std::logic_error("cohort::start_processes: this process ignores SIGCHLD (SIG_IGN or SA_NOCLDWAIT), so the "
                           "kernel would reap the ranks as they exit and their exit statuses would be lost; set "
                           "SIGCHLD back to SIG_DFL before starting processes");
  }
  // More ranks than the system has pids could never all run: refused before
  // their state is made (a count of a billion would take gigabytes first).
  // Read only for counts above the least pid_max Linux allows (301).
  long pid_max = 0;
  if (spec.nprocs > 300 && (pid_max = os::pid_max()) > 0 && spec.nprocs > pid_max) {
    throw std::invalid_argument(fmt::format(
        "cohort::start_processes: nprocs is {}, more processes than the system has pids (pid_max {})", spec.nprocs,
        pid_max));
  }
  if (spec.error_dir.native().find('\0') != std::string::npos) {
    throw std::invalid_argument("cohort::start_processes: error_dir holds NUL");
  }
  // Every call() holds a value (a tuple, empty or not): a function_call
  // built by hand without one would fail in each rank, a forkserver's
  // with no report at all.
  if (const auto* function = std::get_if<function_call>(&spec.entry); function != nullptr && function->args.empty()) {
    throw std::invalid_argument(fmt::format(
        "cohort::start_processes: the call of '{}' holds no arguments, not even an empty tuple; make it with "
        "cohort::call(fn, args...)",
        function->name));
  }
  if (std::holds_alternative<function_call>(spec.entry) && !spec.args.empty()) {
    throw std::invalid_argument("cohort::start_processes: args are for programs; a function's arguments are in its call");
  }
  // A group reads no rank's pipe, and one a rank fills would stop it for good.
  if (const char* piped = piped_stream(spec.options)) {
    if (std::string_view(piped) == "in") {
      throw std::invalid_argument(
          "cohort::start_processes: options.in is a pipe, which a group gives no way to write; use a file, "
          "stdio::null() or stdio::fd()");
    }
    throw std::invalid_argument(fmt::format(
        "cohort::start_processes: options.{} is a pipe, which a group gives no way to read; use logs (logs_spec) or "
        "a file", piped));
  }
  check_rank_keys("args", keys_of(spec.args), spec.nprocs);
  check_rank_keys("envs", keys_of(spec.envs), spec.nprocs);
  // Before the group opens anything: a descriptor of its own could take
  // the number of a closed stdout, and get the console's lines.
  if (spec.logs.active()) check_consoles(spec.logs, spec.options, spec.nprocs);
}

// Whether `state` is a copy that fork() made in another process (one that
// runs its copy of the io_context, say): the run is the starting process's
// to supervise, and nothing of the copy's supervision acts on it.
bool fork_copy(const group_state& state) noexcept { return state.owner != os::this_process(); }

// Sleeps until `until` or until something cancels state.wake; returns
// whether the deadline passed.
asio::awaitable<bool> nap(group_state& state, steady::time_point until) {
  if (steady::now() >= until) co_return true;
  state.wake.expires_at(until);
  std::error_code ec;
  co_await state.wake.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  co_return !ec;
}

// Waits until no rank runs, or `limit` passes, or a second shutdown signal
// asks to hurry.
asio::awaitable<void> await_exits(group_state& state, std::chrono::milliseconds limit) {
  const auto until = os::deadline_after(steady::now(), limit);
  // (No co_await inside the loop condition: g++ 12 evaluates it even when
  // the left side of && is false.)
  while (state.running > 0 && !state.hurry) {
    if (co_await nap(state, until)) break;
  }
}

// `sig` to every live rank's process group; a step of the shutdown notes
// the groups it reached (group_signalled).
void signal_running(group_state& state, int sig, bool shutdown_step = false) {
  if (fork_copy(state)) return;
  state.group_signalled.resize(state.children.size());
  for (std::size_t rank = 0; rank < state.children.size(); ++rank) {
    auto& c = state.children[rank];
    if (c && !c.status()) {
      // A rank that left its own process group (setpgid, setsid) is no
      // longer reached through it: it gets the signal itself, once. (One
      // that leaves between the look and the signal is reached at the
      // next step of the shutdown.)
      const bool in_own_group = ::getpgid(c.pid()) == c.pid();
      std::error_code ignored;
      c.signal_group(sig, ignored);
      if (!ignored && shutdown_step) state.group_signalled[rank] = true;
      if (ignored || !in_own_group) c.signal(sig, ignored);
    }
  }
}

// The process group of each reaped rank that a shutdown signal reached and
// that still has a process in it; forgets those seen empty (their id may
// be another process's from then on).
std::vector<pid_t> groups_left(group_state& state) {
  std::vector<pid_t> left;
  for (std::size_t rank = 0; rank < state.group_signalled.size(); ++rank) {
    const child& c = state.children[rank];
    if (!state.group_signalled[rank] || !c || !c.status()) continue;
    if (::kill(-c.pid(), 0) == 0 || errno != ESRCH) {
      left.push_back(c.pid());
    } else {
      state.group_signalled[rank] = false;
    }
  }
  return left;
}

void take_adopted(group_state& state);

// Waits until no rank runs and no process is left in the groups the
// shutdown's signals reached, or `until` passes, or a second shutdown
// signal asks to hurry. While the group of an ended rank holds a process,
// it is looked at every few milliseconds, so that it is forgotten as soon
// as it empties (its id may be another process's from then on); those
// handed to this process as their parents die are reaped meanwhile, so
// that their group empties.
asio::awaitable<void> await_step_end(group_state& state, steady::time_point until) {
  constexpr std::chrono::milliseconds look_every{5};
  while (!state.hurry) {
    bool left = !groups_left(state).empty();
    if (left) {
      take_adopted(state);
      left = !groups_left(state).empty();
    }
    if (state.running == 0 && !left) break;
    (void)co_await nap(state, left ? std::min(until, steady::now() + look_every) : until);
    if (steady::now() >= until) break;
  }
}

// Notes the group's processes besides its ranks (see group_descendants),
// to be ended by the sweep however they end meanwhile.
void track_descendants(group_state& state, bool by_parent) {
  const std::set<pid_t> ranks(state.pids.begin(), state.pids.end());
  state.pids_since_start.refresh();
  state.descendants.add(group_descendants(state.marker, ranks, by_parent, state.pids_since_start));
}

void record_ended_ranks(const std::shared_ptr<group_state>& state);

// Lets go of the guardian's note of rank `rank`'s process group, where
// there is one: before its child object goes, whose pid names the group.
void forget_group_note(group_state& state, std::size_t rank) {
  if (rank < state.group_noted.size() && state.group_noted[rank]) {
    forget_rank_group(state.children[rank].pid());
    state.group_noted[rank] = false;
  }
}

// Hands rank `rank`, which SIGKILL has not ended, to a thread that reaps it
// whenever it ends. The guardian's note of its process group goes now: it
// is let go of by the child object's pid, which the thread takes.
void hand_to_reaping_thread(group_state& state, std::size_t rank) {
  if (fork_copy(state)) return;
  forget_group_note(state, rank);
  detail::reap_on_a_thread(detail::child_access::take(state.children[rank]));
}

// One step of the shutdown: `sig` to every live rank's process group, then
// up to `limit` for them to exit.
asio::awaitable<void> signal_and_await(std::shared_ptr<group_state> shared, int sig, std::chrono::milliseconds limit) {
  auto& state = *shared;
  if (fork_copy(state)) co_return;
  // Before anything dies: what dies with a rank (the ranks of a group it
  // started, by their parent-death signal) could not be told apart after.
  track_descendants(state, true);
  if (!state.signalled) {
    record_ended_ranks(shared);
    state.first_signal_at = std::chrono::system_clock::now();
  }
  state.signalled = true;
  // What an earlier signal left of a rank's group once the rank ended
  // gets this one too.
  for (const pid_t group : groups_left(state)) ::kill(-group, sig);
  signal_running(state, sig, true);
  co_await await_step_end(state, os::deadline_after(steady::now(), limit));
}

// Lets the guardian's note of a reaped rank's process group go once the
// group is empty: its id may then be given to another process. (A member
// left keeps the id from reuse, a zombie too: this process, a subreaper,
// reaps the orphaned ones, and looks again then.) Reaped is told by the
// rank's own status: a start that failed partway has recorded no exit,
// nor gathered the ranks' pids.
void forget_if_empty(group_state& state, std::size_t rank) {
  if (rank >= state.group_noted.size() || !state.group_noted[rank] || !state.children[rank].status()) return;
  const pid_t pgid = state.children[rank].pid();
  if (::kill(-pgid, 0) != 0 && errno == ESRCH) {
    forget_rank_group(pgid);
    state.group_noted[rank] = false;
  }
}

void forget_empty_rank_groups(group_state& state) {
  for (std::size_t rank = 0; rank < state.group_noted.size(); ++rank) forget_if_empty(state, rank);
}

// Reaps the children handed to this process since the group started that
// have died, and holds those alive for the sweep: a descendant of a rank
// whose parent died is the run's, whatever its environment says.
void take_adopted(group_state& state) {
  if (fork_copy(state)) return;
  if (auto alive = reap_adopted(state.pids_since_start, state.marker)) state.descendants.add(*alive);
  else state.descendants.note_missed();
  forget_empty_rank_groups(state);
}

// Whether every rank that started was reaped here, with its status.
bool all_reaped(const group_state& state) {
  return std::all_of(state.children.begin(), state.children.end(), [](const child& c) { return !c || c.status(); });
}

// How a pass of the sweep ended: it held no process (nothing of the run
// was found alive), every process it held has died and been let go of, or
// some live on (dying, or stuck in the kernel).
enum class pass_end { nothing_held, all_died, some_alive };

// One pass of the sweep: takes the children handed to this process, then
// SIGKILLs every process held and reaps those that have died. A process
// that dies hands its children to this process (the subreaper) before its
// death can be seen, so a pass that ends `all_died` may have been handed
// more, which only the next pass takes: the end of a chain of orphans
// (a rank's `setsid` child's own `setsid` child, and so on) comes a pass
// per link.
pass_end sweep_pass(group_state& state) {
  take_adopted(state);
  const bool held = !state.descendants.empty();
  const bool none_left = state.descendants.kill_and_reap();
  forget_empty_rank_groups(state);
  return !held ? pass_end::nothing_held : none_left ? pass_end::all_died : pass_end::some_alive;
}

// Kills the group's processes besides its ranks, those noted earlier and
// those found now, and reaps those that are or become this process's
// children, until a pass holds none or `limit` passes.
asio::awaitable<void> sweep(group_state& state, std::chrono::milliseconds limit) {
  if (fork_copy(state)) co_return;
  const auto until = os::deadline_after(steady::now(), limit);
  for (;;) {
    // No child at all, not even a rank: nothing of the run is left to find.
    if (state.descendants.empty() && !has_children()) {
      state.nothing_left = state.running == 0;
      co_return;
    }
    // Nor when every rank was reaped here and each child left is one
    // cohort started (a guardian, another group's rank): a live descendant
    // of a rank would have an ancestor among this subreaper's children
    // that no one here started. (A rank whose wait failed may live on,
    // and is still counted as cohort's.) Spares cohort-run, whose guardian
    // is its child, the scans of /proc at every clean end.
    if (state.descendants.empty() && state.running == 0 && all_reaped(state) && is_subreaper() &&
        only_owned_children()) {
      state.nothing_left = true;
      co_return;
    }
    track_descendants(state, false);  // the ranks are reaped: no parent links lead from them
    const pass_end end = sweep_pass(state);
    if (end == pass_end::nothing_held || steady::now() >= until) co_return;
    // Every process held has died: what each had was handed to this
    // process as it died, and the next pass, at once, takes it.
    if (end == pass_end::all_died) continue;
    asio::steady_timer tick(state.strand, std::chrono::milliseconds(1));
    std::error_code ec;
    co_await tick.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  }
}

void finish(const std::shared_ptr<group_state>& state) {
  if (fork_copy(*state)) return;
  // Named shared memory the ranks made and did not free (a rank killed
  // holding it) goes with them; so does what other processes of the run
  // made (a rank's own children: started since the run began, with its
  // marker in their environment) once nothing can reach it. An unrelated
  // process that ended meanwhile keeps its files: its pid is in the window
  // too, but the run's marker is not in its files' headers.
  try {
    state->pids_since_start.refresh();
  } catch (...) {
    // Left holding every pid: more files are looked at, and still only
    // those nothing can reach go.
  }
  // A rank that outlived its SIGKILL (stuck in the kernel: reported
  // unreaped, a thread reaps it) is still ours, its pid no other
  // process's: its files go too.
  std::vector<pid_t> unreaped;
  for (const int rank : state->partial.unreaped) {
    const auto r = static_cast<std::size_t>(rank);
    if (r < state->pids.size()) unreaped.push_back(state->pids[r]);
  }
  // Only while its thread has not reaped it: the thread lets go of the pid
  // once it has, and the pid may be another process's from then on.
  (void)detail::with_owned_pids([&unreaped](const std::set<pid_t>& owned) {
    std::erase_if(unreaped, [&owned](pid_t pid) { return !owned.contains(pid); });
  });
  shm::sweep_segments_of_run(state->pids, unreaped, state->marker,
                             [&window = state->pids_since_start](pid_t maker) { return window.holds(maker); });
  // What came after the sweep: reaped, or killed and reaped if it can be at
  // once, pass after pass while each ends all it held (what those had is
  // handed over as they die). No more comes once the subreaper attribute
  // is restored, nor after a sweep that found nothing of the run alive: no
  // process was left to start more, or to leave any to this process as it
  // died. Bounded, as this runs on the strand and waits for no death: a
  // run that forks as fast as its processes die is left to what the
  // sweep's time already did.
  if (!state->nothing_left) {
    constexpr int most_passes = 64;
    for (int pass = 0; pass < most_passes && sweep_pass(*state) == pass_end::all_died; ++pass) {
    }
  }
  end_subreaper();
  state->subreaper = false;
  state->io->orphan_look.cancel();
  // Swept: what is left of a rank's process group (an unreaped rank, a
  // process that outlived the sweep) is no longer told apart from a group
  // that took a recycled id, and the ranks' segments are gone.
  forget_guardian_notes(*state);
  run_result r = std::move(state->partial);
  if (!state->nothing_left && state->descendants.missed_in_last_pass()) {
    r.sweep_error = fmt::format(
        "the run's end could not look for all of its other processes (the ranks' children) for want of a "
        "descriptor{}: some may live on",
        os::descriptor_limit_note(EMFILE));
  }
  for (std::size_t rank = 0; rank < state->children.size(); ++rank) {
    r.statuses[rank] = state->children[rank] ? state->children[rank].status() : std::nullopt;
  }
  {
    std::lock_guard lock(state->mutex);
    state->result = std::move(r);
    state->finished = true;
    for (auto& waiter : state->waiters) waiter->try_send(std::error_code{}, 0);
    state->waiters.clear();
  }
  state->finished_cv.notify_all();
}

void begin_stop(group_state& state) {
  if (state.stopping || fork_copy(state)) return;
  state.stopping = true;
  // Once every rank has ended there is nothing left to stop: the result
  // stays as the ranks left it, and only the wait for the consoles ends.
  if (!state.failed && state.running > 0) state.partial.stopped = true;
  if (state.logs) state.logs->ask_to_end(state.shutdown.kill_wait);
  state.stop_requested.cancel();
  state.wake.cancel();
}

// A signal a process can catch: what forward_signals handles, and what
// interrupt() may stand for. Not those that glibc keeps for its threads
// (32 and 33, below SIGRTMIN): sigaction refuses them.
bool catchable(int sig) {
  return sig > 0 && sig < NSIG && sig != SIGKILL && sig != SIGSTOP && (sig < __SIGRTMIN || sig >= SIGRTMIN);
}

// A shutdown signal: the first starts the shutdown, a later one (or one
// after stop()) hurries it.
void interrupt(group_state& s, int sig) {
  if (fork_copy(s)) return;
  if (!s.stopping) {
    s.partial.signal = sig;
    begin_stop(s);
  } else {
    // A signal after stop() (or after a first one) is named all the same:
    // the run was interrupted, whatever else ended it.
    if (!s.partial.signal) s.partial.signal = sig;
    s.hurry = true;
    s.wake.cancel();
  }
}

// Handles one signal that reached this process, then waits for the next.
// The run may have ended since asio queued this call, taking the set.
void on_signal(const std::shared_ptr<group_state>& state, const std::vector<int>& passed_on, int sig) {
  auto& s = *state;
  if (!s.signals || fork_copy(s)) return;
  if (std::find(passed_on.begin(), passed_on.end(), sig) != passed_on.end()) {
    signal_running(s, sig);
  } else {
    if (!s.first_caught.is_echo(sig)) interrupt(s, sig);
  }
  s.signals->async_wait([state, passed_on](std::error_code ec, int next) {
    if (!ec) on_signal(state, passed_on, next);
  });
}

// After a rank's exit: takes what it left behind (take_adopted), once for
// all the exits handled on the strand before the look runs. Ranks that end
// together end in one turn of the loop, and each look lists this process's
// children through /proc. Once no rank runs, the sweep that always follows
// looks itself, so this look is left to it.
void take_adopted_soon(const std::shared_ptr<group_state>& state) {
  if (std::exchange(state->adoption_scan_posted, true)) return;
  asio::post(state->strand, [state] {
    state->adoption_scan_posted = false;
    // Not a subreaper any more: the run has ended.
    if (state->subreaper && state->running > 0) take_adopted(*state);
  });
}

// How often, while ranks run, this process looks for dead children.
constexpr std::chrono::seconds orphan_look_period{1};

// Whether a child of this process has ended and is not reaped yet.
bool a_child_ended() noexcept {
  siginfo_t info{};
  return ::waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid != 0;
}

// While ranks run: every orphan_look_period, when a child of this process
// has ended unreaped, takes what was handed to it (take_adopted). Before,
// an orphan of a rank that died while the ranks ran stayed a zombie until
// a rank ended: a rank that left one a second held a pid for each, and
// would have used up a machine's 32,768 in nine hours. Holds the state
// only on the strand, where it lives while a rank runs: its end is not
// held up.
asio::awaitable<void> reap_orphans_while_running(std::weak_ptr<group_state> weak) {
  for (;;) {
    asio::steady_timer* look = nullptr;
    {
      const auto state = weak.lock();
      if (!state || fork_copy(*state) || !state->subreaper || state->running == 0) co_return;
      if (a_child_ended()) take_adopted(*state);
      look = &state->io->orphan_look;
      look->expires_after(orphan_look_period);
    }
    std::error_code ec;
    co_await look->async_wait(asio::redirect_error(asio::use_awaitable, ec));
    if (ec == asio::error::operation_aborted) co_return;  // the run ended, or its state went
  }
}

// How a rank ended, as its wait saw it: when the wait itself failed, the
// status is 255 and `why` says what failed.
struct rank_end {
  exit_status status;
  std::string why;
};

// The latest an error stamped `stamp` can have happened. An error file in
// whole seconds (torch's, or one written by hand) says only that the error
// came within that second: were the second's start taken for it, a rank
// that failed later in it would come before one whose exit was seen
// earlier. A failure is ordered by the earlier of that and its exit.
std::chrono::system_clock::time_point latest_possible(std::chrono::system_clock::time_point stamp) {
  using namespace std::chrono;
  if (stamp.time_since_epoch() % seconds(1) != system_clock::duration::zero()) return stamp;
  return stamp + duration_cast<system_clock::duration>(seconds(1)) - system_clock::duration(1);
}

// Records how rank `rank` ended; returns whether it failed on its own.
bool record_exit(const std::shared_ptr<group_state>& state, int rank, rank_end end) {
  auto& s = *state;
  s.recorded[static_cast<std::size_t>(rank)] = true;
  --s.running;
  shm::take_handed_over();  // what the rank's values still name, before anyone looks for it here
  const auto r = static_cast<std::size_t>(rank);
  exit_status status = end.status;
  // A result that cannot be read fails the rank: never a silent nullopt.
  // A failed wait or read is the supervisor's (rank_failure::
  // supervisor_error), kept apart from what the rank itself reported.
  std::string supervisor_error = std::move(end.why);
  bool returned = true;
  if (status.success() && r < s.result_fds.size() && s.result_fds[r] >= 0) {
    try {
      s.partial.return_values[r] = read_result(s.result_fds[r]);
      // A function that returns a value always writes one: a rank that
      // exited 0 without it ended inside the function (exit() there). It
      // fails with the exit it made; nothing was raised.
      returned = s.partial.return_values[r].has_value();
    } catch (const std::exception& e) {
      supervisor_error = fmt::format("cohort: reading the rank's result: {}", e.what());
      status = exit_status::from_code(255);
    }
  }
  // Counted as running until its result is read: with no rank running and
  // no queue here, what the rank handed over (the shared memory its result
  // names) would be let go of before this process, its receiver, read it.
  if (s.counted_as_keeper) shm::note_ranks_running(-1);
  forget_if_empty(s, r);
  take_adopted_soon(state);  // what the rank leaves behind is handed to this process as it dies
  // A shutdown no failure started (stop(), a signal): nothing here can have
  // come before a failure.
  if ((status.success() && returned) || (s.signalled && s.partial.failures.empty())) return false;
  rank_failure failure{rank, s.pids[r], status, {}, {}, s.error_files[r], std::chrono::system_clock::now(),
                       std::move(supervisor_error)};
  // What the rank wrote cannot stop the supervision: a report that cannot
  // be read (out of memory for it) leaves the failure as its exit says.
  bool reported = false;
  try {
    if (auto report = read_error_file(s.error_files[r])) {
      failure.message = std::move(report->message);
      failure.trace = std::move(report->trace);
      if (report->timestamp) {
        failure.timestamp = std::min(failure.timestamp, latest_possible(*report->timestamp));
        reported = true;
      }
    }
  } catch (const std::exception&) {
  }
  if (s.signalled) {
    // Ended by the shutdown, as a rule: a report it made the rank write
    // (torch's @record on SIGTERM) is dated after its first signal, whole
    // seconds taken at their latest. But a rank can fail on its own while
    // another's failure is seen, and still be exiting (its stack being
    // symbolized) as the shutdown reaches it: its report, dated before the
    // first signal, makes it the failure it was, whether or not it came
    // first (first_failure() orders them by date).
    if (reported && failure.timestamp < s.first_signal_at) s.partial.failures.push_back(std::move(failure));
    return false;
  }
  s.partial.failures.push_back(std::move(failure));
  s.failed = true;
  return true;
}

// Records each rank that has ended and is not yet recorded, reaping it:
// before the shutdown's first signal, so that one that failed meanwhile (its
// wait cancelled as the race was decided, or its drain not yet run) is a
// failure of its own rather than an end the shutdown made.
void record_ended_ranks(const std::shared_ptr<group_state>& state) {
  auto& s = *state;
  for (int rank = 0; rank < s.nprocs && s.running > 0; ++rank) {
    const auto r = static_cast<std::size_t>(rank);
    if (s.recorded[r] || !s.children[r]) continue;
    std::error_code ec;
    if (auto status = s.children[r].try_wait(ec); status && !ec) record_exit(state, rank, rank_end{*status, {}});
  }
}

// The rank's exit. A wait that fails (the child reaped elsewhere?) counts as
// an end, not as a success, and says why. Cancellation passes through.
asio::awaitable<rank_end> exit_of(group_state& s, int rank) {
  rank_end end{exit_status::from_code(255), {}};
  try {
    end.status = co_await s.children[static_cast<std::size_t>(rank)].wait();
    co_return end;
  } catch (const std::system_error& e) {
    if (e.code() == asio::error::operation_aborted) throw;
    end.why = e.what();
  } catch (const std::exception& e) {
    end.why = e.what();
  }
  end.why = "cohort: waiting for the rank's exit: " + end.why;
  co_return end;
}

// One rank's entry in the race: completes when the rank fails on its own or
// is the last to end. A rank that succeeds earlier stays in the race, parked
// until the race is decided and when_any cancels it.
asio::awaitable<void> race_rank(std::shared_ptr<group_state> state, int rank) {
  auto& s = *state;
  rank_end end = co_await exit_of(s, rank);
  if (fork_copy(s)) co_return;  // its wait fails in a copy: no end of the rank's
  const bool failed = record_exit(state, rank, std::move(end));
  if (failed || s.running == 0) co_return;
  asio::steady_timer parked(s.strand, steady::time_point::max());
  std::error_code cancelled;  // the end of the race: not worth an exception
  co_await parked.async_wait(asio::redirect_error(asio::use_awaitable, cancelled));
}

// The race's entry for stop(), forwarded signals and a cancelled wait().
asio::awaitable<void> race_stop(std::shared_ptr<group_state> state) {
  auto& s = *state;
  if (s.stopping) co_return;  // asked before the race began
  std::error_code ec;
  co_await s.stop_requested.async_wait(asio::redirect_error(asio::use_awaitable, ec));
}

// After the race: waits for a rank still running, and wakes the shutdown.
asio::awaitable<void> drain(std::shared_ptr<group_state> state, int rank) {
  auto& s = *state;
  rank_end end = co_await exit_of(s, rank);
  if (fork_copy(s)) co_return;  // a copy forked during the shutdown: see fork_copy
  // An exit seen as the shutdown gave up on the rank: reported unreaped.
  if (std::ranges::find(s.partial.unreaped, rank) != s.partial.unreaped.end()) co_return;
  if (s.recorded[static_cast<std::size_t>(rank)]) co_return;  // found ended before the first signal
  record_exit(state, rank, std::move(end));
  s.wake.cancel();
}

asio::awaitable<void> supervise(std::shared_ptr<group_state> state) {
  auto& s = *state;
  const auto& policy = s.shutdown;
  // The ops of when_any run on a strand over s.strand: they touch the state
  // one at a time, and never alongside the rest of the supervision.
  std::vector<asio::awaitable<void>> race;
  race.reserve(s.children.size() + 1);
  for (int rank = 0; rank < s.nprocs; ++rank) race.push_back(race_rank(state, rank));
  race.push_back(race_stop(state));
  co_await when_any(std::move(race));
  if (fork_copy(s)) co_return;  // see fork_copy: from here on, each step acts on the run
  // Whether a forwarded signal started the shutdown: one that comes once a
  // failure has started it changes the result, not the sequence.
  const std::optional<int> forwarded = s.partial.signal;
  // Once SIGKILL is sent (to the ranks, or by the sweep to what they left),
  // one kill_wait bounds the rest: the ranks' exits, the sweep and the
  // logs' last reads, together.
  std::optional<std::chrono::steady_clock::time_point> kill_wait_ends;
  const auto kill_wait_left = [&] {
    if (!kill_wait_ends) return policy.kill_wait;
    return std::max(std::chrono::ceil<std::chrono::milliseconds>(*kill_wait_ends - std::chrono::steady_clock::now()),
                    std::chrono::milliseconds(0));
  };

  if (s.running > 0) {
    for (int rank = 0; rank < s.nprocs; ++rank) {
      if (!s.recorded[static_cast<std::size_t>(rank)]) {
        asio::co_spawn(s.strand, drain(state, rank),
                       asio::bind_cancellation_slot(s.io->drain_ends[rank].slot(), asio::detached));
      }
    }
    // A forwarded signal reaches the ranks first, as Ctrl-C would in a
    // terminal, so that they can clean up as they do for it.
    if (forwarded) {
      co_await signal_and_await(state, *forwarded, policy.term_grace);
    } else {
      co_await await_exits(s, policy.grace);
    }
    if (forwarded != SIGTERM) co_await signal_and_await(state, SIGTERM, policy.term_grace);
    if (fork_copy(s)) co_return;  // forked during the shutdown, and in the copy
    if (s.running > 0) {
      signal_running(s, SIGKILL);
      kill_wait_ends = std::chrono::steady_clock::now() + policy.kill_wait;
      co_await sweep(s, std::chrono::milliseconds(0));
      s.hurry = false;  // the bounded wait after SIGKILL always runs
      co_await await_exits(s, kill_wait_left());
      if (fork_copy(s)) co_return;
      for (std::size_t rank = 0; rank < s.children.size(); ++rank) {
        if (!s.recorded[rank]) {
          // Reported, not waited for: its drain ends, and a thread reaps it
          // whenever it dies, so that no run() of the io_context waits.
          s.partial.unreaped.push_back(static_cast<int>(rank));
          s.io->drain_ends[rank].emit(asio::cancellation_type::terminal);
          hand_to_reaping_thread(s, rank);
        }
      }
    }
  }
  // What the ranks left is killed now, if the ranks' SIGKILL did not reach
  // it: the same kill_wait then covers the logs' last reads.
  if (!kill_wait_ends) kill_wait_ends = std::chrono::steady_clock::now() + policy.kill_wait;
  co_await sweep(s, kill_wait_left());
  if (fork_copy(s)) co_return;
  if (s.logs) {  // every writer is gone: the pumps reach the end of their streams
    co_await s.logs->drain(kill_wait_left());
    s.partial.log_errors = s.logs->errors();
  }
  s.signals.reset();
  s.signals_before.restore();  // the process's own handling of those signals comes back
  finish(state);
}

}  // namespace

// Lets go of the guardian's notes of every rank and its process group.
// From the child objects, not `pids`: a start that failed partway noted
// the ranks it started before their pids were gathered.
void forget_guardian_notes(group_state& state) noexcept {
  for (std::size_t rank = 0; rank < state.group_noted.size(); ++rank) {
    if (state.group_noted[rank]) forget_rank_group(state.children[rank].pid());
  }
  state.group_noted.clear();
  for (const std::uint64_t note : state.rank_notes) forget_rank(note);
  state.rank_notes.clear();
  forget_run(std::exchange(state.run_note, 0));
}

// Ends what a run left when it cannot finish (a start that failed, or an
// io_context destroyed under the supervision): SIGKILL to the ranks'
// process groups and to what else carries the group's marker, and what
// that hands to this process reaped, for at most a second. Each rank is
// then reaped by its child object, or, one that SIGKILL has not ended by
// then (stuck in the kernel), by a thread whenever it ends: the caller's
// end waits for no rank.
void end_unfinished(group_state& state) noexcept {
  // Dead and ready to be reaped here (not held by a tracer): a rank's
  // orphans are handed over as it dies, so those of one dead before a look
  // at the adopted are among them.
  const auto reapable = [](const child& c) {
    siginfo_t info{};
    if (::waitid(P_PID, static_cast<id_t>(c.pid()), &info, WEXITED | WNOHANG | WNOWAIT) != 0) return errno == ECHILD;
    return info.si_pid != 0;
  };
  const auto ranks_dead = [&state, &reapable] {
    return std::all_of(state.children.begin(), state.children.end(),
                       [&reapable](const child& c) { return !c || c.status() || reapable(c); });
  };
  // The ranks by their child objects: a start that failed partway has not
  // gathered `pids`. Those handed to a thread stay ours until it reaps them.
  std::vector<pid_t> ranks, unreaped;
  try {
    ranks.reserve(state.children.size());
    for (const auto& c : state.children) {
      if (c) ranks.push_back(c.pid());
    }
  } catch (...) {
    // Out of memory (the reserve, before any pid): no sweep of segments.
  }
  // Their results' files are read by no one now.
  for (int& fd : state.result_fds) {
    if (fd >= 0) ::close(std::exchange(fd, -1));
  }
  // A start that failed for want of descriptors (EMFILE) left none for the
  // scans: each rank that has died is reaped and let go of at once, its
  // pidfd closed, so that the scans after it have them.
  const auto let_dead_ranks_go = [&state, &reapable] {
    for (std::size_t rank = 0; rank < state.children.size(); ++rank) {
      auto& c = state.children[rank];
      if (!c || (!c.status() && !reapable(c))) continue;
      std::error_code ignored;
      if (!c.status() && !c.try_wait(ignored)) continue;
      forget_group_note(state, rank);  // as forget_guardian_notes would later
      c = child();
    }
  };
  try {
    track_descendants(state, true);
  } catch (...) {
    // Out of memory or descriptors: what the ranks leave is found below, as
    // they die and hand it to this process.
  }
  signal_running(state, SIGKILL);
  const auto until = steady::now() + std::chrono::seconds(1);
  for (;;) {
    try {
      let_dead_ranks_go();
    } catch (...) {
      // Out of memory: they are reaped by their child objects, or handed over, below.
    }
    const bool dead = ranks_dead();
    // Done once a pass holds nothing: one that killed what it held may
    // have been handed its children (a rank's shell, killed as it started
    // them) after its look (see sweep_pass).
    bool done = false;
    try {
      take_adopted(state);
      const bool held = !state.descendants.empty();
      done = state.descendants.kill_and_reap() && !held;
    } catch (...) {
      // Out of memory or descriptors for the scan: looked again next time.
    }
    if ((done && dead) || steady::now() >= until) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  for (std::size_t rank = 0; rank < state.children.size(); ++rank) {
    auto& c = state.children[rank];
    if (!c || c.status() || reapable(c)) continue;
    try {
      unreaped.push_back(c.pid());
    } catch (...) {
    }
    hand_to_reaping_thread(state, rank);
  }
  // The named segments the ranks made go now, as at a run's finish: the
  // guardian's notes of the ranks, which would have removed them had this
  // process died, go right after.
  try {
    state.pids_since_start.refresh();
  } catch (...) {
    // Left holding every pid, as in finish().
  }
  // Unknown while another launch is in progress: then none counts as ours.
  try {
    const bool known = detail::with_owned_pids([&unreaped](const std::set<pid_t>& owned) {
      std::erase_if(unreaped, [&owned](pid_t pid) { return !owned.contains(pid); });
    });
    if (!known) unreaped.clear();
  } catch (...) {
    unreaped.clear();
  }
  shm::sweep_segments_of_run(ranks, unreaped, state.marker,
                             [&window = state.pids_since_start](pid_t maker) { return window.holds(maker); });
}

}  // namespace detail

namespace {

// Whether a group object that lets go of `state` stops its run: one that
// runs on a live io_context and has not ended. The stop() is queued on the
// strand and holds the state until it runs, so one queued for an ended run
// (nothing left to stop) would keep the state past an io_context that is
// not run again, until that io_context's destruction, when the state's
// strand and timers can no longer be destroyed (~group_state leaves them).
bool stops_as_released(const detail::group_state& state) {
  if (state.context.expired() || detail::fork_copy(state)) return false;
  std::lock_guard lock(state.mutex);
  return !state.finished;
}

}  // namespace

group::group() noexcept = default;
group::group(std::shared_ptr<detail::group_state> state) noexcept : state_(std::move(state)) {}
group::group(group&&) noexcept = default;
group& group::operator=(group&& other) noexcept {
  if (this != &other) {
    if (state_ && stops_as_released(*state_)) stop();
    state_ = std::move(other.state_);
  }
  return *this;
}
group::~group() {
  // Once its io_context is gone, the state's end (the last reference) ends
  // what the run left. An ended run's state goes here, or with the last
  // wait() on it.
  if (state_ && stops_as_released(*state_)) stop();
}

namespace {

// What needs the io_context the group runs on fails once it has been
// destroyed: no strand is left to run on, and the run cannot end.
void refuse_gone_context(const detail::group_state& state, const char* what) {
  // A copy that fork() made: its supervision stands down (fork_copy), and
  // neither can it end.
  if (detail::fork_copy(state)) {
    throw std::logic_error(fmt::format("cohort::group::{}: the group was started by process {}, and this is a copy "
                                       "of it that fork() made: only that process can act on or wait for its run",
                                       what, state.owner));
  }
  if (!state.context.expired()) return;
  throw std::logic_error(fmt::format("cohort::group::{}: the io_context the group runs on has been destroyed; "
                                     "destroying the group ends its ranks",
                                     what));
}

}  // namespace

void group::stop() {
  if (!state_) return;
  refuse_gone_context(*state_, "stop");
  asio::dispatch(state_->strand, [state = state_] { detail::begin_stop(*state); });
}

void group::send_signal(int sig) {
  if (!state_) throw std::logic_error("cohort::group::send_signal: no group");
  if (sig <= 0 || sig >= NSIG) throw std::invalid_argument(fmt::format("cohort::group::send_signal: no signal {}", sig));
  refuse_gone_context(*state_, "send_signal");
  asio::dispatch(state_->strand, [state = state_, sig] { detail::signal_running(*state, sig); });
}

void group::interrupt(int sig) {
  if (!state_) throw std::logic_error("cohort::group::interrupt: no group");
  if (!detail::catchable(sig)) {
    throw std::invalid_argument(fmt::format("cohort::group::interrupt: cannot start a shutdown with {}", signal_name(sig)));
  }
  refuse_gone_context(*state_, "interrupt");
  asio::dispatch(state_->strand, [state = state_, sig] { detail::interrupt(*state, sig); });
}

void group::forward_signals() { forward_signals(std::vector<int>{SIGINT, SIGTERM, SIGHUP, SIGQUIT}); }

void group::forward_signals(std::vector<int> shutdown_signals, std::vector<int> passed_on) {
  if (!state_) throw std::logic_error("cohort::group::forward_signals: no group");
  for (const auto* list : {&shutdown_signals, &passed_on}) {
    for (int sig : *list) {
      if (!detail::catchable(sig)) {
        throw std::invalid_argument(fmt::format("cohort::group::forward_signals: cannot handle {}", signal_name(sig)));
      }
      // Each rank's exit sends this process one: caught, every exit would
      // start the shutdown, or reach every other rank.
      if (sig == SIGCHLD) {
        throw std::invalid_argument(
            "cohort::group::forward_signals: cannot take SIGCHLD, which each rank's exit sends this process");
      }
    }
  }
  refuse_gone_context(*state_, "forward_signals");
  detail::caught_signals before;
  for (const auto* list : {&shutdown_signals, &passed_on}) {
    for (int sig : *list) before.note(sig);
  }
  // Caught from here on: asio queues what arrives before the wait below is
  // set up on the strand.
  std::shared_ptr<asio::signal_set> set;
  try {
    set = std::make_shared<asio::signal_set>(state_->strand);
    for (int sig : shutdown_signals) set->add(sig);
    for (int sig : passed_on) set->add(sig);
  } catch (const std::system_error& e) {  // asio's pipe for signals, with no descriptor left
    throw std::system_error(e.code(), "cohort::group::forward_signals: asio's signal pipe" +
                                          os::descriptor_limit_note(e.code().value()));
  }
  asio::dispatch(state_->strand, [state = state_, set, passed_on = std::move(passed_on),
                                  before = std::move(before)]() mutable {
    std::lock_guard lock(state->mutex);
    if (state->finished || state->signals) {
      set.reset();
      before.restore();
      return;
    }
    state->signals = set;
    state->signals_before = std::move(before);
    state->signals->async_wait([state, passed_on](std::error_code ec, int sig) {
      if (!ec) detail::on_signal(state, passed_on, sig);
    });
  });
}

std::vector<pid_t> group::pids() const { return state_ ? state_->pids : std::vector<pid_t>{}; }

std::optional<run_result> group::result() const {
  if (!state_) return std::nullopt;
  std::lock_guard lock(state_->mutex);
  return state_->finished ? std::optional(state_->result) : std::nullopt;
}

bool group::join(std::chrono::milliseconds timeout) {
  if (!state_) throw std::logic_error("cohort::group::join: no group");
  if (!result()) refuse_gone_context(*state_, "join");
  std::unique_lock lock(state_->mutex);
  // Until a deadline, not for the timeout: wait_for adds it to the clock,
  // which wraps for milliseconds::max().
  return state_->finished_cv.wait_until(lock, os::deadline_after(std::chrono::steady_clock::now(), timeout),
                                        [&] { return state_->finished; });
}

std::optional<asio::any_io_executor> group::executor_of(const std::shared_ptr<detail::group_state>& state) {
  if (!state) return std::nullopt;
  if (state->context.expired() || detail::fork_copy(*state)) {
    // An ended run's wait gives its result where the waiter runs; one not
    // ended cannot end.
    if (group(state).result()) return std::nullopt;
    refuse_gone_context(*state, "wait");
  }
  return state->strand.get_inner_executor();
}

asio::awaitable<run_result> group::wait_for(std::shared_ptr<detail::group_state> state) {
  if (!state) throw std::logic_error("cohort::group::wait: no group");
  auto executor = co_await asio::this_coro::executor;
  // Once cancelled, this coroutine still waits for the shutdown it starts:
  // later awaits must not throw at once, as Asio makes them by default.
  co_await asio::this_coro::throw_if_cancelled(false);
  asio::cancellation_signal none;
  for (bool cancelled = false;;) {
    auto waiter = std::make_shared<detail::run_end>(executor, 1);
    {
      std::lock_guard lock(state->mutex);
      if (state->finished) {
        if (cancelled) throw std::system_error(asio::error::operation_aborted, "cohort::group::wait");
        co_return state->result;
      }
      state->waiters.push_back(waiter);
    }
    std::error_code ec;
    if (!cancelled) {
      co_await waiter->async_receive(asio::redirect_error(asio::use_awaitable, ec));
    } else {  // the shutdown is waited for unhindered
      co_await waiter->async_receive(asio::bind_cancellation_slot(none.slot(), asio::redirect_error(asio::use_awaitable, ec)));
    }
    if (ec) {  // cancelled from outside: shut the group down as a failure would
      cancelled = true;
      co_await asio::this_coro::reset_cancellation_state();
      asio::dispatch(state->strand, [state] { detail::begin_stop(*state); });
      std::lock_guard lock(state->mutex);
      std::erase(state->waiters, waiter);
    }
  }
}

namespace detail {

// An output file the ranks' options name, opened once here (as spawn
// opens it) and given to every rank that names it (the same file, however
// its path is spelled, and the same flags), as `prog > file` shares one:
// opened by each rank, each would truncate it and write over the others
// from its start. `opened` holds the descriptors until the ranks have
// their copies.
void share_output_files(std::vector<spawn_options>& options, std::vector<os::owned_fd>& opened) {
  std::map<std::pair<std::string, int>, int> by_file;
  struct opened_file {
    dev_t device;
    ino_t inode;
    int flags, fd;
  };
  std::vector<opened_file> files;  // by what each path opened: `./x`, a link to x and x are one
  // `fd`, or the descriptor of the same file opened before with the same flags.
  const auto same_as_before = [&](int fd, int flags) {
    struct stat st {};
    if (::fstat(fd, &st) != 0) return fd;
    for (const auto& f : files) {
      if (f.device == st.st_dev && f.inode == st.st_ino && f.flags == flags) return f.fd;
    }
    files.push_back({st.st_dev, st.st_ino, flags, fd});
    return fd;
  };
  const auto share = [&](stdio& stream, const char* name) {
    const auto* file = std::get_if<stdio::file_t>(&stream.get());
    if (file == nullptr) return;
    auto [it, fresh] = by_file.try_emplace({file->path.string(), file->flags}, -1);
    if (fresh) {
      if (file->path.string().find('\0') != std::string::npos) return;  // spawn refuses it, saying why
      const int fd = open_stream_file(*file, 1);
      if (fd < 0) {
        const int error = errno;
        const std::string path = file->path.string();
        throw std::system_error(error, std::system_category(),
                                fmt::format("cohort::start_processes: options.{}: {}", name, cannot_open(path, error)));
      }
      os::owned_fd owned(fd);
      it->second = same_as_before(fd, file->flags);
      if (it->second == fd) opened.push_back(std::move(owned));
    }
    if (it->second >= 0) stream = stdio::fd(it->second);
  };
  for (auto& o : options) {
    share(o.out, "out");
    share(o.err, "err");
  }
}

// Whether a rank started with `o` leads its process group.
bool leads_group(const spawn_options& o) { return o.new_process_group || o.new_session; }

}  // namespace detail

group start_processes(const asio::any_io_executor& executor, const group_spec& spec) {
  detail::validate(spec);
  // Before the group's timers, which would bring up asio's reactor with a
  // bare message of asio's where no descriptor is left.
  detail::ready_to_wait(executor, "cohort::start_processes");
  auto state = std::make_shared<detail::group_state>(executor, spec);
  detail::become_subreaper();
  state->subreaper = true;
  detail::keep_listing_reserve();
  static std::atomic<unsigned> groups_started{0};
  const unsigned group_number = groups_started++;
  state->marker = detail::marker_of(group_number);
  if (spec.logs.active() && spec.error_dir.empty() && !spec.logs.dir.empty()) {
    state->error_dir = spec.logs.attempt_dir();
  }
  detail::claim_folders(*state, spec);
  if (spec.logs.active()) {
    state->logs = std::make_unique<detail::group_logs>(spec.logs, spec.options, spec.name, spec.nprocs);
  }
  detail::prepare_error_files(*state, group_number);
  const auto eq = state->marker.find('=');
  const std::string marker_name = state->marker.substr(0, eq), marker_value = state->marker.substr(eq + 1);

  const auto* function = std::get_if<function_call>(&spec.entry);
  std::vector<spawn_options> options(static_cast<std::size_t>(spec.nprocs), spec.options);
  for (int rank = 0; rank < spec.nprocs; ++rank) {
    auto& env = options[static_cast<std::size_t>(rank)].env;
    env.set(marker_name, marker_value);
    const std::string error_file = state->error_files[static_cast<std::size_t>(rank)].string();
    env.set("COHORT_ERROR_FILE", error_file);
    env.set("TORCHELASTIC_ERROR_FILE", error_file);
    if (auto it = spec.envs.find(rank); it != spec.envs.end()) {
      for (const auto& [name, value] : it->second) env.set(name, value);
    }
    if (state->logs) state->logs->apply(rank, options[static_cast<std::size_t>(rank)]);
  }
  std::vector<os::owned_fd> output_files;
  detail::share_output_files(options, output_files);
  // The guardian knows the run's marker before any rank starts, and each
  // rank from before it runs anything of the caller's: the rank announces
  // itself on the guardian's line, and its note there is withdrawn once
  // the rank is noted here (or its start failed).
  if (const std::uint64_t run = shm::run_marker_hash(state->marker); detail::note_run(run)) state->run_note = run;
  const os::owned_fd line = detail::start_line();
  const auto noted_here = [&](std::size_t rank, pid_t pid) {
    state->group_noted[rank] = detail::leads_group(options[rank]) && detail::note_rank_group(pid);
    state->rank_notes[rank] = detail::note_rank(pid);
    detail::withdraw_start_note(line.get(), pid);
  };
  // Room in the descriptor table for what the running ranks hold, made
  // before the launching threads fill it: growing it then would stall them
  // (os/descriptor_table.hpp). A function rank's result descriptor and the
  // log pumps' waits besides.
  std::size_t held = state->logs ? state->logs->descriptors_to_come(state->strand) : 0;
  for (const auto& o : options) held += detail::descriptors_per_child(state->strand, o) + (function != nullptr ? 1 : 0);
  os::reserve_descriptors(held);
  // On failure the ranks already started are killed and reaped as `state`
  // unwinds.
  if (function != nullptr) {
    state->args = function->args;
    state->children =
        detail::start_functions(state->strand, *function, options, state->result_fds, spec.start_threads, line.get());
    shm::note_ranks_running(static_cast<int>(state->children.size()));
    state->counted_as_keeper = true;
  } else {
    state->children.resize(options.size());
    state->group_noted.assign(options.size(), 0);
    state->rank_notes.assign(options.size(), 0);
    detail::for_each_parallel(options.size(), detail::start_threads(spec.start_threads, options.size()), [&](std::size_t r) {
      command cmd = std::get<command>(spec.entry);
      if (auto it = spec.args.find(static_cast<int>(r)); it != spec.args.end()) {
        cmd.args.insert(cmd.args.end(), it->second.begin(), it->second.end());
      }
      // A rank that cannot start is named, as a function's rank is.
      const auto named = [&](const std::string& what) {
        return fmt::format("cohort: rank {} of '{}': {}", r, cmd.program, what);
      };
      try {
        state->children[r] = detail::spawn_announced(state->strand, cmd, options[r], line.get());
        noted_here(r, state->children[r].pid());
      } catch (const std::system_error& e) {
        throw std::system_error(e.code(), named(os::system_error_words(e)));
      } catch (const std::invalid_argument& e) {
        throw std::invalid_argument(named(e.what()));
      }
    });
  }
  for (const auto& c : state->children) state->pids.push_back(c.pid());
  // What a rank starts in its process group dies with this process, its
  // environment marked or not: the guardian, if one runs, kills the group;
  // and the segments the rank made go, also once it has ended. (A program
  // rank's notes were made as it started; until then, as a function
  // rank's until here, its announcement stood in for them.)
  if (function != nullptr) {
    state->group_noted.assign(state->pids.size(), 0);
    state->rank_notes.assign(state->pids.size(), 0);
    for (std::size_t rank = 0; rank < state->pids.size(); ++rank) noted_here(rank, state->pids[rank]);
  }
  if (state->logs) {
    state->logs->started();
    state->logs->start(state->strand.get_inner_executor(), state->strand);
  }
  state->running = spec.nprocs;
  state->recorded.assign(static_cast<std::size_t>(spec.nprocs), false);
  state->partial.statuses.resize(static_cast<std::size_t>(spec.nprocs));
  state->partial.return_values.resize(static_cast<std::size_t>(spec.nprocs));
  asio::co_spawn(state->strand, detail::supervise(state), asio::detached);
  asio::co_spawn(state->strand, detail::reap_orphans_while_running(state), asio::detached);
  return group(std::move(state));
}

// A start cancelled before it runs starts nothing; once started, the launch
// is not stopped halfway.
asio::awaitable<group> detail::start_processes_on(asio::any_io_executor executor, group_spec spec) {
  const asio::cancellation_state cancellation = co_await asio::this_coro::cancellation_state;
  if (cancellation.cancelled() != asio::cancellation_type::none) {
    throw std::system_error(asio::error::operation_aborted, "cohort::start_processes");
  }
  co_return start_processes(executor, spec);
}

}  // namespace cohort

// The child's side of a function entry point: the registry of functions,
// child_main(), and running a function so that an exception escaping it
// reaches the parent with its type, message and stack trace.
#include "launch/entry.hpp"
#include "config.hpp"
#include "launch/forkserver.hpp"
#include "launch/uncaught.hpp"
#include "os/descriptor_limit.hpp"
#include "os/fork_safe_mutex.hpp"
#include "os/process_identity.hpp"
#include "os/quiet_sigpipe.hpp"
#include "os/raw_syscall.hpp"
#include "os/stack_switch.hpp"
#include "shm/arena.hpp"
#include "shm/keeper.hpp"

#include "cohort/error_file.hpp"

#include <fmt/format.h>

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace cohort {
namespace detail {
namespace {

struct registered {
  std::string name;
  erased_function fn;
  entry_thunk thunk;
};

struct registry {
  // Fork-safe: any thread may look a name up (a call, a pool's map) as
  // another forks, and the child looks names up in turn.
  os::fork_safe_mutex mutex;
  std::vector<registered> entries;
  std::vector<std::string> shared_names;  // given to two different functions
};

// Never destroyed: a thread may still name an entry point as statics go.
registry& entries() {
  static auto& r = *new registry;
  return r;
}

std::atomic<bool> main_called{false};
// Set once child_main has returned an exit code: this process was a rank or
// a forkserver, and its main should be on its way out.
std::atomic<bool> main_handed_back{false};

// What the entry's stack runs and what it leaves behind.
struct entry_run {
  entry_thunk thunk;
  erased_function fn;
  int rank;
  const encoded* args;
  std::optional<encoded> result;
};

// How long a rank whose function returned waits for its values in flight.
constexpr auto receivers_wait = std::chrono::seconds(30);

entry_run* current_run = nullptr;  // one entry per process

// The bottom frame of the entry's stack, below which the unwinder finds no
// frame at all (os::run_on_stack): an escaping exception meets no handler,
// so std::terminate is called at the throw, with the thrower's frames still
// on the stack for the trace.
COHORT_FORKED_CHILD_PATH void entry_stack_main(void*) {
  auto& run = *current_run;
  run.result = run.thunk(run.fn, run.rank, *run.args);
}

// Runs entry_stack_main on `stack`, and returns when it does.
COHORT_FORKED_CHILD_PATH void run_on(const entry_stack& stack) {
  os::run_on_stack(stack.bottom(), stack.size(), entry_stack_main, nullptr);
}

[[noreturn]] void on_uncaught() {
  const auto [message, trace, when] = report_uncaught();
  // What it sent before it failed still reaches its receivers, through the
  // keeper; not waited for, which would hold back the failure's news.
  shm::let_values_go(receivers_wait, false);
  stop_forkserver();
  flush_held_output();  // what it printed before, std::cout's own buffer too
  std::fprintf(stderr, "cohort: rank %d (pid %d) raised %s\n%s", os::running_rank(), static_cast<int>(::getpid()),
               message.c_str(), trace.c_str());
  std::fflush(stderr);
  ::_exit(1);
}

// What std::terminate calls where ranks_inherit_terminate_handler set it:
// on_uncaught in a rank, the C++ runtime's default elsewhere.
[[noreturn]] void on_uncaught_or_default() {
  if (os::running_rank() >= 0) on_uncaught();
#ifdef __GLIBCXX__
  __gnu_cxx::__verbose_terminate_handler();
#endif
  std::abort();
}

// Whether `fd` is a memfd made under `name`, as /proc/self/fd shows it.
bool is_memfd_named(int fd, std::string_view name) {
  char link[32];
  std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  char target[64];
  const ssize_t n = ::readlink(link, target, sizeof target);
  return n > 0 && std::string_view(target, static_cast<std::size_t>(n)) == fmt::format("/memfd:{} (deleted)", name);
}

// Parses "<args fd>,<result fd>,<rank>,<name>"; false where `value` is not
// one cohort gives: malformed, or naming descriptors other than the memfds
// start_spawned made (the result's is -1 where no value is wanted). A
// stray value would otherwise have this program take whatever descriptor
// it named, standard input say, for the arguments, and run a function
// instead of its main.
bool parse_entry(std::string_view value, int& args_fd, int& result_fd, int& rank, std::string& name) {
  int* fields[] = {&args_fd, &result_fd, &rank};
  for (int* field : fields) {
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), *field);
    if (ec != std::errc{} || end == value.data() + value.size() || *end != ',') return false;
    value.remove_prefix(static_cast<std::size_t>(end - value.data()) + 1);
  }
  name = value;
  return !name.empty() && rank >= 0 && is_memfd_named(args_fd, args_memfd_name) &&
         (result_fd == -1 || is_memfd_named(result_fd, result_memfd_name));
}

// The forkserver's socket that `value` names, or -1 where it names none:
// a value cohort did not set, which would otherwise have this program
// serve forks on whatever descriptor it named (0 for "" or "abc") and
// exit 0 without running its main.
int parse_forkserver(std::string_view value) {
  int socket = -1;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), socket);
  struct stat st {};
  if (ec != std::errc{} || end != value.data() + value.size() || socket < 0 || ::fstat(socket, &st) != 0 ||
      !S_ISSOCK(st.st_mode)) {
    return -1;
  }
  return socket;
}

}  // namespace

std::size_t entry_stack::size_for_limit() noexcept {
  rlimit limit{};
  std::size_t size = fallback_size;
  if (::getrlimit(RLIMIT_STACK, &limit) == 0 && limit.rlim_cur >= (64u << 10)) {
    size = limit.rlim_cur == RLIM_INFINITY ? largest_size : std::min<std::size_t>(limit.rlim_cur, largest_size);
  }
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  return (size + page - 1) / page * page;
}

entry_stack::entry_stack() {
  size_ = size_for_limit();
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const auto map = [this, page] {
    return ::mmap(nullptr, size_ + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK | MAP_NORESERVE,
                  -1, 0);
  };
  base_ = map();
  if (base_ == MAP_FAILED && size_ > fallback_size) {  // address space refused (RLIMIT_AS) for a large limit
    size_ = fallback_size;
    base_ = map();
  }
  if (base_ == MAP_FAILED) throw std::system_error(errno, std::system_category(), "cohort: the entry point's stack");
  ::mprotect(base_, page, PROT_NONE);
  bottom_ = static_cast<char*>(base_) + page;
  mapped_ = size_ + page;
}

entry_stack::~entry_stack() { ::munmap(base_, mapped_); }

const entry_stack* entry_stack::ahead_of_forks(std::optional<entry_stack>& into) noexcept {
  try {
    return &into.emplace();
  } catch (...) {
    return nullptr;
  }
}

bool read_whole(int fd, std::vector<std::byte>& out) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return false;
  out.resize(static_cast<std::size_t>(st.st_size));
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return n == 0 ? (out.resize(done), true) : false;
    done += static_cast<std::size_t>(n);
  }
  return true;
}

COHORT_FORKED_CHILD_PATH bool write_whole(int fd, std::span<const std::byte> bytes) {
  const os::quiet_signal past_the_limit(SIGXFSZ);  // EFBIG, not the process's end
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::pwrite(fd, bytes.data() + done, bytes.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    done += static_cast<std::size_t>(n);
  }
  return true;
}

bool register_entry(std::string_view name, erased_function fn, entry_thunk thunk) noexcept {
  try {
    auto& r = entries();
    std::lock_guard lock(r.mutex);
    // A function registered again keeps its first name. A name given to a
    // second function is noted as shared, and the function kept as well:
    // each of the two is then refused by that name (registered_name).
    bool shared = false;
    for (const auto& e : r.entries) {
      if (e.fn == fn) return true;
      shared = shared || e.name == name;
    }
    if (shared) r.shared_names.emplace_back(name);
    r.entries.push_back({std::string(name), fn, thunk});
    return true;
  } catch (...) {
    return false;  // out of memory during static initialisation: reported on use
  }
}

const std::string& registered_name(erased_function fn) {
  auto& r = entries();
  std::lock_guard lock(r.mutex);
  for (const auto& e : r.entries) {
    if (e.fn != fn) continue;
    if (std::find(r.shared_names.begin(), r.shared_names.end(), e.name) != r.shared_names.end()) {
      throw std::logic_error(fmt::format("cohort: two different entry points are registered as '{}'", e.name));
    }
    return e.name;
  }
  throw std::logic_error("cohort: the function is not an entry point: register it with COHORT_ENTRYPOINT(fn)");
}

bool child_main_called() noexcept { return main_called.load(std::memory_order_relaxed); }

bool child_main_returned_code() noexcept { return main_handed_back.load(std::memory_order_relaxed); }

bool ranks_inherit_terminate_handler() noexcept {
#ifdef __GLIBCXX__
  // Only in place of the default, whose work it does outside a rank: a
  // handler the program set stays, and a rank then sets its own.
  const std::terminate_handler found = std::get_terminate();
  if (found == on_uncaught_or_default) return true;
  if (found != __gnu_cxx::__verbose_terminate_handler) return false;
  const std::terminate_handler replaced = std::set_terminate(on_uncaught_or_default);
  if (replaced == __gnu_cxx::__verbose_terminate_handler || replaced == on_uncaught_or_default) return true;
  std::set_terminate(replaced);  // set by another thread meanwhile: it stays
  return false;
#else
  return false;
#endif
}

namespace {

// Whether two different functions are registered under `name`.
bool shared_name(const std::string& name) {
  auto& r = entries();
  std::lock_guard lock(r.mutex);
  return std::find(r.shared_names.begin(), r.shared_names.end(), name) != r.shared_names.end();
}

// The function registered under `name`; throws std::logic_error when none
// is, or two are.
COHORT_FORKED_CHILD_PATH std::pair<entry_thunk, erased_function> find_entry(const std::string& name) {
  const auto found = look_up_entry(name);
  if (found.thunk == nullptr && shared_name(name)) {
    throw std::logic_error(fmt::format("cohort: two different entry points are registered as '{}'", name));
  }
  if (found.thunk == nullptr) {
    throw std::logic_error(fmt::format("cohort: this program has no entry point named '{}'", name));
  }
  return {found.thunk, found.fn};
}

}  // namespace

COHORT_FORKED_CHILD_PATH found_entry look_up_entry(const std::string& name) {
  found_entry found;
  auto& r = entries();
  std::lock_guard lock(r.mutex);
  // A name two functions share runs neither (a function_call made by hand
  // may name one): find_entry says why.
  for (const auto& shared : r.shared_names) {
    if (same_text(shared, name)) return found;
  }
  for (const auto& e : r.entries) {
    if (same_text(e.name, name)) {  // not memcmp: a page of libc fewer for a forked child
      found = {e.thunk, e.fn};
      break;
    }
  }
  return found;
}

std::optional<encoded> call_entry(const std::string& name, int rank, const encoded& args) {
  const auto [thunk, fn] = find_entry(name);
  return thunk(fn, rank, args);
}

// What a result memfd holds: the value's size (8 bytes, this host's order), the value,
// and the record of the references its storages hold for the reader.
std::vector<std::byte> result_contents(const encoded& value) {
  const std::uint64_t size = value.size();
  const auto holds = hold_for_receiver(value);
  std::vector<std::byte> out(sizeof size + size + holds.size());
  std::memcpy(out.data(), &size, sizeof size);
  std::memcpy(out.data() + sizeof size, value.bytes().data(), size);
  if (!holds.empty()) std::memcpy(out.data() + sizeof size + size, holds.data(), holds.size());
  return out;
}

COHORT_FORKED_CHILD_PATH int run_entry(const std::string& name, int rank, const encoded& args, int result_fd,
                                       const from_forking_process& inherited) {
  entry_run run{inherited.entry.thunk, inherited.entry.fn, rank, &args, std::nullopt};
  // The result's descriptor came through the set-up's kept ones, whose
  // close-on-exec it cleared (for spawn, so that it crossed the exec): what
  // the function runs (system(), popen, a spawn keeping other descriptors)
  // must not get a writable copy, as no other descriptor of cohort's does.
  if (result_fd >= 0) os::raw_syscall(SYS_fcntl, result_fd, F_SETFD, FD_CLOEXEC);
  os::set_running_rank(rank);
  if (!inherited.terminate_handler_set) std::set_terminate(on_uncaught);
  shm::let_values_go_at_exit(receivers_wait);  // exit() inside the function
  if (run.thunk == nullptr) std::tie(run.thunk, run.fn) = find_entry(name);
  // The function runs on a stack of its own, which holds no handler of the
  // caller's: see entry_stack_main.
  std::optional<entry_stack> own;
  current_run = &run;
  // The one mapped ahead of the forks serves where it has the size the
  // rank's own limit asks (a forkserver's was sized by the server's limit
  // as it started; the rank has the caller's now).
  const bool fits = inherited.stack != nullptr && inherited.stack->size() == entry_stack::size_for_limit();
  run_on(fits ? *inherited.stack : own.emplace());
  current_run = nullptr;
  // What it returned is read once it has ended: the storages it names get
  // references of their own, which the reader takes over.
  std::vector<std::byte> result;
  if (result_fd >= 0 && run.result) result = result_contents(*run.result);
  // Values it sent that name its shared memory are opened through this
  // process: what they name goes to its keeper, or else it stays until
  // they are received, within a bound.
  shm::let_values_go(receivers_wait, true);
  stop_forkserver();  // what the function started by the forkserver has ended with it
  if (result_fd < 0) return 0;  // what it returned is not wanted
  if (!result.empty() && !write_whole(result_fd, result)) {
    const int error = errno;
    throw std::system_error(error, std::system_category(),
                            "cohort: writing the entry point's result" + os::file_size_limit_note(error));
  }
  ::close(result_fd);
  return 0;
}

}  // namespace detail

std::string_view to_string(start_method method) noexcept {
  switch (method) {
    case start_method::spawn: return "spawn";
    case start_method::fork: return "fork";
    case start_method::forkserver: return "forkserver";
  }
  return "?";
}

std::optional<int> child_main(int /*argc*/, char** /*argv*/) {
  // This main hands control over: the functions it runs may start others by
  // re-execution in turn.
  detail::main_called.store(true, std::memory_order_relaxed);
  if (const char* server = std::getenv(detail::forkserver_env)) {
    const std::string value = server;
    ::unsetenv(detail::forkserver_env);  // not inherited by what it starts
    const int socket = detail::parse_forkserver(value);
    if (socket < 0) {
      throw std::invalid_argument(fmt::format(
          "cohort::child_main: {}=\"{}\" names no socket: the variable is cohort's own, set only in the forkserver "
          "it starts",
          detail::forkserver_env, value));
    }
    const int code = detail::serve_forks(socket);
    detail::main_handed_back.store(true, std::memory_order_relaxed);
    return code;
  }
  const char* entry = std::getenv(detail::entry_env);
  if (entry == nullptr) return std::nullopt;
  const std::string value = entry;
  ::unsetenv(detail::entry_env);  // not inherited by what the function starts
  int args_fd = -1, result_fd = -1, rank = -1;
  std::string name;
  // Refused before the rank's handler is set: this process is no rank.
  if (!detail::parse_entry(value, args_fd, result_fd, rank, name)) {
    throw std::invalid_argument(fmt::format(
        "cohort::child_main: {}=\"{}\" names no arguments cohort wrote: the variable is cohort's own, set only in "
        "the processes it starts to run a function",
        detail::entry_env, value));
  }
  std::set_terminate(detail::on_uncaught);
  std::vector<std::byte> bytes;
  if (!detail::read_whole(args_fd, bytes)) {
    throw std::system_error(errno, std::system_category(), "cohort::child_main: reading the arguments");
  }
  ::close(args_fd);
  const encoded args = encoded::from_bytes(std::move(bytes));
  shm::find_keeper_in_environment();
  const detail::from_forking_process none{.stack = nullptr, .terminate_handler_set = true, .entry = {}};  // not forked
  const int code = detail::run_entry(name, rank, args, result_fd, none);
  detail::main_handed_back.store(true, std::memory_order_relaxed);
  return code;
}

}  // namespace cohort

// cohort-run: starts N ranks of a program with torchrun's environment
// contract, shuts the rest down at the first failure, restarts the group
// when asked, and reports the root cause.
//
//   cohort-run [options] [--] program [args...]
#include <cohort/group.hpp>
#include <cohort/guardian.hpp>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>

#include <CLI/CLI.hpp>
#include <fmt/chrono.h>
#include <fmt/format.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr const char* version = "0.1.0";

struct run_options {
  std::string nproc_per_node = "1";
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: a free port, single node only
  bool standalone = false;
  std::string run_id;
  std::string role = "default";
  int max_restarts = 0;
  double grace_period = 30;  // seconds from SIGTERM to SIGKILL
  std::vector<std::string> signals_to_forward;
  std::string log_dir;
  std::string redirects = "0";
  std::string tee = "0";
  std::vector<int> local_ranks_filter;
  std::string log_line_prefix_template = "[${role}${local_rank}]:";
  std::vector<std::string> command;
};

// A usage error: the message and exit code 2.
struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The GPUs this process may use: CUDA_VISIBLE_DEVICES when set, else the
// ones the NVIDIA driver lists.
int visible_gpus() {
  if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES")) {
    const std::string list = visible;
    if (list.empty()) return 0;
    return static_cast<int>(std::count(list.begin(), list.end(), ',')) + 1;
  }
  std::error_code ec;
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/driver/nvidia/gpus", ec)) {
    static_cast<void>(entry);
    ++n;
  }
  return n;
}

int ranks_per_node(const std::string& value) {
  if (value == "cpu") return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (value == "gpu" || value == "auto") {
    const int gpus = visible_gpus();
    if (value == "gpu" && gpus == 0) throw usage_error("--nproc-per-node gpu: no GPU is visible");
    return gpus > 0 ? gpus : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }
  std::size_t used = 0;
  int n = 0;
  try {
    n = std::stoi(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != value.size() || n < 1) {
    throw usage_error(fmt::format("--nproc-per-node: '{}' is not a positive number, cpu, gpu or auto", value));
  }
  return n;
}

// A port nothing listens on now, from the kernel (bind to port 0): the
// fixed 29500 of torchrun collides when two jobs share a machine.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::system_error(errno, std::system_category(), "cohort-run: socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int error = errno;
    ::close(fd);
    throw std::system_error(error, std::system_category(), "cohort-run: finding a free port");
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

int signal_number(std::string name) {
  if (!name.empty() && std::all_of(name.begin(), name.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::stoi(name);
  }
  if (name.rfind("SIG", 0) != 0) name = "SIG" + name;
  for (int sig = 1; sig < NSIG; ++sig) {
    if (cohort::signal_name(sig) == name) return sig;
  }
  throw usage_error(fmt::format("--signals-to-forward: no signal '{}'", name));
}

// A --redirects/--tee value: 0-3 for every rank, or per local rank as
// "0:3,1:0" (ranks not named get 0), as torchrun takes it.
cohort::streams_per_rank streams_of(const std::string& flag, const std::string& value) {
  const auto number = [&](const std::string& text) {
    if (text.size() != 1 || text[0] < '0' || text[0] > '3') {
      throw usage_error(fmt::format("--{}: '{}' is not 0-3 or rank:0-3,...", flag, value));
    }
    return static_cast<cohort::std_streams>(text[0] - '0');
  };
  if (value.find(':') == std::string::npos) return number(value);
  std::map<int, cohort::std_streams> ranks;
  std::string::size_type begin = 0;
  while (begin <= value.size()) {
    auto end = value.find(',', begin);
    if (end == std::string::npos) end = value.size();
    const std::string item = value.substr(begin, end - begin);
    const auto colon = item.find(':');
    std::size_t used = 0;
    int rank = -1;
    try {
      rank = std::stoi(item.substr(0, colon), &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (colon == std::string::npos || used != colon || rank < 0) {
      throw usage_error(fmt::format("--{}: '{}' is not 0-3 or rank:0-3,...", flag, value));
    }
    ranks[rank] = number(item.substr(colon + 1));
    begin = end + 1;
  }
  return ranks;
}

std::string random_run_id() {
  std::random_device random;
  return fmt::format("{:08x}", random());
}

std::string host_name() {
  char name[256]{};
  return ::gethostname(name, sizeof name - 1) == 0 ? name : "?";
}

std::string describe_status(const cohort::exit_status& status) {
  if (status.signaled()) return fmt::format("signal {} ({})", cohort::signal_name(status.signal()), status.signal());
  return std::to_string(status.code());
}

// The exit code cohort-run gives for a rank's status: its code, or
// 128 + the signal that killed it.
int exit_code_of(const cohort::exit_status& status) {
  const int code = status.shell_code();
  return code == 0 ? 1 : code;
}

void print_failure(const cohort::rank_failure& f, int node_rank, int nproc) {
  const auto seconds = std::chrono::system_clock::to_time_t(f.timestamp);
  std::tm local{};
  ::localtime_r(&seconds, &local);
  fmt::print(stderr, "  time       : {:%Y-%m-%d_%H:%M:%S}\n", local);
  fmt::print(stderr, "  host       : {}\n", host_name());
  fmt::print(stderr, "  rank       : {} (local_rank: {})\n", node_rank * nproc + f.rank, f.rank);
  fmt::print(stderr, "  pid        : {}\n", f.pid);
  fmt::print(stderr, "  exitcode   : {}\n", describe_status(f.status));
  fmt::print(stderr, "  error_file : {}\n", f.message.empty() ? "<N/A>" : f.error_file.string());
  if (!f.message.empty()) fmt::print(stderr, "  message    : {}\n", f.message);
  if (!f.trace.empty()) {
    fmt::print(stderr, "  traceback  :\n");
    std::string::size_type begin = 0;
    while (begin < f.trace.size()) {
      auto end = f.trace.find('\n', begin);
      if (end == std::string::npos) end = f.trace.size();
      fmt::print(stderr, "    {}\n", std::string_view(f.trace).substr(begin, end - begin));
      begin = end + 1;
    }
  }
}

void print_summary(const cohort::run_result& r, const run_options& o, int nproc, int attempt) {
  const auto* root = r.first_failure();
  fmt::print(stderr, "cohort-run: the run failed (role {}, run {}, attempt {} of {})\n", o.role, o.run_id, attempt,
             o.max_restarts);
  if (root == nullptr) return;
  fmt::print(stderr, "Root cause (first failure):\n");
  print_failure(*root, o.node_rank, nproc);
  bool header = false;
  for (const auto& f : r.failures) {
    if (&f == root) continue;
    if (!header) fmt::print(stderr, "Other failures:\n");
    header = true;
    print_failure(f, o.node_rank, nproc);
  }
}

// torchrun's environment contract, for local rank `local` of attempt
// `attempt`.
std::map<std::string, std::string> contract(const run_options& o, int nproc, int local, int attempt) {
  const int world = o.nnodes * nproc;
  const int rank = o.node_rank * nproc + local;
  return {
      {"RANK", std::to_string(rank)},
      {"LOCAL_RANK", std::to_string(local)},
      {"WORLD_SIZE", std::to_string(world)},
      {"LOCAL_WORLD_SIZE", std::to_string(nproc)},
      {"GROUP_RANK", std::to_string(o.node_rank)},
      {"GROUP_WORLD_SIZE", std::to_string(o.nnodes)},
      {"ROLE_RANK", std::to_string(rank)},
      {"ROLE_WORLD_SIZE", std::to_string(world)},
      {"ROLE_NAME", o.role},
      {"MASTER_ADDR", o.master_addr},
      {"MASTER_PORT", std::to_string(o.master_port)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(attempt)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(o.max_restarts)},
      {"TORCHELASTIC_RUN_ID", o.run_id},
  };
}

run_options parse(int argc, char** argv) {
  run_options o;
  CLI::App app("cohort-run: runs N ranks of a program with torchrun's environment contract", "cohort-run");
  app.prefix_command();  // the program's own arguments are not ours
  app.set_version_flag("--version", fmt::format("cohort-run {}", version));
  app.add_option("-n,--nproc-per-node,--nproc_per_node", o.nproc_per_node,
                 "ranks on this node: a number, cpu, gpu (visible GPUs) or auto");
  app.add_option("--nnodes", o.nnodes, "nodes in the job")->check(CLI::PositiveNumber);
  app.add_option("--node-rank,--node_rank", o.node_rank, "this node's rank")->check(CLI::NonNegativeNumber);
  app.add_option("--master-addr,--master_addr", o.master_addr, "address of rank 0's node");
  app.add_option("--master-port,--master_port", o.master_port, "port on it (default: a free one, single node)")
      ->check(CLI::Range(1, 65535));
  app.add_flag("--standalone", o.standalone, "single node, local master, a fresh run id");
  app.add_option("--run-id,--run_id", o.run_id, "the job's id");
  app.add_option("--role", o.role, "the ranks' role name");
  app.add_option("--max-restarts,--max_restarts", o.max_restarts, "restarts of the whole group after a failure")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--grace-period,--grace_period", o.grace_period, "seconds from SIGTERM to SIGKILL at shutdown")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--signals-to-forward,--signals_to_forward", o.signals_to_forward,
                 "signals passed on to every rank, e.g. SIGUSR1,SIGUSR2")
      ->delimiter(',');
  app.add_option("--log-dir,--log_dir", o.log_dir, "folder for the ranks' logs: <dir>/<run-id>/attempt_<k>/<local-rank>/");
  app.add_option("-r,--redirects", o.redirects, "streams to log files only: 0 none, 1 stdout, 2 stderr, 3 both; or 0:3,1:0");
  app.add_option("-t,--tee", o.tee, "streams to log files and the console, prefixed; values as --redirects");
  app.add_option("--local-ranks-filter,--local_ranks_filter", o.local_ranks_filter,
                 "local ranks whose output reaches the console, e.g. 0,3")
      ->delimiter(',')
      ->check(CLI::NonNegativeNumber);
  app.add_option("--log-line-prefix-template,--log_line_prefix_template", o.log_line_prefix_template,
                 "prefix of teed console lines: ${role}, ${rank}, ${local_rank}");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    fmt::print("{}", app.help());
    std::exit(0);
  } catch (const CLI::CallForVersion&) {
    fmt::print("cohort-run {}\n", version);
    std::exit(0);
  } catch (const CLI::ParseError& e) {
    throw usage_error(e.what());
  }
  o.command = app.remaining();
  if (!o.command.empty() && o.command.front() == "--") {
    o.command.erase(o.command.begin());
  } else if (!o.command.empty() && o.command.front().size() > 1 && o.command.front()[0] == '-') {
    throw usage_error(fmt::format("unknown option {}", o.command.front()));
  }
  if (o.command.empty()) throw usage_error("no program to run: cohort-run [options] [--] program [args...]");
  if (o.node_rank >= o.nnodes) throw usage_error(fmt::format("--node-rank {} is not below --nnodes {}", o.node_rank, o.nnodes));
  if (o.standalone) {
    if (o.nnodes != 1) throw usage_error("--standalone runs a single node: --nnodes must be 1");
    o.master_addr = "127.0.0.1";
    if (o.run_id.empty()) o.run_id = random_run_id();
  }
  if (o.run_id.empty()) o.run_id = "none";
  return o;
}

// Exits as a shell would when the program cannot be run: 127 when it is not
// found, 126 when it is not executable. Quickly, before any rank starts.
void check_program(const std::string& program) {
  namespace fs = std::filesystem;
  const auto runnable = [](const fs::path& p) { return ::access(p.c_str(), X_OK) == 0 && !fs::is_directory(p); };
  if (program.find('/') != std::string::npos) {
    if (runnable(program)) return;
    fmt::print(stderr, "cohort-run: {}: {}\n", program, fs::exists(program) ? "not executable" : "not found");
    std::exit(fs::exists(program) ? 126 : 127);
  }
  const char* path = std::getenv("PATH");
  std::string_view dirs = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  while (true) {
    const auto colon = dirs.find(':');
    const std::string dir(dirs.substr(0, colon));
    if (runnable(fs::path(dir.empty() ? "." : dir) / program)) return;
    if (colon == std::string_view::npos) break;
    dirs.remove_prefix(colon + 1);
  }
  fmt::print(stderr, "cohort-run: {}: not found in PATH\n", program);
  std::exit(127);
}

// The ranks' logs from the flags. Files are asked for without --log-dir:
// a fresh folder in $TMPDIR, as torchrun makes one.
cohort::logs_spec logs_of(const run_options& o, int nproc) {
  cohort::logs_spec logs;
  logs.run_id = o.run_id;
  logs.redirects = streams_of("redirects", o.redirects);
  logs.tee = streams_of("tee", o.tee);
  logs.prefix = o.log_line_prefix_template;
  logs.first_rank = o.node_rank * nproc;
  for (const auto* per_rank : {&logs.redirects.ranks, &logs.tee.ranks}) {
    for (const auto& [rank, streams] : *per_rank) {
      if (rank >= nproc) throw usage_error(fmt::format("--redirects/--tee name local rank {}; there are {}", rank, nproc));
    }
  }
  if (!o.local_ranks_filter.empty()) {
    logs.console_ranks.emplace();
    for (int rank : o.local_ranks_filter) {
      if (rank >= nproc) throw usage_error(fmt::format("--local-ranks-filter names local rank {}; there are {}", rank, nproc));
      logs.console_ranks->insert(rank);
    }
  }
  if (!o.log_dir.empty()) {
    logs.dir = o.log_dir;
  } else if (!logs.redirects.empty() || !logs.tee.empty()) {
    std::string pattern = (std::filesystem::temp_directory_path() / "cohort-run-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::system_error(errno, std::system_category(), "cohort-run: mkdtemp " + pattern);
    logs.dir = pattern;
    fmt::print(stderr, "cohort-run: logs in {}\n", pattern);
  }
  return logs;
}

int run(run_options o) {
  check_program(o.command.front());
  // Before any thread: what the workers start dies with cohort-run, also
  // when it is killed with SIGKILL.
  const cohort::guardian guard;
  const int nproc = ranks_per_node(o.nproc_per_node);
  cohort::group_spec spec;
  spec.logs = logs_of(o, nproc);
  if (o.master_port == 0) o.master_port = o.nnodes == 1 ? free_port() : 29500;
  std::vector<int> passed_on;
  for (const auto& name : o.signals_to_forward) passed_on.push_back(signal_number(name));

  spec.name = o.role;
  spec.entry = cohort::command(o.command.front(), std::vector<std::string>(o.command.begin() + 1, o.command.end()));
  spec.nprocs = nproc;
  spec.shutdown.term_grace = std::chrono::milliseconds(static_cast<long long>(o.grace_period * 1000));
  if (nproc > 1 && std::getenv("OMP_NUM_THREADS") == nullptr) {
    spec.options.env.set("OMP_NUM_THREADS", "1");
    fmt::print(stderr, "cohort-run: OMP_NUM_THREADS is set to 1 for each of the {} ranks; set it to tune\n", nproc);
  }
  for (int attempt = 0;; ++attempt) {
    spec.logs.attempt = attempt;
    spec.envs.clear();
    for (int local = 0; local < nproc; ++local) spec.envs[local] = contract(o, nproc, local, attempt);
    asio::io_context io;
    std::optional<cohort::run_result> result;
    std::exception_ptr failure;
    std::vector<std::thread> helpers;
    asio::co_spawn(io, [&]() -> asio::awaitable<void> {
      // Held until they are handled, so that none lands between the start
      // of the ranks and forward_signals (the default action would end
      // cohort-run, and the ranks with it, without a shutdown).
      sigset_t handled, old;
      sigemptyset(&handled);
      for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) sigaddset(&handled, sig);
      for (int sig : passed_on) sigaddset(&handled, sig);
      ::pthread_sigmask(SIG_BLOCK, &handled, &old);
      std::optional<cohort::group> g;
      try {
        g = co_await cohort::start_processes(spec);
        g->forward_signals({SIGINT, SIGTERM, SIGHUP, SIGQUIT}, passed_on);
      } catch (...) {
        ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
        throw;
      }
      ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
      // The logs' pumps copy on every thread the io_context runs on. Made
      // only now: a thread that does not block those signals before their
      // handlers are in place could take one with its default action.
      if (spec.logs.active()) {
        for (unsigned i = 1; i < std::min(2u, std::thread::hardware_concurrency()); ++i) helpers.emplace_back([&io] { io.run(); });
      }
      result = co_await g->wait();
    }, [&](std::exception_ptr e) { failure = e; });
    io.run();
    for (auto& t : helpers) t.join();
    if (failure) std::rethrow_exception(failure);
    const auto& r = *result;
    for (const auto& error : r.log_errors) fmt::print(stderr, "cohort-run: {}\n", error);
    if (r.ok()) return 0;
    if (r.signal) {
      fmt::print(stderr, "cohort-run: {} received: the ranks were shut down\n", cohort::signal_name(*r.signal));
      return 128 + *r.signal;
    }
    if (attempt < o.max_restarts) {
      fmt::print(stderr, "cohort-run: attempt {} failed; restarting the group ({} of {} restarts)\n", attempt,
                 attempt + 1, o.max_restarts);
      continue;
    }
    print_summary(r, o, nproc, attempt);
    const auto* root = r.first_failure();
    if (root != nullptr) return exit_code_of(root->status);
    return 1;  // ranks left unreaped (D state), with no failure of their own
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const usage_error& e) {
    fmt::print(stderr, "cohort-run: {}\nRun cohort-run --help for the options.\n", e.what());
    return 2;
  } catch (const std::filesystem::filesystem_error& e) {  // the logs' folder or files
    fmt::print(stderr, "cohort-run: {}\n", e.what());
    return 1;
  } catch (const std::system_error& e) {
    fmt::print(stderr, "{}\n", e.what());
    // A program that cannot be found or run: as a shell says it.
    if (e.code() == std::errc::no_such_file_or_directory) return 127;
    if (e.code() == std::errc::permission_denied) return 126;
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "cohort-run: {}\n", e.what());
    return 1;
  }
}

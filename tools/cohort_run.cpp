// cohort-run: starts N ranks of a program with torchrun's flags and
// environment contract, on one node or many (static, Slurm, or an etcd v3
// rendezvous), shuts the rest down at the first failure, restarts the group
// when asked, and reports the root cause.
//
//   cohort-run [options] script.py [args...]   (see --help for every form)
#include "run/file_timer.hpp"
#include "run/node_sizes.hpp"
#include "run/options.hpp"
#include "run/port.hpp"
#include "run/program.hpp"
#include "run/rendezvous.hpp"
#include "run/report.hpp"
#include "run/say.hpp"
#include "run/signal_owner.hpp"
#include "run/slurm.hpp"

#include "os/descriptor_limit.hpp"
#include "os/owned_fd.hpp"
#include "os/process_identity.hpp"
#include "os/replace_file.hpp"
#include "os/temp_directory.hpp"

#include <cohort/group.hpp>
#include <cohort/guardian.hpp>
#include <cohort/io_uring_info.hpp>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>

#include <fmt/chrono.h>
#include <fmt/format.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

namespace cohort_run {
namespace {

// The open-file limit cohort-run was started with, which the ranks get
// back where cohort-run raised its own: it holds a few descriptors for each
// rank (its pidfd, a second where exits are watched on asio's reactor, the
// log pumps'), and the usual soft limit of 1024 would stop it short of a
// few hundred ranks. Programs are told to raise their soft limit as they
// need, and to hand their children the one they were given, which some
// still need (select() takes no descriptor above 1023).
rlimit given_fd_limit{};

// Raises the soft limit to room for `ranks` ranks where it is lower, within
// the hard limit (no higher: where close_range is missing, a new child
// marks descriptors one by one up to the limit); whether it did. A rank
// holds up to eight as it starts, teed through pipes: both ends of two
// pipes, two log files, two pidfds (at six per rank, 1,000 such ranks
// under a soft limit of 1,024 ran out).
bool raise_fd_limit(int ranks) noexcept {
  if (::getrlimit(RLIMIT_NOFILE, &given_fd_limit) != 0) return false;
  const rlim_t wanted = 256 + rlim_t{8} * static_cast<rlim_t>(ranks);
  if (given_fd_limit.rlim_cur == RLIM_INFINITY || given_fd_limit.rlim_cur >= wanted) return false;
  rlimit raised = given_fd_limit;
  raised.rlim_cur = given_fd_limit.rlim_max == RLIM_INFINITY ? wanted : std::min(wanted, given_fd_limit.rlim_max);
  return raised.rlim_cur > given_fd_limit.rlim_cur && ::setrlimit(RLIMIT_NOFILE, &raised) == 0;
}

// spawn_options::before_exec of every rank: in the vfork-style child, one
// system call.
int restore_fd_limit(void* given) noexcept {
  return ::setrlimit(RLIMIT_NOFILE, static_cast<const rlimit*>(given)) == 0 ? 0 : errno;
}

namespace fs = std::filesystem;

// The GPUs this process may use: CUDA_VISIBLE_DEVICES when set, its entries
// (blanks around each taken off) up to the first that is no device's index
// or name ("-1" hides them all; whether they exist is not asked of the
// driver), else the ones the NVIDIA driver lists.
int visible_gpus() {
  if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES")) {
    int n = 0;
    for (const auto& spaced : comma_list(visible)) {
      const auto entry = trimmed(spaced, " \t");
      const bool index = !entry.empty() && entry.find_first_not_of("0123456789") == std::string::npos;
      if (!index && !entry.starts_with("GPU-") && !entry.starts_with("MIG-")) break;
      ++n;
    }
    return n;
  }
  std::error_code ec;
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/driver/nvidia/gpus", ec)) {
    static_cast<void>(entry);
    ++n;
  }
  return n;
}

// CUDA_VISIBLE_DEVICES's entries, blanks around each taken off, as
// torchrun splits it for --virtual-local-rank; nullopt when it is unset.
std::optional<std::vector<std::string>> visible_device_entries() {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  if (visible == nullptr) return std::nullopt;
  std::vector<std::string> entries;
  for (const auto& entry : comma_list(visible)) {
    if (auto bare = trimmed(entry, " \t"); !bare.empty()) entries.push_back(std::move(bare));
  }
  return entries;
}

int ranks_per_node(const std::string& value) {
  if (value == "cpu") return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (value == "gpu" || value == "auto") {
    const int gpus = visible_gpus();
    if (value == "gpu" && gpus == 0) throw usage_error("--nproc-per-node gpu: no GPU is visible");
    return gpus > 0 ? gpus : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }
  // A count as Python's int() reads it, blanks around it taken off, as
  // torchrun takes it; cpu, gpu and auto above are compared whole, as there.
  const std::string digits = trimmed(value);
  std::size_t used = 0;
  long long n = 0;
  bool too_big = false;
  try {
    n = std::stoll(digits, &used);
  } catch (const std::out_of_range&) {
    too_big = digits.find_first_not_of("+0123456789") == std::string::npos;
  } catch (const std::exception&) {
  }
  if (!too_big && (used != digits.size() || n < 1)) {
    throw usage_error(fmt::format("--nproc-per-node: '{}' is not a positive number, cpu, gpu or auto", value));
  }
  // Refused before any rank's environment is made: a count of a billion
  // would take gigabytes first, and could never all run.
  const long pids = cohort::os::pid_max();
  if (too_big || n > std::numeric_limits<int>::max() || (pids > 0 && n > pids)) {
    throw usage_error(fmt::format("--nproc-per-node: {} ranks are more than this system can run (pid_max {})",
                                  value.size() > 24 ? value.substr(0, 20) + "..." : value, pids));
  }
  return static_cast<int>(n);
}

// A --redirects/--tee value: 0-3 for every rank, or per local rank as
// "0:3,1:0" (ranks not named get 0), as torchrun takes it.
cohort::streams_per_rank streams_of(const std::string& flag, const std::string& value) {
  const auto number = [&](const std::string& given) {
    const std::string text = trimmed(given);  // torchrun's int() takes blanks around a number
    if (text.size() != 1 || text[0] < '0' || text[0] > '3') {
      throw usage_error(fmt::format("--{}: '{}' is not 0-3 or rank:0-3,...", flag, value));
    }
    return static_cast<cohort::std_streams>(text[0] - '0');
  };
  if (value.find(':') == std::string::npos) return number(value);
  std::map<int, cohort::std_streams> ranks;
  for (const auto& item : comma_items(value)) {  // an empty item is refused, as torchrun's pattern does
    const auto colon = item.find(':');
    int rank = -1;
    bool whole = false;  // the rank is all there is before the colon, blanks aside
    try {
      const std::string bare = trimmed(item.substr(0, colon));
      std::size_t used = 0;
      rank = std::stoi(bare, &used);
      whole = used == bare.size();
    } catch (const std::exception&) {
    }
    if (colon == std::string::npos || !whole || rank < 0) {
      throw usage_error(fmt::format("--{}: '{}' is not 0-3 or rank:0-3,...", flag, value));
    }
    ranks[rank] = number(item.substr(colon + 1));
  }
  return ranks;
}

// Random bits for names that runs must not share. They come from
// getrandom, not from std::random_device, whose start alone took 26 us
// here, a hundredth of a whole run of /bin/true; where getrandom gives
// none, the clock's nanoseconds mixed with the pid still tell apart two
// runs started within the same second.
std::uint64_t random_bits() {
  std::uint64_t bits = 0;
  if (::getrandom(&bits, sizeof bits, GRND_NONBLOCK) != static_cast<ssize_t>(sizeof bits)) {
    bits = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
           (static_cast<std::uint64_t>(::getpid()) * 2654435761U);
  }
  return bits;
}

// A run id of its own for every run, so that two runs' logs never meet:
// the time, then 32 random bits.
std::string fresh_run_id() {
  const auto random = static_cast<std::uint32_t>(random_bits());
  const auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm local{};
  ::localtime_r(&now, &local);
  return fmt::format("{:%Y%m%d-%H%M%S}-{:08x}", local, random);
}

std::string host_name() {
  char name[256]{};
  return ::gethostname(name, sizeof name - 1) == 0 ? name : "?";
}

// This node's name as torchrun publishes it where --local-addr is not
// given, Python's socket.getfqdn(): the host name's first address (as it
// is where the name is an IPv4 or IPv6 address), looked up backwards; of
// the name found there and its aliases, the first with a dot, else that
// name. Where either lookup fails, the host name. A host name that leads
// to a loopback address gives that address's name, often localhost, as
// under torchrun. Both lookups block, as Python's do.
std::string qualified_host_name() {
  const std::string name = host_name();
  sockaddr_storage address{};
  auto& v4 = reinterpret_cast<sockaddr_in&>(address);
  auto& v6 = reinterpret_cast<sockaddr_in6&>(address);
  if (::inet_pton(AF_INET, name.c_str(), &v4.sin_addr) == 1) {
    address.ss_family = AF_INET;
  } else if (name.find('%') == std::string::npos && ::inet_pton(AF_INET6, name.c_str(), &v6.sin6_addr) == 1) {
    address.ss_family = AF_INET6;
  } else {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    addrinfo* found = nullptr;
    if (::getaddrinfo(name.c_str(), nullptr, &hints, &found) != 0) return name;
    std::memcpy(&address, found->ai_addr, std::min<std::size_t>(found->ai_addrlen, sizeof address));
    ::freeaddrinfo(found);
  }
  const int family = address.ss_family;
  if (family != AF_INET && family != AF_INET6) return name;
  const void* bytes = family == AF_INET ? static_cast<const void*>(&v4.sin_addr) : &v6.sin6_addr;
  const socklen_t size = family == AF_INET ? sizeof v4.sin_addr : sizeof v6.sin6_addr;
  hostent entry{};
  hostent* host = nullptr;
  int error = 0;
  // Python's buffer: an answer that does not fit fails the lookup there too.
  char buffer[16384];
  ::gethostbyaddr_r(bytes, size, family, &entry, buffer, sizeof buffer - 1, &host, &error);
  if (host == nullptr || host->h_addrtype != family) return name;
  const auto dotted = [](const char* n) { return std::strchr(n, '.') != nullptr; };
  if (dotted(host->h_name)) return host->h_name;
  for (char** alias = host->h_aliases; *alias != nullptr; ++alias) {
    if (dotted(*alias)) return *alias;
  }
  return host->h_name;
}

// The exit code cohort-run gives for a rank's status: its code, or
// 128 + the signal that killed it.
int exit_code_of(const cohort::exit_status& status) {
  const int code = status.shell_code();
  return code == 0 ? 1 : code;
}

// Where this node stands in the job for one attempt.
struct placement {
  int node_rank = 0;
  int nnodes = 1;
  int world_size = 1;
  int first_rank = 0;
  std::string master_addr;
  int master_port = 0;
};

// torchrun's environment contract, the part every local rank shares: set
// once on the spec's options rather than copied into each rank's map.
std::map<std::string, std::string> shared_contract(const run_options& o, const placement& p, int nproc, int restarts,
                                                   const std::string& run_id) {
  const auto inherited = [](const char* name, const char* otherwise) {
    const char* value = std::getenv(name);
    return std::string(value != nullptr ? value : otherwise);
  };
  return {
      {"WORLD_SIZE", std::to_string(p.world_size)},
      {"LOCAL_WORLD_SIZE", std::to_string(nproc)},
      {"GROUP_RANK", std::to_string(p.node_rank)},
      {"GROUP_WORLD_SIZE", std::to_string(p.nnodes)},
      {"ROLE_WORLD_SIZE", std::to_string(p.world_size)},
      {"ROLE_NAME", o.role},
      {"MASTER_ADDR", p.master_addr},
      {"MASTER_PORT", std::to_string(p.master_port)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(restarts)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(o.max_restarts)},
      {"TORCHELASTIC_RUN_ID", run_id},
      // The workers host their own store at MASTER_ADDR:MASTER_PORT.
      {"TORCHELASTIC_USE_AGENT_STORE", "False"},
      {"TORCH_NCCL_ASYNC_ERROR_HANDLING", inherited("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")},
  };
}

// --log-dir /dev/null (Python's os.devnull, named exactly so), which
// torchrun's logs specs take for no files at all: no folder, no log file
// and no error file.
bool no_log_files(const run_options& o) { return o.log_dir == "/dev/null"; }

// torchrun's environment contract, the part that is local rank `local`'s own.
std::map<std::string, std::string> rank_contract(const run_options& o, const placement& p, int local) {
  const int rank = p.first_rank + local;
  auto variables = std::map<std::string, std::string>{
      {"RANK", std::to_string(rank)},
      {"LOCAL_RANK", std::to_string(local)},
      {"ROLE_RANK", std::to_string(rank)},
  };
  if (no_log_files(o)) {
    // No error file either, as torchrun sets TORCHELASTIC_ERROR_FILE=""
    // then: a rank writes its report nowhere, and nothing is kept of it.
    variables["TORCHELASTIC_ERROR_FILE"] = "";
    variables["COHORT_ERROR_FILE"] = "";
  }
  if (o.virtual_local_rank) {  // each rank sees its own GPU, as device 0
    variables["LOCAL_RANK"] = "0";
    const auto gpus = visible_device_entries();
    variables["CUDA_VISIBLE_DEVICES"] = gpus ? gpus->at(static_cast<std::size_t>(local)) : std::to_string(local);
  }
  return variables;
}

// Under --virtual-local-rank every local rank needs an entry of
// CUDA_VISIBLE_DEVICES, when it is set, as torchrun requires.
void check_virtual_local_ranks(const run_options& o, int nproc) {
  if (!o.virtual_local_rank) return;
  const auto gpus = visible_device_entries();
  if (gpus && gpus->size() < static_cast<std::size_t>(nproc)) {
    throw usage_error(fmt::format("--virtual-local-rank: {} local ranks, and CUDA_VISIBLE_DEVICES='{}' names {} device{}",
                                  nproc, std::getenv("CUDA_VISIBLE_DEVICES"), gpus->size(), gpus->size() == 1 ? "" : "s"));
  }
}

// A folder of its own, $TMPDIR/<prefix>XXXXXX; empty, with `ec` set, when
// none can be made. $TMPDIR unset, missing or not writable, the folder is
// made where torchrun's Python would make it (/tmp, ...), without a word.
fs::path fresh_temp_folder(const std::string& prefix, std::error_code& ec) {
  std::string pattern = (cohort::os::temp_directory(ec) / (prefix + "XXXXXX")).string();
  if (ec) return {};
  if (::mkdtemp(pattern.data()) == nullptr) {
    ec.assign(errno, std::system_category());
    return {};
  }
  return pattern;
}

// The run's folder under the log dir, named as torchrun names it (Python's
// mkdtemp, the run id and '_' before it): <run-id>_ and 8 characters of
// a-z, 0-9 and '_', made with mode 0700. Made here, so that runs started
// with one id (the nodes of a job, on a shared file system) never share
// one; without --log-dir, the logs' fresh folder holds it. The folders
// this call makes (those of --log-dir that were not there, then the run's)
// are added to `made`, in the order made, as each is made. Throws
// std::runtime_error naming the --log-dir given where it, or the run's
// folder in it, cannot be made: the run ends before anything starts, with
// no folder for its result.json.
std::string log_folder(const run_options& o, const std::string& run_id, std::vector<fs::path>& made) {
  static constexpr std::string_view characters = "abcdefghijklmnopqrstuvwxyz0123456789_";
  const auto fresh_name = [&run_id] {
    auto bits = random_bits();
    std::string name = run_id + "_";
    for (int i = 0; i < 8; ++i, bits >>= 8) name += characters[(bits & 0xff) % characters.size()];
    return name;
  };
  if (o.log_dir.empty()) return fresh_name();
  const auto unusable = [&o](const char* what, const std::error_code& ec) {
    return std::runtime_error(fmt::format("--log-dir {}: {} could not be made: {}", o.log_dir, what, ec.message()));
  };
  // One folder at a time, as create_directories makes them, so that those
  // made here are known: only those are removed where the run ends before
  // it starts.
  fs::path above;
  for (const auto& part : fs::path(o.log_dir)) {
    above /= part;
    if (part.empty()) continue;  // a trailing '/'
    if (::mkdir(above.c_str(), 0777) == 0) {
      made.push_back(above);
    } else if (errno != EEXIST) {
      throw unusable("the folder", std::error_code(errno, std::system_category()));
    }
  }
  for (int tries = 0;; ++tries) {
    auto folder = fresh_name();
    const auto path = fs::path(o.log_dir) / folder;
    if (::mkdir(path.c_str(), 0700) == 0) {
      made.push_back(path);
      return folder;
    }
    if (errno != EEXIST || tries == 100) {
      throw unusable("the run's folder in it", std::error_code(errno, std::system_category()));
    }
  }
}

// The ranks' logs from the flags, checked before the run's folder under the
// log dir is made (log_folder). Files are asked for without --log-dir: a
// fresh folder in $TMPDIR, as torchrun makes one. The folders made here
// (that one, or --log-dir's and the run's in it) are added to `made`.
cohort::logs_spec logs_of(const run_options& o, int nproc, const std::string& run_id, std::vector<fs::path>& made) {
  cohort::logs_spec logs;
  logs.redirects = streams_of("redirects", o.redirects);
  logs.tee = streams_of("tee", o.tee);
  if (no_log_files(o)) {
    // Checked all the same; with no file to write, every stream reaches
    // the console as it would without them, as under torchrun.
    logs.redirects = {};
    logs.tee = {};
  } else {
    logs.run_id = log_folder(o, run_id, made);
  }
  logs.tee_through_pipes = o.tee_through_pipes;
  logs.prefix = o.log_line_prefix_template;
  // Local ranks past this node's are left out, as torchrun leaves them
  // (one command line may serve nodes with fewer ranks), and said.
  const auto beyond = [nproc](const char* flag, int rank) {
    say("cohort-run: {} names local rank {}; there are {} here: left out\n", flag, rank, nproc);
  };
  for (const auto& [flag, per_rank] : {std::pair{"--redirects", &logs.redirects.ranks}, std::pair{"--tee", &logs.tee.ranks}}) {
    std::erase_if(*per_rank, [&, flag = flag](const auto& entry) {
      if (entry.first < nproc) return false;
      beyond(flag, entry.first);
      return true;
    });
  }
  if (!o.local_ranks_filter.empty()) {
    logs.console_ranks.emplace();
    for (int rank : o.local_ranks_filter) {
      if (rank < nproc) logs.console_ranks->insert(rank);
      else beyond("--local-ranks-filter", rank);
    }
  }
  if (!o.log_dir.empty()) {
    if (!no_log_files(o)) logs.dir = o.log_dir;
  } else if (!logs.redirects.empty() || !logs.tee.empty()) {
    std::error_code ec;
    logs.dir = fresh_temp_folder("cohort-run-", ec);
    // A filesystem_error, as for --log-dir: exit 1, where a system_error
    // naming ENOENT or EACCES would read as a program not found (127) or
    // not runnable (126).
    if (ec) throw fs::filesystem_error("making a log folder in $TMPDIR", ec);
    made.push_back(logs.dir);
  }
  return logs;
}

// The colon before an endpoint's port, as torchrun reads host[:port]: npos
// for a host alone, or an IPv6 host alone in brackets.
std::string::size_type port_colon(const std::string& endpoint) {
  const bool bracketed = endpoint.size() > 1 && endpoint.front() == '[' && endpoint.back() == ']';
  return bracketed ? std::string::npos : endpoint.rfind(':');
}

// An endpoint's host, as torchrun reads host[:port] (`colon` is
// port_colon's), brackets around an IPv6 host taken off; its port, 0 to
// 65535, where it names one. Usage errors name --rdzv-endpoint `e`.
struct host_port {
  std::string host;
  std::optional<int> port;
};
// `given` as a host, brackets around an IPv6 address taken off: what
// torchrun's endpoint parser takes for one, a name, an IPv4 or an IPv6
// address, never a host no name or address can be (it would be waited for
// until the join timeout, never resolving). A ':' or a '%' (an IPv6
// zone's, fe80::1%eth0) is an IPv6 address's only: 127.0.0.1:29500 is a
// host with its port, not a host. Usage errors name `flag` and `value`.
std::string checked_host(std::string given, const std::string& flag, const std::string& value) {
  std::string host = std::move(given);
  if (host.size() > 1 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host.empty()) throw usage_error(fmt::format("{} '{}': no host", flag, value));
  const auto not_host = [](unsigned char c) {
    return !std::isalnum(c) && c != '_' && c != '.' && c != ':' && c != '-' && c != '%';
  };
  if (std::ranges::any_of(host, not_host)) {
    throw usage_error(fmt::format("{} '{}': the host is not a host name, an IPv4 or an IPv6 address "
                                  "(letters, digits, '_', '.', ':', '-' and '%')",
                                  flag, value));
  }
  const auto zone = host.find('%');
  if (zone != std::string::npos || host.find(':') != std::string::npos) {
    const std::string address = host.substr(0, zone);
    in6_addr parsed{};
    if (zone + 1 == host.size() || ::inet_pton(AF_INET6, address.c_str(), &parsed) != 1) {
      throw usage_error(fmt::format("{} '{}': the host is not a host name, an IPv4 or an IPv6 address ('{}' holds "
                                    "':' or '%', which only an IPv6 address does; a port goes apart from the host, "
                                    "and an IPv6 address in an endpoint goes in brackets: [addr]:port)",
                                    flag, value, host));
    }
  }
  return host;
}

// --local-addr as a host, blanks around it taken off as around the
// endpoint. torchrun publishes it as given, blanks and all, where the
// other nodes cannot reach it; blanks only are no host.
std::string local_address(const std::string& given) {
  return checked_host(stripped(given), "--local-addr", given);
}

host_port endpoint_parts(const std::string& e) {
  const auto colon = port_colon(e);
  const std::string given_host = e.substr(0, colon);
  // torchrun takes the last ':' for the port's: 2001:db8::5 would be host
  // 2001:db8: and port 5, ::1 host ':' and port 1. (A host that opens a
  // bracket it does not close is checked_host's to refuse.)
  if (colon != std::string::npos && !given_host.starts_with('[') && given_host.find(':') != std::string::npos) {
    throw usage_error(fmt::format("--rdzv-endpoint '{}': an IPv6 address goes in brackets, [addr]:port or [addr] "
                                  "(unbracketed, its last ':' would be taken for the port's)",
                                  e));
  }
  std::string host = checked_host(given_host, "--rdzv-endpoint", e);
  if (colon == std::string::npos) return {std::move(host), std::nullopt};
  // As torchrun reads the port: 1 to 5 digits, nothing else.
  const std::string digits = e.substr(colon + 1);
  int port = 0;
  const bool number = !digits.empty() && digits.size() <= 5 &&
                      std::ranges::all_of(digits, [](unsigned char c) { return std::isdigit(c) != 0; });
  if (number) std::from_chars(digits.data(), digits.data() + digits.size(), port);
  if (!number || port > 65535) {
    throw usage_error(fmt::format("--rdzv-endpoint '{}': the port '{}' is not 0 to 65535", e, digits));
  }
  return {std::move(host), port};
}

// --rdzv-endpoint as the master's address and port, as torchrun reads it:
// host[:port], an IPv6 host in brackets ([::1]:29400, [::1]). The port is
// `default_port` where none is named (nullopt: one is required); port 0,
// any free port, is checked against the node count once Slurm's is known.
void master_from_endpoint(run_options& o, std::optional<int> default_port) {
  const auto& e = o.rdzv_endpoint;
  auto [host, port] = endpoint_parts(e);
  if (!port && !default_port) {
    throw usage_error(fmt::format("--rdzv-endpoint {}: the static rendezvous needs the master's port (host:port)", e));
  }
  o.master_port = port ? *port : *default_port;
  o.master_addr = std::move(host);
  o.master_addr_given = true;
}

// What Slurm, the endpoint and the defaults say of a static job.
placement static_placement(run_options& o, int nproc) {
  const bool c10d = o.rdzv_backend == "c10d";
  if (c10d && o.min_nodes != o.max_nodes) {
    throw usage_error("--rdzv-backend c10d takes a fixed --nnodes N here; for MIN:MAX use --rdzv-backend etcd-v3");
  }
  // The master's host:port, for c10d (29400 when no port is named; port 0,
  // torchrun's localhost:0, picks a free one) and for static, where torchrun
  // takes it before --master-addr and --master-port.
  if (!o.rdzv_endpoint.empty()) {
    master_from_endpoint(o, c10d ? std::optional(29400) : std::nullopt);
  } else if (o.master_addr_given) {
    // Blanks around it taken off, as torchrun strips the endpoint it makes of it.
    o.master_addr = checked_host(trimmed(o.master_addr), "--master-addr", o.master_addr);
  }
  // Only etcd-v3 uses --local-addr; here it is checked all the same, so a
  // command line that names no host there fails on every backend alike.
  if (!o.local_addr.empty()) local_address(o.local_addr);
  // Slurm places the node unless the flags do. c10d's command lines across
  // nodes give --nnodes and leave the node rank to the rendezvous, so there
  // Slurm still gives it. --standalone is one node, whatever Slurm says.
  if (!o.standalone && !o.node_rank_given && (!o.nnodes_given || (c10d && o.max_nodes > 1))) {
    std::optional<slurm_step> step;
    try {
      step = slurm_step_from_environment();
    } catch (const std::invalid_argument& e) {
      throw usage_error(fmt::format("under Slurm: {}", e.what()));
    }
    if (step) {
      if (!o.nnodes_given) o.min_nodes = o.max_nodes = step->nnodes;
      if (step->node_id >= o.max_nodes) {
        throw usage_error(fmt::format("under Slurm: SLURM_NODEID {} is not below --nnodes {}", step->node_id, o.max_nodes));
      }
      o.node_rank = step->node_id;
      o.node_rank_given = true;
      if (o.run_id.empty()) o.run_id = step->job_id;
      if (!o.master_addr_given) {
        o.master_addr = checked_host(step->first_host, fmt::format("under Slurm: {}", step->nodelist_name),
                                     step->first_host);
      }
    }
  }
  // Checked once Slurm's node count is known, as the flags': a free port
  // on each node would be no master's the others could find.
  if (!o.rdzv_endpoint.empty() && o.master_port == 0 && o.max_nodes > 1) {
    throw usage_error(fmt::format("--rdzv-endpoint {}: port 0 (any free port) serves one node only, and the job has {} "
                                  "nodes; give the master's port",
                                  o.rdzv_endpoint, o.max_nodes));
  }
  if (o.min_nodes != o.max_nodes) {
    throw usage_error(fmt::format("--nnodes {}:{} needs a rendezvous: --rdzv-backend etcd-v3", o.min_nodes, o.max_nodes));
  }
  // No rendezvous tells the other nodes of a restart: they would run on in
  // the attempt that ended, and the restarted ranks join a world that is
  // gone.
  if (o.max_restarts > 0 && o.max_nodes > 1) {
    throw usage_error(fmt::format("--max-restarts {} across {} nodes needs --rdzv-backend etcd-v3: under {}, a "
                                  "restart would reach only this node's ranks",
                                  o.max_restarts, o.max_nodes, o.rdzv_backend));
  }
  // torchrun's c10d rendezvous hands out the node ranks, so its command
  // lines, the same on every node, name none: every node would be node 0.
  if (c10d && o.max_nodes > 1 && !o.node_rank_given) {
    throw usage_error(fmt::format("--rdzv-backend c10d across {} nodes: give each node its --node-rank (no c10d "
                                  "rendezvous runs here to hand them out), run under Slurm's srun, or use "
                                  "--rdzv-backend etcd-v3",
                                  o.max_nodes));
  }
  if (o.node_rank >= o.max_nodes) {
    throw usage_error(fmt::format("--node-rank {} is not below --nnodes {}", o.node_rank, o.max_nodes));
  }
  if (o.master_port == 0) o.master_port = o.max_nodes == 1 ? free_port() : 29500;
  return {o.node_rank, o.max_nodes, o.max_nodes * nproc, o.node_rank * nproc, o.master_addr, o.master_port};
}

// One key=value of --rdzv-conf.
struct conf_item {
  std::string key;
  std::string value;
};

// --rdzv-conf's items, as torchrun's parser reads them: blanks around the
// whole, and around each key and value, are taken off, so a list written
// "join_timeout=5, last_call_timeout=3" names last_call_timeout. An item
// that is no key=value, or gives no key or no value (an empty item, as in
// "a=1,,b=2", too), is a usage error: torchrun refuses it as well.
std::vector<conf_item> conf_items(const std::string& conf) {
  std::vector<conf_item> items;
  for (const auto& item : comma_items(trimmed(conf))) {
    const auto eq = item.find('=');
    if (eq == std::string::npos && !trimmed(item).empty()) {
      throw usage_error(fmt::format("--rdzv-conf: '{}' is not key=value", item));
    }
    std::string key = trimmed(item.substr(0, eq));
    if (key.empty()) {
      throw usage_error(fmt::format("--rdzv-conf '{}': an item has no key (give key=value items, one comma between "
                                    "two)",
                                    conf));
    }
    std::string value = trimmed(item.substr(eq + 1));
    if (value.empty()) throw usage_error(fmt::format("--rdzv-conf: '{}' gives {} no value", item, key));
    items.push_back({std::move(key), std::move(value)});
  }
  return items;
}

double conf_seconds(const std::string& key, const std::string& value) {
  // Counted in milliseconds: less than one would be none.
  return seconds("--rdzv-conf " + key, value, 0.001, 1e6, "0.001 to 1e6");
}

std::chrono::milliseconds millis(double seconds) {
  return std::chrono::milliseconds(static_cast<long long>(seconds * 1000));
}

// --rdzv-conf and the flags, as the etcd rendezvous takes them.
rendezvous_config etcd_config(const run_options& o, int nproc, const std::string& run_id) {
  if (o.rdzv_endpoint.empty()) throw usage_error("--rdzv-backend etcd-v3 needs --rdzv-endpoint host:port (etcd's client URL)");
  rendezvous_config c;
  c.endpoint = o.rdzv_endpoint;
  // The client speaks plain HTTP: a TLS endpoint is refused, not spoken to
  // in the clear.
  if (c.endpoint.rfind("https://", 0) == 0) {
    throw usage_error(fmt::format("--rdzv-endpoint {}: etcd over TLS (https) is not supported; give an http endpoint",
                                  o.rdzv_endpoint));
  }
  if (c.endpoint.rfind("http://", 0) == 0) c.endpoint.erase(0, std::string_view("http://").size());
  // Checked here: etcd's client would take a host or port no endpoint has
  // for etcd unreachable, and try it until join_timeout.
  const auto port = endpoint_parts(c.endpoint).port;
  if (port == 0) {
    throw usage_error(fmt::format("--rdzv-endpoint {}: port 0 is no etcd's; give etcd's client port", o.rdzv_endpoint));
  }
  // etcd's client port where none is named, as torchrun's etcd rendezvous
  // takes it (host, [v6 host]).
  if (!port) c.endpoint += ":2379";
  c.run_id = run_id;
  c.min_nodes = o.min_nodes;
  c.max_nodes = o.max_nodes;
  c.nproc = nproc;
  c.local_addr = o.local_addr.empty() ? qualified_host_name() : local_address(o.local_addr);
  c.local_port = o.master_port;  // 0: a free one at each round
  c.poll_interval = std::max(millis(o.monitor_interval), std::chrono::milliseconds(10));
  double keep_alive_interval = 1, keep_alive_max_attempt = 3;
  for (const auto& [key, value] : conf_items(o.rdzv_conf)) {
    if (key == "join_timeout" || key == "timeout") {
      c.join_timeout = millis(conf_seconds(key, value));
    } else if (key == "last_call_timeout") {
      c.last_call_timeout = millis(conf_seconds(key, value));
    } else if (key == "keep_alive_interval") {
      keep_alive_interval = conf_seconds(key, value);
    } else if (key == "keep_alive_max_attempt") {
      keep_alive_max_attempt = whole_number("--rdzv-conf keep_alive_max_attempt", value, 1);
    } else if (key == "read_timeout") {
      c.request_timeout = millis(conf_seconds(key, value));
    } else if (key == "close_timeout" || key == "is_host" || key == "use_libuv" || key == "store_type") {
      // c10d's; nothing to do with etcd.
    } else if (key == "protocol") {
      if (value != "http") throw usage_error(fmt::format("--rdzv-conf protocol={}: etcd is reached over http only", value));
    } else {
      throw usage_error(fmt::format("--rdzv-conf: no key '{}' (join_timeout, last_call_timeout, keep_alive_interval, "
                                    "keep_alive_max_attempt, read_timeout)",
                                    key));
    }
  }
  c.lease_ttl = millis(std::max(1.0, keep_alive_interval * keep_alive_max_attempt));
  return c;
}

// The longest a node of a static job waits at the exchange of rank counts:
// --rdzv-conf's join_timeout (or timeout), as torchrun's rendezvous takes
// it; 600 s when not given. Its other keys are etcd's and c10d's, taken
// and left alone; a key no backend has is refused, as a misspelt
// join_timeout would otherwise leave the wait at 600 s. Under c10d, a
// store_type that torchrun's c10d backend has no store for is refused, as
// it refuses it.
std::chrono::milliseconds static_join_timeout(const run_options& o) {
  std::chrono::milliseconds timeout = std::chrono::seconds(600);
  for (const auto& [key, value] : conf_items(o.rdzv_conf)) {
    if (key == "join_timeout" || key == "timeout") {
      timeout = millis(conf_seconds(key, value));
    } else if (key == "store_type") {
      std::string type = value;
      std::ranges::transform(type, type.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
      if (o.rdzv_backend == "c10d" && type != "tcp" && type != "file") {
        throw usage_error(fmt::format("--rdzv-conf store_type={}: c10d's store is tcp or file", value));
      }
    } else if (key != "last_call_timeout" && key != "keep_alive_interval" && key != "keep_alive_max_attempt" &&
               key != "read_timeout" && key != "close_timeout" && key != "is_host" && key != "use_libuv" &&
               key != "protocol") {
      throw usage_error(fmt::format("--rdzv-conf: no key '{}' (join_timeout, the wait of a node for the others)", key));
    }
  }
  return timeout;
}

// Sets the world of a static job across nodes from each node's rank count,
// by node rank, as torchrun's agents number their workers: node k's ranks
// follow those of the nodes before it. Throws node_sizes_error when the
// sum does not fit.
void place_by_sizes(placement& p, const std::vector<int>& sizes) {
  long long world = 0, first = 0;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    if (static_cast<int>(k) == p.node_rank) first = world;
    world += sizes[k];
  }
  if (world > std::numeric_limits<int>::max()) {
    throw node_sizes_error(fmt::format("the nodes run {} ranks between them: more than a world can hold", world));
  }
  p.world_size = static_cast<int>(world);
  p.first_rank = static_cast<int>(first);
}

// Copies the rank's error file at `from` to `to`, made or emptied. The
// rank chose what lies at `from`: it is opened without blocking, a link
// followed as the group's reader follows it, and only a regular file is
// copied. Returns false with `ec` clear when there is none (nothing, a
// dangling link, a FIFO, a directory, a device: passed over, as the group
// passed it over), and false with `ec` set when it could not be copied
// whole.
bool copy_error_file(const fs::path& from, const fs::path& to, std::error_code& ec) {
  ec.clear();
  const cohort::os::owned_fd in(::open(from.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
  struct stat st{};
  if (in.get() < 0) {
    if (errno != ENOENT && errno != ELOOP && errno != ENXIO && errno != ENOTDIR) ec.assign(errno, std::system_category());
    return false;
  }
  if (::fstat(in.get(), &st) != 0) {
    ec.assign(errno, std::system_category());
    return false;
  }
  if (!S_ISREG(st.st_mode)) return false;
  const cohort::os::owned_fd out(::open(to.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  if (out.get() < 0) {
    ec.assign(errno, std::system_category());
    return false;
  }
  char buffer[64 * 1024];
  for (;;) {
    const ssize_t n = ::read(in.get(), buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n < 0) ec.assign(errno, std::system_category());
      return n == 0;
    }
    if (!cohort::os::write_all(out.get(), std::string_view(buffer, static_cast<std::size_t>(n)))) {
      ec.assign(errno, std::system_category());
      return false;
    }
  }
}

// Without a log folder, the ranks' error files are in the group's private
// folder, which goes with the group. Those of failed ranks are copied here
// first ($TMPDIR/cohort-run-errors-XXXXXX/attempt_<k>/<rank>/error.json),
// kept when the run failed, so that the summary can name them, and removed
// otherwise. (Made only when a rank failed: a folder per rank made at every
// start costs a run of /bin/true a tenth more.)
struct error_folder {
  fs::path path;
  bool keep = false;

  // A file that cannot be kept (a full disk) is named as none, with a line
  // that says why: the group's goes with it, and a part of a copy is no
  // report. So is anything at the path but a regular file, without a line:
  // the rank left no report there. The rank's message and trace are still
  // in `r`.
  void take(cohort::run_result& r, int attempt) {
    for (auto& f : r.failures) {
      std::error_code ec;
      if (f.error_file.empty() || !fs::is_regular_file(fs::status(f.error_file, ec))) {
        f.error_file.clear();
        continue;
      }
      if (path.empty()) path = fresh_temp_folder("cohort-run-errors-", ec);
      fs::path kept;
      if (!ec) {
        kept = path / fmt::format("attempt_{}", attempt) / std::to_string(f.rank) / "error.json";
        fs::create_directories(kept.parent_path(), ec);
      }
      if (!ec && copy_error_file(f.error_file, kept, ec)) {
        f.error_file = kept;
        continue;
      }
      // No error: replaced by something else since it was looked at, and
      // passed over as that.
      if (ec) {
        say("cohort-run: rank {}'s error file could not be kept{}: {}\n", f.rank,
            kept.empty() ? std::string() : " as " + kept.string(), ec.message());
      }
      // What was made for it goes, the folders where they hold nothing else
      // (a folder that is not empty is not removed).
      std::error_code ignored;
      if (!kept.empty()) {
        fs::remove(kept, ignored);
        fs::remove(kept.parent_path(), ignored);
        fs::remove(kept.parent_path().parent_path(), ignored);
      }
      if (!path.empty() && fs::remove(path, ignored)) path.clear();
      f.error_file.clear();
    }
  }
  ~error_folder() {
    std::error_code ec;
    if (!path.empty() && !keep) fs::remove_all(path, ec);
  }
};

// The folders a run made for its logs (the fresh one in $TMPDIR, or the
// run's own under --log-dir and those of --log-dir that were not there),
// in the order made, removed where the run ends before its first attempt
// (a set-up that failed, a shutdown signal, an exception) and they are
// still empty: no folder is left behind, and result.json names none.
struct made_log_folders {
  std::vector<fs::path> paths;
  run_record& record;

  ~made_log_folders() {
    if (paths.empty() || !record.attempts.empty()) return;
    // The last one made first: a folder that holds anything fails, and
    // stays, and so do those above it.
    std::error_code ec;
    if (!fs::remove(paths.back(), ec)) return;
    record.log_dir.clear();
    for (auto it = std::next(paths.rbegin()); it != paths.rend(); ++it) {
      if (!fs::remove(*it, ec)) return;
    }
  }
};

void write_results(const run_options& o, const run_record& record) {
  std::vector<fs::path> files;
  if (!o.result_json.empty()) files.emplace_back(o.result_json);
  if (!o.log_dir.empty() && !record.log_dir.empty()) files.push_back(record.log_dir / "result.json");
  if (files.empty()) return;  // nothing asked for it
  const auto text = result_json(record);
  for (const auto& file : files) {
    std::error_code ec;
    if (file.has_parent_path()) fs::create_directories(file.parent_path(), ec);
    // Whole or not at all: a reader never finds part of it. Where it could
    // not be written, an earlier run's file there goes, so that none is
    // read as this run's.
    if (cohort::os::replace_file(file, text)) continue;
    const int error = errno;
    // Only a file replace_file would have renamed over: not another
    // user's, nor a link of several.
    const bool stale = cohort::os::replaced_by_rename(file) && fs::remove(file, ec);
    say("cohort-run: writing {} failed: {}{}{}\n", file.string(), std::strerror(error),
        cohort::os::file_size_limit_note(error), stale ? "; the earlier file there was removed" : "");
  }
}

// One attempt of this node's ranks, until they end or `rdzv` ends the round
// (then `ended_by` says why).
attempt_record run_attempt(cohort::group_spec& spec, signal_owner& signals, etcd_rendezvous* rdzv,
                           std::optional<round_change>& ended_by, error_folder& errors, file_timer_server* timer) {
  attempt_record a;
  a.started = std::chrono::system_clock::now();
  const auto began = std::chrono::steady_clock::now();
  // On asio's reactor, without a ring: the ranks' exits reach it as soon
  // (bench/exit_latency), and a ring's set-up and teardown are saved
  // (cohort-run -n K -- /bin/true, 40-400 alternating runs of builds with
  // and without: K = 1 0.966x, K = 8 0.984-0.994x, K = 32 1.001x, K = 128
  // 0.992x).
  asio::io_context io;
  cohort::use_reactor_only(io);
  std::optional<cohort::run_result> result;
  std::exception_ptr failure;
  std::vector<std::thread> helpers;
  std::mutex ended_mutex;
  // The io_context runs on this thread alone, which gives teed lines the
  // lowest latency, until the ranks write faster than one thread turns
  // their output into lines: the pumps then copy on a second thread too.
  spec.logs.on_busy = [&io, &helpers]() noexcept {
    try {
      for (unsigned i = 1; i < std::min(2u, std::thread::hardware_concurrency()); ++i) helpers.emplace_back([&io] { io.run(); });
    } catch (const std::system_error&) {  // no thread: the pumps copy on this one alone
    }
  };
  struct forget_on_busy {  // it names this attempt's io_context
    cohort::group_spec& spec;
    ~forget_on_busy() { spec.logs.on_busy = nullptr; }
  } forget{spec};
  asio::co_spawn(io, [&]() -> asio::awaitable<void> {
    // Their file timers' signals reach them, and what they start, until
    // they have ended; a rank's timer that expires before the start has
    // named the ranks waits for it.
    struct watched {
      file_timer_server* timer;
      ~watched() {
        if (timer != nullptr) timer->watch({});
      }
    } watch{timer};
    if (timer != nullptr) timer->starting();
    // The descriptor the group's signals are read from is had before the
    // start: where the limit leaves none for it, no rank has run.
    signals.prepare_attach();
    auto g = co_await cohort::start_processes(spec);
    // Signals reach the group until it has ended; one that came during the
    // start reaches it now.
    struct attached {
      signal_owner& signals;
      attached(signal_owner& s, cohort::group& g, const asio::any_io_executor& ex) : signals(s) { signals.attach(g, ex); }
      ~attached() { signals.detach(); }
    } attach{signals, g, co_await asio::this_coro::executor};
    a.pids = g.pids();
    if (timer != nullptr) timer->watch(a.pids);
    if (rdzv != nullptr) {
      rdzv->watch([&, group = &g](const round_change& change) {
        {
          std::lock_guard lock(ended_mutex);
          ended_by = change;
        }
        group->stop();
      });
    }
    try {
      result = co_await g.wait();
    } catch (...) {
      if (rdzv != nullptr) rdzv->unwatch();
      throw;
    }
    if (rdzv != nullptr) rdzv->unwatch();  // before the group goes: the watcher stops it
    if (spec.logs.dir.empty()) errors.take(*result, spec.logs.attempt);  // before they go with the group
  }, [&](std::exception_ptr e) { failure = e; });
  io.run();
  for (auto& t : helpers) t.join();
  if (failure) std::rethrow_exception(failure);
  a.result = std::move(*result);
  a.lasted = std::chrono::steady_clock::now() - began;
  return a;
}

// Tells the rendezvous how this node's attempt ended (`what` says it for
// the message). Best effort: the node's outcome stands when etcd cannot
// hear it, and the other nodes learn of its end from its lease.
template <class F>
void tell_rendezvous(const char* what, F&& tell) {
  try {
    tell();
  } catch (const std::exception& e) {
    say("cohort-run: could not {} at the rendezvous: {}\n", what, e.what());
  }
}

// The attempts of a run, under a guardian.
int run_attempts(run_options& o, run_record& record, const std::vector<std::string>& command, signal_owner& signals) {
  const int nproc = ranks_per_node(o.nproc_per_node);
  check_virtual_local_ranks(o, nproc);
  const bool elastic = o.rdzv_backend.rfind("etcd", 0) == 0;
  std::optional<placement> fixed;
  if (!elastic) {
    fixed = static_placement(o, nproc);
    // Across nodes, torchrun's default (--rdzv-id none): the same on every node.
    if (o.run_id.empty() && fixed->nnodes > 1) o.run_id = "none";
  } else if (o.run_id.empty()) {  // every node must name the same job
    const char* job = std::getenv("SLURM_JOB_ID");
    o.run_id = job != nullptr && *job != '\0' ? job : "none";
  }
  check_run_id(o.run_id, "SLURM_JOB_ID");  // --run-id was checked with the flags: only Slurm's may be left
  const std::string run_id = o.run_id.empty() ? fresh_run_id() : o.run_id;
  record.run_id = run_id;
  record.role = o.role;
  record.host = host_name();
  record.rdzv_backend = elastic ? "etcd-v3" : o.rdzv_backend;
  record.max_restarts = o.max_restarts;

  // Every flag is checked before anything is made: a usage error leaves no
  // folder behind and says nothing of logs.
  std::optional<etcd_rendezvous> rdzv;
  if (elastic) rdzv.emplace(etcd_config(o, nproc, run_id));
  // The nodes of a static job tell node 0 how many ranks each runs, unless
  // the job says every node runs as many (as torchrun's fast path).
  const char* identical = std::getenv("TORCH_ELASTIC_WORKER_IDENTICAL");
  const bool exchange_sizes =
      fixed && fixed->nnodes > 1 && (identical == nullptr || std::string_view(identical) != "1");
  // Read on every node that does not meet through etcd, one alone too: a
  // bad --rdzv-conf is refused wherever the command line runs first.
  const auto join_timeout = elastic ? std::chrono::milliseconds(0) : static_join_timeout(o);

  error_folder errors;
  const auto finish = [&](const char* outcome, int code, std::string message = {}) {
    record.outcome = outcome;
    record.exit_code = code;
    record.message = std::move(message);
    const bool failures = !record.attempts.empty() && !record.attempts.back().result.failures.empty();
    if ((record.outcome == "failed" || failures) && !errors.path.empty()) {
      errors.keep = true;
      record.error_dir = errors.path;
    }
    return code;
  };
  // A shutdown signal that came while no group ran: the run ends before
  // another attempt.
  const auto interrupted_between = [&](int sig, int attempt) {
    say("cohort-run: interrupted by {} (run {}) before attempt {}: no rank was running\n", cohort::signal_name(sig),
        run_id, attempt);
    return finish("interrupted", 128 + sig, fmt::format("{} received", cohort::signal_name(sig)));
  };
  // A shutdown signal during the checks (a python3 slow to say whether it
  // finds torch): the run ends before anything is made.
  if (const auto sig = signals.interrupted()) return interrupted_between(*sig, 0);

  cohort::group_spec spec;
  made_log_folders made{{}, record};
  spec.logs = logs_of(o, nproc, run_id, made.paths);
  if (!spec.logs.dir.empty()) {
    // Named absolute in result.json (the folder itself is made and used by
    // the path as given, which needs no search of the directories above).
    std::error_code ec;
    record.log_dir = spec.logs.dir / spec.logs.run_id;
    if (auto absolute = fs::absolute(record.log_dir, ec); !ec) record.log_dir = std::move(absolute);
  }
  if (o.logs_specs.size() > 0) {
    say("cohort-run: --logs-specs {}: torchrun's logs specs are Python plugins; the logs follow --log-dir\n",
        o.logs_specs);
  }
  if (!o.duplicate_stdout_filters.empty() || !o.duplicate_stderr_filters.empty()) {
    say("cohort-run: --duplicate-stdout/stderr-filters are not applied: every line is in the console "
        "and the log files\n");
  }
  spec.name = o.role;
  spec.nprocs = nproc;
  if (names_local_rank(command)) {  // torchrun's ${local_rank}: each rank's own arguments
    spec.entry = cohort::command(command.front(), {});
    for (int local = 0; local < nproc; ++local) {
      auto own = with_local_rank(command, local);
      spec.args[local] = std::vector<std::string>(own.begin() + 1, own.end());
    }
  } else {
    spec.entry = cohort::command(command.front(), std::vector<std::string>(command.begin() + 1, command.end()));
  }
  if (raise_fd_limit(nproc)) {
    spec.options.before_exec = &restore_fd_limit;
    spec.options.before_exec_context = &given_fd_limit;
  }
  spec.shutdown.term_grace = std::chrono::milliseconds(static_cast<long long>(o.grace_period * 1000));
  // Each rank in a session of its own, as torchrun starts its workers: a
  // rank that reads the terminal (a debugger's prompt, input()) is not
  // stopped as a background job would be.
  spec.options.new_session = true;
  if (nproc > 1 && std::getenv("OMP_NUM_THREADS") == nullptr) {
    spec.options.env.set("OMP_NUM_THREADS", "1");
    say("cohort-run: OMP_NUM_THREADS is set to 1 for each of the {} ranks; set it to tune\n", nproc);
  }
  // torchrun's file-timer watchdog, when the environment asks for it.
  std::optional<file_timer_server> timer;
  try {
    if (const auto path = file_timer_path_from_environment()) timer.emplace(*path);
  } catch (const std::system_error& e) {
    say("cohort-run: {}\n", e.what());
    return finish("failed", 1, e.what());
  }
  if (timer && std::getenv("TORCHELASTIC_TIMER_FILE") == nullptr) {
    spec.options.env.set("TORCHELASTIC_TIMER_FILE", timer->path());
  }
  if (exchange_sizes) {
    node_sizes_config c;
    c.master_addr = fixed->master_addr;
    c.master_port = fixed->master_port;
    c.nnodes = fixed->nnodes;
    c.node_rank = fixed->node_rank;
    c.nproc = nproc;
    c.timeout = join_timeout;
    c.pause = [&signals](std::chrono::milliseconds d) { return signals.pause(d); };
    try {
      const auto sizes = gather_node_sizes(c);
      if (!sizes) return interrupted_between(signals.interrupted().value_or(SIGTERM), 0);
      place_by_sizes(*fixed, *sizes);
      if (std::any_of(sizes->begin(), sizes->end(), [nproc](int n) { return n != nproc; })) {
        say("cohort-run: node {} of {}: ranks {} to {} of {} (the nodes run {} ranks)\n", fixed->node_rank,
            fixed->nnodes, fixed->first_rank, fixed->first_rank + nproc - 1, fixed->world_size,
            fmt::join(*sizes, ", "));
      }
    } catch (const node_sizes_error& e) {
      if (const auto sig = signals.interrupted()) return interrupted_between(*sig, 0);
      say("cohort-run: {}\n", e.what());
      return finish("failed", 1, e.what());
    }
  }
  for (int attempt = 0;; ++attempt) {
    if (const auto sig = signals.interrupted()) return interrupted_between(*sig, attempt);
    placement p;
    if (rdzv) {
      try {
        const auto a = rdzv->next_round([&signals](std::chrono::milliseconds d) { return signals.pause(d); });
        p = {a.node_rank, a.nnodes, a.world_size, a.first_rank, a.master_addr, a.master_port};
      } catch (const std::exception& e) {
        if (const auto sig = signals.interrupted()) return interrupted_between(*sig, attempt);
        say("cohort-run: {}\n", e.what());
        if (attempt > 0) record.failed_joining = attempt;
        return finish("failed", 1, e.what());
      }
      say("cohort-run: node {} of {}: ranks {} to {} of {}, master {}:{}\n", p.node_rank, p.nnodes,
          p.first_rank, p.first_rank + nproc - 1, p.world_size, p.master_addr, p.master_port);
    } else {
      p = *fixed;
    }
    spec.logs.attempt = attempt;
    spec.logs.first_rank = p.first_rank;
    for (auto& [name, value] : shared_contract(o, p, nproc, record.restarts, run_id)) {
      spec.options.env.set(name, std::move(value));
    }
    spec.envs.clear();
    for (int local = 0; local < nproc; ++local) spec.envs[local] = rank_contract(o, p, local);
    // Named as the first attempt starts: a run that ends before has none.
    if (attempt == 0 && o.log_dir.empty() && !spec.logs.dir.empty()) {
      say("cohort-run: logs in {}\n", spec.logs.dir.string());
    }
    std::optional<round_change> ended_by;
    record.attempts.push_back(
        run_attempt(spec, signals, rdzv ? &*rdzv : nullptr, ended_by, errors, timer ? &*timer : nullptr));
    auto& a = record.attempts.back();
    a.attempt = attempt;
    a.node_rank = p.node_rank;
    a.nnodes = p.nnodes;
    a.world_size = p.world_size;
    a.first_rank = p.first_rank;
    const auto& r = a.result;
    // A shutdown signal once every rank had exited 0 stops nothing, but it
    // ends the run's wait for the console: the run was interrupted.
    if (r.ok() && !r.signal) {
      a.outcome = "succeeded";
      if (rdzv) tell_rendezvous("record this node's success", [&] { rdzv->finished(); });
      return finish("succeeded", 0);
    }
    // A shutdown signal that came as the group was ending (after its last
    // rank) ends the run as well, instead of a restart.
    if (const auto sig = r.signal ? r.signal : signals.interrupted()) {
      a.outcome = "interrupted";
      a.reason = fmt::format("{} received", cohort::signal_name(*sig));
      say("cohort-run: interrupted by {} (run {}, attempt {}): {}\n", cohort::signal_name(*sig), run_id, attempt,
          !r.signal || r.ok()   ? "its ranks had ended"
          : !r.failures.empty() ? "the ranks were being shut down after a failure, told below"
                                   : "the ranks were shut down");
      return finish("interrupted", 128 + *sig, a.reason);
    }
    if (r.failures.empty() && ended_by) {  // the rendezvous ended the round
      a.reason = ended_by->reason;
      using cause = round_change::cause;
      // Another node ended the job for good, or it finished in another round: no next round.
      if (ended_by->what == cause::closed) {
        a.outcome = "failed";
        say("cohort-run: attempt {} ended: {}\n", attempt, a.reason);
        return finish("failed", 1, a.reason);
      }
      a.outcome = "re-formed";
      // A node lost counts against --max-restarts, as a failure would; a
      // node joining or another node's restart does not.
      const bool lost = ended_by->what == cause::member_lost || ended_by->what == cause::lease_lost ||
                        ended_by->what == cause::etcd_unreachable;
      if (lost && record.restarts >= o.max_restarts) {
        say("cohort-run: attempt {} ended: {}; no restarts left ({} of {} used)\n", attempt,
            a.reason, record.restarts, o.max_restarts);
        tell_rendezvous("close the job", [&] {
          rdzv->close(fmt::format("node {} ({}) has no restarts left after: {}", p.node_rank, record.host, a.reason));
        });
        return finish("failed", 1, a.reason);
      }
      if (lost) ++record.restarts;
      say("cohort-run: attempt {} ended: {}; joining the next round{}\n", attempt, a.reason,
          lost ? fmt::format(" ({} of {} restarts)", record.restarts, o.max_restarts) : "");
      continue;
    }
    const auto* root = r.first_failure();
    a.outcome = "failed";
    a.reason = root != nullptr ? describe(*root, p.first_rank) : "ranks could not be killed";
    if (record.restarts < o.max_restarts) {
      ++record.restarts;
      say("cohort-run: attempt {} failed: {}; restarting the group ({} of {} restarts)\n", attempt,
          a.reason, record.restarts, o.max_restarts);
      // Unheard, the next round still forms: this node joins it anew.
      if (rdzv) {
        tell_rendezvous("ask for a new round", [&] {
          rdzv->restart(fmt::format("node {} ({}) restarts: {}", p.node_rank, record.host, a.reason));
        });
      }
      continue;
    }
    if (rdzv) {
      tell_rendezvous("close the job",
                      [&] { rdzv->close(fmt::format("node {} ({}) failed: {}", p.node_rank, record.host, a.reason)); });
    }
    return finish("failed", root != nullptr ? exit_code_of(root->status) : 1);
  }
}

int run(run_options o, run_record& record) {
  // First, before any thread is made (every thread of cohort-run blocks
  // them): a signal during the checks below ends them (a python3 asked
  // whether it finds torch is killed), and the run ends before its first
  // attempt.
  signal_owner signals(o.signals_to_handle, o.signals_to_forward);
  std::vector<std::string> command;
  try {
    command = rank_command(o, [&signals](std::chrono::milliseconds limit, int fd) { return signals.pause(limit, fd); });
  } catch (const program_error& e) {
    say("cohort-run: {}\n", e.what());
    return e.exit_code;
  }
  // What the workers start dies with cohort-run, also when it is killed
  // with SIGKILL.
  cohort::guardian guard;
  const int code = run_attempts(o, record, command, signals);
  // Every attempt's group has ended and swept what it started: nothing is
  // left for the guardian to look for. (An exception leaves it its look.)
  guard.release();
  return code;
}

}  // namespace
}  // namespace cohort_run

// A shutdown signal from before main on (the program's static
// initialization, such as the C++ locale's, takes longer than main's own
// start) ends the run as one during it does, not by its default action:
// the signal_owner takes it.
[[gnu::constructor(101)]] void hold_signals_before_main() { cohort_run::hold_signals_from_start(); }

int main(int argc, char** argv) {
  using namespace cohort_run;
  // A standard stream started closed (`2>&-`) gets /dev/null, as the ranks
  // would otherwise find cohort-run's own descriptors (its signalfd) there,
  // and its messages would go into them.
  for (int fd = 0; fd < 3; ++fd) {
    if (::fcntl(fd, F_GETFD) < 0 && errno == EBADF && ::open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY) < 0) return 1;
  }
  // SIGCHLD ignored by whoever started it (an ignored signal stays so
  // across exec) would have the kernel reap the ranks, their statuses
  // lost: a launcher owns its children's ends.
  struct sigaction default_chld {};
  default_chld.sa_handler = SIG_DFL;
  ::sigaction(SIGCHLD, &default_chld, nullptr);
  std::optional<run_options> options;
  run_record record;
  int code = 1;
  // A console whose reader has gone, or a file past RLIMIT_FSIZE (a log, the
  // results, a copied error file), fails cohort-run's writes instead of
  // ending it: the ranks run on, and the outcome is still recorded. Its
  // ranks start with SIGPIPE and SIGXFSZ at their defaults again (spawn
  // resets them where ignored, as a shell does).
  ::signal(SIGPIPE, SIG_IGN);
  ::signal(SIGXFSZ, SIG_IGN);
  try {
    options = parse_options(argc, argv);
    code = run(*options, record);
  } catch (const usage_error& e) {
    say("cohort-run: {}\nRun cohort-run --help for the options.\n", e.what());
    release_signals_held_from_start();  // one that came meanwhile acts now, as it would have
    return 2;
  } catch (const std::filesystem::filesystem_error& e) {  // the logs' folder or files
    say("cohort-run: {}\n", e.what());
    record.outcome = "failed";
    record.message = e.what();
  } catch (const std::system_error& e) {
    say("cohort-run: {}\n", e.what());
    record.outcome = "failed";
    record.message = e.what();
    // A program that cannot be found or run: as a shell says it.
    if (e.code() == std::errc::no_such_file_or_directory) code = 127;
    if (e.code() == std::errc::permission_denied) code = 126;
  } catch (const std::exception& e) {
    say("cohort-run: {}\n", e.what());
    record.outcome = "failed";
    record.message = e.what();
  }
  record.exit_code = code;
  if (options && !record.outcome.empty()) {
    write_results(*options, record);
    write_own_error_file(record);
    print_summary(record);
  }
  release_signals_held_from_start();  // where no signal_owner took them over
  return code;
}

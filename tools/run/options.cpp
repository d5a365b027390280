#include "run/options.hpp"

#include "run/say.hpp"

#include <cohort/exit_status.hpp>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <signal.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>

namespace cohort_run {
namespace {

constexpr const char* version = "0.1.0";

constexpr const char* usage_lines =
    "Usage: cohort-run [OPTIONS] script.py [args...]      a Python script, with Python (as torchrun)\n"
    "       cohort-run [OPTIONS] -m module [args...]      python -m module\n"
    "       cohort-run [OPTIONS] --run-path script.py [args...]\n"
    "       cohort-run [OPTIONS] --no-python program [args...]\n"
    "       cohort-run [OPTIONS] -- program [args...]     any program, as given\n"
    "\n"
    "A script is a file ending in .py or a file that is not executable; an executable\n"
    "or a name found in PATH runs as it is. Python is --python, else $COHORT_PYTHON,\n"
    "else $PYTHON_EXEC, else the first python3 in PATH that finds the torch package,\n"
    "else the first python3 in PATH. Every flag may also come from the environment as\n"
    "PET_<FLAG> (PET_NPROC_PER_NODE=4); the command line wins.\n";

// --help's first lines: the program forms and where Python comes from.
class formatter : public CLI::Formatter {
 public:
  std::string make_usage(const CLI::App*, std::string) const override { return usage_lines; }
};

// "nproc-per-node" -> "PET_NPROC_PER_NODE", as torchrun names them.
std::string environment_name(const std::string& long_name) {
  std::string name = "PET_";
  for (char c : long_name) name += c == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return name;
}

// Why cohort-run refuses `sig` as one that shuts the run down (`shuts_down`)
// or that it passes on, or nullptr where it takes it. It gets these in its
// own ordinary work, where they mean no shutdown and nothing for the ranks.
const char* refused_because(int sig, bool shuts_down) {
  switch (sig) {
    case SIGCHLD:
      return "cohort-run gets one each time a rank, or a program it runs, ends";
    case SIGPIPE:
      return "cohort-run raises it itself each time it writes to a pipe or socket whose reader has gone "
             "(a console that was closed)";
    case SIGCONT:
      return shuts_down ? "cohort-run gets one each time it is resumed after a stop (Ctrl-Z, then fg or bg)" : nullptr;
    case SIGWINCH:
      return shuts_down ? "cohort-run gets one each time its terminal is resized" : nullptr;
    default:
      return nullptr;
  }
}

std::vector<int> signals(const std::string& flag, const std::string& list, bool shuts_down) {
  std::vector<int> numbers;
  for (const auto& name : comma_list(list)) {
    // Blanks around a name are taken off, as torchrun takes them: an item
    // of blanks only is as empty as ",,".
    if (trimmed(name).empty()) continue;
    const int sig = signal_number(flag, name);
    if (const char* why = refused_because(sig, shuts_down)) {
      throw usage_error(fmt::format("{}: {} is refused: {}", flag, cohort::signal_name(sig), why));
    }
    numbers.push_back(sig);
  }
  return numbers;
}

// A PET_<FLAG> that is set but empty, for a flag not on the command line.
// CLI11 takes it for unset, and the flag's default would apply unsaid;
// torchrun takes it as the value "", which fails a number or a switch
// (PET_NPROC_PER_NODE=$NGPUS with NGPUS unset). Refused for those; for a
// text whose default is empty as well (an endpoint, a folder, the ranks'
// filter), "" is that default; PET_ROLE="" is the role "", as --role '' is.
void take_empty_environment(const CLI::App& app, run_options& o) {
  static constexpr std::string_view empty_by_default[] = {"rdzv-endpoint", "rdzv-conf", "log-dir", "local-addr",
                                                          "local-ranks-filter"};
  for (const auto* option : app.get_options()) {
    const std::string name = option->get_envname();
    const std::string& flag = option->get_lnames().front();
    if (name.empty() || option->count() > 0 || std::ranges::find(empty_by_default, flag) != std::end(empty_by_default)) {
      continue;
    }
    const char* value = std::getenv(name.c_str());
    if (value == nullptr || *value != '\0') continue;
    if (flag == "role") {
      o.role.clear();
      continue;
    }
    throw usage_error(fmt::format("{} is set but empty: give --{} a value there, or unset it", name, flag));
  }
}

void check_choice(const std::string& flag, const std::string& value, std::initializer_list<const char*> choices) {
  for (const char* choice : choices) {
    if (value == choice) return;
  }
  throw usage_error(fmt::format("{}: '{}' is not one of {}", flag, value, fmt::join(choices, ", ")));
}

// "N" or "MIN:MAX".
void parse_nnodes(const std::string& text, run_options& o) {
  const auto colon = text.find(':');
  const auto bad = [&] {
    return usage_error(fmt::format("--nnodes: '{}' is not N or MIN:MAX (whole numbers, 1 <= MIN <= MAX)", text));
  };
  try {
    if (colon == std::string::npos) {
      o.min_nodes = o.max_nodes = whole_number("--nnodes", text, 1);
    } else {
      o.min_nodes = whole_number("--nnodes", text.substr(0, colon), 1);
      o.max_nodes = whole_number("--nnodes", text.substr(colon + 1), 1);
    }
  } catch (const usage_error&) {
    throw bad();
  }
  if (o.min_nodes > o.max_nodes) throw bad();
}

// The long names that are cohort-run's own, not torchrun's: a prefix that
// also starts one of torchrun's names means torchrun's, so that a command
// line torchrun reads means the same here (--te: --tee, not also
// --tee-through-pipes; --ru: --run-path, not also --run-id).
bool own_name(std::string_view long_name) {
  static constexpr std::string_view own[] = {"run-id",      "run_id",      "grace-period",      "grace_period",
                                             "result-json", "result_json", "tee-through-pipes", "tee_through_pipes",
                                             "python",      "version"};
  return std::ranges::find(own, long_name) != std::end(own);
}

// The option of `app` named by long name `name` (no dashes) or, as
// torchrun's parser takes them, by a prefix of its long names; nullptr for
// none. A prefix several options' names start with is refused, as torchrun
// refuses it, unless only one of those options is torchrun's (own_name);
// one that only several spellings of the same option start with (--nproc:
// --nproc-per-node, --nproc_per_node) names that option.
const CLI::Option* long_option(const CLI::App& app, const std::string& name) {
  std::vector<std::string> matches;
  std::vector<const CLI::Option*> options, torchruns;  // each once
  for (const CLI::Option* option : app.get_options()) {
    for (const auto& long_name : option->get_lnames()) {
      if (long_name == name) return option;
      if (long_name.rfind(name, 0) != 0) continue;
      matches.push_back("--" + long_name);
      if (std::ranges::find(options, option) == options.end()) options.push_back(option);
      if (!own_name(long_name) && std::ranges::find(torchruns, option) == torchruns.end()) torchruns.push_back(option);
    }
  }
  if (options.size() <= 1) return options.empty() ? nullptr : options.front();
  if (torchruns.size() == 1) return torchruns.front();
  throw usage_error(fmt::format("ambiguous option: --{} could match {}", name, fmt::join(matches, ", ")));
}

// Whether `arg`, given where an option's value belongs, is an option to
// torchrun's parser instead: it starts with '-', and is not "-" alone, a
// negative number, or words with a space.
bool reads_as_option(const std::string& arg) {
  if (arg.size() < 2 || arg[0] != '-' || arg.find(' ') != std::string::npos) return false;
  char* end = nullptr;
  std::strtod(arg.c_str(), &end);
  return end != arg.c_str() + arg.size();
}

// cohort-run's own arguments as torchrun's parser would read them: each
// abbreviated long option written out in full, up to the program (the
// first argument that is neither an option nor an option's value, or what
// follows "--"), whose own arguments are left as they are.
std::vector<std::string> written_out(const CLI::App& app, int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  // Argument `i`, option `head` (as it is to be written) given `value`
  // after '=', as torchrun's parser reads "--tee=3" and "-t=3": a flag
  // refuses it (--standalone=0 must not turn it on); an empty value
  // ("--log-dir=") is the value, put in an argument of its own after
  // `head` (the parser would take the next argument instead); another is
  // written head, `joint`, value. Whether the value stays attached.
  const auto given_after_equals = [&args](std::size_t i, const CLI::Option& option, const std::string& head,
                                          const char* joint, const std::string& value) {
    if (option.get_expected_max() == 0) {
      throw usage_error(fmt::format("{}: takes no value, '{}' given", head, value));
    }
    if (value.empty()) {
      args[i] = head;
      args.insert(args.begin() + static_cast<std::ptrdiff_t>(i) + 1, std::string());
      return false;  // it follows, and is skipped below
    }
    args[i] = head + joint + value;
    return true;
  };
  for (std::size_t i = 1; i < args.size(); ++i) {
    const std::string arg = args[i];  // a copy: args may grow below
    if (arg == "--" || arg.size() < 2 || arg[0] != '-') break;
    const CLI::Option* option = nullptr;
    bool value_attached = false;
    if (arg[1] == '-') {
      const auto equals = arg.find('=');
      value_attached = equals != std::string::npos;
      const std::string name = arg.substr(2, value_attached ? equals - 2 : std::string::npos);
      option = name.empty() ? nullptr : long_option(app, name);
      if (option == nullptr) continue;  // unknown: the parser says so
      const std::string head = "--" + option->get_lnames().front();
      args[i] = head;
      if (value_attached) value_attached = given_after_equals(i, *option, head, "=", arg.substr(equals + 1));
    } else {
      option = app.get_option_no_throw(arg.substr(0, 2));
      value_attached = arg.size() > 2;
      if (option != nullptr && value_attached && arg[2] == '=') {
        value_attached = given_after_equals(i, *option, arg.substr(0, 2), "", arg.substr(3));
      }
    }
    if (option == nullptr || option->get_expected_max() == 0 || value_attached) continue;
    // Its value, the next argument, unless that reads as an option (or is
    // missing, which the parser says): torchrun's parser then says the
    // value is missing, rather than take "--standalone" as a --role.
    if (i + 1 < args.size() && reads_as_option(args[i + 1])) {
      throw usage_error(fmt::format("{}: expected a value, not '{}'", args[i], args[i + 1]));
    }
    ++i;
  }
  return args;
}

}  // namespace

double seconds(const std::string& flag, const std::string& text) {
  // At most 10^9 s (31 years): what the run counts in milliseconds stays
  // far inside 64 bits. Beyond, a wait came out negative: no wait at all.
  return seconds(flag, text, 0, 1e9, "0 to 1e9");
}

double seconds(const std::string& flag, const std::string& text, double least, double most, std::string_view range) {
  const std::string number = trimmed(text);  // as Python's float() reads it
  char* end = nullptr;
  const double value = std::strtod(number.c_str(), &end);
  if (number.empty() || end != number.c_str() + number.size() || !std::isfinite(value) || value < least ||
      value > most) {
    throw usage_error(fmt::format("{}: '{}' is not a number of seconds from {} (e.g. 30 or 0.5)", flag, text, range));
  }
  return value;
}

std::string trimmed(const std::string& text, std::string_view blanks) {
  const auto first = text.find_first_not_of(blanks);
  return first == std::string::npos ? std::string() : text.substr(first, text.find_last_not_of(blanks) + 1 - first);
}

std::string stripped(const std::string& text) {
  static constexpr std::string_view ascii = " \t\n\r\v\f\x1c\x1d\x1e\x1f";
  // The rest of Python's whitespace, each in UTF-8: U+0085, U+00A0, U+1680,
  // U+2000 to U+200A, U+2028, U+2029, U+202F, U+205F and U+3000.
  static constexpr std::string_view wide[] = {
      "\xc2\x85",     "\xc2\xa0",     "\xe1\x9a\x80", "\xe2\x80\x80", "\xe2\x80\x81", "\xe2\x80\x82",
      "\xe2\x80\x83", "\xe2\x80\x84", "\xe2\x80\x85", "\xe2\x80\x86", "\xe2\x80\x87", "\xe2\x80\x88",
      "\xe2\x80\x89", "\xe2\x80\x8a", "\xe2\x80\xa8", "\xe2\x80\xa9", "\xe2\x80\xaf", "\xe2\x81\x9f",
      "\xe3\x80\x80"};
  std::string_view rest = text;
  // The length of the blank at the front (or the back) of rest; 0 for none.
  const auto blank = [&](bool front) -> std::size_t {
    if (rest.empty()) return 0;
    if (ascii.find(front ? rest.front() : rest.back()) != std::string_view::npos) return 1;
    for (const auto w : wide) {
      if (front ? rest.starts_with(w) : rest.ends_with(w)) return w.size();
    }
    return 0;
  };
  while (const auto n = blank(true)) rest.remove_prefix(n);
  while (const auto n = blank(false)) rest.remove_suffix(n);
  return std::string(rest);
}

std::vector<std::string> comma_items(const std::string& list) {
  std::vector<std::string> items;
  if (list.empty()) return items;
  std::string::size_type begin = 0;
  while (begin <= list.size()) {
    auto end = list.find(',', begin);
    if (end == std::string::npos) end = list.size();
    items.push_back(list.substr(begin, end - begin));
    begin = end + 1;
  }
  return items;
}

std::vector<std::string> comma_list(const std::string& list) {
  auto items = comma_items(list);
  std::erase_if(items, [](const std::string& item) { return item.empty(); });
  return items;
}

int whole_number(const std::string& flag, const std::string& text, int least) {
  // As Python's int() reads it: blanks around it, and a plus sign, are taken.
  std::string digits = trimmed(text);
  if (digits.starts_with('+')) digits.erase(0, 1);
  int value = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size() || value < least) {
    throw usage_error(fmt::format("{}: '{}' is not a whole number of {} or more", flag, text, least));
  }
  return value;
}

int signal_number(const std::string& flag, const std::string& given) {
  std::string name = trimmed(given);
  int sig = 0;
  if (!name.empty() && std::all_of(name.begin(), name.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    sig = whole_number(flag, name, 1);
    if (sig >= NSIG) sig = 0;
  } else {
    if (name.rfind("SIG", 0) != 0) name = "SIG" + name;
    for (int n = 1; n < NSIG && sig == 0; ++n) {
      if (cohort::signal_name(n) == name) sig = n;
    }
  }
  if (sig == 0) throw usage_error(fmt::format("{}: '{}' is not a signal (e.g. SIGUSR1, USR1 or 10)", flag, given));
  if (sig == SIGKILL || sig == SIGSTOP) {
    throw usage_error(fmt::format("{}: {} is refused: no process can catch it (the kernel {} the receiver at once), "
                                  "so cohort-run would never see it come",
                                  flag, cohort::signal_name(sig), sig == SIGKILL ? "kills" : "stops"));
  }
  return sig;
}

run_options parse_options(int argc, char** argv) {
  run_options o;
  std::string nnodes = "1", node_rank = "0", master_port, max_restarts = "0", monitor_interval = "0.1";
  const char* shutdown_timeout = std::getenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT");
  std::string grace_period = shutdown_timeout != nullptr && *shutdown_timeout != '\0' ? shutdown_timeout : "30";
  std::string local_ranks_filter, signals_to_handle = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";
  std::string signals_to_forward = "SIGUSR1,SIGUSR2";
  bool module = false, no_python = false, run_path = false;

  CLI::App app("cohort-run: runs N ranks of a program with torchrun's flags and environment contract", "cohort-run");
  app.formatter(std::make_shared<formatter>());
  app.prefix_command();  // the program's own arguments are not ours
  app.set_version_flag("--version", fmt::format("cohort-run {}", version));
  // An option given twice takes its last value, as torchrun's parser does.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);

  // torchrun's flags, in its order.
  auto* nnodes_flag = app.add_option("--nnodes", nnodes, "nodes: N, or MIN:MAX for an elastic job (etcd-v3)");
  app.add_option("-n,--nproc-per-node,--nproc_per_node", o.nproc_per_node,
                 "ranks on this node: a number, cpu, gpu (CUDA_VISIBLE_DEVICES, else the driver's GPUs) or auto");
  app.add_option("--rdzv-backend,--rdzv_backend", o.rdzv_backend,
                 "static (default); etcd-v3 (also named etcd and etcd-v2: etcd's v3 API is spoken either way); "
                 "c10d (its endpoint is the master's host:port, with a fixed --nnodes)");
  app.add_option("--rdzv-endpoint,--rdzv_endpoint", o.rdzv_endpoint,
                 "etcd's host[:port] (port 2379 by default), or the master's host:port for static and c10d "
                 "(c10d's port 0: a free one, on one node)");
  app.add_option("--rdzv-id,--rdzv_id,--run-id,--run_id", o.run_id,
                 "the job's id, TORCHELASTIC_RUN_ID (default: SLURM_JOB_ID where Slurm places the node or under "
                 "etcd-v3, else 'none' across nodes and under etcd-v3, else a fresh one per run)");
  app.add_option("--rdzv-conf,--rdzv_conf", o.rdzv_conf,
                 "etcd-v3: join_timeout, last_call_timeout, keep_alive_interval, keep_alive_max_attempt, "
                 "read_timeout (seconds) as key=value,...; static and c10d across nodes: join_timeout");
  app.add_flag("--standalone", o.standalone, "one node, master on this host, a fresh run id");
  app.add_option("--max-restarts,--max_restarts", max_restarts,
                 "restarts of the whole group after a failure (across nodes: etcd-v3 only)");
  app.add_option("--monitor-interval,--monitor_interval", monitor_interval,
                 "seconds between checks of an etcd-v3 rendezvous (ranks' exits are seen at once, not polled)");
  app.add_option("--start-method,--start_method", o.start_method,
                 "spawn, fork or forkserver: accepted; programs are always started afresh");
  app.add_option("--event-log-handler,--event_log_handler", o.event_log_handler,
                 "accepted; torchrun's event handlers are Python plugins, none is called here");
  app.add_option("--role", o.role, "the ranks' role name");
  app.add_flag("-m,--module", module, "run the script as a module: python -m");
  app.add_flag("--no-python,--no_python", no_python, "run the program itself, not with Python");
  app.add_flag("--run-path,--run_path", run_path, "run the script with runpy.run_path (a path, relative or absolute)");
  app.add_option("--log-dir,--log_dir", o.log_dir,
                 "folder for the ranks' logs: <dir>/<run-id>_XXXXXXXX/attempt_<k>/<local-rank>/, and result.json there; "
                 "/dev/null: no files at all, as torchrun takes it (no folder, no error files, and every stream "
                 "reaches the console as without --redirects and --tee)");
  app.add_option("-r,--redirects", o.redirects, "streams to log files only: 0 none, 1 stdout, 2 stderr, 3 both; or 0:3,1:0");
  app.add_option("-t,--tee", o.tee, "streams to log files and the console, prefixed; values as --redirects");
  app.add_option("--local-ranks-filter,--local_ranks_filter", local_ranks_filter,
                 "local ranks whose output reaches the console, e.g. 0,3");
  auto* node_rank_flag = app.add_option("--node-rank,--node_rank", node_rank, "this node's rank (static)");
  auto* master_addr_flag = app.add_option("--master-addr,--master_addr", o.master_addr, "address of rank 0's node (static)");
  app.add_option("--master-port,--master_port", master_port,
                 "port on it (default: a free one on one node, 29500 across nodes)");
  app.add_option("--local-addr,--local_addr", o.local_addr,
                 "this node's address for the others (etcd-v3; default: its fully qualified name, as Python's "
                 "socket.getfqdn() gives it)");
  app.add_option("--logs-specs,--logs_specs", o.logs_specs,
                 "accepted; torchrun's logs_specs are Python plugins: the logs follow --log-dir's layout");
  app.add_option("--numa-binding,--numa_binding", o.numa_binding,
                 "node, socket, exclusive or core-complex: accepted, not applied (ranks are not pinned)");
  app.add_option("--duplicate-stdout-filters,--duplicate_stdout_filters", o.duplicate_stdout_filters,
                 "accepted, not applied: the console and --log-dir's files have every line");
  app.add_option("--duplicate-stderr-filters,--duplicate_stderr_filters", o.duplicate_stderr_filters,
                 "accepted, not applied, as --duplicate-stdout-filters");
  app.add_option("--shutdown-timeout,--shutdown_timeout,--grace-period,--grace_period", grace_period,
                 "seconds the ranks are given after each shutdown signal before the next, then SIGKILL "
                 "(default: TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else 30)");
  app.add_flag("--virtual-local-rank,--virtual_local_rank", o.virtual_local_rank,
               "LOCAL_RANK 0 for every rank, and CUDA_VISIBLE_DEVICES naming only its own GPU");
  app.add_option("--signals-to-handle,--signals_to_handle", signals_to_handle,
                 "signals that shut the group down, each passed on to the ranks first (default "
                 "SIGTERM,SIGINT,SIGHUP,SIGQUIT)");
  // cohort-run's own.
  app.add_option("--signals-to-forward,--signals_to_forward", signals_to_forward,
                 "signals passed on to every rank's process group, the run going on (default SIGUSR1,SIGUSR2)");
  auto* prefix_template_flag =
      app.add_option("--log-line-prefix-template,--log_line_prefix_template", o.log_line_prefix_template,
                     "prefix of teed console lines: ${role} (or ${role_name}), ${rank}, ${local_rank}, also "
                     "without braces, $$ for $, as torchrun expands it (also TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE)");
  app.add_flag("--tee-through-pipes,--tee_through_pipes", o.tee_through_pipes,
               "teed streams through pipes that cohort-run writes to the log files, rather than files the "
               "ranks write and it follows: faster for ranks that write in small pieces; what the pipes hold "
               "is lost if cohort-run is killed");
  app.add_option("--result-json,--result_json", o.result_json, "write the run's outcome as JSON to this file");
  app.add_option("--python", o.python, "the Python interpreter for scripts and modules (also COHORT_PYTHON)");
  for (auto* option : app.get_options()) {
    if (!option->get_lnames().empty() && option->get_lnames().front() != "help" &&
        option->get_lnames().front() != "version") {
      option->envname(environment_name(option->get_lnames().front()));
    }
  }
  try {
    auto args = written_out(app, argc, argv);
    std::vector<char*> pointers;
    for (auto& arg : args) pointers.push_back(arg.data());
    app.parse(static_cast<int>(pointers.size()), pointers.data());
  } catch (const CLI::CallForHelp&) {
    print_to(stdout, "{}", app.help());
    std::exit(0);
  } catch (const CLI::CallForVersion&) {
    print_to(stdout, "cohort-run {}\n", version);
    std::exit(0);
  } catch (const CLI::ParseError& e) {
    throw usage_error(e.what());
  }
  take_empty_environment(app, o);

  parse_nnodes(nnodes, o);
  o.nnodes_given = nnodes_flag->count() > 0;
  o.node_rank = whole_number("--node-rank", node_rank, 0);
  o.node_rank_given = node_rank_flag->count() > 0;
  o.master_addr_given = master_addr_flag->count() > 0;
  if (!master_port.empty()) {
    o.master_port = whole_number("--master-port", master_port, 1);
    if (o.master_port > 65535) throw usage_error(fmt::format("--master-port: '{}' is not a port, 1 to 65535", master_port));
  }
  o.max_restarts = whole_number("--max-restarts", max_restarts, 0);
  o.monitor_interval = seconds("--monitor-interval", monitor_interval);
  o.grace_period = seconds("--shutdown-timeout", grace_period);
  // Blanks around each number are Python's int()'s, as torchrun takes them;
  // an empty item is refused, as int('') is there.
  for (const auto& item : comma_items(local_ranks_filter)) {
    o.local_ranks_filter.push_back(whole_number("--local-ranks-filter", item, 0));
  }
  o.signals_to_handle = signals("--signals-to-handle", signals_to_handle, true);
  for (int sig : signals("--signals-to-forward", signals_to_forward, false)) {
    if (std::find(o.signals_to_handle.begin(), o.signals_to_handle.end(), sig) == o.signals_to_handle.end()) {
      o.signals_to_forward.push_back(sig);
    }
  }
  check_choice("--rdzv-backend", o.rdzv_backend, {"static", "etcd-v3", "etcd", "etcd-v2", "c10d"});
  check_choice("--start-method", o.start_method, {"spawn", "fork", "forkserver"});
  if (!o.numa_binding.empty()) check_choice("--numa-binding", o.numa_binding, {"node", "socket", "exclusive", "core-complex"});
  if (prefix_template_flag->count() == 0) {
    if (const char* from_torch = std::getenv("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE")) o.log_line_prefix_template = from_torch;
  }
  if (o.python.empty()) {
    if (const char* chosen = std::getenv("COHORT_PYTHON"); chosen != nullptr && *chosen != '\0') o.python = chosen;
  }

  o.program = app.remaining();
  bool separated = false;
  if (!o.program.empty() && o.program.front() == "--") {
    o.program.erase(o.program.begin());
    separated = true;
  } else if (!o.program.empty() && o.program.front().size() > 1 && o.program.front()[0] == '-') {
    throw usage_error(fmt::format("unknown option {}", o.program.front()));
  }
  if (o.program.empty()) throw usage_error("no program to run: see the forms in cohort-run --help");
  // torchrun's parser drops a "--" right after the script (train.py -- --lr 1
  // gives the script --lr 1); after "--" the command's arguments are its own.
  if (!separated && o.program.size() > 1 && o.program[1] == "--") o.program.erase(o.program.begin() + 1);
  if (module && no_python) throw usage_error("-m runs a module with Python: it cannot go with --no-python");
  if (run_path) {  // first, as in torchrun
    o.form = program_form::run_path;
  } else if (module) {
    o.form = program_form::module;
  } else if (no_python) {
    o.form = program_form::no_python;
  } else if (separated) {
    o.form = program_form::direct;
  }

  // Blanks around the endpoint are taken off, as torchrun's str.strip()
  // takes them. An endpoint of blanks only names no master: torchrun's
  // static rendezvous refuses it, where an empty one means --master-addr
  // and --master-port; c10d and etcd-v3 take it for none given.
  const std::string endpoint = stripped(o.rdzv_endpoint);
  if (endpoint.empty() && !o.rdzv_endpoint.empty() && o.rdzv_backend == "static" && !o.standalone) {
    throw usage_error(fmt::format("--rdzv-endpoint '{}': blanks only, no host:port; give the master's host:port, or "
                                  "leave --rdzv-endpoint out for --master-addr and --master-port",
                                  o.rdzv_endpoint));
  }
  o.rdzv_endpoint = endpoint;
  if (o.standalone) {
    if (o.max_nodes != 1) throw usage_error("--standalone runs one node: --nnodes must be 1");
    o.rdzv_backend = "static";
    o.rdzv_endpoint.clear();  // torchrun's is localhost:0 then, whatever was given
    o.master_addr = "127.0.0.1";
    o.master_addr_given = true;
    o.master_port = 0;  // a free port, whatever --master-port says: as torchrun's localhost:0
    o.run_id.clear();  // a fresh one, whatever was asked
  }
  check_run_id(o.run_id, "--run-id");
  return o;
}

// The run id names the logs' folder (<log-dir>/<run-id>_XXXXXXXX/), as
// torchrun's names its: it must be one folder's name, not a path that
// leads out, and leave room in a name of NAME_MAX bytes for the suffix.
void check_run_id(const std::string& id, std::string_view from) {
  if (id == "." || id == ".." || id.find('/') != std::string::npos) {
    throw usage_error(fmt::format("{} '{}': a run id names the logs' folder, so it may not hold '/' nor be "
                                  "'.' or '..'", from, id));
  }
  if (id.size() > max_run_id_bytes) {
    throw usage_error(fmt::format("{} '{}...': a run id names the logs' folder, with 9 bytes after it, so it may "
                                  "be {} bytes long at most; this one is {}",
                                  from, id.substr(0, 16), max_run_id_bytes, id.size()));
  }
}

}  // namespace cohort_run

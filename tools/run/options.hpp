// cohort-run's command line: every torchrun flag (with dashes or
// underscores), each also read from torchrun's PET_<FLAG> variable (the
// command line wins), cohort-run's own flags, and the program forms.
#pragma once

#include <cstddef>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace cohort_run {

/// A usage error: its message, and exit code 2.
struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// How the positional program is run.
enum class program_form {
  automatic,  ///< a Python script with Python (torchrun's form), else the program itself
  module,     ///< -m: python -m module
  no_python,  ///< --no-python: the program itself
  run_path,   ///< --run-path: runpy.run_path of the script in Python
  direct,     ///< after `--`: the program itself, as given
};

struct run_options {
  // Nodes and ranks.
  std::string nproc_per_node = "1";
  int min_nodes = 1;
  int max_nodes = 1;
  bool nnodes_given = false;  ///< on the command line or in PET_NNODES
  int node_rank = 0;
  bool node_rank_given = false;
  // Rendezvous.
  std::string rdzv_backend = "static";
  std::string rdzv_endpoint;
  std::string rdzv_conf;
  bool standalone = false;
  std::string master_addr = "127.0.0.1";
  bool master_addr_given = false;
  int master_port = 0;  ///< 0: a free port on one node, 29500 across nodes
  std::string local_addr;
  // The run.
  std::string run_id;  ///< --run-id / --rdzv-id; empty: a fresh one per run
  std::string role = "default";
  int max_restarts = 0;
  double monitor_interval = 0.1;
  double grace_period = 30;  ///< seconds each shutdown signal is given
  std::vector<int> signals_to_handle;   ///< shut the group down
  std::vector<int> signals_to_forward;  ///< passed on to every rank's process group
  // Logs and results.
  std::string log_dir;
  std::string redirects = "0";
  std::string tee = "0";
  bool tee_through_pipes = false;  ///< teed streams through pipes cohort-run pumps (logs_spec::tee_through_pipes)
  std::vector<int> local_ranks_filter;
  std::string log_line_prefix_template = "[${role}${local_rank}]:";
  std::string result_json;
  // Accepted for torchrun's command lines; see --help for what each means here.
  std::string start_method = "spawn";
  std::string event_log_handler = "null";
  std::string logs_specs;
  std::string numa_binding;
  std::string duplicate_stdout_filters;
  std::string duplicate_stderr_filters;
  /// --virtual-local-rank: LOCAL_RANK 0 for every rank, each seeing only its
  /// own GPU (CUDA_VISIBLE_DEVICES).
  bool virtual_local_rank = false;
  // The program.
  program_form form = program_form::automatic;
  std::string python;  ///< --python / COHORT_PYTHON; empty: chosen at start
  std::vector<std::string> program;  ///< the script, module or program, then its arguments
};

/// Parses argv and the PET_ variables. Prints --help or --version and exits
/// 0; throws usage_error for anything it cannot take.
run_options parse_options(int argc, char** argv);

/// "a,b,,c" -> a b c: the items of a comma-separated list, empty ones left out.
std::vector<std::string> comma_list(const std::string& list);
/// "a,b,,c" -> a b "" c: every item, empty ones too; "" -> none.
std::vector<std::string> comma_items(const std::string& list);
/// The ASCII blanks that Python's str.strip(), int() and float() all take.
inline constexpr std::string_view python_blanks = " \t\n\r\v\f";
/// `text` without the characters of `blanks` at either end.
std::string trimmed(const std::string& text, std::string_view blanks = python_blanks);
/// `text` without what Python's str.strip() takes off a UTF-8 command line:
/// python_blanks, \x1c to \x1f, and Unicode's spaces (U+00A0, U+2003 ...).
std::string stripped(const std::string& text);
/// The longest run id: the logs' folder is named `<run-id>_XXXXXXXX`, in
/// a name of at most NAME_MAX (255) bytes.
inline constexpr std::size_t max_run_id_bytes = 255 - 9;
/// Throws usage_error, naming where `id` came from (`from`: --run-id,
/// SLURM_JOB_ID), unless it can name the logs' folder: one folder's name,
/// not a path that leads elsewhere, of max_run_id_bytes at most.
void check_run_id(const std::string& id, std::string_view from);
/// A number of seconds, 0 to 10^9, blanks around it taken (as Python's
/// float() takes them); throws usage_error naming `flag`.
double seconds(const std::string& flag, const std::string& text);
/// A number of seconds from `least` to `most`, read as seconds(flag, text)
/// reads it; the usage_error says the range as `range` writes it ("0.001
/// to 1e6").
double seconds(const std::string& flag, const std::string& text, double least, double most, std::string_view range);
/// "5" -> 5, blanks around it and a plus sign taken (as Python's int()
/// takes them); a message naming `flag` and what it accepts otherwise.
int whole_number(const std::string& flag, const std::string& text, int least);
/// A signal by name ("SIGUSR1", "USR1") or number, blanks around it taken;
/// a usage_error naming `flag` and `given` as it came otherwise.
int signal_number(const std::string& flag, const std::string& given);

}  // namespace cohort_run

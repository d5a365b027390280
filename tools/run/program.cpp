#include "run/program.hpp"
#include "run/say.hpp"

#include <cohort/environment.hpp>

#include <fmt/format.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <set>
#include <string_view>

namespace cohort_run {
namespace {

namespace fs = std::filesystem;

// Every `name` in PATH, in PATH's order.
std::vector<fs::path> all_in_path(const std::string& name) {
  std::vector<fs::path> found;
  for (const auto& candidate : cohort::environment::inherit().path_candidates(name)) {
    if (cohort::is_executable_file(candidate)) found.emplace_back(candidate);
  }
  return found;
}

// `program` as a shell finds it: a path as it is, a name in PATH.
std::string program_path(const std::string& program, const char* what) {
  if (program.find('/') != std::string::npos) {
    if (cohort::is_executable_file(program)) return program;
    std::error_code ec;
    const bool exists = fs::exists(program, ec);
    throw program_error(fmt::format("{}{}: {}", what, program, exists ? "not executable" : "not found"), exists ? 126 : 127);
  }
  const auto found = all_in_path(program);
  if (found.empty()) throw program_error(fmt::format("{}{}: not found in PATH", what, program), 127);
  return program;
}

// How long a python3 has to say whether it finds torch (a cold start on a
// network file system takes a few seconds): one that stalls is not waited
// for all the run long.
constexpr std::chrono::seconds torch_check_limit(10);

enum class torch_check { found, not_found, interrupted };

// Whether `python` finds the torch package (without importing it: that
// takes seconds). Where it has not answered within torch_check_limit
// (taken as not finding it, and said) or where `wait` says the run ends,
// its process group is killed and it is reaped. It leads a group of its
// own for that: a python3 that is a wrapper (a shell script, a module
// system's shim) runs the interpreter as a child of its own, which a kill
// of its pid alone would leave running. Out of cohort-run's group, it is
// not reached by a SIGKILL sent to that group (`timeout -s KILL`), so it
// dies with cohort-run by its parent-death signal instead: the process
// cohort-run started (a wrapper's `exec`ed interpreter too), not what a
// wrapper runs as a child of its own.
torch_check finds_torch(const fs::path& python, const check_wait& wait) {
  std::string program = python.string();
  std::string dash_c = "-c";
  // Not from the current folder, which `-c` puts first in sys.path (as ''):
  // a script runs with its own folder there instead, and an empty torch/
  // folder here would be found, as a namespace package, by an interpreter
  // that has no torch. Nor such a package anywhere: torch has an __init__.
  std::string code =
      "import importlib.util, sys; sys.path = [p for p in sys.path if p]; "
      "s = importlib.util.find_spec('torch'); sys.exit(s is None or s.origin is None)";
  char* argv[] = {program.data(), dash_c.data(), code.data(), nullptr};
  const int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  if (null < 0) return torch_check::not_found;
  const pid_t parent = ::getpid();
  // Between fork and exec only calls safe in a child of a threaded
  // process. Started with no signal blocked (cohort-run blocks those it
  // handles), leading a process group of its own.
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // cohort-run died before the line above
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int fd = 0; fd < 3; ++fd) ::dup2(null, fd);
    ::execv(program.c_str(), argv);
    ::_exit(127);
  }
  ::close(null);
  if (pid < 0) return torch_check::not_found;
  // Set here too, so that the kill below finds the group whichever side
  // ran first.
  ::setpgid(pid, pid);
  // Readable once the check ends. Without one (a kernel before 5.3, a
  // filter that refuses the call), the check is looked at every 50 ms.
  const int ended = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  const auto slice = ended >= 0 ? std::chrono::milliseconds(torch_check_limit) : std::chrono::milliseconds(50);
  const auto end = std::chrono::steady_clock::now() + torch_check_limit;
  std::optional<torch_check> cut_short;
  int status = 0;
  for (;;) {
    const pid_t got = ::waitpid(pid, &status, WNOHANG);
    if (got == pid) break;
    if (got < 0 && errno != EINTR) {  // not ours to reap, nor its group to kill: no answer
      cut_short = torch_check::not_found;
      break;
    }
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
    if (left <= std::chrono::milliseconds(0)) {
      say("cohort-run: {} did not say within {} s whether it finds torch: taken as not finding it\n", program,
          torch_check_limit.count());
      cut_short = torch_check::not_found;
    } else if (!wait(std::min(left, slice), ended)) {
      cut_short = torch_check::interrupted;
    }
    if (cut_short) {
      ::kill(-pid, SIGKILL);  // the group it leads, its pid ours until reaped below
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      break;
    }
  }
  if (ended >= 0) ::close(ended);
  if (cut_short) return *cut_short;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? torch_check::found : torch_check::not_found;
}

// Whether Python runs `name` (torchrun runs every script with it): a name
// ending in .py, a file that is not executable, a folder (its __main__.py),
// or a bare name that PATH does not hold but that names a file or folder
// here. A name PATH holds runs as a shell would run it.
bool is_python_script(const std::string& name) {
  std::error_code ec;
  if (name.size() > 3 && name.compare(name.size() - 3, 3, ".py") == 0) return true;
  const bool bare = name.find('/') == std::string::npos;
  if (bare && !all_in_path(name).empty()) return false;
  if (fs::is_directory(name, ec)) return true;
  return fs::is_regular_file(name, ec) && (bare || !cohort::is_executable_file(name));
}

// A script, a zip of one or a folder with its __main__.py: what Python runs.
std::string existing_script(const std::string& script) {
  std::error_code ec;
  if (!fs::is_regular_file(script, ec) && !fs::is_directory(script, ec)) {
    throw program_error(fmt::format("{}: no such script", script), 127);
  }
  return script;
}

}  // namespace

std::string python_interpreter(const std::string& chosen, const check_wait& wait) {
  if (!chosen.empty()) return program_path(chosen, "Python ");
  if (const char* exec = std::getenv("PYTHON_EXEC"); exec != nullptr && *exec != '\0') {
    return program_path(exec, "Python (PYTHON_EXEC) ");
  }
  // One interpreter is asked once, where PATH names its folder twice (/bin
  // and /usr/bin, one folder on a merged /usr). The file itself is not
  // followed: a venv's bin/python3 links to its base interpreter, but finds
  // the venv's packages, from the pyvenv.cfg next to the path it was
  // started by.
  std::set<fs::path> tried;
  const auto candidates = all_in_path("python3");
  for (const auto& python : candidates) {
    std::error_code ec;
    auto folder = fs::canonical(python.parent_path(), ec);
    if (!tried.insert(ec ? python : folder / python.filename()).second) continue;
    const auto answer = finds_torch(python, wait);
    if (answer == torch_check::found) return python.string();
    if (answer == torch_check::interrupted) break;  // no rank starts: the rest is not asked
  }
  if (candidates.empty()) throw program_error("python3: not found in PATH (choose one with --python)", 127);
  return candidates.front().string();
}

// --run-path's program: the script through runpy.run_path, under what
// torch's `record` does for torchrun's function entry point: an escaping
// exception (not SystemExit) is written to TORCHELASTIC_ERROR_FILE in
// torch's form, unless the script wrote one (or it cannot be written), and
// raised on.
constexpr const char* run_path_program =
    "import runpy, sys\n"
    "sys.argv = sys.argv[1:]\n"
    "try:\n"
    "    runpy.run_path(sys.argv[0], run_name='__main__')\n"
    "except Exception as e:\n"
    "    import json, os, time, traceback\n"
    "    path = os.environ.get('TORCHELASTIC_ERROR_FILE')\n"
    "    if path and not os.path.exists(path):\n"
    "        try:\n"
    "            with open(path, 'w') as f:\n"
    "                json.dump({'message': {'message': f'{type(e).__name__}: {e}', 'extraInfo': {\n"
    "                    'py_callstack': traceback.format_exc(), 'timestamp': str(int(time.time()))}}}, f)\n"
    "        except OSError:\n"
    "            pass\n"
    "    raise\n";

std::vector<std::string> rank_command(const run_options& o, const check_wait& wait) {
  const auto& program = o.program.front();
  const std::vector<std::string> args(o.program.begin() + 1, o.program.end());
  std::vector<std::string> command;
  const auto with_python = [&](std::initializer_list<std::string> head) {
    command = {python_interpreter(o.python, wait), "-u"};
    command.insert(command.end(), head);
  };
  switch (o.form) {
    case program_form::run_path:
      with_python({"-c", run_path_program, existing_script(program)});
      break;
    case program_form::module:
      with_python({"-m", program});
      break;
    case program_form::automatic:
      if (is_python_script(program)) {
        with_python({existing_script(program)});
        break;
      }
      [[fallthrough]];
    case program_form::no_python:
    case program_form::direct:
      command = {program_path(program, "")};
      break;
  }
  command.insert(command.end(), args.begin(), args.end());
  return command;
}

namespace {

// The length of torchrun's local-rank macro at `at` in `arg` (`$` there),
// or 0 when there is none. `$$` is never one: the caller steps over it.
std::size_t local_rank_macro_at(std::string_view arg, std::size_t at) {
  const auto rest = arg.substr(at);
  if (rest.starts_with("${local_rank}")) return 13;
  if (!rest.starts_with("$local_rank")) return 0;
  if (rest.size() == 11) return 11;
  const unsigned char next = static_cast<unsigned char>(rest[11]);
  return std::isalnum(next) || next == '_' ? 0 : 11;
}

// Calls `found(position, length)` for each macro in `arg`, in order.
template <class F>
void each_local_rank_macro(std::string_view arg, F&& found) {
  for (std::size_t at = arg.find('$'); at != std::string_view::npos; at = arg.find('$', at)) {
    if (at + 1 < arg.size() && arg[at + 1] == '$') {
      at += 2;
    } else if (const auto length = local_rank_macro_at(arg, at)) {
      found(at, length);
      at += length;
    } else {
      ++at;
    }
  }
}

}  // namespace

bool names_local_rank(const std::vector<std::string>& command) {
  bool named = false;
  for (std::size_t i = 1; i < command.size() && !named; ++i) {
    each_local_rank_macro(command[i], [&](std::size_t, std::size_t) { named = true; });
  }
  return named;
}

std::vector<std::string> with_local_rank(std::vector<std::string> command, int local_rank) {
  const auto number = std::to_string(local_rank);
  for (std::size_t i = 1; i < command.size(); ++i) {
    std::string out;
    std::size_t copied = 0;
    each_local_rank_macro(command[i], [&](std::size_t at, std::size_t length) {
      out.append(command[i], copied, at - copied).append(number);
      copied = at + length;
    });
    if (copied > 0) command[i] = out.append(command[i], copied);
  }
  return command;
}

}  // namespace cohort_run

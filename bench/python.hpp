// Runs a Python baseline script: Debian's interpreter first (python3-torch
// is installed for it), or $COHORT_BENCH_PYTHON; returns its stdout lines,
// and why it failed where it did.
#pragma once

#include <fmt/format.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace cohort::bench {

/// The interpreter the baselines run on.
inline std::string python_interpreter() {
  const char* python = std::getenv("COHORT_BENCH_PYTHON");
  if (python != nullptr) return python;
  return ::access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
}

/// What a script printed on stdout, line by line, and, where it did not
/// exit 0, why: its status and the last line of its stderr.
struct python_output {
  std::vector<std::string> lines;
  std::string failure;
};

inline python_output run_python(const char* script, const std::string& args) {
  python_output out;
  char path[] = "/tmp/cohort-bench-XXXXXX.py";
  char err_path[] = "/tmp/cohort-bench-stderr-XXXXXX";
  const int fd = ::mkstemps(path, 3);
  const int err = ::mkstemp(err_path);
  if (fd < 0 || err < 0) {
    out.failure = "cannot write its script";
  } else {
    FILE* f = ::fdopen(fd, "w");
    std::fputs(script, f);
    std::fclose(f);
    const std::string python = python_interpreter();
    int status = -1;
    if (FILE* pipe = ::popen(fmt::format("{} {} {} 2>{}", python, path, args, err_path).c_str(), "r")) {
      char line[256];
      while (std::fgets(line, sizeof line, pipe) != nullptr) out.lines.emplace_back(line);
      status = ::pclose(pipe);
    }
    if (status != 0) {
      // The shell's 127 and 126: the interpreter was not found or would not run.
      out.failure = status < 0                 ? fmt::format("{} could not be run", python)
                    : WIFSIGNALED(status)      ? fmt::format("{} killed by signal {}", python, WTERMSIG(status))
                                               : fmt::format("{} exited with {}", python, WEXITSTATUS(status));
      std::string last;
      if (FILE* e = std::fopen(err_path, "r")) {
        char line[1024];
        while (std::fgets(line, sizeof line, e) != nullptr) {
          std::string text(line);
          while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
          if (std::any_of(text.begin(), text.end(), [](unsigned char c) { return std::isalpha(c); })) last = text;
        }
        std::fclose(e);
      }
      if (!last.empty()) out.failure += ": " + last;
    }
  }
  if (fd >= 0) std::remove(path);
  if (err >= 0) {
    ::close(err);
    std::remove(err_path);
  }
  return out;
}

inline std::vector<std::string> python_lines(const char* script, const std::string& args) {
  return run_python(script, args).lines;
}

}  // namespace cohort::bench

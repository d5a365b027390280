// Runs a Python baseline script: Debian's interpreter first (python3-torch
// is installed for it), or $COHORT_BENCH_PYTHON; returns its stdout lines.
#pragma once

#include <fmt/format.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace cohort::bench {

inline std::vector<std::string> python_lines(const char* script, const std::string& args) {
  char path[] = "/tmp/cohort-bench-XXXXXX.py";
  const int fd = ::mkstemps(path, 3);
  std::vector<std::string> lines;
  if (fd < 0) return lines;
  FILE* f = ::fdopen(fd, "w");
  std::fputs(script, f);
  std::fclose(f);
  const char* python = std::getenv("COHORT_BENCH_PYTHON");
  if (python == nullptr) python = ::access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
  if (FILE* out = ::popen(fmt::format("{} {} {} 2>/dev/null", python, path, args).c_str(), "r")) {
    char line[256];
    while (std::fgets(line, sizeof line, out) != nullptr) lines.emplace_back(line);
    ::pclose(out);
  }
  std::remove(path);
  return lines;
}

}  // namespace cohort::bench

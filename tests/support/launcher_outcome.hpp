// What the cohort-run tests read back: how a launcher ended, what it
// wrote, and the "NAME=value" lines its workers wrote.
#pragma once

#include "cohort/exit_status.hpp"

#include "support/harness.hpp"

#include <filesystem>
#include <map>
#include <sstream>
#include <string>

namespace cohort::test {

struct outcome {
  exit_status status;
  std::string out;
  std::string err;
};

// The "NAME=value" lines of `file`, as a map.
inline std::map<std::string, std::string> variables_in(const std::filesystem::path& file) {
  std::map<std::string, std::string> vars;
  std::istringstream in(read_file(file));
  for (std::string line; std::getline(in, line);) {
    const auto eq = line.find('=');
    if (eq != std::string::npos) vars[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return vars;
}

}  // namespace cohort::test

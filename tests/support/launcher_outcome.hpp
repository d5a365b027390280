// What the cohort-run tests read back: how a launcher ended, what it
// wrote, the "NAME=value" lines its workers wrote, and when their files
// are there.
#pragma once

#include "cohort/exit_status.hpp"

#include "support/harness.hpp"

#include <asio/awaitable.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

extern "C" char** environ;

namespace cohort::test {

// Whether cohort-run reads the variable `name` (besides its flags): a
// Slurm step's, torchrun's PET_ flags and its TORCHELASTIC_ settings, the
// interpreter's choice, the thread count it defaults. (CUDA_VISIBLE_DEVICES,
// which --nproc-per-node gpu counts, is left: the tests that count set it.)
inline bool launcher_reads(std::string_view name) {
  for (std::string_view prefix : {"SLURM_", "PET_", "TORCHELASTIC_", "TORCH_ELASTIC_"}) {
    if (name.starts_with(prefix)) return true;
  }
  return name == "PYTHON_EXEC" || name == "COHORT_PYTHON" || name == "OMP_NUM_THREADS";
}

// Unsets, in this process, those variables, so that the
// launchers a test starts see only what the test sets, wherever the suite
// runs (in a Slurm step, under torchrun, with OMP_NUM_THREADS set).
inline const bool launcher_environment_cleared = [] {
  std::vector<std::string> names;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string_view variable(*entry);
    const auto name = variable.substr(0, variable.find('='));
    if (launcher_reads(name)) names.emplace_back(name);
  }
  for (const auto& name : names) ::unsetenv(name.c_str());
  return true;
}();

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

// Waits until `dir` holds `n` files whose names start with `prefix` (the
// workers are up), polling every `tick` for at most `limit`.
inline asio::awaitable<void> files_appear(std::filesystem::path dir, std::size_t n, std::string prefix = {},
                                          std::chrono::milliseconds tick = std::chrono::milliseconds(5),
                                          std::chrono::milliseconds limit = std::chrono::seconds(10)) {
  asio::steady_timer timer(co_await asio::this_coro::executor);
  for (auto waited = std::chrono::milliseconds(0); waited < limit; waited += tick) {
    std::size_t count = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir)) count += e.path().filename().string().starts_with(prefix);
    if (count >= n) co_return;
    timer.expires_after(tick);
    co_await timer.async_wait(asio::use_awaitable);
  }
}

}  // namespace cohort::test

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

#include <chrono>
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

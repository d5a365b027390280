// How a child process ended, and what it used.
#pragma once

#include "cohort/export.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

COHORT_API_BEGIN

namespace cohort {

/// Resources a child used over its whole life (from the kernel's rusage).
struct resource_usage {
  std::chrono::microseconds user_time{0};    ///< CPU time in user mode
  std::chrono::microseconds system_time{0};  ///< CPU time in the kernel
  /// Peak resident set, KiB: the kernel's peak for the process, which
  /// before its exec was this process's memory (a spawn's vfork-style
  /// clone, or a fork, alike), so never below this process's own peak at
  /// the spawn, however small the program.
  std::int64_t max_rss_kib = 0;

  bool operator==(const resource_usage&) const = default;
};

/// "SIGKILL" for 9; "SIGRTMIN+3" for real-time signals; "signal 99" for
/// numbers that name no signal.
std::string signal_name(int signal);

/// The end of a child: exited with a code, or killed by a signal.
class exit_status {
 public:
  /// "exited with code 0": a placeholder for containers and asio results.
  exit_status() = default;
  static exit_status from_code(int code, resource_usage usage = {}) {
    return exit_status(false, code, false, usage);
  }
  static exit_status from_signal(int signal, bool core_dumped = false, resource_usage usage = {}) {
    return exit_status(true, signal, core_dumped, usage);
  }

  bool exited() const noexcept { return !signaled_; }
  bool signaled() const noexcept { return signaled_; }
  /// The exit code (0..255); 0 when killed by a signal.
  int code() const noexcept { return signaled_ ? 0 : value_; }
  /// The signal that killed it; 0 when it exited.
  int signal() const noexcept { return signaled_ ? value_ : 0; }
  bool core_dumped() const noexcept { return core_dumped_; }
  /// Exited with code 0.
  bool success() const noexcept { return !signaled_ && value_ == 0; }
  /// The code a shell reports: the exit code, or 128 + the signal.
  int shell_code() const noexcept { return signaled_ ? 128 + value_ : value_; }
  const resource_usage& usage() const noexcept { return usage_; }

  /// Equal when they ended the same way; resource usage is not compared.
  bool operator==(const exit_status& other) const noexcept {
    return signaled_ == other.signaled_ && value_ == other.value_ &&
           core_dumped_ == other.core_dumped_;
  }

 private:
  exit_status(bool signaled, int value, bool core, resource_usage usage)
      : signaled_(signaled), value_(value), core_dumped_(core), usage_(usage) {}

  bool signaled_ = false;
  int value_ = 0;
  bool core_dumped_ = false;
  resource_usage usage_{};
};

}  // namespace cohort

/// "exited with code 3"; "killed by signal SIGKILL (9)"; "... (core dumped)".
template <>
struct fmt::formatter<cohort::exit_status> : fmt::formatter<std::string_view> {
  template <class Context>
  auto format(const cohort::exit_status& status, Context& ctx) const {
    std::string text =
        status.exited()
            ? fmt::format("exited with code {}", status.code())
            : fmt::format("killed by signal {} ({}){}", cohort::signal_name(status.signal()),
                          status.signal(), status.core_dumped() ? " (core dumped)" : "");
    return fmt::formatter<std::string_view>::format(text, ctx);
  }
};

COHORT_API_END

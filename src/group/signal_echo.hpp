// The first shutdown signal, told apart from its echo: a terminal's Ctrl-C
// reaches `timeout N program` and the program at once, and timeout passes
// it on to the program (and its process group) again.
#pragma once

#include <chrono>
#include <optional>

namespace cohort::detail {

/// The first shutdown signal a run caught, and when.
class first_shutdown_signal {
 public:
  /// How soon the first one caught again is the same one passed on.
  static constexpr std::chrono::milliseconds echo{100};

  /// Notes shutdown signal `sig`, caught now. True when it is the first
  /// one again within `echo`: the same one passed on, which does not skip
  /// the shutdown's waits as a second one does.
  bool is_echo(int sig) {
    const auto now = std::chrono::steady_clock::now();
    if (!first_) {
      first_ = sig;
      at_ = now;
      return false;
    }
    return sig == *first_ && now - at_ < echo;
  }
  /// The first one caught; nullopt while none has come.
  std::optional<int> signal() const noexcept { return first_; }

 private:
  std::optional<int> first_;
  std::chrono::steady_clock::time_point at_;
};

}  // namespace cohort::detail

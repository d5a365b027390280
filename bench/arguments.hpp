// A benchmark's command line: the whole positive numbers it takes after its
// name, each in its place, or its usage.
#pragma once

#include <fmt/format.h>

#include <charconv>
#include <cstdio>
#include <optional>
#include <string_view>
#include <system_error>
#include <vector>

namespace cohort::bench {

/// Reads up to `counts.size()` whole positive numbers (below 2^31) from
/// argv[1] on, each replacing the default `counts` holds in its place; the
/// numbers not given keep theirs. Anything else is answered with `usage`
/// (the line after "usage: ", as "spawn_reap [rounds = 15]") rather than
/// run as a count of 0: --help or -h with the usage on stdout and exit
/// code 0; a word, 0, a sign, a fraction or a number too many with the
/// usage on stderr and exit code 2. Returns that exit code, for main to
/// return at once; nullopt where the numbers are read.
[[nodiscard]] inline std::optional<int> read_counts(int argc, char* const* argv, std::string_view usage,
                                                    std::vector<int>& counts) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view a(argv[i]);
    if (a == "--help" || a == "-h") {
      fmt::print("usage: {}\n", usage);
      return 0;
    }
  }
  for (int i = 1; i < argc; ++i) {
    const std::string_view a(argv[i]);
    int value = 0;
    const auto [end, error] = std::from_chars(a.data(), a.data() + a.size(), value);
    const bool whole = error == std::errc{} && end == a.data() + a.size() && value > 0;
    if (!whole || static_cast<std::size_t>(i) > counts.size()) {
      fmt::print(stderr, "usage: {}\n", usage);
      return 2;
    }
    counts[static_cast<std::size_t>(i) - 1] = value;
  }
  return std::nullopt;
}

}  // namespace cohort::bench

// cohort-run's own words on its console: a line that cannot be written (a
// closed or full stderr, a reader gone from the pipe) is dropped, and never
// the reason the run ends or its outcome goes unrecorded.
#pragma once

#include <fmt/format.h>

#include <cstdio>
#include <string_view>
#include <utility>

namespace cohort_run {

/// Writes `text` to `stream` as far as it will go; failures are forgotten.
/// cohort-run ignores SIGPIPE (its ranks start with the default again), so
/// a reader that has gone fails the write with EPIPE instead of ending it.
void write_out(std::FILE* stream, std::string_view text) noexcept;

/// fmt::print to `stream`, through write_out.
template <class... Args>
void print_to(std::FILE* stream, fmt::format_string<Args...> format, Args&&... args) noexcept {
  try {
    write_out(stream, fmt::format(format, std::forward<Args>(args)...));
  } catch (...) {
    // Out of memory for the line: it is left out, as a line that cannot be written.
  }
}

/// A line of cohort-run's own on stderr.
template <class... Args>
void say(fmt::format_string<Args...> format, Args&&... args) noexcept {
  print_to(stderr, format, std::forward<Args>(args)...);
}

}  // namespace cohort_run

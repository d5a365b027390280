// cohort-run's own words on its console: a line that cannot be written (a
// closed or full stderr, a reader gone from the pipe) is dropped, and never
// the reason the run ends or its outcome goes unrecorded.
#pragma once

#include <fmt/format.h>

#include <signal.h>

#include <cstdio>
#include <string_view>
#include <utility>

namespace cohort_run {

/// Writes `text` to `stream` as far as it will go; failures are forgotten.
/// cohort-run ignores SIGPIPE (its ranks start with the default again), so
/// a reader that has gone fails the write with EPIPE instead of ending it.
/// On stdout and stderr, a console that does not take it (a paused
/// terminal, a pipe nobody reads) is waited for as a plain program waits,
/// until a shutdown signal came (read, or pending: no thread reads them
/// while one waits here); from then on, the lines wait for it 5 s in all,
/// and what it does not take after that is dropped: the run ends and its
/// outcome is recorded whatever the console does. The first line it takes
/// after some were dropped says how many. Any thread may call it.
void write_out(std::FILE* stream, std::string_view text) noexcept;

/// The signals that end the run, whose coming limits write_out's waits
/// while they are still pending. Call before any thread is made.
void end_console_waits_on(const sigset_t& shutdown) noexcept;

/// A shutdown signal was read: write_out's waits are limited from now.
void shutdown_began() noexcept;

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

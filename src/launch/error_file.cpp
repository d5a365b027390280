// Writing and reading torchelastic-shaped error files.
#include "cohort/error_file.hpp"

#include "launch/json_text.hpp"
#include "launch/uncaught.hpp"
#include "os/owned_fd.hpp"
#include "os/replace_file.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <typeinfo>

namespace cohort {

namespace {

// The most of a message, and of a trace, that an error file holds: the
// message twice (alone, and ending the trace) and the trace, escaped at
// worst six bytes for one, stay within what its readers take (16 MiB,
// max_error_file_size).
constexpr std::size_t max_error_field = 512 * 1024;

// `text`, cut to max_error_field bytes with a note of what was left out.
std::string within_limit(std::string_view text) {
  if (text.size() <= max_error_field) return std::string(text);
  return fmt::format("{}... ({} bytes more left out)", text.substr(0, max_error_field), text.size() - max_error_field);
}

// What torch's "py_callstack" holds: the trace, then the message as its
// last line, as Python's traceback.format_exc() ends with the exception's.
// torch shows only this where there is one.
std::string callstack_of(const std::string& message, const std::string& trace) {
  if (message.empty()) return trace;
  std::string stack = trace;
  if (!stack.empty() && stack.back() != '\n') stack += '\n';
  return stack + message + '\n';
}

// `stack` without a last line that repeats `message` (callstack_of, or
// Python's traceback), and the line break before it.
std::string trace_of(std::string stack, const std::string& message) {
  if (message.empty()) return stack;
  for (const std::string& line : {message + '\n', message}) {
    if (stack.size() < line.size() || stack.compare(stack.size() - line.size(), line.size(), line) != 0) continue;
    const std::size_t start = stack.size() - line.size();
    if (start != 0 && stack[start - 1] != '\n') continue;
    stack.resize(start);
    if (!stack.empty()) stack.pop_back();
    return stack;
  }
  return stack;
}

}  // namespace

std::optional<std::filesystem::path> error_file_path() {
  for (const char* name : {"COHORT_ERROR_FILE", "TORCHELASTIC_ERROR_FILE"}) {
    if (const char* value = std::getenv(name); value != nullptr && *value != '\0') return std::filesystem::path(value);
  }
  return std::nullopt;
}

bool record_error(const error_report& report) noexcept {
  try {
    auto path = error_file_path();
    if (!path) return false;
    const auto when = report.timestamp.value_or(std::chrono::system_clock::now());
    const auto since = when.time_since_epoch();
    const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(since).count();
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(since).count();
    // torch reads "timestamp" as whole seconds (int() of the string);
    // "timestamp_ns" is cohort's, so that failures within one second are
    // ordered as they happened.
    const auto message = within_limit(report.message);
    nlohmann::json file = {
        {"message",
         {{"message", message},
          {"extraInfo",
           {{"py_callstack", callstack_of(message, within_limit(report.trace))},
            {"timestamp", std::to_string(seconds)},
            {"timestamp_ns", std::to_string(ns)}}}}}};
    // Made before the file is opened, so that a report that cannot be put
    // into words leaves no empty file. Bytes that are not UTF-8 (a what()
    // naming a file in Latin-1) become U+FFFD rather than losing the report.
    return os::replace_file(*path, file.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + '\n');
  } catch (...) {
    return false;
  }
}

bool record_error(const std::exception& error, std::string_view trace) noexcept {
  try {
    return record_error(error_report{detail::exception_message(error), std::string(trace), std::nullopt});
  } catch (...) {
    return false;
  }
}

namespace {

// The whole of the regular file at `path`, at most max_error_file_size bytes;
// nullopt for anything else. The rank chose what lies there: it is opened
// without blocking, so that a FIFO (whose open waits for a writer) or a
// device cannot hold up its supervisor, and then only a regular file is read.
std::optional<std::string> regular_file_text(const std::filesystem::path& path) {
  const os::owned_fd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
  struct stat st{};
  if (fd.get() < 0 || ::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  if (st.st_size < 0 || static_cast<std::uintmax_t>(st.st_size) > max_error_file_size) return std::nullopt;
  std::string text;
  text.reserve(static_cast<std::size_t>(st.st_size));
  char buffer[64 * 1024];
  for (;;) {
    const ssize_t n = ::read(fd.get(), buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return std::nullopt;
    if (n == 0) return text;
    text.append(buffer, static_cast<std::size_t>(n));
    if (text.size() > max_error_file_size) return std::nullopt;  // grown since fstat
  }
}

// The string at `key`, or "" where there is none or it is not a string: a
// file written by hand, or by another version, still gives what it can.
std::string string_at(const nlohmann::json& object, const char* key) {
  const auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// A count of `Unit` since the epoch at `key`, as a string of digits or a
// whole number; nullopt when missing, malformed, negative, or too large to
// be a time point.
template <class Unit>
std::optional<std::chrono::system_clock::time_point> time_at(const nlohmann::json& object, const char* key) {
  const auto it = object.find(key);
  if (it == object.end()) return std::nullopt;
  long long count = -1;
  if (it->is_number_integer()) {
    count = it->get<long long>();
  } else if (it->is_string()) {
    const auto& text = it->get_ref<const std::string&>();
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), count);
    if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  }
  const auto most = std::chrono::duration_cast<Unit>(std::chrono::system_clock::duration::max()).count();
  if (count < 0 || count > most) return std::nullopt;
  using std::chrono::system_clock;
  return system_clock::time_point(std::chrono::duration_cast<system_clock::duration>(Unit(count)));
}

}  // namespace

std::optional<error_report> read_error_file(const std::filesystem::path& path) {
  const auto text = regular_file_text(path);
  if (!text) return std::nullopt;
  const auto file = nlohmann::json::parse(detail::without_lone_surrogates(*text), nullptr, /*allow_exceptions=*/false);
  if (!file.is_object() || !file.contains("message")) return std::nullopt;
  const auto& message = file["message"];
  error_report report;
  if (message.is_string()) {
    // Torch's other shape: its time, in whole seconds, beside the message.
    report.message = message.get<std::string>();
    report.timestamp = time_at<std::chrono::seconds>(file, "timestamp");
    return report;
  }
  if (!message.is_object()) return std::nullopt;
  report.message = string_at(message, "message");
  if (auto extra = message.find("extraInfo"); extra != message.end() && extra->is_object()) {
    report.trace = trace_of(string_at(*extra, "py_callstack"), report.message);
    report.timestamp = time_at<std::chrono::nanoseconds>(*extra, "timestamp_ns");
    if (!report.timestamp) report.timestamp = time_at<std::chrono::seconds>(*extra, "timestamp");
  }
  return report;
}

}  // namespace cohort

// Writing and reading torchelastic-shaped error files.
#include "cohort/error_file.hpp"

#include "os/demangle.hpp"

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <fstream>
#include <typeinfo>

namespace cohort {

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
    const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(when.time_since_epoch()).count();
    nlohmann::json file = {
        {"message",
         {{"message", report.message},
          {"extraInfo", {{"py_callstack", report.trace}, {"timestamp", std::to_string(seconds)}}}}}};
    std::ofstream out(*path, std::ios::trunc);
    out << file.dump(2) << '\n';
    return static_cast<bool>(out.flush());
  } catch (...) {
    return false;
  }
}

bool record_error(const std::exception& error, std::string_view trace) noexcept {
  try {
    return record_error(error_report{os::demangle(typeid(error)) + ": " + error.what(), std::string(trace), std::nullopt});
  } catch (...) {
    return false;
  }
}

std::optional<error_report> read_error_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  auto file = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!file.is_object() || !file.contains("message")) return std::nullopt;
  const auto& message = file["message"];
  error_report report;
  if (message.is_string()) {
    report.message = message.get<std::string>();
    return report;
  }
  if (!message.is_object()) return std::nullopt;
  report.message = message.value("message", "");
  if (auto extra = message.find("extraInfo"); extra != message.end() && extra->is_object()) {
    report.trace = extra->value("py_callstack", "");
    if (auto stamp = extra->find("timestamp"); stamp != extra->end()) {
      long long seconds = 0;
      try {
        seconds = stamp->is_string() ? std::stoll(stamp->get<std::string>()) : stamp->get<long long>();
        report.timestamp = std::chrono::system_clock::time_point(std::chrono::seconds(seconds));
      } catch (...) {
        // A timestamp that is not a number is left out.
      }
    }
  }
  return report;
}

}  // namespace cohort

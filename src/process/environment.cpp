// Building a child's environment block.
#include "cohort/environment.hpp"

#include <stdexcept>
#include <string_view>

extern char** environ;

namespace cohort {
namespace {

void check_name(const std::string& name) {
  if (name.empty() || name.find('=') != std::string::npos || name.find('\0') != std::string::npos) {
    throw std::invalid_argument("cohort::environment: bad variable name '" + name + "'");
  }
}

}  // namespace

environment environment::from(const std::map<std::string, std::string>& variables) {
  environment env = empty();
  for (const auto& [name, value] : variables) env.set(name, value);
  return env;
}

environment& environment::set(std::string name, std::string value) {
  changes_.insert_or_assign(std::move(name), std::move(value));
  return *this;
}

environment& environment::unset(std::string name) {
  changes_.insert_or_assign(std::move(name), std::nullopt);
  return *this;
}

std::vector<std::string> environment::materialize() const {
  std::map<std::string, std::string> vars;
  if (inherit_ && environ != nullptr) {
    for (char** entry = environ; *entry != nullptr; ++entry) {
      std::string_view text(*entry);
      auto eq = text.find('=');
      if (eq == std::string_view::npos || eq == 0) continue;
      vars.emplace(std::string(text.substr(0, eq)), std::string(text.substr(eq + 1)));
    }
  }
  for (const auto& [name, value] : changes_) {
    check_name(name);
    if (!value) {
      vars.erase(name);
    } else if (value->find('\0') != std::string::npos) {
      throw std::invalid_argument("cohort::environment: value of '" + name + "' holds NUL");
    } else {
      vars.insert_or_assign(name, *value);
    }
  }
  std::vector<std::string> block;
  block.reserve(vars.size());
  for (const auto& [name, value] : vars) block.push_back(name + "=" + value);
  return block;
}

std::optional<std::string> environment::get(const std::string& name) const {
  if (auto it = changes_.find(name); it != changes_.end()) return it->second;
  if (!inherit_) return std::nullopt;
  if (const char* value = std::getenv(name.c_str())) return std::string(value);
  return std::nullopt;
}

}  // namespace cohort

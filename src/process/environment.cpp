// Building a child's environment block.
#include "cohort/environment.hpp"

#include <algorithm>
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

namespace {

std::string_view name_of(std::string_view entry) { return entry.substr(0, entry.find('=')); }

}  // namespace

// One string per variable, no map: a group builds a block per rank.
std::vector<std::string> environment::materialize() const {
  std::vector<std::string> block;
  if (inherit_ && environ != nullptr) {
    std::size_t count = 0;
    while (environ[count] != nullptr) ++count;
    block.reserve(count + changes_.size());
    for (std::size_t i = 0; i < count; ++i) {
      const std::string_view text(environ[i]);
      const auto eq = text.find('=');
      if (eq != std::string_view::npos && eq != 0) block.emplace_back(text);
    }
    // Sorted by name; of a name given twice, the first one stays.
    std::stable_sort(block.begin(), block.end(), [](const std::string& a, const std::string& b) { return name_of(a) < name_of(b); });
    block.erase(std::unique(block.begin(), block.end(),
                            [](const std::string& a, const std::string& b) { return name_of(a) == name_of(b); }),
                block.end());
  }
  for (const auto& [name, value] : changes_) {
    check_name(name);
    const auto at = std::lower_bound(block.begin(), block.end(), name,
                                     [](const std::string& entry, const std::string& n) { return name_of(entry) < n; });
    const bool present = at != block.end() && name_of(*at) == name;
    if (!value) {
      if (present) block.erase(at);
    } else if (value->find('\0') != std::string::npos) {
      throw std::invalid_argument("cohort::environment: value of '" + name + "' holds NUL");
    } else if (present) {
      *at = name + "=" + *value;
    } else {
      block.insert(at, name + "=" + *value);
    }
  }
  return block;
}

std::optional<std::string> environment::get(const std::string& name) const {
  if (auto it = changes_.find(name); it != changes_.end()) return it->second;
  if (!inherit_) return std::nullopt;
  if (const char* value = std::getenv(name.c_str())) return std::string(value);
  return std::nullopt;
}

}  // namespace cohort

// Building a child's environment block.
#include "cohort/environment.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <stdexcept>
#include <string_view>

extern char** environ;

namespace cohort {
namespace {

// The name as a message shows it: a NUL would end the message there, so
// it is written \0.
std::string shown(const std::string& name) {
  std::string text;
  for (const char c : name) {
    if (c == '\0') text += "\\0";
    else text += c;
  }
  return text;
}

void check_name(const std::string& name) {
  const char* why = nullptr;
  if (name.empty()) why = "it is empty";
  else if (name.find('\0') != std::string::npos) why = "it holds NUL";
  else if (name.find('=') != std::string::npos) why = "it holds '='";
  if (why != nullptr) {
    throw std::invalid_argument("cohort::environment: bad variable name '" + shown(name) + "': " + why);
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

// No map: a group builds a block per rank. Each name is found once, not
// at every comparison of the sort.
template <class Entry>
void environment::merge(Entry&& entry) const {
  std::vector<std::pair<std::string_view, std::string_view>> inherited;  // name, whole entry
  if (inherit_ && environ != nullptr) {
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string_view text(*e);
      const auto eq = text.find('=');
      if (eq != std::string_view::npos && eq != 0) inherited.emplace_back(text.substr(0, eq), text);
    }
    // Sorted by name; of a name given twice, the first one stays.
    const auto by_name = [](const auto& a, const auto& b) { return a.first < b.first; };
    std::stable_sort(inherited.begin(), inherited.end(), by_name);
    inherited.erase(std::unique(inherited.begin(), inherited.end(),
                                [](const auto& a, const auto& b) { return a.first == b.first; }),
                    inherited.end());
  }
  // The changes are sorted by name too: one merge of the two.
  auto next = inherited.begin();
  for (const auto& [name, value] : changes_) {
    check_name(name);
    for (; next != inherited.end() && next->first < name; ++next) entry(next->second, nullptr);
    if (next != inherited.end() && next->first == name) ++next;  // set or unset here
    if (!value) continue;
    if (value->find('\0') != std::string::npos) {
      throw std::invalid_argument("cohort::environment: value of '" + name + "' holds NUL");
    }
    entry(std::string_view(name), &*value);
  }
  for (; next != inherited.end(); ++next) entry(next->second, nullptr);
}

std::vector<std::string> environment::materialize() const {
  std::vector<std::string> block;
  merge([&block](std::string_view first, const std::string* value) {
    if (value == nullptr) {
      block.emplace_back(first);
    } else {
      block.push_back(std::string(first) + "=" + *value);
    }
  });
  return block;
}

void environment::materialize(std::vector<char>& text, std::vector<char*>& pointers) const {
  // Room for every entry the block can hold, so that neither grows.
  std::size_t entries = changes_.size(), bytes = 0;
  if (inherit_ && environ != nullptr) {
    for (char** e = environ; *e != nullptr; ++e, ++entries) bytes += std::char_traits<char>::length(*e) + 1;
  }
  for (const auto& [name, value] : changes_) bytes += name.size() + (value ? value->size() : 0) + 2;
  text.clear();
  pointers.clear();
  text.reserve(bytes);
  try {
    merge([&](std::string_view first, const std::string* value) {
      text.insert(text.end(), first.begin(), first.end());
      if (value != nullptr) {
        text.push_back('=');
        text.insert(text.end(), value->begin(), value->end());
      }
      text.push_back('\0');
    });
  } catch (...) {
    text.clear();  // no part of a block that was refused
    throw;
  }
  // The pointers once the text is whole: each entry ends at its NUL, and
  // none holds another (refused above, and none in environ's).
  pointers.reserve(entries + 1);
  for (std::size_t at = 0; at < text.size(); at += std::char_traits<char>::length(text.data() + at) + 1) {
    pointers.push_back(text.data() + at);
  }
  pointers.push_back(nullptr);
}

std::optional<std::string> environment::get(const std::string& name) const {
  if (auto it = changes_.find(name); it != changes_.end()) return it->second;
  if (!inherit_) return std::nullopt;
  if (const char* value = std::getenv(name.c_str())) return std::string(value);
  return std::nullopt;
}

std::vector<std::string> environment::path_candidates(const std::string& program) const {
  std::vector<std::string> candidates;
  if (program.empty() || program.find('/') != std::string::npos) return candidates;
  const std::string search = get("PATH").value_or("/usr/local/bin:/usr/bin:/bin");
  std::size_t begin = 0;
  for (;;) {
    const std::size_t end = search.find(':', begin);
    const std::string dir = search.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
    candidates.push_back((dir.empty() ? std::string(".") : dir) + "/" + program);
    if (end == std::string::npos) break;
    begin = end + 1;
  }
  return candidates;
}

bool is_executable_file(const std::string& path) noexcept {
  struct stat st {};
  // AT_EACCESS: by the effective ids, as execve judges.
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
         ::faccessat(AT_FDCWD, path.c_str(), X_OK, AT_EACCESS) == 0;
}

}  // namespace cohort

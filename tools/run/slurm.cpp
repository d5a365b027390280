#include "run/slurm.hpp"

#include <fmt/format.h>

#include <charconv>
#include <cstdlib>
#include <stdexcept>

namespace cohort_run {
namespace {

// The items of `list` split at commas outside brackets.
std::vector<std::string_view> top_level_items(std::string_view list) {
  std::vector<std::string_view> items;
  int depth = 0;
  std::size_t begin = 0;
  for (std::size_t i = 0; i <= list.size(); ++i) {
    if (i == list.size() || (list[i] == ',' && depth == 0)) {
      if (i > begin) items.push_back(list.substr(begin, i - begin));
      begin = i + 1;
    } else if (list[i] == '[') {
      if (++depth > 1) throw std::invalid_argument("nested brackets");
    } else if (list[i] == ']') {
      if (--depth < 0) throw std::invalid_argument("a ']' without its '['");
    }
  }
  if (depth != 0) throw std::invalid_argument("a '[' without its ']'");
  return items;
}

unsigned long number(std::string_view digits) {
  unsigned long value = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size()) {
    throw std::invalid_argument(fmt::format("'{}' is not a number", digits));
  }
  return value;
}

// One host name pattern: "a[1-2]b[3,5]" -> a1b3 a1b5 a2b3 a2b5.
void expand_name(std::string_view name, const std::string& head, std::vector<std::string>& hosts) {
  const auto open = name.find('[');
  if (open == std::string_view::npos) {
    hosts.push_back(head + std::string(name));
    return;
  }
  const auto close = name.find(']', open);
  const std::string prefix = head + std::string(name.substr(0, open));
  const auto rest = name.substr(close + 1);
  std::string_view ranges = name.substr(open + 1, close - open - 1);
  if (ranges.empty()) throw std::invalid_argument("empty brackets");
  while (!ranges.empty()) {
    const auto comma = ranges.find(',');
    const auto range = ranges.substr(0, comma);
    ranges = comma == std::string_view::npos ? std::string_view() : ranges.substr(comma + 1);
    const auto dash = range.find('-');
    const auto low = range.substr(0, dash);
    const unsigned long first = number(low);
    const unsigned long last = dash == std::string_view::npos ? first : number(range.substr(dash + 1));
    if (last < first) throw std::invalid_argument(fmt::format("range '{}' runs backwards", range));
    if (last - first > 100000) throw std::invalid_argument(fmt::format("range '{}' is too long", range));
    for (unsigned long i = first; i <= last; ++i) {
      expand_name(rest, fmt::format("{}{:0{}}", prefix, i, low.size()), hosts);
    }
  }
}

std::string variable(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

int count_in(const char* name, const std::string& text, int least) {
  unsigned long value = 0;
  try {
    value = number(text);
  } catch (const std::invalid_argument&) {
    throw std::invalid_argument(fmt::format("{}='{}' is not a number", name, text));
  }
  if (value < static_cast<unsigned long>(least) || value > 1000000) {
    throw std::invalid_argument(fmt::format("{}='{}' is out of range", name, text));
  }
  return static_cast<int>(value);
}

}  // namespace

std::vector<std::string> expand_nodelist(std::string_view list) {
  std::vector<std::string> hosts;
  for (const auto item : top_level_items(list)) expand_name(item, "", hosts);
  return hosts;
}

std::optional<slurm_step> slurm_step_from_environment() {
  if (std::getenv("SLURM_STEP_ID") == nullptr || std::getenv("SLURM_NODEID") == nullptr) return std::nullopt;
  slurm_step step;
  step.node_id = count_in("SLURM_NODEID", variable("SLURM_NODEID"), 0);
  const char* nnodes_name = std::getenv("SLURM_STEP_NUM_NODES") != nullptr ? "SLURM_STEP_NUM_NODES" : "SLURM_NNODES";
  step.nnodes = count_in(nnodes_name, variable(nnodes_name), 1);
  if (step.node_id >= step.nnodes) {
    throw std::invalid_argument(fmt::format("SLURM_NODEID={} is not below {}={}", step.node_id, nnodes_name, step.nnodes));
  }
  step.job_id = variable("SLURM_JOB_ID");
  const char* list_name = std::getenv("SLURM_STEP_NODELIST") != nullptr ? "SLURM_STEP_NODELIST" : "SLURM_JOB_NODELIST";
  const std::string list = variable(list_name);
  try {
    const auto hosts = expand_nodelist(list);
    if (hosts.empty()) throw std::invalid_argument("no host");
    step.first_host = hosts.front();
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(fmt::format("{}='{}' is not a Slurm node list: {}", list_name, list, e.what()));
  }
  return step;
}

}  // namespace cohort_run

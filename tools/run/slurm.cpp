#include "run/slurm.hpp"

#include <fmt/format.h>

#include <charconv>
#include <climits>
#include <cstdlib>
#include <stdexcept>
#include <utility>
#include <vector>

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

// Throws std::invalid_argument for what is not a number, std::out_of_range
// for one too large for an unsigned long.
unsigned long number(std::string_view digits) {
  unsigned long value = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (digits.empty() || end != digits.data() + digits.size() ||
      (ec != std::errc() && ec != std::errc::result_out_of_range)) {
    throw std::invalid_argument(fmt::format("'{}' is not a number", digits));
  }
  if (ec == std::errc::result_out_of_range) throw std::out_of_range(fmt::format("'{}' is too large", digits));
  return value;
}

// The first host one host name pattern stands for ("a[1-2]b[3,5]" -> a1b3),
// the whole pattern checked: every range of every bracket group.
std::string first_of_name(std::string_view name) {
  std::string first;
  for (;;) {
    const auto open = name.find('[');
    first += name.substr(0, open);
    if (open == std::string_view::npos) return first;
    const auto close = name.find(']', open);
    std::string_view ranges = name.substr(open + 1, close - open - 1);
    name = name.substr(close + 1);
    if (ranges.empty()) throw std::invalid_argument("empty brackets");
    bool first_range = true;
    for (;;) {
      const auto comma = ranges.find(',');
      const auto range = ranges.substr(0, comma);
      const auto dash = range.find('-');
      const auto low = range.substr(0, dash);
      const unsigned long from = number(low);
      const unsigned long to = dash == std::string_view::npos ? from : number(range.substr(dash + 1));
      if (to < from) throw std::invalid_argument(fmt::format("range '{}' runs backwards", range));
      if (to - from > 100000) throw std::invalid_argument(fmt::format("range '{}' is too long", range));
      if (first_range) first += fmt::format("{:0{}}", from, low.size());
      first_range = false;
      if (comma == std::string_view::npos) break;
      ranges = ranges.substr(comma + 1);
      if (ranges.empty()) throw std::invalid_argument("a ',' with no range after it");
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
  } catch (const std::out_of_range&) {
    value = ULONG_MAX;  // too large for any count
  }
  if (value < static_cast<unsigned long>(least) || value > 1000000) {
    throw std::invalid_argument(fmt::format("{}='{}' is out of range", name, text));
  }
  return static_cast<int>(value);
}

}  // namespace

std::optional<std::string> nodelist_first_host(std::string_view list) {
  std::optional<std::string> first;
  try {
    for (const auto item : top_level_items(list)) {
      auto host = first_of_name(item);
      if (!first) first = std::move(host);
    }
  } catch (const std::out_of_range& e) {  // a number in brackets too large
    throw std::invalid_argument(e.what());
  }
  return first;
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
  step.nodelist_name = list_name;
  try {
    auto first = nodelist_first_host(list);
    if (!first) throw std::invalid_argument("no host");
    step.first_host = std::move(*first);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(fmt::format("{}='{}' is not a Slurm node list: {}", list_name, list, e.what()));
  }
  return step;
}

}  // namespace cohort_run

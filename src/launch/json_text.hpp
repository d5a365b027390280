// JSON text as Python writes it, made readable to nlohmann::json.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace cohort::detail {

// `text` with each \u escape of a lone UTF-16 surrogate (one not in a
// high-low pair) written as \ufffd. Python's json.dump escapes the
// surrogates that stand for undecodable bytes (a file name read with
// os.fsdecode) this way, and its json.load reads them back; nlohmann::json
// refuses the whole text. Escapes are found by walking backslash pairs, so
// that an escaped backslash before a 'u' is not taken for one.
inline std::string without_lone_surrogates(std::string_view text) {
  const auto hex = [](std::string_view at) -> int {
    if (at.size() < 4) return -1;
    int value = 0;
    for (char c : at.substr(0, 4)) {
      const int digit = c >= '0' && c <= '9' ? c - '0'
                        : c >= 'a' && c <= 'f' ? c - 'a' + 10
                        : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                               : -1;
      if (digit < 0) return -1;
      value = value * 16 + digit;
    }
    return value;
  };
  // The unit of the \u escape at `at` (which holds "\u"), or -1.
  const auto unit_at = [&](std::size_t at) {
    return at + 1 < text.size() && text[at] == '\\' && text[at + 1] == 'u' ? hex(text.substr(at + 2)) : -1;
  };
  const auto high = [](int u) { return u >= 0xD800 && u <= 0xDBFF; };
  const auto low = [](int u) { return u >= 0xDC00 && u <= 0xDFFF; };
  std::string out;
  out.reserve(text.size());
  std::size_t i = 0;
  while (i < text.size()) {
    if (text[i] != '\\' || i + 1 >= text.size()) {
      out += text[i++];
      continue;
    }
    const int unit = unit_at(i);
    if (high(unit) && low(unit_at(i + 6))) {
      out.append(text.substr(i, 12));
      i += 12;
    } else if (high(unit) || low(unit)) {
      out += "\\ufffd";
      i += 6;
    } else {
      out.append(text.substr(i, 2));  // any other escape, the backslash's pair
      i += 2;
    }
  }
  return out;
}

}  // namespace cohort::detail

// Whole-string integer parsing for ids in requests and flags.
#pragma once

#include <optional>
#include <string>

namespace g4 {

// `text` as a whole decimal integer in std::stoll's syntax (leading white space and a sign are
// accepted); nullopt where it is empty, has any other character, or lies outside long long.
inline std::optional<long long> ParseWholeInteger(const std::string& text) {
  size_t pos = 0;
  long long v = 0;
  try {
    v = std::stoll(text, &pos);
  } catch (...) {
    return std::nullopt;
  }
  if (pos != text.size()) return std::nullopt;
  return v;
}

}  // namespace g4

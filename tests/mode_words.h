// Tests only: a mode compares equal to its word, so a check reads as the deck
// line it tests (CHECK(c.compress.exchange == "partitioned")). The program
// itself never compares a mode with a string (core/modes.h).
#pragma once
#include <string>
#include "core/modes.h"

namespace xx {
template <Mode E>
bool operator==(E e, const char* word) {
  return mode_name(e) == word;
}
template <Mode E>
bool operator==(E e, const std::string& word) {
  return mode_name(e) == word;
}
}  // namespace xx

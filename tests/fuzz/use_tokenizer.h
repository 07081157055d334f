// What a run and tools/prepare-data ask of a tokenizer that loaded, for the
// tokenizer fuzz targets: its start-up line, every token's bytes (one past
// each end too), a decode of its first 4096 ids, and `text` encoded and
// decoded back.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>
#include "data/tokenizer.h"

inline void use_tokenizer(const xx::Tokenizer& tok, const std::string& text) {
  tok.describe();
  const int32_t vocab = tok.vocab();
  std::vector<int32_t> every;
  for (int32_t t = -1; t <= vocab; ++t) tok.bytes_of(t);
  for (int32_t t = 0; t < std::min<int32_t>(vocab, 4096); ++t) every.push_back(t);
  tok.decode(every);
  tok.decode(tok.encode(text));
}

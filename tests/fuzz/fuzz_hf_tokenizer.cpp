// The tokenizer.json reader (src/data/hf_tokenizer.cpp) on untrusted bytes:
// parse_hf_tokenizer, then what a run and tools/prepare-data ask of it (its
// vocab, every token's bytes, a decode of every id, an encode of text with
// scripts, digits, emoji, whitespace runs and invalid UTF-8). An InputError
// is the expected outcome of bad bytes; anything else (another exception, a
// crash, a sanitizer report, a hang) is a finding. libFuzzer target under
// XX_FUZZ (tools/lab/fuzz --target hf_tokenizer; seeds in tests/fuzz/seeds/hf_tokenizer).
#include <cstdint>
#include <string>
#include "core/error.h"         // InputError
#include "data/hf_tokenizer.h"  // parse_hf_tokenizer
#include "use_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  std::unique_ptr<xx::Tokenizer> tok;
  try {
    tok = xx::parse_hf_tokenizer(std::string(reinterpret_cast<const char*>(bytes), size), "fuzz/tokenizer.json");
  } catch (const xx::InputError&) {
    return 0;  // bad input, reported as such: the expected outcome
  }
  const std::string text =
      "Line 7: the quick brown fox, 1234567 and 3.14159; \xe7\x8e\x84\xe5\xad\xa6 \xe3\x81\x8b\xe3\x81\xaa "
      "\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x92\xbb\n\n\t  x\xc2\x85y\xe3\x80\x80z \xff\xfe\xc3 <|end|>";
  use_tokenizer(*tok, text);
  return 0;
}

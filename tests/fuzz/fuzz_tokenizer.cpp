// The SentencePiece model reader (src/data/tokenizer.cpp) on untrusted
// bytes: load_tokenizer, then what a run asks of the model (its vocab, the
// bytes of every token for bits per byte, the decode of validation samples)
// and an encode, as tools/prepare-data's shards are made with it. An
// InputError is the expected outcome of bad bytes; anything else (another
// exception, a crash, a sanitizer report) is a finding. libFuzzer target
// under XX_FUZZ (tools/lab/fuzz --target tokenizer). libsentencepiece itself
// is not instrumented: coverage guides the fuzzer through our code only, and
// ASan sees the library's heap through its malloc and free.
#include <unistd.h>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>
#include "core/error.h"      // InputError
#include "data/tokenizer.h"  // load_tokenizer
#include "use_tokenizer.h"

namespace {
std::string g_path;  // the file each input is written to
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  char dir[] = "/tmp/xx-fuzz-tok.XXXXXX";
  if (!mkdtemp(dir)) return perror("mkdtemp"), 1;
  g_path = std::string(dir) + "/tokenizer.model";
  std::atexit([] { std::error_code ignored; std::filesystem::remove_all(std::filesystem::path(g_path).parent_path(), ignored); });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  {
    std::ofstream out(g_path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes), std::streamsize(size));
  }
  std::unique_ptr<xx::Tokenizer> tok;
  try {
    tok = xx::load_tokenizer(g_path);
  } catch (const xx::InputError&) {
    return 0;  // bad input, reported as such: the expected outcome
  }
  use_tokenizer(*tok, "Line 7: the quick brown fox jumps over the lazy dog, again. \xc3\xa9\xe2\x96\x81 \x01");
  return 0;
}

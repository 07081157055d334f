// Token corpora. Two formats (docs/DATA.md):
//   bytes: any file, one token per byte (vocab 256);
//   shard: a header (magic "XXTOKENS", version, token width 2 or 4, count,
//          vocab) followed by little-endian uint16 or uint32 tokens.
// The stream is cut into non-overlapping windows of seq+1 tokens (inputs and
// shifted targets); the last `valid_fraction` of the windows is validation.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace xx {

class Corpus {
 public:
  // Throws InputError naming the file, the offset and what was expected.
  static Corpus load(const std::string& path, const std::string& format);

  int64_t size() const { return int64_t(tokens_.size()); }
  int32_t vocab() const { return vocab_; }
  int32_t token(int64_t i) const { return tokens_[i]; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int32_t vocab_ = 256;
  std::vector<int32_t> tokens_;
};

// Writes a shard (used by tools and tests); write to temp, fsync, rename.
void write_shard(const std::string& path, const std::vector<int32_t>& tokens, int32_t vocab, int token_bytes);

// Window split of a corpus for a context of `seq` tokens.
struct WindowSplit {
  int64_t seq = 0;
  int64_t train_windows = 0;  // windows [0, train_windows)
  int64_t valid_windows = 0;  // windows [train_windows, train_windows + valid_windows)
};
// Throws InputError when the corpus is too small for one train and one valid window.
WindowSplit split_windows(const Corpus& corpus, int64_t seq, double valid_fraction);

}  // namespace xx

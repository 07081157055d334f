// Token corpora (docs/DATA.md). Two formats:
//   bytes: any file, one token per byte (vocab 256);
//   shard: a header (magic "XXTOKENS", version, token width 2 or 4, count,
//          vocab; version 2 adds the tokenizer's hash and the text's byte
//          count) followed by little-endian uint16 or uint32 tokens.
// A corpus is one file or many shards (a glob, in name order). Files are
// memory-mapped: a rank touches only the windows it reads, and lets their
// pages go again once it has copied them, so its resident memory does not
// grow with the corpus.
// Each shard is cut into non-overlapping windows of seq+1 tokens (inputs and
// shifted targets); a window never spans two shards. Windows are numbered
// across the shards in order; the last `valid_fraction` of them is
// validation unless validation has a file of its own.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>
#include "core/modes.h"  // DataFormat

namespace xx {

// What a shard's header says beyond its tokens (version 2; version 1 has neither).
struct ShardInfo {
  uint64_t tokenizer_hash = 0;  // FNV-1a 64 of the tokenizer model file; 0: none (bytes)
  uint64_t text_bytes = 0;      // UTF-8 bytes of text the tokens encode; 0: unknown
};

// One memory-mapped file: a shard or a bytes file.
class TokenFile {
 public:
  // Throws InputError naming the file, the offset and what was expected.
  // Tokens are range-checked when read; `check_tokens` scans them all now.
  static TokenFile open(const std::string& path, DataFormat format, bool check_tokens);

  const std::string& path() const { return path_; }
  int64_t size() const { return count_; }
  int32_t vocab() const { return vocab_; }
  int version() const { return version_; }  // 0: bytes, else the shard version
  const ShardInfo& info() const { return info_; }
  // Tokens [start, start + n) into out; throws InputError for a token >= vocab.
  // `release`: hand the pages back to the page cache afterwards.
  void read(int64_t start, int64_t n, int32_t* out, bool release) const;

 private:
  struct Mapping;
  std::string path_;
  std::shared_ptr<const Mapping> map_;
  const unsigned char* tokens_ = nullptr;  // first token byte
  int width_ = 1, version_ = 0;
  int64_t count_ = 0, header_ = 0;
  int32_t vocab_ = 256;
  ShardInfo info_;
};

class Corpus {
 public:
  // `pattern`: a file, or (shard) a glob of files read in name order. Throws
  // InputError naming the file and offset, or the pattern that matched nothing.
  static Corpus load(const std::string& pattern, DataFormat format, bool check_tokens = true);

  int64_t size() const { return size_; }  // tokens in all shards
  int32_t vocab() const { return vocab_; }  // the largest shard vocab
  const std::string& path() const { return path_; }  // the pattern as given
  const std::vector<TokenFile>& files() const { return files_; }

  // Windows of seq+1 tokens over all shards, and where window w starts in
  // the flat token stream (shard after shard).
  int64_t windows(int64_t seq) const;
  int64_t window_start(int64_t w, int64_t seq) const;
  // seq+1 tokens of window w into out (then its pages are released).
  void read_window(int64_t w, int64_t seq, int32_t* out) const;
  int32_t token(int64_t i) const;  // one token of the flat stream (tests, tools)

 private:
  std::pair<size_t, int64_t> locate(int64_t w, int64_t seq) const;
  std::string path_;
  std::vector<TokenFile> files_;
  std::vector<int64_t> first_;  // flat index of each file's first token
  int64_t size_ = 0;
  int32_t vocab_ = 0;
};

// Writes a shard (tools, tests) through a temp file, fsync, rename. Version 2
// unless `version` is 1 (no tokenizer hash or text bytes).
void write_shard(const std::string& path, const std::vector<int32_t>& tokens, int32_t vocab, int token_bytes,
                 const ShardInfo& info = {}, int version = 2);

// Window split of a corpus for a context of `seq` tokens.
struct WindowSplit {
  int64_t seq = 0;
  int64_t train_windows = 0;  // windows [0, train_windows)
  int64_t valid_windows = 0;  // windows [train_windows, train_windows + valid_windows)
};
// Throws InputError when the corpus is too small for one train and one valid window.
WindowSplit split_windows(const Corpus& corpus, int64_t seq, double valid_fraction);

}  // namespace xx

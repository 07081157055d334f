// Byte and SentencePiece tokenizers (interface in tokenizer.h).
#include "data/tokenizer.h"
#include <fstream>
#include <iterator>
#include "core/error.h"
#include "data/corpus.h"
#include "data/hf_tokenizer.h"
#ifdef XX_HAVE_SENTENCEPIECE
#include <sentencepiece_processor.h>
#endif

namespace xx {

namespace {

class ByteTokenizer final : public Tokenizer {
 public:
  std::string describe() const override { return "bytes: one token per byte, vocab 256"; }
  int32_t vocab() const override { return 256; }
  std::vector<int32_t> encode(const std::string& text) const override {
    return std::vector<int32_t>(reinterpret_cast<const unsigned char*>(text.data()),
                                reinterpret_cast<const unsigned char*>(text.data()) + text.size());
  }
  std::string decode(const std::vector<int32_t>& tokens) const override {
    std::string s;
    for (int32_t t : tokens) s += char(t & 0xff);
    return s;
  }
  int32_t bytes_of(int32_t) const override { return 1; }
};

#ifdef XX_HAVE_SENTENCEPIECE
// SentencePiece, as tools/prepare-data trains it: byte fallback, identity
// normalization, no dummy prefix, so decoding gives back the exact bytes.
class SentencePieceTokenizer final : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const std::string& path) : path_(path) {
    const auto status = sp_.Load(path);
    if (!status.ok())
      input_error("{}: not a SentencePiece model ({}) (expected the tokenizer.model tools/prepare-data writes)", path,
                  status.ToString());
    bytes_.resize(size_t(sp_.GetPieceSize()));
    for (int id = 0; id < sp_.GetPieceSize(); ++id) {
      if (sp_.IsControl(id) || sp_.IsUnknown(id)) continue;  // decode to nothing (unk: rare, counted as 0)
      if (sp_.IsByte(id)) {
        bytes_[size_t(id)] = 1;  // <0xNN>
        continue;
      }
      // U+2581 (3 bytes in UTF-8) stands for one space.
      std::string piece = sp_.IdToPiece(id);
      int32_t n = 0;
      for (size_t i = 0; i < piece.size();) {
        if (piece.compare(i, 3, "\xe2\x96\x81") == 0) ++n, i += 3;
        else ++n, ++i;
      }
      bytes_[size_t(id)] = n;
    }
  }
  std::string describe() const override {
    return fmt::format("sentencepiece: {}, vocab {}", path_, sp_.GetPieceSize());
  }
  int32_t vocab() const override { return sp_.GetPieceSize(); }
  std::vector<int32_t> encode(const std::string& text) const override {
    std::vector<int> ids;
    const auto status = sp_.Encode(text, &ids);
    if (!status.ok()) throw std::runtime_error(fmt::format("{}: encode failed ({})", path_, status.ToString()));
    return {ids.begin(), ids.end()};
  }
  std::string decode(const std::vector<int32_t>& tokens) const override {
    std::string text;
    const std::vector<int> ids(tokens.begin(), tokens.end());
    const auto status = sp_.Decode(ids, &text);
    if (!status.ok()) throw std::runtime_error(fmt::format("{}: decode failed ({})", path_, status.ToString()));
    return text;
  }
  int32_t bytes_of(int32_t t) const override { return t >= 0 && size_t(t) < bytes_.size() ? bytes_[size_t(t)] : 0; }

 private:
  std::string path_;
  sentencepiece::SentencePieceProcessor sp_;
  std::vector<int32_t> bytes_;
};
#endif

}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  if (path.empty()) return std::make_unique<ByteTokenizer>();
  if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0) return load_hf_tokenizer(path);
  if (!std::ifstream(path))
    input_error("{}: cannot open the tokenizer (expected a SentencePiece .model file or a Hugging Face tokenizer.json)",
                path);
#ifdef XX_HAVE_SENTENCEPIECE
  return std::make_unique<SentencePieceTokenizer>(path);
#else
  input_error("{}: this binary was built without SentencePiece (expected libsentencepiece-dev at build time; "
              "tools/setup-deps installs it)", path);
#endif
}

uint64_t tokenizer_hash(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) input_error("{}: cannot open the tokenizer model (expected a SentencePiece .model file)", path);
  uint64_t h = 0xcbf29ce484222325ull;
  for (std::istreambuf_iterator<char> it(in), end; it != end; ++it) {
    h ^= uint64_t(static_cast<unsigned char>(*it));
    h *= 0x100000001b3ull;
  }
  return h == 0 ? 1 : h;
}

void check_tokenizer(const Corpus& corpus, const std::string& tokenizer, const Tokenizer& tok, int32_t model_vocab,
                     const std::string& where) {
  const TokenFile* first_hashed = nullptr;
  for (const auto& f : corpus.files()) {
    const uint64_t h = f.info().tokenizer_hash;
    if (h != 0 && !first_hashed) first_hashed = &f;
    if (h != 0 && h != first_hashed->info().tokenizer_hash && tokenizer.empty())
      input_error("{}: tokenizer hash {:#018x} in its header, but {} has {:#018x} (expected every shard made with one "
                  "tokenizer)", f.path(), h, first_hashed->path(), first_hashed->info().tokenizer_hash);
  }
  if (tokenizer.empty()) return;  // nothing to check against: bits per byte and samples need the tokenizer
  if (tok.vocab() != model_vocab)
    input_error("{}: model vocab {}, but the tokenizer {} has vocab {} (expected model vocab {})", where, model_vocab,
                tokenizer, tok.vocab(), tok.vocab());
  const uint64_t want = tokenizer_hash(tokenizer);
  for (const auto& f : corpus.files()) {
    if (f.info().tokenizer_hash != 0 && f.info().tokenizer_hash != want)
      input_error("{}: tokenizer hash {:#018x} in its header, but {} hashes to {:#018x} (expected shards made with "
                  "this tokenizer: tools/prepare-data --model {})", f.path(), f.info().tokenizer_hash, tokenizer, want,
                  tokenizer);
    if (f.vocab() != tok.vocab())
      input_error("{}: vocab {} in its header, but the tokenizer {} has vocab {} (expected shards made with this "
                  "tokenizer)", f.path(), f.vocab(), tokenizer, tok.vocab());
  }
}

}  // namespace xx

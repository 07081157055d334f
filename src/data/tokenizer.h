// Tokenizers: text to token ids and back. One interface, two implementations,
// chosen by `load_tokenizer` from what the deck names:
//   bytes          one token per byte (vocab 256), the default demo;
//   sentencepiece  a SentencePiece model (tools/prepare-data --tokenizer bpe).
// Each token also knows how many bytes of text it stands for, so validation
// can report bits per byte, comparable across tokenizers (docs/DATA.md).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace xx {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::string describe() const = 0;  // start-up row: kind, file, vocab
  virtual int32_t vocab() const = 0;
  virtual std::vector<int32_t> encode(const std::string& text) const = 0;
  virtual std::string decode(const std::vector<int32_t>& tokens) const = 0;
  // UTF-8 bytes of text token t decodes to (0 for control tokens).
  virtual int32_t bytes_of(int32_t token) const = 0;
};

// "" : bytes; a path ending in .json: a Hugging Face tokenizer.json
// (byte-level BPE, data/hf_tokenizer.h); else the SentencePiece model at `path`. Throws InputError
// naming the file when it cannot be read or this binary has no SentencePiece.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);

// The hash a shard records of its tokenizer (docs/DATA.md): FNV-1a 64 of the
// model file's bytes, never 0 (0 means "no tokenizer").
uint64_t tokenizer_hash(const std::string& path);

}  // namespace xx

namespace xx {
class Corpus;

// Every shard of `corpus` was made with one tokenizer, and it is the deck's
// (`tokenizer`, "" when the deck names none), whose vocab is the model's.
// Throws InputError naming both files and both values of the first
// disagreement. `where`: the deck location, for the model's vocab.
void check_tokenizer(const Corpus& corpus, const std::string& tokenizer, const Tokenizer& tok, int32_t model_vocab,
                     const std::string& where);
}  // namespace xx

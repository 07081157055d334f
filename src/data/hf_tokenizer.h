// Hugging Face tokenizer.json, byte-level BPE (DeepSeek V2/V3, Llama 3,
// Qwen, GPT-2): the released models' own tokenizer, for encode and decode.
//
// What it reads (docs/DATA.md, "tokenizer.json"): the added tokens, matched
// in the raw text first; a normalizer that does nothing; the pre-tokenizer's
// Split (a regex over Unicode classes, through PCRE2), Digits and ByteLevel
// steps; the BPE model's vocab and merges, with ignore_merges; the ByteLevel
// decoder. The post-processor is not applied: encode adds no BOS (a shard's
// documents are framed by tools/prepare-data). Anything else that changes the
// ids is refused by name, so a file is either read exactly or not at all.
//
// The file is untrusted input (it is downloaded): every error is an
// InputError naming the file and the JSON path or byte offset, and nothing
// is allocated from a size the file states (tests/fuzz/fuzz_hf_tokenizer.cpp).
#pragma once
#include <memory>
#include <string>
#include "data/tokenizer.h"

namespace xx {

// Throws InputError naming `path`; also when this binary has no PCRE2.
std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& path);
// The same from the file's text (`path` names it in errors): the fuzz target's entry.
std::unique_ptr<Tokenizer> parse_hf_tokenizer(const std::string& json_text, const std::string& path);

}  // namespace xx

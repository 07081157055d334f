// `init hf DIR`: a Hugging Face model's config.json as the deck lines of the
// model it describes. Rank 0 expands the deck before it builds the program,
// so the resolved deck (echoed, and stored in every checkpoint) says the
// model in xuanxue's own words and needs DIR no more to be read back.
//
// Llama (dense MHA), DeepSeek-V2 and DeepSeek-V3 configs are read. Every key
// that changes the computation is mapped or refused by name, with the
// config.json line it is on; keys this reader does not know are refused too
// (a key that is not understood may change the model), except the ones that
// only describe the files or serving (docs/HF.md lists both).
#pragma once
#include <string>
#include <vector>
#include "deck/deck.h"

namespace xx {

// One keyword of a generated line; `key` is the config.json key it comes
// from ("" for a value config.json does not give: a training setting).
struct HfKeyword {
  std::string name, value, key;
};

// One generated deck line: `command kind keyword value ...`, and where its
// values come from (DIR/config.json and the line of its first key).
struct HfLine {
  std::string command, kind;
  std::vector<HfKeyword> keywords;
  int line = 1;
};

// The model, attention, moe and mtp lines of DIR/config.json (and a
// rope_scaling yarn line where it has YaRN); `seq` the
// training context (0: config.json's max_position_embeddings). `where` is
// the init line, for the errors. Throws InputError naming the key.
std::vector<HfLine> hf_model_lines(const std::string& dir, int seq, const std::string& where);

// The FP8 block shape of DIR/config.json's quantization_config
// (weight_block_size; DeepSeek-V3: 128 x 128), or {0, 0} without one.
std::pair<int, int> hf_fp8_block(const std::string& dir);

// Every `init hf` line of `lines` followed by the lines its config.json
// describes, and marked `expanded yes` (a checkpoint's resolved deck is not
// expanded again: it holds them, and DIR may be gone); the deck's later model, attention, moe and mtp lines may set
// what config.json does not say (moe ep, balance_coef, capacity_factor; mtp
// weight; model seq, init_std), never change what it does. A model line
// before the init line is build_program's error. Throws InputError.
std::vector<DeckLine> expand_hf_init(const std::vector<DeckLine>& lines);

}  // namespace xx

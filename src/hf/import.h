// `init hf DIR`: a Hugging Face checkpoint's tensors as xuanxue's, element
// range by element range, so each rank reads only what it keeps (its experts
// under ep, its pieces under shard params) from the memory-mapped files.
//
// Our tensor names (model/params.cpp) map to the HF model codes' names with
// the permutations tools/xxpy/hf_export.py documents, undone here:
//   - Llama (attention mha): q_proj and k_proj rows of each head are halves
//     (i, i + D/2), ours interleaved pairs (2i, 2i + 1);
//   - DeepSeek-V3's MTP eh_proj multiplies [enorm(emb) | hnorm(h)], ours
//     [hnorm(h) | enorm(emb)]: the column halves swap.
// FP8 weights (float8_e4m3fn) are multiplied by their weight_scale_inv block
// (config.json's weight_block_size) on the way in.
#pragma once
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>
#include "core/placement.h"
#include "deck/config.h"
#include "hf/safetensors.h"

namespace xx {

// The Hugging Face name of our tensor `ours` ("layers.3.attn.wkv_a" ->
// "model.layers.3.self_attn.kv_a_proj_with_mqa.weight"); an MTP module is
// layer layers + D, as DeepSeek-V3 numbers it.
std::string hf_tensor_name(const ModelConfig& model, const std::string& ours);

class HfWeights {
 public:
  // Maps DIR's safetensors and checks, before anything is read, that every
  // tensor of `frame` has its source of the same shape in a dtype read (FP8
  // with its scale blocks), that the MoE selection biases are there when the
  // model has them, and that the files hold nothing this model would not
  // use. Throws InputError naming the file and the tensor.
  HfWeights(const std::string& dir, const ModelConfig& model, const Frame& frame);

  // Elements [first, first + count) of our tensor `t` (row-major), as float32.
  void read(const FrameTensor& t, int64_t first, int64_t count, float* out) const;
  // The selection bias of the MoE layer `prefix` ("layers.3.", "mtp.0."):
  // DeepSeek-V3's e_score_correction_bias (moe balance bias only).
  std::vector<float> selection_bias(const std::string& prefix) const;
  // "N tensors, M values (each dtype's count)" for the start-up line.
  std::string summary() const;

 private:
  enum class Layout { same, halves_rows, swapped_cols };
  struct Source {
    const SafetensorsFile* file = nullptr;
    const StTensor* tensor = nullptr;
    const SafetensorsFile* scale_file = nullptr;  // FP8: weight_scale_inv
    const StTensor* scale = nullptr;
    Layout layout = Layout::same;
    int64_t rows = 1, cols = 1;
  };
  void read_row(const Source& s, int64_t row, int64_t col, int64_t count, float* out) const;
  std::string bias_name(const std::string& prefix) const;
  void check_tied_head(std::set<std::string>& used) const;

  ModelConfig model_;
  SafetensorsSet files_;
  std::pair<int, int> block_;  // FP8 weight_block_size, {0, 0} without
  std::map<std::string, Source> sources_;
  std::map<std::string, int64_t> dtype_counts_;  // values by HF dtype, for the summary
  int64_t values_ = 0;
};

}  // namespace xx

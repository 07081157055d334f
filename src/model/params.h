// Parameter layout: every tensor of the model is a named window into one flat
// buffer, so one collective moves all gradients and a checkpoint writes them
// in one pass. Tensors are laid out in forward order (embedding, layers 0..L-1,
// final norm, head); the backward finishes them from the end of the buffer
// towards the start, which is what lets the gradient all-reduce start early.
#pragma once
#include <cstdint>
#include <string>
#include <vector>
#include "config.h"

namespace xx {

struct TensorInfo {
  std::string name;            // e.g. "layers.3.attn.wq"
  std::vector<int64_t> shape;  // real shape, e.g. {C, C}
  int64_t offset = 0;          // into the flat buffer, in elements
  int64_t size = 0;
  bool decay = true;           // weight decay applies (not to norm weights)
  bool is_norm = false;        // initialised to one
  int layer = -1;              // transformer block index, -1 outside the blocks
  double init_std = 0;         // normal(0, init_std) when not a norm
};

class ParamLayout {
 public:
  explicit ParamLayout(const ModelConfig& m);

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  int64_t total() const { return total_; }
  const TensorInfo& at(const std::string& name) const;  // throws std::out_of_range
  // Offset where layer l's tensors begin; layer_begin(L) is where the final norm begins.
  int64_t layer_begin(int layer) const { return layer_begin_[layer]; }
  // Parameters that take part in matrix products (for the FLOP count).
  int64_t matmul_params() const { return matmul_params_; }

 private:
  void add(const std::string& name, std::vector<int64_t> shape, int layer, bool is_norm, double init_std,
           bool matmul);
  std::vector<TensorInfo> tensors_;
  std::vector<int64_t> layer_begin_;
  int64_t total_ = 0, matmul_params_ = 0;
};

// Training FLOPs per token (docs/ARCHITECTURE.md, ../shared/MEASURING.md):
// 6 * N_matmul + 12 * L * T * d_attn.
double flops_per_token(const ModelConfig& m, const ParamLayout& layout);

}  // namespace xx

#include "model/params.h"
#include <cmath>
#include <stdexcept>

namespace xx {

ParamLayout::ParamLayout(const ModelConfig& m) {
  const int64_t C = m.dim, V = m.vocab, F = m.ffn;
  const double std = m.init_std;
  // Output projections of each residual branch are scaled down with depth (GPT-2).
  const double out_std = m.init_std / std::sqrt(2.0 * m.layers);
  add("embed", {V, C}, -1, false, std, false);
  for (int l = 0; l < m.layers; ++l) {
    layer_begin_.push_back(total_);
    const std::string p = "layers." + std::to_string(l) + ".";
    add(p + "attn_norm", {C}, l, true, 0, false);
    // wq, wk, wv are adjacent: together they are the (3C, C) fused QKV weight.
    add(p + "attn.wq", {C, C}, l, false, std, true);
    add(p + "attn.wk", {C, C}, l, false, std, true);
    add(p + "attn.wv", {C, C}, l, false, std, true);
    add(p + "attn.wo", {C, C}, l, false, out_std, true);
    add(p + "ffn_norm", {C}, l, true, 0, false);
    // w1 (gate) and w3 (up) are adjacent: together the (2F, C) fused weight.
    add(p + "ffn.w1", {F, C}, l, false, std, true);
    add(p + "ffn.w3", {F, C}, l, false, std, true);
    add(p + "ffn.w2", {C, F}, l, false, out_std, true);
  }
  layer_begin_.push_back(total_);
  add("norm", {C}, -1, true, 0, false);
  add("head", {V, C}, -1, false, std, true);
}

void ParamLayout::add(const std::string& name, std::vector<int64_t> shape, int layer, bool is_norm,
                      double init_std, bool matmul) {
  TensorInfo t;
  t.name = name;
  t.shape = std::move(shape);
  t.size = 1;
  for (auto d : t.shape) t.size *= d;
  t.offset = total_;
  t.layer = layer;
  t.is_norm = is_norm;
  t.decay = !is_norm;
  t.init_std = init_std;
  total_ += t.size;
  if (matmul) matmul_params_ += t.size;
  tensors_.push_back(std::move(t));
}

const TensorInfo& ParamLayout::at(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return t;
  throw std::out_of_range("no parameter tensor named " + name);
}

double flops_per_token(const ModelConfig& m, const ParamLayout& layout) {
  return 6.0 * double(layout.matmul_params()) + 12.0 * m.layers * m.seq * double(m.dim);
}

}  // namespace xx

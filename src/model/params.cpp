#include "model/params.h"
#include <unordered_map>
#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace xx {

ParamLayout::ParamLayout(const ModelConfig& m, int ep_rank, const StageCut& stage)
    : ep_(m.moe.enabled() ? m.moe.ep : 1), ep_rank_(ep_rank), stage_(stage), layers_(m.layers),
      embed_on_last_(m.mtp.depth > 0 || m.tie_embeddings), head_(m.tie_embeddings ? "embed" : "head") {
  if (stage_.whole()) stage_.runs = {{0, 0, m.layers}}, stage_.holders = {0};  // one run of every block
  if (ep_ > 1) experts_per_rank_ = m.moe.routed / ep_;
  const int64_t C = m.dim, V = m.vocab;
  // Tied (model ... tie_embeddings yes): the embedding is also the head, a matrix product.
  add("embed", {V, C}, -1, false, m.init_std, m.tie_embeddings);  // (add: read in fp32, a lookup)
  if (m.tie_embeddings) active_ += V * C;  // every token's logits read all of it
  for (int l = 0; l < m.layers; ++l) {
    layer_begin_.push_back(total_);
    add_block("layers." + std::to_string(l) + ".", m, l, m.moe.is_moe_layer(l));
  }
  layer_begin_.push_back(total_);
  add("norm", {C}, -1, true, 0, false);
  if (!m.tie_embeddings) add("head", {V, C}, -1, false, m.init_std, true);
  matmul_active_ += m.mtp.depth * V * C;  // the shared head also serves every MTP depth
  for (int d = 0; d < m.mtp.depth; ++d) {
    const std::string p = "mtp." + std::to_string(d) + ".";
    add(p + "hnorm", {C}, m.layers + d, true, 0, false);
    add(p + "enorm", {C}, m.layers + d, true, 0, false);
    add(p + "proj", {C, 2 * C}, m.layers + d, false, m.init_std, true);
    // MTP blocks are full blocks, MoE by the main blocks' rule at index layers + d (HF's numbering).
    add_block(p, m, m.layers + d, m.moe.is_moe_layer(m.layers + d));
    add(p + "norm", {C}, m.layers + d, true, 0, false);
  }
}

std::vector<WeightUnit> ParamLayout::weight_units() const {
  std::vector<WeightUnit> units;
  const int L = int(layer_begin_.size()) - 1;
  for (size_t i = 0; i < tensors_.size();) {
    size_t j = i;
    while (j < tensors_.size() && tensors_[j].layer == tensors_[i].layer) ++j;
    const int l = tensors_[i].layer;
    const std::string name = l < 0 ? (tensors_[i].name == "embed" ? "embed" : j - i > 1 ? "norm + head" : "norm")
                             : l < L ? "layers." + std::to_string(l) : "mtp." + std::to_string(l - L);
    units.push_back({name, tensors_[i].offset, tensors_[j - 1].offset + tensors_[j - 1].size});
    i = j;
  }
  return units;
}

void ParamLayout::add_block(const std::string& p, const ModelConfig& m, int layer, bool moe) {
  const int64_t C = m.dim, H = m.heads;
  const auto& a = m.attention;
  const double std = m.init_std;
  // Output projections of each residual branch are scaled down with depth (GPT-2).
  const double out_std = m.init_std / std::sqrt(2.0 * m.layers);
  add(p + "attn_norm", {C}, layer, true, 0, false);
  if (!a.mla()) {
    // wq, wk, wv are adjacent: together they are the (3C, C) fused QKV weight.
    add(p + "attn.wq", {C, C}, layer, false, std, true);
    add(p + "attn.wk", {C, C}, layer, false, std, true);
    add(p + "attn.wv", {C, C}, layer, false, std, true);
    add(p + "attn.wo", {C, C}, layer, false, out_std, true);
  } else {
    const int64_t qk = a.qk_nope_dim + a.rope_dim;
    if (a.q_lora_rank == 0) {
      add(p + "attn.wq", {H * qk, C}, layer, false, std, true);
    } else {
      add(p + "attn.wq_a", {a.q_lora_rank, C}, layer, false, std, true);
      add(p + "attn.q_norm", {a.q_lora_rank}, layer, true, 0, false);
      add(p + "attn.wq_b", {H * qk, a.q_lora_rank}, layer, false, std, true);
    }
    // rows [0, R) make the latent, rows [R, R + rope) the shared rope key
    add(p + "attn.wkv_a", {a.kv_lora_rank + a.rope_dim, C}, layer, false, std, true);
    add(p + "attn.kv_norm", {a.kv_lora_rank}, layer, true, 0, false);
    add(p + "attn.wkv_b", {H * (a.qk_nope_dim + a.v_dim), a.kv_lora_rank}, layer, false, std, true);
    add(p + "attn.wo", {C, H * a.v_dim}, layer, false, out_std, true);
  }
  add(p + "ffn_norm", {C}, layer, true, 0, false);
  if (!moe) {
    const int64_t F = m.ffn;
    // w1 (gate) and w3 (up) are adjacent: together the (2F, C) fused weight.
    add(p + "ffn.w1", {F, C}, layer, false, std, true);
    add(p + "ffn.w3", {F, C}, layer, false, std, true);
    add(p + "ffn.w2", {C, F}, layer, false, out_std, true);
    return;
  }
  const auto& e = m.moe;
  const int64_t Fm = e.ffn;
  add(p + "ffn.gate", {e.routed, C}, layer, false, std, true);  // (add: read in fp32, the router's scores)
  if (e.shared > 0) {
    add(p + "ffn.shared.w1", {e.shared * Fm, C}, layer, false, std, true);
    add(p + "ffn.shared.w3", {e.shared * Fm, C}, layer, false, std, true);
    add(p + "ffn.shared.w2", {C, e.shared * Fm}, layer, false, out_std, true);
  }
  for (int x = 0; x < e.routed; ++x) {
    const std::string q = p + "ffn.experts." + std::to_string(x) + ".";
    add(q + "w1", {Fm, C}, layer, false, std, true, x);
    add(q + "w3", {Fm, C}, layer, false, std, true, x);
    add(q + "w2", {C, Fm}, layer, false, out_std, true, x);
  }
  // Only topk of the routed experts are active for a token.
  const int64_t expert = 3 * Fm * C;
  active_ -= (e.routed - e.topk) * expert;
  matmul_active_ -= (e.routed - e.topk) * expert;
}

void ParamLayout::add(const std::string& name, std::vector<int64_t> shape, int layer, bool is_norm,
                      double init_std, bool matmul, int expert) {
  TensorInfo t;
  t.name = name;
  t.shape = std::move(shape);
  t.size = 1;
  for (auto d : t.shape) t.size *= d;
  t.offset = total_;
  t.full_offset = full_total_;
  t.layer = layer;
  t.expert = expert;
  t.is_norm = is_norm;
  // (the lookup, and the router's gate: its scores are fp32, ffn.cpp)
  t.reads_fp32 = is_norm || name == "embed" || name.ends_with("ffn.gate");
  t.decay = !is_norm;
  t.matmul = matmul;
  t.init_std = init_std;
  full_total_ += t.size;
  if (name != "embed") active_ += t.size;
  if (matmul) matmul_active_ += t.size;
  // Another rank's expert, or another stage's tensor: counted in the model, not held here.
  if (expert >= 0 && ep_ > 1 && expert / experts_per_rank_ != ep_rank_) return;
  if (!on_stage(t.name, layer)) return;
  total_ += t.size;
  tensors_.push_back(std::move(t));
}

bool ParamLayout::on_stage(const std::string& name, int layer) const {
  if (stage_.whole()) return true;
  if (name == "embed") return stage_.first() || (stage_.last() && embed_on_last_);
  if (layer >= 0 && layer < layers_) return stage_.holds_layer(layer);
  return stage_.last();  // the final norm, the head, the MTP modules
}

std::vector<std::pair<int64_t, int64_t>> ParamLayout::expert_runs() const {
  std::vector<std::pair<int64_t, int64_t>> runs;
  if (ep_ == 1) return runs;
  for (const auto& t : tensors_) {
    if (t.expert < 0) continue;
    if (!runs.empty() && runs.back().second == t.offset) runs.back().second += t.size;
    else runs.emplace_back(t.offset, t.offset + t.size);
  }
  return runs;
}

void ParamLayout::to_full(const float* mine, float* full) const {
  for (const auto& t : tensors_) std::copy_n(mine + t.offset, t.size, full + t.full_offset);
}

void ParamLayout::from_full(const float* full, float* mine) const {
  for (const auto& t : tensors_) std::copy_n(full + t.full_offset, t.size, mine + t.offset);
}

std::vector<std::pair<int64_t, int64_t>> ParamLayout::fp32_read_runs() const {
  std::vector<std::pair<int64_t, int64_t>> runs;
  for (const auto& t : tensors_) {
    if (!t.reads_fp32) continue;
    if (!runs.empty() && runs.back().second == t.offset) runs.back().second += t.size;
    else runs.emplace_back(t.offset, t.offset + t.size);
  }
  return runs;
}

std::vector<TensorSpan> ParamLayout::spans() const {
  std::vector<TensorSpan> out;
  out.reserve(tensors_.size());
  for (const auto& t : tensors_) out.push_back({.name = t.name, .offset = t.offset, .size = t.size});
  return out;
}

const TensorInfo& ParamLayout::at(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return t;
  throw std::out_of_range("no parameter tensor named " + name);
}

bool ParamLayout::has(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return true;
  return false;
}

double flops_per_token(const ModelConfig& m, const ParamLayout& layout) {
  const double d_attn = 0.5 * m.heads * double(m.qk_dim() + m.v_dim());
  return 6.0 * double(layout.matmul_per_token()) + 12.0 * (m.layers + m.mtp.depth) * m.seq * d_attn;
}

Frame whole_frame(const ParamLayout& whole) {
  if (!whole.holds_all()) throw std::logic_error("whole_frame: the layout holds an expert share or a pipeline stage, not the whole model");
  Frame frame;
  for (const auto& t : whole.tensors()) frame.push_back({t.name, t.shape, t.offset, t.size, t.offset, -1});
  return frame;
}

Placement place_model(const ModelConfig& m, const ParamLayout& mine, ShardLevel level, int64_t bucket, int world,
                      int rank, bool master_in_pieces) {
  ModelConfig whole_config = m;
  whole_config.moe.ep = 1;
  const ParamLayout whole(whole_config);
  ExpertShare experts;
  experts.ep = m.moe.enabled() ? m.moe.ep : 1;
  experts.share = rank % experts.ep, experts.holders = world / experts.ep, experts.holder = rank / experts.ep;
  experts.runs = mine.expert_runs();
  std::unordered_map<std::string, int64_t> here;
  for (const auto& t : mine.tensors()) here[t.name] = t.offset;
  std::vector<FrameTensor> frame;
  for (const auto& t : whole.tensors()) {
    const auto at = here.find(t.name);
    const int share = t.expert >= 0 && experts.ep > 1 ? t.expert / (m.moe.routed / experts.ep) : -1;
    frame.push_back({t.name, t.shape, t.offset, t.size, at == here.end() ? -1 : at->second, share});
  }
  std::vector<std::pair<int64_t, int64_t>> units;
  for (const auto& u : mine.weight_units()) units.emplace_back(u.begin, u.end);
  const int64_t total = mine.total();
  const ExpertHolders holders{experts.runs, experts.holders, experts.holder};
  Ownership owned = level == ShardLevel::off      ? Ownership::whole(total)
                    : level == ShardLevel::params ? Ownership(units, bucket, world, rank, holders)
                                                  : Ownership({{0, total}}, bucket, world, rank, holders);
  return Placement(std::move(frame), total, std::move(experts), level, std::move(owned), std::move(units),
                   master_in_pieces, mine.stage());
}

}  // namespace xx

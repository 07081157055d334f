// A Hugging Face checkpoint read as xuanxue's tensors (interface in import.h).
#include "hf/import.h"
#include <algorithm>
#include <cstring>
#include <set>
#include <stdexcept>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include "core/error.h"
#include "hf/config.h"

namespace xx {
namespace {

// Our block tensor names (after "layers.L." or "mtp.D.") and HF's (after
// "model.layers.N."), without ".weight".
const std::map<std::string, std::string> kBlockNames = {
    {"attn_norm", "input_layernorm"},
    {"ffn_norm", "post_attention_layernorm"},
    {"attn.wq", "self_attn.q_proj"},
    {"attn.wk", "self_attn.k_proj"},
    {"attn.wv", "self_attn.v_proj"},
    {"attn.wo", "self_attn.o_proj"},
    {"attn.wq_a", "self_attn.q_a_proj"},
    {"attn.q_norm", "self_attn.q_a_layernorm"},
    {"attn.wq_b", "self_attn.q_b_proj"},
    {"attn.wkv_a", "self_attn.kv_a_proj_with_mqa"},
    {"attn.kv_norm", "self_attn.kv_a_layernorm"},
    {"attn.wkv_b", "self_attn.kv_b_proj"},
    {"ffn.w1", "mlp.gate_proj"},
    {"ffn.w3", "mlp.up_proj"},
    {"ffn.w2", "mlp.down_proj"},
    {"ffn.gate", "mlp.gate"},
    {"ffn.shared.w1", "mlp.shared_experts.gate_proj"},
    {"ffn.shared.w3", "mlp.shared_experts.up_proj"},
    {"ffn.shared.w2", "mlp.shared_experts.down_proj"},
};
// An MTP module's own tensors (DeepSeek-V3's layer num_hidden_layers + D).
const std::map<std::string, std::string> kMtpNames = {
    {"enorm", "enorm"}, {"hnorm", "hnorm"}, {"proj", "eh_proj"}, {"norm", "shared_head.norm"}};
const std::map<std::string, std::string> kExpertNames = {
    {"w1", "gate_proj"}, {"w3", "up_proj"}, {"w2", "down_proj"}};

// "layers.12.rest" -> (12, "rest"); false when `name` does not start with `head`.
bool split_index(const std::string& name, const std::string& head, int& index, std::string& rest) {
  if (name.compare(0, head.size(), head) != 0) return false;
  const size_t dot = name.find('.', head.size());
  if (dot == std::string::npos) return false;
  index = std::stoi(name.substr(head.size(), dot - head.size()));
  rest = name.substr(dot + 1);
  return true;
}

std::string shape_text(const std::vector<int64_t>& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

}  // namespace

std::string hf_tensor_name(const ModelConfig& model, const std::string& ours) {
  if (ours == "embed") return "model.embed_tokens.weight";
  if (ours == "norm") return "model.norm.weight";
  if (ours == "head") return "lm_head.weight";
  int index = 0;
  std::string rest;
  std::string layer;
  if (split_index(ours, "layers.", index, rest)) {
    layer = fmt::format("model.layers.{}.", index);
  } else if (split_index(ours, "mtp.", index, rest)) {
    layer = fmt::format("model.layers.{}.", model.layers + index);
    if (auto it = kMtpNames.find(rest); it != kMtpNames.end()) return layer + it->second + ".weight";
  } else {
    throw std::logic_error("hf import: no Hugging Face name for tensor '" + ours + "'");
  }
  if (auto it = kBlockNames.find(rest); it != kBlockNames.end()) return layer + it->second + ".weight";
  int expert = 0;
  std::string part;
  if (split_index(rest, "ffn.experts.", expert, part))
    if (auto it = kExpertNames.find(part); it != kExpertNames.end())
      return layer + fmt::format("mlp.experts.{}.{}.weight", expert, it->second);
  throw std::logic_error("hf import: no Hugging Face name for tensor '" + ours + "'");
}

std::string HfWeights::bias_name(const std::string& prefix) const {
  const std::string gate = hf_tensor_name(model_, prefix + "ffn.gate");  // model.layers.N.mlp.gate.weight
  return gate.substr(0, gate.size() - std::string("weight").size()) + "e_score_correction_bias";
}

HfWeights::HfWeights(const std::string& dir, const ModelConfig& model, const Frame& frame)
    : model_(model), files_(dir), block_(hf_fp8_block(dir)) {
  std::set<std::string> used;
  const bool llama = !model.attention.mla();
  for (const FrameTensor& t : frame) {
    const std::string name = hf_tensor_name(model, t.name);
    Source s;
    std::tie(s.file, s.tensor) = files_.find(name);
    used.insert(name);
    if (s.tensor->shape != t.shape)
      input_error("{}: tensor '{}' has shape {} (expected {} for xuanxue's '{}', from config.json)", s.file->path(),
                  name, shape_text(s.tensor->shape), shape_text(t.shape), t.name);
    if (s.tensor->dtype == StDtype::other)
      input_error("{}: tensor '{}' is {} (expected F32, F16, BF16, or F8_E4M3 with its weight_scale_inv)",
                  s.file->path(), name, s.tensor->dtype_name);
    s.rows = t.shape.size() == 2 ? t.shape[0] : 1;
    s.cols = t.shape.size() == 2 ? t.shape[1] : t.size;
    if (llama && (t.name.ends_with(".attn.wq") || t.name.ends_with(".attn.wk"))) s.layout = Layout::halves_rows;
    if (t.name.starts_with("mtp.") && t.name.ends_with(".proj")) s.layout = Layout::swapped_cols;
    if (s.tensor->dtype == StDtype::f8_e4m3) {
      const std::string scale = name + "_scale_inv";
      if (!files_.contains(scale))
        input_error("{}: FP8 tensor '{}' has no '{}' (expected DeepSeek-V3's block scales beside it)", s.file->path(),
                    name, scale);
      if (block_.first == 0)
        input_error("{}: FP8 tensor '{}', but config.json has no quantization_config (expected its "
                    "weight_block_size)", s.file->path(), name);
      std::tie(s.scale_file, s.scale) = files_.find(scale);
      used.insert(scale);
      const std::vector<int64_t> want = {(s.rows + block_.first - 1) / block_.first,
                                         (s.cols + block_.second - 1) / block_.second};
      if (s.scale->shape != want || (s.scale->dtype != StDtype::f32 && s.scale->dtype != StDtype::bf16))
        input_error("{}: tensor '{}' is {} {} (expected F32 or BF16 {}: one scale per {}x{} block of '{}')",
                    s.scale_file->path(), scale, s.scale->dtype_name, shape_text(s.scale->shape), shape_text(want),
                    block_.first, block_.second, name);
    }
    dtype_counts_[s.tensor->dtype_name] += t.size;
    values_ += t.size;
    sources_[t.name] = s;
  }
  const auto& moe = model.moe;
  if (moe.enabled() && moe.balance == Balance::bias) {
    for (int l = 0; l < model.layers + model.mtp.depth; ++l) {
      if (!moe.is_moe_layer(l)) continue;
      const std::string prefix =
          l < model.layers ? fmt::format("layers.{}.", l) : fmt::format("mtp.{}.", l - model.layers);
      const std::string name = bias_name(prefix);
      const auto [file, t] = files_.find(name);
      if (t->shape != std::vector<int64_t>{moe.routed} || t->dtype == StDtype::other)
        input_error("{}: tensor '{}' is {} {} (expected {} values: DeepSeek-V3's selection bias)", file->path(), name,
                    t->dtype_name, shape_text(t->shape), moe.routed);
      used.insert(name);
    }
  }
  if (model.tie_embeddings && files_.contains("lm_head.weight")) check_tied_head(used);
  // Left over: the MTP layers' copies of the shared embedding and head, the
  // rotary tables old checkpoints keep, and width-0 shared experts are not
  // weights of ours; anything else means the files hold another model.
  for (const std::string& name : files_.names()) {
    if (used.count(name)) continue;
    int layer = 0;
    std::string rest;
    const bool mtp_copy = split_index(name, "model.layers.", layer, rest) && layer >= model.layers &&
                          (rest == "embed_tokens.weight" || rest == "shared_head.head.weight");
    if (mtp_copy || name.ends_with("rotary_emb.inv_freq")) continue;
    const auto [file, t] = files_.find(name);
    if (t->count == 0) continue;
    input_error("{}: tensor '{}' has no place in the model config.json describes (expected only that model's "
                "weights)", file->path(), name);
  }
}

// Tied (tie_word_embeddings true): a file may still hold lm_head.weight, as
// some writers save both names of the one tensor; it must be the embedding,
// value for value (and an FP8 one's block scales too). Read a row at a time.
void HfWeights::check_tied_head(std::set<std::string>& used) const {
  const std::string embed = "model.embed_tokens.weight", head = "lm_head.weight";
  for (const std::string suffix : {"", "_scale_inv"}) {
    if (!files_.contains(head + suffix) && !files_.contains(embed + suffix)) continue;
    const auto [hf, h] = files_.find(head + suffix);
    const auto [ef, e] = files_.find(embed + suffix);
    if (h->shape != e->shape || h->dtype_name != e->dtype_name)
      input_error("{}: tensor '{}' is {} {}, '{}' {} {} (expected tie_word_embeddings true to mean one tensor: "
                  "lm_head.weight absent, or equal to model.embed_tokens.weight)", hf->path(), head + suffix,
                  h->dtype_name, shape_text(h->shape), embed + suffix, e->dtype_name, shape_text(e->shape));
    const int64_t cols = h->shape.empty() ? 1 : h->shape.back(), rows = h->count / std::max<int64_t>(1, cols);
    std::vector<float> a(static_cast<size_t>(cols)), b(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
      hf->read(*h, r * cols, cols, a.data()), ef->read(*e, r * cols, cols, b.data());
      hf->release(*h, r * cols, cols), ef->release(*e, r * cols, cols);
      if (std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) != 0)
        input_error("{}: tensor '{}' differs from '{}' in row {} (expected tie_word_embeddings true to mean one "
                    "tensor: lm_head.weight absent, or equal to model.embed_tokens.weight)", hf->path(), head + suffix,
                    embed + suffix, r);
    }
    used.insert(head + suffix);
  }
}

void HfWeights::read_row(const Source& s, int64_t row, int64_t col, int64_t count, float* out) const {
  s.file->read(*s.tensor, row * s.cols + col, count, out);
  s.file->release(*s.tensor, row * s.cols + col, count);  // read once: resident memory stays the rank's own
  if (!s.scale) return;
  const int64_t scale_cols = s.scale->shape[1];
  const int64_t first = col / block_.second, last = (col + count - 1) / block_.second;
  std::vector<float> scales(size_t(last - first + 1));
  s.scale_file->read(*s.scale, (row / block_.first) * scale_cols + first, last - first + 1, scales.data());
  for (int64_t i = 0; i < count; ++i) out[i] *= scales[size_t((col + i) / block_.second - first)];
}

void HfWeights::read(const FrameTensor& t, int64_t first, int64_t count, float* out) const {
  const Source& s = sources_.at(t.name);
  if (first < 0 || count < 0 || first + count > t.size)
    throw std::out_of_range(
        fmt::format("hf import: elements [{}, {}) of '{}' ({})", first, first + count, t.name, t.size));
  const int64_t heads = model_.heads, per_head = s.rows / std::max<int64_t>(1, heads);
  for (int64_t at = first; at < first + count;) {
    const int64_t row = at / s.cols, col = at % s.cols;
    const int64_t n = std::min(s.cols - col, first + count - at);
    float* dst = out + (at - first);
    switch (s.layout) {
      case Layout::same:
        read_row(s, row, col, n, dst);
        break;
      case Layout::halves_rows: {  // our row 2i + m of a head is HF's m * D/2 + i
        const int64_t h = row / per_head, i = row % per_head;
        read_row(s, h * per_head + (i % 2) * (per_head / 2) + i / 2, col, n, dst);
        break;
      }
      case Layout::swapped_cols: {  // our [hnorm | enorm] columns are HF's [enorm | hnorm]
        const int64_t half = s.cols / 2;
        for (int64_t c = col; c < col + n;) {
          const int64_t run = c < half ? std::min(col + n, half) - c : col + n - c;
          read_row(s, row, c < half ? c + half : c - half, run, dst + (c - col));
          c += run;
        }
        break;
      }
    }
    at += n;
  }
}

std::vector<float> HfWeights::selection_bias(const std::string& prefix) const {
  const auto [file, t] = files_.find(bias_name(prefix));
  return file->read_all(*t);
}

std::string HfWeights::summary() const {
  std::vector<std::string> kinds;
  for (const auto& [dtype, n] : dtype_counts_) kinds.push_back(fmt::format("{} {}", dtype, n));
  std::string out = fmt::format("{} tensors, {} values ({})", sources_.size(), values_, fmt::join(kinds, ", "));
  if (dtype_counts_.count("F8_E4M3"))
    out += fmt::format("; FP8 dequantized with {}x{} weight_scale_inv blocks", block_.first, block_.second);
  return out;
}

}  // namespace xx

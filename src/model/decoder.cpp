// Decoding with a KV cache (decoder.h): the per-token forward of each block,
// and the sampling of the next token.
#include "core/device_memory.h"
#include "model/decoder.h"
#include <algorithm>
#include <cmath>
#include <numeric>
#include <fmt/format.h>
#include "core/rng.h"
#include "kernels/decode.h"
#include "kernels/embedding.h"
#include "kernels/linear.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "model/attention.h"

namespace xx {
namespace k = kernels;

struct Decoder::Layer {
  std::string prefix;
  Param<float> attn_norm, ffn_norm, wq, wq_a, q_norm, wq_b, wkv_a, kv_norm, wkv_b, wo;
  std::unique_ptr<FeedForward<float>> ffn;
  Buffer<float> k, v;   // MHA cache: rotated keys (L, H*D), values (L, H*Dv)
  Buffer<float> c, kr;  // MLA cache: normed latents (L, R), rotated rope keys (L, P)
};

Decoder::Decoder(Transformer<float>& model, int64_t max_len)
    : model_(model), m_(model.config()), max_len_(std::min<int64_t>(max_len, model.config().seq)) {
  const ModelConfig& m = model.config();
  m_.seq = 1;
  const ParamStore<float> store{&model.layout(), model.params().data(), model.grads().data(), nullptr,
                                k::Precision::fp32};  // the fp32 master weights, whatever the training precision
  const auto& a = m.attention;
  const int64_t C = m.dim, H = m.heads, L = max_len_;
  embed_ = store("embed"), norm_ = store("norm"), head_ = store(model.layout().head_name());
  for (int l = 0; l < m.layers; ++l) {
    auto layer = std::make_unique<Layer>();
    const std::string p = "layers." + std::to_string(l) + ".";
    layer->prefix = p;
    layer->attn_norm = store(p + "attn_norm"), layer->ffn_norm = store(p + "ffn_norm");
    layer->wo = store(p + "attn.wo");
    if (!a.mla()) {
      layer->wq = store(p + "attn.wq");
      layer->k = Buffer<float>("Decoder::k_cache", L * H * m.head_dim());
      layer->v = Buffer<float>("Decoder::v_cache", L * H * m.head_dim());
    } else {
      if (a.q_lora_rank == 0) {
        layer->wq = store(p + "attn.wq");
      } else {
        layer->wq_a = store(p + "attn.wq_a"), layer->q_norm = store(p + "attn.q_norm");
        layer->wq_b = store(p + "attn.wq_b");
      }
      layer->wkv_a = store(p + "attn.wkv_a"), layer->kv_norm = store(p + "attn.kv_norm");
      layer->wkv_b = store(p + "attn.wkv_b");
      layer->c = Buffer<float>("Decoder::latent_cache", L * a.kv_lora_rank);
      layer->kr = Buffer<float>("Decoder::rope_key_cache", L * a.rope_dim);
    }
    layer->ffn = std::make_unique<FeedForward<float>>(m_, store, p, m.moe.is_moe_layer(l), 1, ws_);
    layers_.push_back(std::move(layer));
  }
  const int64_t rope = m.rope_width();
  rope_cos_ = Buffer<float>("Decoder::rope_cos", m.seq * (rope / 2));
  rope_sin_ = Buffer<float>("Decoder::rope_sin", m.seq * (rope / 2));
  k::rope_tables<float>(mat(rope_cos_, m.seq, rope / 2), mat(rope_sin_, m.seq, rope / 2), rope_frequencies(m));
  score_scale_ = attention_score_scale<float>(m);
  x_ = Buffer<float>("Decoder::x", C), xn_ = Buffer<float>("Decoder::xn", C);
  rstd_ = Buffer<float>("Decoder::rstd", 1), logits_ = Buffer<float>("Decoder::logits", m.vocab);
  reset();
}

Decoder::~Decoder() = default;

void Decoder::reset() {
  len_ = 0;
  for (auto& [prefix, ffn] : model_.moe_layers())
    for (auto& layer : layers_)
      if (layer->prefix == prefix) Kokkos::deep_copy(layer->ffn->bias(), ffn->bias());
}

int64_t Decoder::cache_bytes_per_token(const ModelConfig& m) {
  const auto& a = m.attention;
  const int64_t per_layer = a.mla() ? a.kv_lora_rank + a.rope_dim : 2 * int64_t(m.heads) * m.head_dim();
  return per_layer * m.layers * int64_t(sizeof(float));
}

int64_t Decoder::mha_bytes_per_token(const ModelConfig& m) {
  return int64_t(m.heads) * (m.qk_dim() + m.v_dim()) * m.layers * int64_t(sizeof(float));
}

std::vector<float> Decoder::step(int32_t token) {
  if (len_ >= max_len_)
    throw std::out_of_range(fmt::format("Decoder: position {} is past the cache of {} positions", len_, max_len_));
  const ModelConfig& m = model_.config();
  const auto& a = m.attention;
  const int64_t C = m.dim, H = m.heads, V = m.vocab, pos = len_, len = pos + 1;
  const int64_t qk = m.qk_dim(), vd = m.v_dim(), L = max_len_;
  Kokkos::View<int32_t*, MemSpace> tok("Decoder::token", 1);
  Kokkos::deep_copy(tok, token);
  auto x = mat(x_, 1, C), xn = mat(xn_, 1, C);
  Vec<float> rstd(rstd_.data(), 1);
  k::embedding_forward<float>(x, Tokens(tok.data(), 1), embed_.mat(V, C));
  auto o = ws_.mat("decode_o", 1, H * vd);
  auto p = ws_.mat("decode_p", H, L);
  for (auto& layer : layers_) {
    Layer& ly = *layer;
    k::rmsnorm_forward<float>(xn, rstd, x, ly.attn_norm.vec(C), m.norm_eps);
    if (!a.mla()) {
      const int64_t D = qk;
      auto qkv = ws_.mat("decode_qkv", 1, 3 * C);
      k::linear_forward<float>(qkv, k::GemmIn<float>(xn), ly.wq.in(3 * C, C));
      auto q = ws_.mat("decode_q", H, D);
      // This token's key and value go straight into cache row pos.
      Mat<float> kc(ly.k.data(), L, H * D), vc(ly.v.data(), L, H * D);
      // (row pos by address: Kokkos' kc(pos, 0) would be a host access of device memory)
      k::split_heads_rope_forward<float>(q, Mat<float>(kc.data() + pos * H * D, H, D),
                                         Mat<float>(vc.data() + pos * H * D, H, D), qkv,
                                         Mat<const float>(rope_cos_.data() + pos * (D / 2), 1, D / 2),
                                         Mat<const float>(rope_sin_.data() + pos * (D / 2), 1, D / 2), 1, 1, H);
      k::mha_decode_attention<float>(o, q, kc, vc, p, len, score_scale_);
    } else {
      const int64_t R = a.kv_lora_rank, Q = a.q_lora_rank, P = a.rope_dim;
      auto q = ws_.mat("decode_q", 1, H * qk);
      if (Q == 0) {
        k::linear_forward<float>(q, k::GemmIn<float>(xn), ly.wq.in(H * qk, C));
      } else {
        auto qa = ws_.mat("decode_qa", 1, Q), qan = ws_.mat("decode_qan", 1, Q);
        k::linear_forward<float>(qa, k::GemmIn<float>(xn), ly.wq_a.in(Q, C));
        k::rmsnorm_forward<float>(qan, rstd, qa, ly.q_norm.vec(Q), m.latent_eps());
        k::linear_forward<float>(q, k::GemmIn<float>(qan), ly.wq_b.in(H * qk, Q));
      }
      Mat<const float> cos_t(rope_cos_.data(), m.seq, P / 2), sin_t(rope_sin_.data(), m.seq, P / 2);
      k::rope_rotate_rows<float>(Mat<float>(q.data(), H, qk), cos_t, sin_t, pos, a.qk_nope_dim, P / 2);
      // wkv_a rows [0, R) give the latent, rows [R, R + P) the shared rope key, as in training.
      Mat<float> cc(ly.c.data(), L, R), krc(ly.kr.data(), L, P);
      auto c = ws_.mat("decode_c", 1, R);
      k::linear_forward<float>(c, k::GemmIn<float>(xn), ly.wkv_a.in(R, C));
      k::rmsnorm_forward<float>(Mat<float>(cc.data() + pos * R, 1, R), rstd, c, ly.kv_norm.vec(R), m.latent_eps());
      Mat<float> kr(krc.data() + pos * P, 1, P);
      k::linear_forward<float>(kr, k::GemmIn<float>(xn), ly.wkv_a.in(P, C, R));
      k::rope_rotate_rows<float>(kr, cos_t, sin_t, pos, 0, P / 2);
      k::mla_decode_attention<float>(o, q, cc, krc, ly.wkv_b.mat(H * (a.qk_nope_dim + vd), R), p,
                                     ws_.mat("decode_lat", H, 2 * R), len, H, a.qk_nope_dim, P, vd, score_scale_);
    }
    k::linear_forward<float>(x, k::GemmIn<float>(o), ly.wo.in(C, H * vd), 1.0f);  // x += attention
    k::rmsnorm_forward<float>(xn, rstd, x, ly.ffn_norm.vec(C), m.norm_eps);
    ly.ffn->forward(x, k::GemmIn<float>(xn));  // x += ffn
  }
  k::rmsnorm_forward<float>(xn, rstd, x, norm_.vec(C), m.norm_eps);
  k::linear_forward<float>(mat(logits_, 1, V), k::GemmIn<float>(xn), head_.in(V, C));
  ++len_;
  auto host = host_copy(logits_);
  return std::vector<float>(host.data(), host.data() + V);
}

int32_t sample_token(const std::vector<float>& logits, const SamplingOptions& o, uint64_t draw) {
  const int32_t V = int32_t(logits.size());
  if (o.temperature <= 0) return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
  // Candidates by falling logit (ties: lower id first), cut to top_k.
  std::vector<int32_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  if (o.top_k > 0 && o.top_k < V) order.resize(size_t(o.top_k));
  std::vector<double> prob(order.size());
  const double top = logits[order[0]];
  double sum = 0;
  for (size_t i = 0; i < order.size(); ++i) sum += prob[i] = std::exp((logits[order[i]] - top) / o.temperature);
  // Nucleus: the shortest prefix whose probability reaches top_p.
  size_t keep = order.size();
  if (o.top_p < 1) {
    double acc = 0;
    for (size_t i = 0; i < order.size(); ++i)
      if ((acc += prob[i] / sum) >= o.top_p) {
        keep = i + 1;
        break;
      }
  }
  double kept = 0;
  for (size_t i = 0; i < keep; ++i) kept += prob[i];
  const double u = uniform01(mix_seed(o.seed, 0x5a3e), draw) * kept;
  double acc = 0;
  for (size_t i = 0; i < keep; ++i)
    if ((acc += prob[i]) > u) return order[i];
  return order[keep - 1];
}

std::vector<int32_t> generate(Decoder& d, const std::vector<int32_t>& prompt, int64_t count, const SamplingOptions& o) {
  if (prompt.empty()) throw std::invalid_argument("generate: an empty prompt (expected at least one token)");
  d.reset();
  std::vector<float> logits;
  for (int32_t t : prompt) logits = d.step(t);
  std::vector<int32_t> out;
  for (int64_t i = 0; i < count; ++i) {
    const int32_t next = sample_token(logits, o, uint64_t(i));
    out.push_back(next);
    if (d.length() >= d.max_length() || i + 1 == count) break;
    logits = d.step(next);
  }
  return out;
}

}  // namespace xx

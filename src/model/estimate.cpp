#include "model/estimate.h"
#include <algorithm>
#include <fmt/format.h>
#include "kernels/attention.h"
#include "model/params.h"

namespace xx {

// Mirrors the buffers Block, Attention, FeedForward and Transformer allocate
// (the constructors in src/model/), counted in elements.
static int64_t block_activations(const ModelConfig& m, bool moe, int64_t B) {
  const int64_t T = m.seq, N = B * T, C = m.dim, H = m.heads, qk = m.qk_dim(), vd = m.v_dim();
  const auto& a = m.attention;
  kernels::CausalBlocks blocks(T, 64);
  int64_t n = 3 * N * C + 2 * N;                                              // xn, xmid, xn2, two rstd
  n += B * H * T * (2 * qk + vd) + B * H * blocks.per_head() + N * H * vd;    // q, k, v, probabilities, o
  n += T * (a.mla() ? a.rope_dim : qk);                                       // rope tables
  if (a.mla()) n += 2 * N * a.kv_lora_rank + N + N * a.rope_dim + (a.q_lora_rank ? 2 * N * a.q_lora_rank + N : 0);
  if (!moe) return n + 3 * N * m.ffn;                                         // h (2F), a (F)
  const auto& e = m.moe;
  const int64_t K = e.topk, E = e.routed, Fm = e.ffn;
  n += 3 * N * e.shared * Fm;                                                 // shared experts' h, a
  n += 2 * N * E + N * K + E;                                                 // logits, scores, weights, score grad
  n += N * K * (2 * C + 3 * Fm) + 3 * N * K;                                  // expert in/out, h, a; indices (int32)
  return n;
}

MemoryEstimate estimate_memory(const ModelConfig& m, int batch) {
  const ParamLayout layout(m);
  MemoryEstimate est;
  est.params = layout.total();
  est.active = layout.active_per_token();
  const int64_t B = batch, T = m.seq, N = B * T, C = m.dim, V = m.vocab;
  int64_t n = (m.layers + 1) * N * C + N * C + N + N * V + N;  // residual streams, final norm, logits, losses
  for (int l = 0; l < m.layers; ++l) n += block_activations(m, m.moe.is_moe_layer(l), B);
  for (int d = 0; d < m.mtp.depth; ++d)
    n += 6 * N * C + 4 * N + 2 * N * C + N * V + 2 * N + block_activations(m, m.moe.enabled(), B);
  // Scratch shared by the blocks: one block's largest gradients at once.
  const int64_t F = std::max<int64_t>(m.ffn, m.moe.enabled() ? int64_t(m.moe.topk) * m.moe.ffn : 0);
  n += B * m.heads * T * (2 * m.qk_dim() + 2 * m.v_dim()) + N * (3 * C + 3 * F) + 64 * T;
  est.activation_elements = n;
  return est;
}

std::string dry_run_report(const ModelConfig& m, int batch, int world) {
  const auto est = estimate_memory(m, batch);
  const ParamLayout layout(m);
  auto gib = [](double bytes) { return bytes / (1024.0 * 1024.0 * 1024.0); };
  std::string out;
  out += fmt::format("# dry run: nothing allocated\n");
  out += fmt::format("  parameters total        {:>16} ({:.2f} B)\n", est.params, est.params / 1e9);
  out += fmt::format("  parameters per token    {:>16} ({:.2f} B active: all but the embedding table and the\n"
                     "                                            routed experts a token does not pick)\n",
                     est.active, est.active / 1e9);
  out += fmt::format("  training FLOP per token {:>16.4g}\n", flops_per_token(m, layout));
  out += fmt::format("  batch per rank          {:>16} sequences of {}, {} rank(s), data parallel\n", batch, m.seq, world);
  out += "\n# memory per rank (GiB): every rank holds the whole model under data parallelism\n";
  out += fmt::format("  {:<10} {:>10} {:>10} {:>10} {:>12} {:>10}\n", "precision", "weights", "gradients", "optimizer",
                     "activations", "total");
  struct Row { const char* name; double weight, grad, act; };
  // Master weights and AdamW moments stay fp32; 16-bit runs add a 16-bit copy
  // of the weights for the forward and keep gradients and activations in 16 bits.
  for (const Row& r : {Row{"fp32", 4, 4, 4}, Row{"bf16", 4 + 2, 2, 2}, Row{"fp16", 4 + 2, 2, 2}}) {
    const double w = r.weight * est.params, g = r.grad * est.params, o = 8.0 * est.params,
                 a = r.act * est.activation_elements;
    out += fmt::format("  {:<10} {:>10.2f} {:>10.2f} {:>10.2f} {:>12.2f} {:>10.2f}\n", r.name, gib(w), gib(g), gib(o),
                       gib(a), gib(w + g + o + a));
  }
  return out;
}

}  // namespace xx

#include "model/estimate.h"
#include <algorithm>
#include <vector>
#include <fmt/format.h>
#include "kernels/attention.h"
#include "model/params.h"

namespace xx {

// Elements of activations: {16 bits under mixed precision, the others}.
struct Kept {
  int64_t half = 0, other = 0;
  Kept& operator+=(const Kept& k) { return half += k.half, other += k.other, *this; }
};

// Mirrors the buffers Block, Attention, FeedForward and Transformer allocate
// (the constructors in src/model/), counted in elements.
static Kept block_activations(const ModelConfig& m, bool moe, int64_t B) {
  const int64_t T = m.seq, N = B * T, C = m.dim, H = m.heads, qk = m.qk_dim(), vd = m.v_dim();
  const auto& a = m.attention;
  kernels::CausalBlocks blocks(T, 64);
  Kept k;
  k.half = 2 * N * C, k.other = N * C + 2 * N;                                  // xn, xn2; xmid, two rstd
  k.half += B * H * T * (2 * qk + vd) + B * H * blocks.per_head() + N * H * vd;  // q, k, v, probabilities, o
  k.other += T * (a.mla() ? a.rope_dim : qk);                                    // rope tables
  if (a.mla()) {
    k.half += N * a.kv_lora_rank + N * a.q_lora_rank;                            // cn, qan
    k.other += N * a.kv_lora_rank + N + N * a.rope_dim + (a.q_lora_rank ? N * a.q_lora_rank + N : 0);  // c, krope, qa
  }
  if (!moe) return k.half += 3 * N * m.ffn, k;                                  // h (2F), a (F)
  const auto& e = m.moe;
  const int64_t K = e.topk, E = e.routed, Fm = e.ffn;
  k.half += 3 * N * e.shared * Fm;                                               // shared experts' h, a
  k.other += 2 * N * E + N * K + E;                                              // logits, scores, weights, score grad
  k.half += N * K * (C + 3 * Fm);                                                // expert in, h, a
  k.other += N * K * C + 3 * N * K;                                              // expert out; indices (int32)
  return k;
}

MemoryEstimate estimate_memory(const ModelConfig& m, int batch) {
  const ParamLayout layout(m);
  MemoryEstimate est;
  est.params = layout.total();
  est.active = layout.active_per_token();
  const int64_t B = batch, T = m.seq, N = B * T, C = m.dim, V = m.vocab;
  Kept kept{N * C, (m.layers + 1) * N * C + N + N * V + N};  // xf; residual streams, final rstd, logits, losses
  for (int l = 0; l < m.layers; ++l) kept += block_activations(m, m.moe.is_moe_layer(l), B);
  for (int d = 0; d < m.mtp.depth; ++d) {
    kept += Kept{3 * N * C, 5 * N * C + 4 * N + N * V + 2 * N};  // cat, hf; hn, e, en, x0, h, rstds, logits, tokens
    kept += block_activations(m, m.moe.enabled(), B);
  }
  est.halvable_elements = kept.half;
  est.other_elements = kept.other;
  // Scratch shared by the blocks: one block's largest gradients at once.
  const int64_t F = std::max<int64_t>(m.ffn, m.moe.enabled() ? int64_t(m.moe.topk) * m.moe.ffn : 0);
  est.scratch_elements = B * m.heads * T * (2 * m.qk_dim() + 2 * m.v_dim()) + N * (3 * C + 3 * F) + 64 * T;
  // Mixed precision: the 32-bit targets KeptActivations are written through
  // (slot 0 as large as the largest of them; slot 1 for SwiGLU's gate/up, and
  // with slot 2 for k and v), the 16-bit copies of output gradients (half an
  // element each) and a softmax block.
  const int64_t BHT = B * m.heads * T, Fm = m.moe.enabled() ? int64_t(m.moe.topk) * m.moe.ffn : 0;
  const int64_t slot0 = std::max({N * 2 * C * (m.mtp.depth > 0), BHT * m.qk_dim(), N * m.heads * m.v_dim(), N * m.ffn,
                                  N * Fm, N * int64_t(m.attention.kv_lora_rank), N * int64_t(m.attention.q_lora_rank),
                                  N * C, N * int64_t(m.moe.shared) * m.moe.ffn});
  const int64_t widest = std::max({3 * C, 2 * F, V, int64_t(m.heads) * (m.qk_dim() + m.v_dim())});
  const int64_t slot1 = std::max({BHT * m.qk_dim(), 2 * N * m.ffn, 2 * N * Fm, 2 * N * int64_t(m.moe.shared) * m.moe.ffn});
  est.mixed_scratch_elements = slot0 + slot1 + BHT * m.v_dim() + (N * widest + BHT * m.v_dim()) / 2 + 64 * T;
  return est;
}

std::string dry_run_report(const ModelConfig& m, int batch, int world) {
  const auto est = estimate_memory(m, batch);
  const ParamLayout layout(m);
  std::string out;
  out += fmt::format("# dry run: nothing allocated\n");
  out += fmt::format("  parameters total        {:>16} ({:.2f} B)\n", est.params, est.params / 1e9);
  out += fmt::format("  parameters per token    {:>16} ({:.2f} B active: all but the embedding table and the\n"
                     "                                            routed experts a token does not pick)\n",
                     est.active, est.active / 1e9);
  out += fmt::format("  training FLOP per token {:>16.4g}\n", flops_per_token(m, layout));
  out += fmt::format("  batch per rank          {:>16} sequences of {}, {} rank(s), data parallel\n", batch, m.seq, world);
  // Master weights, gradients and AdamW moments stay fp32. 16-bit runs add a
  // 16-bit copy of the weights for the GEMMs, keep the halvable activations in
  // 16 bits, and write those through 32-bit scratch.
  struct Row {
    const char* name;
    double weights, grads, optimizer, activations;
    double total() const { return weights + grads + optimizer + activations; }
  };
  std::vector<Row> rows;
  for (const char* name : {"fp32", "bf16", "fp16"}) {
    const bool half = std::string(name) != "fp32";
    rows.push_back({name, (half ? 6.0 : 4.0) * est.params, 4.0 * est.params, 8.0 * est.params,
                    (half ? 2.0 : 4.0) * est.halvable_elements + 4.0 * (est.other_elements + est.scratch_elements) +
                        (half ? 4.0 * est.mixed_scratch_elements : 0.0)});
  }
  const bool small = rows[0].total() < 1024.0 * 1024.0 * 1024.0;  // MiB below a GiB
  const double unit = small ? 1024.0 * 1024.0 : 1024.0 * 1024.0 * 1024.0;
  out += fmt::format("\n# memory per rank ({}): every rank holds the whole model under data parallelism\n",
                     small ? "MiB" : "GiB");
  out += fmt::format("  {:<10} {:>10} {:>10} {:>10} {:>12} {:>10} {:>9}\n", "precision", "weights", "gradients",
                     "optimizer", "activations", "total", "vs fp32");
  for (const Row& r : rows)
    out += fmt::format("  {:<10} {:>10.2f} {:>10.2f} {:>10.2f} {:>12.2f} {:>10.2f} {:>8.2f}x\n", r.name, r.weights / unit,
                       r.grads / unit, r.optimizer / unit, r.activations / unit, r.total() / unit,
                       r.total() / rows[0].total());
  out += fmt::format("  activations: {:.2f} kept in 16 bits under bf16/fp16, {:.2f} other kept, "
                     "{:.2f} scratch (fp32), +{:.2f} scratch under bf16/fp16\n",
                     4.0 * est.halvable_elements / unit, 4.0 * est.other_elements / unit,
                     4.0 * est.scratch_elements / unit, 4.0 * est.mixed_scratch_elements / unit);
  return out;
}

}  // namespace xx

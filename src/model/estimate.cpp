#include "model/estimate.h"
#include "core/ownership.h"
#include <algorithm>
#include <cmath>
#include <vector>
#include <fmt/format.h>
#include "core/error.h"
#include "core/units.h"
#include "kernels/attention_packed.h"
#include "kernels/flash_attention.h"
#include "model/attention.h"
#include "model/params.h"

namespace xx {

// Elements of activations: {16 bits under mixed precision, the others}.
struct Kept {
  int64_t half = 0, other = 0;
  Kept& operator+=(const Kept& k) { return half += k.half, other += k.other, *this; }
};

// The rows this rank's experts run per MoE layer: all its tokens' N K rows
// without ep; under ep its group's rows for its experts, at `expert_load`
// times the even load (estimate.h).
static int64_t expert_rows(const ModelConfig& m, int64_t B, double expert_load) {
  const int64_t NK = B * m.seq * m.moe.topk;
  return m.moe.ep > 1 ? int64_t(std::ceil(expert_load * double(NK))) : NK;
}

// Mirrors the buffers Block, Attention, FeedForward and Transformer allocate
// (the constructors in src/model/), counted in elements.
static Kept block_activations(const ModelConfig& m, bool moe, int64_t B, int64_t rows) {
  const int64_t T = m.seq, N = B * T, C = m.dim, H = m.heads, qk = m.qk_dim(), vd = m.v_dim();
  const auto& a = m.attention;
  kernels::CausalBlocks blocks(T, kAttentionBlock);
  Kept k;
  k.half = 2 * N * C, k.other = N * C + 2 * N;                                  // xn, xn2; xmid, two rstd
  k.half += B * H * T * (2 * qk + vd) + N * H * vd;                             // q, k, v, o
  if (uses_flash_attention(a)) k.other += B * H * T;                            // flash: a log-sum-exp per row
  else k.half += B * H * blocks.per_head();                                     // packed: the probabilities
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
  if (e.sequence_loss_coef() > 0) k.other += 2 * B * E;                         // the sequence-wise loss: counts, coef
  k.half += N * K * C;                                                           // expert in (the rows sent)
  k.other += N * K * C + 3 * N * K;                                              // expert out; indices (int32)
  k.half += rows * (e.ep > 1 ? C + 3 * Fm : 3 * Fm);                             // the rows run: (ep: in), h, a
  return k;
}

MemoryEstimate estimate_memory(const ModelConfig& m, int batch, double expert_load) {
  const ParamLayout layout(m);
  MemoryEstimate est;
  est.params = layout.full_total();
  est.active = layout.active_per_token();
  const int64_t B = batch, T = m.seq, N = B * T, C = m.dim, V = m.vocab;
  const bool moe = m.moe.enabled(), ep = moe && m.moe.ep > 1;
  const int64_t rows = moe ? expert_rows(m, B, expert_load) : 0, NK = moe ? N * m.moe.topk : 0;
  Kept kept{N * C, (m.layers + 1) * N * C + N + N * V + N};  // xf; residual streams, final rstd, logits, losses
  for (int l = 0; l < m.layers; ++l) kept += block_activations(m, m.moe.is_moe_layer(l), B, rows);
  for (int d = 0; d < m.mtp.depth; ++d) {
    kept += Kept{3 * N * C, 5 * N * C + 4 * N + N * V + 2 * N};  // cat, hf; hn, e, en, x0, h, rstds, logits, tokens
    kept += block_activations(m, m.moe.is_moe_layer(m.layers + d), B, rows);
  }
  est.halvable_elements = kept.half;
  est.other_elements = kept.other;
  // Scratch shared by the blocks: one block's largest gradients at once. Of
  // a MoE block: the dense or shared SwiGLU's (N rows), the routed experts'
  // over the rows run here (`run`), the rows' output and input gradients at
  // the tokens (N K C each), and under ep those rows' input gradients before
  // they travel home.
  const int64_t Fm = moe ? m.moe.ffn : 0, run = std::max(NK, rows);
  const int64_t swiglu = std::max<int64_t>(m.ffn, int64_t(m.moe.shared) * Fm);
  // Attention's own: packed, one block row of dp (Bk T); flash, a key
  // block's scores and dP against a span of queries of every head, each
  // row's running max and sum, and the rows' delta.
  const bool flash = uses_flash_attention(m.attention);
  const int64_t BH = B * m.heads, Bk = kAttentionBlock;
  const int64_t attention = flash ? kernels::flash_scratch_size(BH, T, Bk) + BH * T : Bk * T;
  est.scratch_elements = B * m.heads * T * (2 * m.qk_dim() + 2 * m.v_dim()) + N * (3 * C + 3 * swiglu) + attention +
                         run * 3 * Fm + 2 * NK * C + (ep ? rows * C : 0);
  est.expert_rows = rows;
  est.exchange_elements = ep ? 2 * rows * C : 0;  // outputs going home, output gradients arriving
  // Mixed precision: the 32-bit targets KeptActivations are written through
  // (slot 0 as large as the largest of them; slot 1 for SwiGLU's gate/up, and
  // with slot 2 for k and v), the 16-bit copies of output gradients (half an
  // element each) and a softmax block (packed: Bk T; flash: the 16-bit copies
  // of a P and a dS tile of every head, span x Bk, half an element each).
  const int64_t BHT = B * m.heads * T;
  const int64_t slot0 = std::max({N * 2 * C * (m.mtp.depth > 0), BHT * m.qk_dim(), N * m.heads * m.v_dim(), N * m.ffn,
                                  run * Fm, N * int64_t(m.attention.kv_lora_rank), N * int64_t(m.attention.q_lora_rank),
                                  N * C, N * int64_t(m.moe.shared) * Fm});
  const int64_t widest = std::max(N * std::max({3 * C, 2 * swiglu, V, int64_t(m.heads) * (m.qk_dim() + m.v_dim())}),
                                  run * 2 * Fm);  // rows x width of the widest output gradient
  const int64_t slot1 = std::max({BHT * m.qk_dim(), 2 * N * m.ffn, 2 * run * Fm, 2 * N * int64_t(m.moe.shared) * Fm});
  const int64_t softmax = flash ? BH * kernels::flash_span(T) * Bk : Bk * T;
  est.mixed_scratch_elements = slot0 + slot1 + BHT * m.v_dim() + (widest + BHT * m.v_dim()) / 2 + softmax;
  return est;
}

namespace {

bool sixteen_bit(Precision precision) { return precision != Precision::fp32; }

// Bytes of activations: the halvable ones in 16 bits under bf16/fp16, written
// through 32-bit scratch; everything else 32 bits.
double activation_bytes(const MemoryEstimate& est, Precision precision) {
  const bool half = sixteen_bit(precision);
  return (half ? 2.0 : 4.0) * est.halvable_elements + 4.0 * (est.other_elements + est.scratch_elements) +
         (half ? 4.0 * est.mixed_scratch_elements : 0.0);
}

// The largest unit shard params gathers at once (ParamLayout::weight_units).
void largest_layer(const ParamLayout& layout, const ModelConfig&, int64_t& size, std::string& name) {
  size = 0;
  for (const auto& u : layout.weight_units())
    if (u.end - u.begin > size) size = u.end - u.begin, name = u.name;
}

// fp32 elements the phase's sync strategy allocates beside the model's
// buffers (src/comm/): the compressor's packed, dense, residual and momentum
// buffers and its top-k workspace (about four of its largest buckets), the
// update target's delta and pre-step copy, local SGD's anchor and outer
// momentum, and the group mean that local SGD and a topology other than
// full take; exchange partitioned adds the owner residual and the owner's
// sum over its range, ceil(S / ranks) each (S the sparse part).
int64_t sync_elements(const Config& c, const ParamLayout& layout, int ranks, std::string& what) {
  const int64_t P = layout.total();
  int64_t n = 0;
  std::vector<std::string> parts;
  if (c.compress.kind != CompressKind::off) {
    const int64_t per_bucket = std::max<int64_t>(1, int64_t(c.sync.bucket_mb * 1024 * 1024 / sizeof(float)));
    int64_t sparse = 0, largest = 0;
    for (const auto& t : layout.tensors())
      if (t.size >= c.compress.min_size) sparse += t.size, largest = std::max(largest, std::min(t.size, per_bucket));
    n += 3 * sparse + (P - sparse) + (c.compress.momentum > 0 ? sparse : 0) + 4 * largest;
    parts.push_back(c.compress.momentum > 0 ? "compressor (packed, dense, residual, momentum, workspace)"
                                            : "compressor (packed, dense, residual, workspace)");
    if (c.compress.exchange == Exchange::partitioned)
      n += 2 * ((sparse + std::max(1, ranks) - 1) / std::max(1, ranks)), parts.push_back("owner residual and range sum");
    if (c.compress.target == CompressTarget::update) n += 2 * P, parts.push_back("update delta and pre-step copy");
  }
  if (c.sync.kind == SyncKind::local && c.sync.outer != Outer::average) n += 2 * P, parts.push_back("outer anchor and momentum");
  if (c.sync.kind == SyncKind::local || c.topology.kind != TopologyKind::full) n += P, parts.push_back("group mean");
  what.clear();
  for (const auto& p : parts) what += (what.empty() ? "" : ", ") + p;
  return n;
}

// What the precision changes: the 16-bit copy, what params gathers, the activations.
void set_precision(PlanBasis& b, const MemoryEstimate& est, Precision precision) {
  b.precision = precision;
  b.copy_bytes = sixteen_bit(precision) ? 2 : 0;
  b.activations = activation_bytes(est, precision);
}

// This rank's routed experts under ep (the tensors of rank 0's layout: every
// rank holds as many); 0 without ep, where every tensor is replicated.
int64_t held_experts(const ParamLayout& layout) {
  int64_t n = 0;
  for (const auto& [begin, end] : layout.expert_runs()) n += end - begin;
  return n;
}

// A plan needs whole expert-parallel groups; a run is refused the same way
// (Trainer::split_expert_groups), this one for a dry run's -ranks.
void check_expert_groups(const Program& program, int ranks) {
  const MoeConfig& moe = program.phases.front().config.model.moe;
  if (!moe.enabled() || ranks % moe.ep == 0) return;
  input_error("{}: moe ep {} does not divide the {} ranks planned (expected a world size that is a multiple of ep, "
              "or an ep that divides {} and routed {})", where_given(program, "moe"), moe.ep, ranks, ranks, moe.routed);
}

PlanBasis basis_of(const Config& c, const ParamLayout& layout, const MemoryEstimate& est, int ranks) {
  PlanBasis b;
  b.ranks = ranks;
  b.ep = c.model.moe.enabled() ? c.model.moe.ep : 1;
  b.model_params = layout.full_total();
  b.params = layout.total();
  b.experts = held_experts(layout);
  const int64_t holders = ranks / b.ep;
  b.shard = (b.params - b.experts + ranks - 1) / ranks + (b.experts + holders - 1) / holders;
  largest_layer(layout, c.model, b.largest_layer, b.largest_name);
  set_precision(b, est, c.precision.kind);
  b.moment_bytes = c.optimizer.moments == Precision::bf16 ? 4 : 8;
  b.bucket_bytes = std::min(c.sync.bucket_mb * 1024 * 1024, 4.0 * b.params);  // a bucket never outgrows the gradient
  b.sync_buffers = 4.0 * sync_elements(c, layout, ranks, b.sync_what);
  b.exchange = 4.0 * est.exchange_elements;
  b.expert_rows = b.ep > 1 ? est.expert_rows : 0;
  b.held_units = c.model.mtp.depth > 0 ? 4 : c.model.tie_embeddings ? 3 : 2;  // tied: the embedding is the head
  b.deck_level = c.shard.level;
  for (const auto& [begin, end] : layout.fp32_read_runs()) b.fp32_read += end - begin;
  return b;
}

}  // namespace

PlanBasis plan_basis(const Program& program, int ranks) {
  const Config& first = program.phases.front().config;
  check_expert_groups(program, ranks);
  const ParamLayout layout(first.model);  // rank 0's experts under ep: every rank holds as many
  const auto est = estimate_memory(first.model, first.data.batch, kExpertLoadPlanned);
  PlanBasis best;
  for (const Phase& phase : program.phases) {
    PlanBasis b = basis_of(phase.config, layout, est, ranks);
    b.phase = phase.where;
    if (best.phase.empty() || b.sync_buffers + 2 * b.bucket_bytes > best.sync_buffers + 2 * best.bucket_bytes)
      best = b;
  }
  return best;
}

// Bytes per rank, with P parameters held, S of them owned, L in the largest
// unit (ParamLayout::weight_units), c the 16-bit copy's bytes per weight (0
// under fp32), o the moments' bytes per weight (8: two fp32; 4 under
// optimizer ... moments bf16), F = 2 buckets reduced at once (core/ownership.h), H the units
// held at once under params:
//              weights            gradients  optimizer  communication (besides the sync strategy's buffers)
//   off        (4 + c) P          4 P        o P        0: the all-reduce works in place
//   optimizer  (4 + c) P          4 P        o S        0: the all-gather fills the weights in place
//   gradients  (4 + c) P          4 S        o S        4 L + 2 F bucket: gradients in flight
//   params     (4 + c) S          4 S        o S        4 L + 2 F bucket + H L (4 + c): in flight, units gathered
// Under 16-bit precision (c = 2) at W > 1 ranks, optimizer and gradients keep
// the fp32 master only of their pieces and of the M weights the model reads
// in fp32 (embedding, norms, router gates): their weights are
// c P + 4 S + 4 M (W - 1) / W, and communication adds the 4 M all-gathered.
// Without ep P is the whole model and S = ceil(P/W). Under ep N, P is the
// replicated tensors R and this rank's experts X (E/N of each MoE layer's),
// and S = ceil(R/W) + ceil(X/D): the D = W/N holders of an expert share its
// pieces. The all-to-all's scratch adds to communication at every level.
// In flight under gradients and params:
// the unit whose whole gradients the backward is writing, and F buckets
// being reduced, each twice (ours, and the temporary Open MPI's nonblocking
// all-reduce allocates for it); a bucket's pages go back to the kernel when
// its reduction ends. Under params the buckets are cut inside the units. Gathered under
// params, in fp32 with their 16-bit copy: the unit computing and the next,
// prefetched (H = 2), and with MTP the embedding and the head held through
// the forward (H = 4).
bool pieces_of_master(const PlanBasis& b, ShardLevel level) {
  return b.copy_bytes > 0 && b.ranks > 1 && (level == ShardLevel::optimizer || level == ShardLevel::gradients);
}

MemoryPlan plan_level(const PlanBasis& b, ShardLevel level) {
  const double P = double(b.params), S = double(b.shard), L = double(b.largest_layer), c = b.copy_bytes;
  MemoryPlan plan;
  plan.level = level;
  plan.activations = b.activations;
  plan.communication = b.sync_buffers + b.exchange;
  const bool owns_grads = level == ShardLevel::gradients || level == ShardLevel::params;
  const double W = b.ranks, M = double(b.fp32_read);
  plan.weights = (4 + c) * (level == ShardLevel::params ? S : P);
  if (pieces_of_master(b, level)) {
    plan.weights = c * P + 4 * S + 4 * M * (W - 1) / W;
    plan.communication += 4 * M;
  }
  plan.gradients = owns_grads ? 4 * S : 4 * P;
  plan.optimizer = b.moment_bytes * (level == ShardLevel::off ? P : S);
  const double F = kShardBucketsInFlight;
  // optimizer: the buckets reduce in place in the whole gradient buffer, F at
  // once, each also in the temporary Open MPI's nonblocking all-reduce
  // allocates for it (measured on every rank, leaves of its tree included).
  if (level == ShardLevel::optimizer && b.ranks > 1) plan.communication += F * b.bucket_bytes;
  if (level == ShardLevel::gradients) plan.communication += 4 * L + 2 * F * b.bucket_bytes;
  if (level == ShardLevel::params) plan.communication += 4 * L + 2 * F * b.bucket_bytes + b.held_units * L * (4 + c);
  return plan;
}

namespace {

// The smallest level (least sharded) whose plan fits, if any.
const MemoryPlan* smallest_fitting(const std::array<MemoryPlan, 4>& plans, double limit) {
  for (const auto& p : plans)
    if (p.total() <= limit) return &p;
  return nullptr;
}

std::array<MemoryPlan, 4> all_levels(const PlanBasis& b) {
  std::array<MemoryPlan, 4> plans;
  for (size_t i = 0; i < kShardLevels.size(); ++i) plans[i] = plan_level(b, kShardLevels[i]);
  return plans;
}


}  // namespace

std::string dry_run_report(const Program& program, int ranks, const MemoryLimit& limit) {
  const Config& c = program.phases.front().config;
  const PlanBasis deck_basis = plan_basis(program, ranks);
  const auto est = estimate_memory(c.model, c.data.batch, kExpertLoadPlanned);
  const ParamLayout layout(c.model);
  const auto& moe = c.model.moe;
  const int ep = deck_basis.ep, holders = ranks / ep;
  std::string out;
  out += fmt::format("# dry run: nothing allocated\n");
  out += fmt::format("  parameters total        {:>16} ({})\n", est.params, format_count(double(est.params)));
  out += fmt::format("  parameters per token    {:>16} ({} active: all but the {}\n"
                     "                                            routed experts a token does not pick{})\n",
                     est.active, format_count(double(est.active)),
                     c.model.tie_embeddings ? "" : "embedding table and the",
                     c.model.tie_embeddings ? "; the tied embedding is the head" : "");
  out += fmt::format("  training FLOP per token {:>16.4g}\n", flops_per_token(c.model, layout));
  if (ep == 1) {
    out += fmt::format("  batch per rank          {:>16} sequences of {}, {} rank(s), data parallel\n", c.data.batch,
                       c.model.seq, ranks);
  } else {
    // Every rank still trains on its own batch; only the routed experts are split.
    const auto& b = deck_basis;
    out += fmt::format("  batch per rank          {:>16} sequences of {}, {} rank(s), data parallel but for the "
                       "routed experts\n", c.data.batch, c.model.seq, ranks);
    out += fmt::format("  expert parallel         {:>16} ranks per group, {} group(s): each rank holds {} of every\n"
                       "                                            MoE layer's {} routed experts, each expert held by "
                       "D = {} rank(s)\n", ep, holders, moe.routed / ep, moe.routed, holders);
    out += fmt::format("  parameters per rank     {:>16} ({}: {} replicated, {} of its routed experts)\n", b.params,
                       format_count(double(b.params)), format_count(double(b.params - b.experts)),
                       format_count(double(b.experts)));
  }
  auto row = [](const std::string& name, const MemoryPlan& p, const std::string& tail) {
    return fmt::format("  {:<10} {:>11} {:>11} {:>11} {:>12} {:>13} {:>11}{}\n", name, format_bytes(p.weights),
                       format_bytes(p.gradients), format_bytes(p.optimizer), format_bytes(p.activations),
                       format_bytes(p.communication), format_bytes(p.total()), tail);
  };
  auto header = [](const char* first, const char* tail) {
    return fmt::format("  {:<10} {:>11} {:>11} {:>11} {:>12} {:>13} {:>11}{}\n", first, "weights", "gradients",
                       "optimizer", "activations", "communication", "total", tail);
  };
  // Master weights and gradients stay fp32, the moments as the deck keeps them. 16-bit runs add a
  // 16-bit copy of the weights for the GEMMs, keep the halvable activations in
  // 16 bits, and write those through 32-bit scratch.
  out += ep == 1 ? "\n# memory per rank, sharding off: every rank holds the whole model under data parallelism\n"
                 : fmt::format("\n# memory per rank, sharding off: every rank holds the replicated tensors and {} of "
                               "the {} routed experts per MoE layer (ep {})\n", moe.routed / ep, moe.routed, ep);
  out += header("precision", "  vs fp32");
  double fp32_total = 0;
  for (Precision type : {Precision::fp32, Precision::bf16, Precision::fp16}) {
    PlanBasis b = deck_basis;
    set_precision(b, est, type);
    const MemoryPlan p = plan_level(b, ShardLevel::off);
    if (fp32_total == 0) fp32_total = p.total();
    out += row(std::string(mode_name(type)), p, fmt::format(" {:>8.2f}x", p.total() / fp32_total));
  }
  out += fmt::format("  optimizer: AdamW's moments m and v in {}, {} bytes per parameter{}\n",
                     deck_basis.moment_bytes == 4 ? "bf16" : "fp32", deck_basis.moment_bytes,
                     deck_basis.moment_bytes == 4 ? " (optimizer ... moments bf16; fp32 would take 8)" : "");
  out += fmt::format("  activations: {} kept in 16 bits under bf16/fp16, {} other kept, {} scratch (fp32), "
                     "+{} scratch under bf16/fp16\n",
                     format_bytes(4.0 * est.halvable_elements), format_bytes(4.0 * est.other_elements),
                     format_bytes(4.0 * est.scratch_elements), format_bytes(4.0 * est.mixed_scratch_elements));
  out += uses_flash_attention(c.model.attention)
             ? fmt::format("  attention: the flash kernel: a log-sum-exp per row kept ({} x {} rows per layer), the "
                           "probabilities recomputed key block by key block\n",
                           c.data.batch * c.model.heads, c.model.seq)
             : fmt::format("  attention: the packed kernel: its probabilities kept ({} x {} per layer; "
                           "attention_kernel flash keeps {} x {})\n", c.data.batch * c.model.heads,
                           kernels::CausalBlocks(c.model.seq, kAttentionBlock).per_head(),
                           c.data.batch * c.model.heads, c.model.seq);

  const auto plans = all_levels(deck_basis);
  const bool known = limit.bytes > 0;
  const std::string expert_holders =
      ep > 1 ? fmt::format(", ep {}: experts sharded over their D = {} holder(s)", ep, holders) : "";
  out += fmt::format("\n# memory per rank by sharding level (deck: shard): {}, {} rank(s){}\n", deck_basis.precision,
                     ranks, expert_holders);
  out += header("level", known ? "  fits" : "");
  for (const auto& p : plans)
    out += row(std::string(mode_name(p.level)), p,
               (known ? (p.total() <= limit.bytes ? "  yes" : "  no") : std::string()) +
                   (p.level == deck_basis.deck_level ? "  <- the deck's" : ""));
  const PlanBasis& b = deck_basis;
  if (ep == 1)
    out += fmt::format("  assumed: P = {} parameters, each rank owning S = ceil(P/{}) = {}; largest layer {} ({}); "
                       "bucket {}\n", format_count(double(b.params)), ranks, format_count(double(b.shard)),
                       b.largest_name, format_count(double(b.largest_layer)), format_bytes(b.bucket_bytes));
  else
    out += fmt::format("  assumed: P = {} parameters held, R = {} replicated and X = {} of experts, each rank owning "
                       "S = ceil(R/{}) + ceil(X/{}) = {}; largest layer {} ({}; a MoE layer counts its held experts); "
                       "bucket {}\n",
                       format_count(double(b.params)), format_count(double(b.params - b.experts)),
                       format_count(double(b.experts)), ranks, holders, format_count(double(b.shard)), b.largest_name,
                       format_count(double(b.largest_layer)), format_bytes(b.bucket_bytes));
  out += fmt::format("  off: the gradient all-reduce works in place in the gradient buffer (no buffer of ours)\n");
  if (pieces_of_master(b, ShardLevel::optimizer))
    out += fmt::format("  optimizer: AdamW's moments sharded ({} S), and the fp32 master weights (4 S) but for the M = "
                       "{} the model reads in fp32 (embedding, norms, router gates: 4 M (W-1)/W more, and 4 M "
                       "gathered); the 16-bit copy ({} P) stays whole, all-gathered in place before the next forward\n",
                       b.moment_bytes, format_count(double(b.fp32_read)), b.copy_bytes);
  else
    out += fmt::format("  optimizer: AdamW's moments sharded ({} S); the weights (fp32 and any 16-bit copy) stay "
                       "whole, all-gathered in place after the update\n", b.moment_bytes);
  if (ranks > 1)
    out += fmt::format("  optimizer: in flight during the backward, {} buckets reduced in place, each also in MPI's "
                       "temporary: {} bucket\n", kShardBucketsInFlight, kShardBucketsInFlight);
  out += fmt::format("  gradients: also the gradients (4 S); in flight during the backward, the unit written and {} "
                     "buckets reduced, each also in MPI's temporary: 4 L + {} bucket\n",
                     kShardBucketsInFlight, 2 * kShardBucketsInFlight);
  out += fmt::format("  params: also the weights (4 S{}); in flight as under gradients (4 L + {} bucket); "
                     "gathered: {} units at once (the one computing, the next{}) "
                     "in fp32{}: {} L x {} B\n",
                     b.copy_bytes ? fmt::format(" + {} S", b.copy_bytes) : "", 2 * kShardBucketsInFlight, b.held_units,
                     b.held_units == 4   ? ", the embedding and head held through the forward for MTP"
                     : b.held_units == 3 ? ", the embedding held through the forward: it is the head"
                                         : "",
                     b.copy_bytes ? " with their 16-bit copy" : "", b.held_units, 4 + b.copy_bytes);
  if (!b.sync_what.empty())
    out += fmt::format("  communication also holds the sync strategy's {} of {} (phase at {}), whole at every level\n",
                       b.sync_what, format_bytes(b.sync_buffers), b.phase);
  if (ep > 1) {
    // What a busier step would add: the rows every token of the group could send here.
    const double worst = double(ep) * std::min(moe.topk, moe.routed / ep) / moe.topk;
    const auto busiest = estimate_memory(c.model, c.data.batch, worst);
    const double more = activation_bytes(busiest, b.precision) + 4.0 * busiest.exchange_elements -
                        (b.activations + b.exchange);
    const int64_t even = int64_t(c.data.batch) * c.model.seq * moe.topk;
    out += fmt::format("  ep: the rows this rank's experts run, planned at {}x an even load: {} per MoE layer (even: "
                       "{} tokens x top-{} = {}), each kept (input, gate/up, SwiGLU output) beside the rows sent; a "
                       "busier step grows them for the rest of the run, and the worst load ({:.3g}x even: every token "
                       "of the group on this rank's experts) adds {}\n",
                       kExpertLoadPlanned, b.expert_rows, int64_t(c.data.batch) * c.model.seq, moe.topk, even, worst,
                       format_bytes(more));
    out += fmt::format("  ep: communication holds the all-to-all's fp32 scratch, shared by the layers (outputs going "
                       "home, output gradients arriving: 2 x {} rows x {}): {} at every level\n",
                       b.expert_rows, c.model.dim, format_bytes(b.exchange));
    if (holders == 1)
      out += "  D = 1: each expert has one holder, so no level shards its state; only the replicated tensors' is\n";
  }
  out += "  not counted: memory of MPI, Kokkos and the GEMM library, the data loader's queue, checkpoint copies\n";
  if (ranks == 1) out += "  one rank: nothing to shard; levels that shard gradients or weights only add their buffers\n";

  if (!known) {
    out += fmt::format("\n# verdict: no memory limit known ({}); pass -device-gb G\n", limit.source);
    return out;
  }
  std::string fitting;
  for (const auto& p : plans)
    if (p.total() <= limit.bytes) fitting += (fitting.empty() ? "" : ", ") + std::string(mode_name(p.level));
  const MemoryPlan* smallest = smallest_fitting(plans, limit.bytes);
  out += fmt::format("\n# verdict: limit {} per rank ({})\n", format_bytes(limit.bytes), limit.source);
  if (!smallest) {
    out += fmt::format("  no level fits: even params needs {}\n", format_bytes(plans.back().total()));
  } else {
    out += fmt::format("  fits: {}\n", fitting);
    out += fmt::format("  smallest level that fits: {}\n", mode_name(smallest->level));
  }
  return out;
}

std::string memory_refusal(const Program& program, int ranks, const MemoryLimit& limit) {
  if (limit.bytes <= 0) return "";
  const MoeConfig& moe = program.phases.front().config.model.moe;
  if (moe.enabled() && ranks % moe.ep != 0) return "";  // the trainer refuses it, naming any checkpoint's layout
  const PlanBasis b = plan_basis(program, ranks);
  const auto plans = all_levels(b);
  const MemoryPlan& off = plans[size_t(b.deck_level)];  // the deck's level
  if (off.total() <= limit.bytes) return "";
  const MemoryPlan* smallest = smallest_fitting(plans, limit.bytes);
  const std::string instead =
      smallest ? fmt::format("the least sharded level that would fit is shard {} ({})", mode_name(smallest->level),
                             format_bytes(smallest->total()))
               : fmt::format("no sharding level fits (params needs {}): more ranks, {}a smaller model or batch",
                             format_bytes(plans.back().total()), moe.enabled() ? "a larger moe ep, " : "");
  const std::string deck = b.phase.substr(0, b.phase.rfind(':'));
  return fmt::format("{}: memory: the plan for shard {} needs {} per rank at {} rank(s){} ({} weights, {} gradients, "
                     "{} optimizer, "
                     "{} activations, {} communication), over the limit of {} ({}); {} "
                     "(expected a deck that fits: xuanxue -in DECK -dry-run prints the plan)",
                     deck, b.deck_level, format_bytes(off.total()),
                     ranks, b.ep > 1 ? fmt::format(", ep {}", b.ep) : "",
                     format_bytes(off.weights), format_bytes(off.gradients),
                     format_bytes(off.optimizer), format_bytes(off.activations), format_bytes(off.communication),
                     format_bytes(limit.bytes), limit.source, instead);
}

}  // namespace xx

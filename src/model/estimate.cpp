#include "model/estimate.h"
#include "core/ownership.h"
#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <tuple>
#include <vector>
#include <fmt/format.h>
#include "core/error.h"
#include "core/pipeline_schedule.h"
#include "core/placement.h"
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

// What one block keeps for its backward, in two parts as the model shares
// them under recompute (model/store.h Workspace: a buffer is shared by the
// blocks allocating the same name and size): the norms and attention, alike
// in every block, and the feed-forward, alike within a kind (dense or MoE).
// Of each part, what recompute selective remakes (16-bit under mixed
// precision): the RMSNorm outputs (xn, xn2; MLA's cn, qan), MLA's q, k, v
// (MHA's are kept: they come from the fused GEMM, not a latent) and the
// SwiGLU activations (the dense FFN's, the shared experts', the routed
// rows'), the routed rows sent (gathered again; under ep not read again)
// and under ep 1 their outputs (multiplied again). `own`: what stays each
// block's under full (the router's indices and its score and sequence-loss
// gradients).
struct BlockKept {
  Kept attn, ffn, own;
  int64_t attn_selective = 0, ffn_selective = 0;  // of attn.half, ffn.half
  int64_t ffn_selective_other = 0;                // of ffn.other (the routed rows' outputs, ep 1)
  bool moe = false;
};

// Mirrors the buffers Block, Attention, FeedForward and Transformer allocate
// (the constructors in src/model/), counted in elements.
static BlockKept block_activations(const ModelConfig& m, bool moe, int64_t B, int64_t rows) {
  const int64_t T = m.seq, N = B * T, C = m.dim, H = m.heads, qk = m.qk_dim(), vd = m.v_dim();
  const auto& a = m.attention;
  kernels::CausalBlocks blocks(T, kAttentionBlock);
  BlockKept b;
  b.moe = moe;
  Kept& k = b.attn;
  k.half = 2 * N * C, k.other = N * C + 2 * N;                                  // xn, xn2; xmid, two rstd
  b.attn_selective = 2 * N * C + (a.mla() ? B * H * T * (2 * qk + vd) : 0);    // xn, xn2; MLA: q, k, v
  k.half += B * H * T * (2 * qk + vd) + N * H * vd;                             // q, k, v, o
  if (uses_flash_attention(a)) k.other += B * H * T;                            // flash: a log-sum-exp per row
  else k.half += B * H * blocks.per_head();                                     // packed: the probabilities
  k.other += T * (a.mla() ? a.rope_dim : qk);                                    // rope tables
  if (a.mla()) {
    k.half += N * a.kv_lora_rank + N * a.q_lora_rank;                            // cn, qan
    b.attn_selective += N * a.kv_lora_rank + N * a.q_lora_rank;
    k.other += N * a.kv_lora_rank + N + N * a.rope_dim + (a.q_lora_rank ? N * a.q_lora_rank + N : 0);  // c, krope, qa
  }
  Kept& f = b.ffn;
  if (!moe) return f.half = 3 * N * m.ffn, b.ffn_selective = N * m.ffn, b;     // h (2F), a (F)
  const auto& e = m.moe;
  const int64_t K = e.topk, E = e.routed, Fm = e.ffn;
  f.half += 3 * N * e.shared * Fm;                                               // shared experts' h, a
  f.other += 2 * N * E + N * K;                                                  // logits, scores, weights
  b.own.other += E + 3 * N * K;                                                  // score grad; indices (int32)
  if (e.sequence_loss_coef() > 0) b.own.other += 2 * B * E;                     // the sequence-wise loss: counts, coef
  f.half += N * K * C;                                                           // expert in (the rows sent)
  f.other += N * K * C;                                                          // expert out
  f.half += rows * (e.ep > 1 ? C + 3 * Fm : 3 * Fm);                             // the rows run: (ep: in), h, a
  b.ffn_selective = N * e.shared * Fm + rows * Fm + N * K * C;                   // the shared experts' a, the rows' a, in
  if (e.ep <= 1) b.ffn_selective_other = N * K * C;                              // ep 1: the rows' out
  return b;
}

// The layers of each pipeline stage: P contiguous runs, the first L mod P one
// layer longer than the rest.
std::vector<std::pair<int, int>> stage_layers(int layers, int stages, const std::vector<int>& cut) {
  std::vector<std::pair<int, int>> spans;
  const int q = layers / stages, r = layers % stages;
  const bool given = int(cut.size()) == stages;
  for (int s = 0, begin = 0; s < stages; ++s) {
    const int n = given ? cut[size_t(s)] : q + (s < r);
    spans.emplace_back(begin, begin + n);
    begin += n;
  }
  return spans;
}

std::vector<StageSpan> PipelinePlan::runs(int layers, int stage) const {
  if (stages == 1) return {StageSpan{0, layers, true, true, 1}};
  const auto spans = stage_layers(layers, chunks(), cut);
  // the trainer's own table for this stage: what each run holds in flight
  const auto order = stage_order(schedule, stages, micro, stage, virtual_stages);
  std::vector<StageSpan> out;
  for (int r = 0; r < virtual_stages; ++r) {
    const int k = chunk_of(stages, virtual_stages, schedule == PipelineSchedule::dualpipev, stage, r);
    out.push_back({spans[size_t(k)].first, spans[size_t(k)].second, k == 0, k == chunks() - 1, most_in_flight(order, r)});
  }
  return out;
}

std::string PlanBasis::layers_text() const {
  std::vector<std::string> parts;
  for (const StageSpan& r : runs)
    parts.push_back(r.end - r.begin == 1 ? std::to_string(r.begin) : fmt::format("{}-{}", r.begin, r.end - 1));
  return fmt::format("{}", fmt::join(parts, ","));
}

int PipelinePlan::in_flight(int stage) const {
  if (stages == 1) return 1;
  const auto per_run = in_flight_per_run(stage_order(schedule, stages, micro, stage, virtual_stages), virtual_stages);
  return std::accumulate(per_run.begin(), per_run.end(), 0);
}

MemoryEstimate estimate_memory(const ModelConfig& m, int batch, double expert_load) {
  return estimate_stage(m, batch, {StageSpan{0, m.layers, true, true, 1}}, expert_load);
}

MemoryEstimate estimate_stage(const ModelConfig& m, int batch, const std::vector<StageSpan>& runs, double expert_load,
                              bool scratch_per_run) {
  const ParamLayout layout(m);
  MemoryEstimate est;
  est.params = layout.full_total();
  est.active = layout.active_per_token();
  const int64_t B = batch, T = m.seq, N = B * T, C = m.dim, V = m.vocab;
  const bool moe = m.moe.enabled(), ep = moe && m.moe.ep > 1;
  const int64_t rows = moe ? expert_rows(m, B, expert_load) : 0, NK = moe ? N * m.moe.topk : 0;
  // Per micro-batch in flight in each run: the residual streams (the run's
  // input and each block's output), the blocks' own; the last chunk adds xf,
  // the final rstd, the logits, the losses and the MTP modules.
  Kept kept, run_kept;
  // Once, whatever is in flight: the blocks' shared set (recompute), the
  // attention part's largest and each feed-forward kind's.
  Kept shared_attn, shared_ffn[2];
  auto larger = [](Kept& into, const Kept& k) {
    if (k.half + k.other > into.half + into.other) into = k;
  };
  auto add_block = [&](const BlockKept& b) {
    Kept& ffn_set = shared_ffn[b.moe];
    switch (m.recompute) {
      case Recompute::off: run_kept += b.attn, run_kept += b.ffn, run_kept += b.own; break;
      case Recompute::selective:
        run_kept += Kept{b.attn.half - b.attn_selective, b.attn.other};
        run_kept += Kept{b.ffn.half - b.ffn_selective, b.ffn.other - b.ffn_selective_other};
        run_kept += b.own;
        larger(shared_attn, Kept{b.attn_selective, 0});
        larger(ffn_set, Kept{b.ffn_selective, b.ffn_selective_other});
        break;
      case Recompute::full:  // one block's set at a time; only the streams and `own` stay
        run_kept += b.own;
        larger(shared_attn, b.attn);
        larger(ffn_set, b.ffn);
        break;
    }
  };
  for (const StageSpan& span : runs) {
    run_kept = Kept{0, (span.end - span.begin + 1) * N * C};
    for (int l = span.begin; l < span.end; ++l) add_block(block_activations(m, m.moe.is_moe_layer(l), B, rows));
    if (span.last) {
      run_kept += Kept{N * C, N + N * V + N};  // xf; final rstd, logits, losses
      for (int d = 0; d < m.mtp.depth; ++d) {
        run_kept += Kept{3 * N * C, 5 * N * C + 4 * N + N * V + 2 * N};  // cat, hf; hn, e, en, x0, h, rstds, logits, tokens
        add_block(block_activations(m, m.moe.is_moe_layer(m.layers + d), B, rows));
      }
    }
    kept += Kept{run_kept.half * span.in_flight, run_kept.other * span.in_flight};
  }
  Kept shared = shared_attn;
  shared += shared_ffn[0], shared += shared_ffn[1];
  est.recomputed_elements = shared.half + shared.other;
  kept += shared;
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
  if (scratch_per_run) {  // each run its own scratch and recomputed set (model/transformer.h)
    const int64_t n = int64_t(runs.size());
    est.recomputed_elements *= n;
    est.halvable_elements += (n - 1) * shared.half, est.other_elements += (n - 1) * shared.other;
    est.scratch_elements *= n, est.mixed_scratch_elements *= n, est.exchange_elements *= n;
  }
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

// fp32 elements the phase's sync strategy allocates beside the model's
// buffers (src/comm/): the compressor's packed, dense, residual and momentum
// buffers and its top-k workspace (about four of its largest buckets), the
// update target's delta and pre-step copy, local SGD's anchor and outer
// momentum, and the group mean that local SGD and a topology other than
// full take; exchange partitioned adds the owner residual and the owner's
// sum over its range, ceil(S / ranks) each (S the sparse part).
template <class Holds>
int64_t sync_elements(const Config& c, const ParamLayout& layout, int64_t P, Holds holds, int ranks,
                      std::string& what) {
  int64_t n = 0;
  std::vector<std::string> parts;
  if (c.compress.kind != CompressKind::off) {
    const int64_t per_bucket = std::max<int64_t>(1, int64_t(c.sync.bucket_mb * 1024 * 1024 / sizeof(float)));
    int64_t sparse = 0, largest = 0;
    for (const auto& t : layout.tensors())
      if (holds(t) && t.size >= c.compress.min_size)
        sparse += t.size, largest = std::max(largest, std::min(t.size, per_bucket));
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

// A plan needs whole expert-parallel groups; a run is refused the same way
// (Trainer::split_expert_groups), this one for a dry run's -ranks.
void check_expert_groups(const Program& program, int ranks) {
  const MoeConfig& moe = program.phases.front().config.model.moe;
  if (!moe.enabled() || ranks % moe.ep == 0) return;
  input_error("{}: moe ep {} does not divide the {} ranks planned (expected a world size that is a multiple of ep, "
              "or an ep that divides {} and routed {})", where_given(program, "moe"), moe.ep, ranks, ranks, moe.routed);
}

// The basis of one stage's rank (P = 1: the whole model) among `ranks`:
// its tensors (under ep, rank 0's experts: every rank holds as many), the
// embedding copy the last stage keeps when MTP or a tied head reads it, and
// ZeRO over the stage's W / P data-parallel ranks.
PlanBasis basis_of(const Config& c, const ParamLayout& layout, const MemoryEstimate& est, int ranks,
                   const PipelinePlan& pipe, int stage) {
  const ModelConfig& m = c.model;
  PlanBasis b;
  b.pipe = pipe;
  b.stage = stage;
  b.runs = pipe.runs(m.layers, stage);
  const bool first = b.runs.front().first, last = b.runs.back().last;
  // the embedding the first chunk's, a block its chunk's, the final norm, the head and the MTP modules the last's
  auto holds = [&](const TensorInfo& t) {
    if (pipe.stages == 1) return true;
    if (t.layer < 0) return t.name == "embed" ? first : last;
    if (t.layer >= m.layers) return last;
    for (const StageSpan& r : b.runs)
      if (t.layer >= r.begin && t.layer < r.end) return true;
    return false;
  };
  b.ranks = ranks / pipe.stages;
  b.ep = m.moe.enabled() ? m.moe.ep : 1;
  b.model_params = layout.full_total();
  const TensorInfo& embed = layout.at("embed");
  b.embed_copy = pipe.stages > 1 && last && !first && (m.mtp.depth > 0 || m.tie_embeddings) ? embed.size : 0;
  b.params = b.embed_copy;
  b.fp32_read = embed.reads_fp32 ? b.embed_copy : 0;
  for (const auto& t : layout.tensors()) {
    if (!holds(t)) continue;
    b.params += t.size;
    if (t.expert >= 0 && b.ep > 1) b.experts += t.size;
    if (t.reads_fp32) b.fp32_read += t.size;
  }
  const int64_t W = b.ranks, holders = W / b.ep;
  b.shard = (b.params - b.experts + W - 1) / W + (b.experts + holders - 1) / holders;
  // The largest unit params gathers at once (ParamLayout::weight_units) of those this stage holds.
  std::map<int64_t, const TensorInfo*> at;
  for (const auto& t : layout.tensors()) at[t.offset] = &t;
  for (const auto& u : layout.weight_units())
    if (holds(*at.at(u.begin)) && u.end - u.begin > b.largest_layer)
      b.largest_layer = u.end - u.begin, b.largest_name = u.name;
  if (b.embed_copy > b.largest_layer) b.largest_layer = b.embed_copy, b.largest_name = "embed (copy)";
  set_precision(b, est, c.precision.kind);
  b.moment_bytes = c.optimizer.moments == Precision::bf16 ? 4 : 8;
  b.bucket_bytes = std::min(c.sync.bucket_mb * 1024 * 1024, 4.0 * b.params);  // a bucket never outgrows the gradient
  b.sync_buffers = 4.0 * sync_elements(c, layout, b.params, holds, int(W), b.sync_what);
  b.exchange = 4.0 * est.exchange_elements;
  b.expert_rows = b.ep > 1 ? est.expert_rows : 0;
  // params holds the embedding and head through the forward on the stage that
  // runs MTP (tied: the embedding is the head).
  b.held_units = pipe.stages > 1 && !last ? 2 : m.mtp.depth > 0 ? 4 : m.tie_embeddings ? 3 : 2;
  b.deck_level = c.shard.level;
  // Between stages, fp32 buffers of one micro-batch's N x C: per neighbour of each chunk the activation and
  // its gradient.
  int neighbours = 0;
  for (const StageSpan& r : b.runs) neighbours += !r.first + !r.last;
  b.pipe_buffers = 4.0 * 2 * neighbours * int64_t(c.data.batch / pipe.micro) * m.seq * m.dim;
  return b;
}

}  // namespace

PipelinePlan deck_pipeline(const Config& c) {
  const PipelineConfig& p = c.pipeline;
  return p.stages > 1 ? PipelinePlan{p.stages, p.schedule, p.micro, p.cut, p.virtual_stages} : PipelinePlan{};
}

PlanBasis plan_basis(const Program& program, int ranks) {
  const Config& first = program.phases.front().config;
  const PipelinePlan pipe = deck_pipeline(first);
  if (pipe.stages == 1 || ranks % pipe.stages) return plan_basis(program, ranks, PipelinePlan{}, 0);
  // The stage whose rank needs the most at the deck's level.
  PlanBasis worst;
  double most = -1;
  for (int s = 0; s < pipe.stages; ++s) {
    PlanBasis b = plan_basis(program, ranks, pipe, s);
    const double total = plan_level(b, first.shard.level).total();
    if (total > most) most = total, worst = std::move(b);
  }
  return worst;
}

namespace {

// The sequences of one pass: the batch, or under stages a micro-batch.
int pass_batch(const Config& c, const PipelinePlan& pipe) {
  return pipe.stages > 1 ? c.data.batch / pipe.micro : c.data.batch;
}

// What stage `stage` of `pipe` keeps (P = 1: the whole model), at an expert load.
MemoryEstimate stage_estimate(const Config& c, const PipelinePlan& pipe, int stage, double expert_load) {
  return estimate_stage(c.model, pass_batch(c, pipe), pipe.runs(c.model.layers, stage), expert_load,
                        pipe.overlapped(c.model));
}

}  // namespace

PlanBasis plan_basis(const Program& program, int ranks, const PipelinePlan& pipe, int stage) {
  const Config& first = program.phases.front().config;
  check_expert_groups(program, ranks / pipe.stages);
  const ParamLayout layout(first.model);  // rank 0's experts under ep: every rank holds as many
  const auto est = stage_estimate(first, pipe, stage, kExpertLoadPlanned);
  PlanBasis best;
  for (const Phase& phase : program.phases) {
    PlanBasis b = basis_of(phase.config, layout, est, ranks, pipe, stage);
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
  plan.communication = b.sync_buffers + b.exchange + b.pipe_buffers;
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
  // Under the deck's pipeline stages every figure below is its worst stage's rank's.
  const PlanBasis deck_basis = plan_basis(program, ranks);
  const PipelinePlan& pipe = deck_basis.pipe;
  const int batch = pass_batch(c, pipe), W = ranks / pipe.stages;
  const auto est = stage_estimate(c, pipe, deck_basis.stage, kExpertLoadPlanned);
  const ParamLayout layout(c.model);
  const auto& moe = c.model.moe;
  const int ep = deck_basis.ep, holders = W / ep;
  std::string out;
  out += fmt::format("# dry run: nothing allocated\n");
  out += fmt::format("  parameters total        {:>16} ({})\n", est.params, format_count(double(est.params)));
  out += fmt::format("  parameters per token    {:>16} ({} active: all but the {}\n"
                     "                                            routed experts a token does not pick{})\n",
                     est.active, format_count(double(est.active)),
                     c.model.tie_embeddings ? "" : "embedding table and the",
                     c.model.tie_embeddings ? "; the tied embedding is the head" : "");
  out += fmt::format("  training FLOP per token {:>16.4g}\n", flops_per_token(c.model, layout));
  if (pipe.stages > 1) {
    const PlanBasis& b = deck_basis;
    out += fmt::format("  pipeline stages         {:>16} stages of {} data-parallel rank(s) each{}; planned here: stage "
                       "{} (layers {}{}{}), its rank holding {} parameters ({})\n", pipe.stages, W,
                       pipe.virtual_stages > 1 ? fmt::format(", {} chunks each", pipe.virtual_stages) : "", b.stage,
                       b.layers_text(), b.runs.front().first ? ", the embedding" : "",
                       b.runs.back().last ? ", the head" : "", b.params, format_count(double(b.params)));
    out += fmt::format("  micro-batches           {:>16} of {} sequence(s) of {} per step ({}): this stage keeps "
                       "{} in flight\n", pipe.micro, batch, c.model.seq, pipe.schedule, pipe.in_flight(b.stage));
  }
  if (ep == 1) {
    out += fmt::format("  batch per rank          {:>16} sequences of {}, {} rank(s), data parallel{}\n", c.data.batch,
                       c.model.seq, W, pipe.stages > 1 ? " (per pipeline)" : "");
  } else {
    // Every rank still trains on its own batch; only the routed experts are split.
    const auto& b = deck_basis;
    out += fmt::format("  batch per rank          {:>16} sequences of {}, {} rank(s), data parallel but for the "
                       "routed experts{}\n", c.data.batch, c.model.seq, W, pipe.stages > 1 ? " (per pipeline)" : "");
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
  out += pipe.stages > 1 ? fmt::format("\n# memory per rank, sharding off: stage {}'s rank holds its stage{}\n",
                                        deck_basis.stage, ep > 1 ? fmt::format(", {} of the routed experts per MoE layer "
                                                                               "(ep {})", moe.routed / ep, ep) : "")
         : ep == 1 ? "\n# memory per rank, sharding off: every rank holds the whole model under data parallelism\n"
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
                           batch * c.model.heads, c.model.seq)
             : fmt::format("  attention: the packed kernel: its probabilities kept ({} x {} per layer; "
                           "attention_kernel flash keeps {} x {})\n", batch * c.model.heads,
                           kernels::CausalBlocks(c.model.seq, kAttentionBlock).per_head(),
                           batch * c.model.heads, c.model.seq);

  if (c.model.recompute != Recompute::off)
    out += fmt::format("  recompute {}: {}; one set shared by the blocks for their recompute: {}\n", c.model.recompute,
                       c.model.recompute == Recompute::selective
                           ? "the RMSNorm outputs, MLA's up-projections (q, k, v) and the SwiGLU activations are "
                             "not kept per block"
                           : "a block keeps only its input (the residual stream)",
                       format_bytes(4.0 * est.recomputed_elements));
  const auto plans = all_levels(deck_basis);
  const bool known = limit.bytes > 0;
  const std::string expert_holders =
      ep > 1 ? fmt::format(", ep {}: experts sharded over their D = {} holder(s)", ep, holders) : "";
  out += fmt::format("\n# memory per rank by sharding level (deck: shard): {}, {} rank(s){}\n", deck_basis.precision,
                     fmt::format("{}{}", W, pipe.stages > 1 ? " (per stage)" : ""), expert_holders);
  out += header("level", known ? "  fits" : "");
  for (const auto& p : plans)
    out += row(std::string(mode_name(p.level)), p,
               (known ? (p.total() <= limit.bytes ? "  yes" : "  no") : std::string()) +
                   (p.level == deck_basis.deck_level ? "  <- the deck's" : ""));
  const PlanBasis& b = deck_basis;
  if (ep == 1)
    out += fmt::format("  assumed: P = {} parameters, each rank owning S = ceil(P/{}) = {}; largest layer {} ({}); "
                       "bucket {}\n", format_count(double(b.params)), W, format_count(double(b.shard)),
                       b.largest_name, format_count(double(b.largest_layer)), format_bytes(b.bucket_bytes));
  else
    out += fmt::format("  assumed: P = {} parameters held, R = {} replicated and X = {} of experts, each rank owning "
                       "S = ceil(R/{}) + ceil(X/{}) = {}; largest layer {} ({}; a MoE layer counts its held experts); "
                       "bucket {}\n",
                       format_count(double(b.params)), format_count(double(b.params - b.experts)),
                       format_count(double(b.experts)), W, holders, format_count(double(b.shard)), b.largest_name,
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
  if (W > 1)
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
    const auto busiest = stage_estimate(c, pipe, deck_basis.stage, worst);
    const double more = activation_bytes(busiest, b.precision) + 4.0 * busiest.exchange_elements -
                        (b.activations + b.exchange);
    const int64_t even = int64_t(batch) * c.model.seq * moe.topk;
    out += fmt::format("  ep: the rows this rank's experts run, planned at {}x an even load: {} per MoE layer (even: "
                       "{} tokens x top-{} = {}), each kept (input, gate/up, SwiGLU output) beside the rows sent; a "
                       "busier step grows them for the rest of the run, and the worst load ({:.3g}x even: every token "
                       "of the group on this rank's experts) adds {}\n",
                       kExpertLoadPlanned, b.expert_rows, int64_t(batch) * c.model.seq, moe.topk, even, worst,
                       format_bytes(more));
    out += fmt::format("  ep: communication holds the all-to-all's fp32 scratch, shared by the layers (outputs going "
                       "home, output gradients arriving: 2 x {} rows x {}): {} at every level\n",
                       b.expert_rows, c.model.dim, format_bytes(b.exchange));
    if (holders == 1)
      out += "  D = 1: each expert has one holder, so no level shards its state; only the replicated tensors' is\n";
  }
  out += "  not counted: memory of MPI, Kokkos and the GEMM library, the data loader's queue, checkpoint copies\n";
  if (W == 1) out += "  one rank: nothing to shard; levels that shard gradients or weights only add their buffers\n";

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

namespace {

[[noreturn]] void bad_plan(const std::string& text, const std::string& what) {
  input_error("command line: bad -plan '{}': {} (expected -plan \"KEY=V1,V2 ...\" with keys P, ep, shard, recompute, "
              "micro, schedule, e.g. -plan \"P=1,2,4 ep=1,8 shard=optimizer,params recompute=off,selective micro=8\")",
              text, what);
}

std::vector<std::string> split(const std::string& text, char by) {
  std::vector<std::string> parts;
  size_t begin = 0;
  for (size_t at; (at = text.find(by, begin)) != std::string::npos; begin = at + 1)
    parts.push_back(text.substr(begin, at - begin));
  parts.push_back(text.substr(begin));
  return parts;
}

template <class E>
std::vector<E> plan_modes(const std::string& text, const std::string& key, const std::vector<std::string>& values) {
  std::vector<E> out;
  for (const auto& v : values) {
    const auto e = mode_from_name<E>(v);
    if (!e) {
      std::string words;
      for (const auto& w : mode_word_list<E>()) words += (words.empty() ? "" : ", ") + w;
      bad_plan(text, fmt::format("{}={} is not one of {}", key, v, words));
    }
    out.push_back(*e);
  }
  return out;
}

std::vector<int> plan_counts(const std::string& text, const std::string& key, const std::vector<std::string>& values) {
  std::vector<int> out;
  for (const auto& v : values) {
    char* end = nullptr;
    const long n = std::strtol(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || n < 1 || n > 1000000)
      bad_plan(text, fmt::format("{}={} is not an integer >= 1", key, v));
    out.push_back(int(n));
  }
  return out;
}

}  // namespace

PlanGrid parse_plan_grid(const std::string& text) {
  PlanGrid grid;
  std::vector<std::string> seen;
  for (const auto& item : split(text, ' ')) {
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string::npos) bad_plan(text, fmt::format("'{}' has no '='", item));
    const std::string key = item.substr(0, eq);
    const auto values = split(item.substr(eq + 1), ',');
    for (const auto& v : values)
      if (v.empty()) bad_plan(text, fmt::format("{} has an empty value", key));
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) bad_plan(text, fmt::format("{} given twice", key));
    seen.push_back(key);
    if (key == "P") grid.stages = plan_counts(text, key, values);
    else if (key == "ep") grid.ep = plan_counts(text, key, values);
    else if (key == "micro") grid.micro = plan_counts(text, key, values);
    else if (key == "shard") grid.shard = plan_modes<ShardLevel>(text, key, values);
    else if (key == "recompute") grid.recompute = plan_modes<Recompute>(text, key, values);
    else if (key == "schedule") grid.schedule = plan_modes<PipelineSchedule>(text, key, values);
    else bad_plan(text, fmt::format("unknown key '{}'{}", key,
                                    did_you_mean(key, {"P", "ep", "shard", "recompute", "micro", "schedule"})));
  }
  if (seen.empty()) bad_plan(text, "no KEY=VALUES");
  return grid;
}

// Chunks per stage a plan row takes: 1, or for a chunked schedule the
// deck's V where it has one, else 2.
static int chunks_planned(PipelineSchedule schedule, const PipelinePlan& deck) {
  const bool chunked = schedule == PipelineSchedule::interleaved || schedule == PipelineSchedule::dualpipev;
  return !chunked ? 1 : deck.virtual_stages > 1 ? deck.virtual_stages : 2;
}

std::vector<PlanRow> plan_rows(const Program& program, int ranks, const PlanGrid& grid) {
  const Config& c = program.phases.front().config;
  const ModelConfig& m = c.model;
  const bool moe = m.moe.enabled();
  auto or_deck = [](auto values, auto deck) { return values.empty() ? decltype(values){deck} : values; };
  const PipelinePlan deck = deck_pipeline(c);
  const auto stages = or_deck(grid.stages, deck.stages), eps = or_deck(grid.ep, moe ? m.moe.ep : 1),
             micros = or_deck(grid.micro, deck.micro);
  const auto shards = or_deck(grid.shard, c.shard.level);
  const auto recomputes = or_deck(grid.recompute, m.recompute);
  const auto schedules = or_deck(grid.schedule, deck.schedule);
  std::vector<PlanRow> rows;
  for (int P : stages)
    for (int ep : eps)
      for (ShardLevel shard : shards)
        for (Recompute recompute : recomputes)
          for (size_t mi = 0; mi < micros.size(); ++mi)
            for (size_t si = 0; si < schedules.size(); ++si) {
              // At P = 1 there is no pipeline: one row, M taken as 1.
              if (P == 1 && (mi > 0 || si > 0)) continue;
              PlanRow row;
              row.stages = P, row.ep = ep, row.micro = P == 1 ? 1 : micros[mi];
              row.shard = shard, row.recompute = recompute, row.schedule = schedules[si];
              const int dp = ranks / P;
              const int V = chunks_planned(row.schedule, deck);
              if (P * V > m.layers)
                row.invalid = V > 1 ? fmt::format("P {} x V {} > {} layers: a chunk needs a layer", P, V, m.layers)
                                    : fmt::format("P {} > {} layers: a stage needs a layer", P, m.layers);
              else if (ranks % P) row.invalid = fmt::format("P {} does not divide the {} ranks", P, ranks);
              else if (!moe && ep > 1) row.invalid = fmt::format("ep {} without moe", ep);
              else if (moe && m.moe.routed % ep)
                row.invalid = fmt::format("ep {} does not divide routed {}", ep, m.moe.routed);
              else if (dp % ep)
                row.invalid = fmt::format("ep {} does not divide the W/P = {} data-parallel ranks of a stage", ep, dp);
              else if (P > 1 && row.schedule == PipelineSchedule::dualpipev && row.micro < 2 * P)
                row.invalid = fmt::format("micro {} < 2 P: dualpipev fills both arms of its V", row.micro);
              else if (P > 1 && row.schedule == PipelineSchedule::interleaved && row.micro % P)
                row.invalid = fmt::format("micro {} is not a multiple of P {} (interleaved)", row.micro, P);
              else if (c.data.batch % row.micro)
                row.invalid = fmt::format("micro {} does not divide batch {} (sequences per pipeline per step)",
                                          row.micro, c.data.batch);
              if (!row.invalid.empty()) {
                rows.push_back(row);
                continue;
              }
              Program variant = program;
              for (Phase& phase : variant.phases) {
                if (moe) phase.config.model.moe.ep = ep;
                phase.config.model.recompute = recompute;
                phase.config.shard.level = shard;
              }
              const PipelinePlan pipe{P, row.schedule, row.micro,
                                      P == deck.stages && V == deck.virtual_stages ? deck.cut : std::vector<int>{}, V};
              for (int s = 0; s < P; ++s) {
                const MemoryPlan plan = plan_level(plan_basis(variant, ranks, pipe, s), shard);
                if (s == 0 || plan.total() > row.plan.total()) row.plan = plan, row.worst_stage = s;
              }
              rows.push_back(row);
            }
  return rows;
}

const PlanRow* smallest_fitting_row(const std::vector<PlanRow>& rows, double limit) {
  const PlanRow* best = nullptr;
  auto key = [](const PlanRow& r) {
    return std::make_tuple(r.stages, int(r.recompute), int(r.shard), r.ep, r.micro, r.plan.total());
  };
  for (const auto& r : rows)
    if (r.invalid.empty() && r.plan.total() <= limit && (!best || key(r) < key(*best))) best = &r;
  return best;
}

std::string plan_grid_report(const Program& program, int ranks, const PlanGrid& grid, const MemoryLimit& limit) {
  const Config& c = program.phases.front().config;
  const auto rows = plan_rows(program, ranks, grid);
  const bool known = limit.bytes > 0;
  std::string out = fmt::format("\n# -plan: memory per rank for each combination, {} rank(s), {}, batch {} sequence(s) "
                                "of {} per pipeline per step; each row its worst stage's rank\n",
                                ranks, c.precision.kind, c.data.batch, c.model.seq);
  auto row_text = [&](const PlanRow& r, const std::string& stage, const MemoryPlan& p, const std::string& tail) {
    return fmt::format("  {:>3} {:>4} {:<9} {:<9} {:>5} {:<11} {:>6} {:>11} {:>11} {:>11} {:>12} {:>13} {:>11}{}\n",
                       r.stages, r.ep, mode_name(r.shard), mode_name(r.recompute),
                       r.stages == 1 ? std::string("-") : std::to_string(r.micro),
                       r.stages == 1 ? std::string("-") : std::string(mode_name(r.schedule)), stage,
                       format_bytes(p.weights), format_bytes(p.gradients), format_bytes(p.optimizer),
                       format_bytes(p.activations), format_bytes(p.communication), format_bytes(p.total()), tail);
  };
  const std::string header = fmt::format(
      "  {:>3} {:>4} {:<9} {:<9} {:>5} {:<11} {:>6} {:>11} {:>11} {:>11} {:>12} {:>13} {:>11}{}\n", "P", "ep", "shard",
      "recompute", "micro", "sched", "stage", "weights", "gradients", "optimizer", "activations", "communication",
      "total", known ? "  fits" : "");
  out += header;
  for (const auto& r : rows) {
    if (!r.invalid.empty()) {
      out += fmt::format("  {:>3} {:>4} {:<9} {:<9} {:>5} {:<11}  invalid: {}\n", r.stages, r.ep, mode_name(r.shard),
                         mode_name(r.recompute), r.stages == 1 ? std::string("-") : std::to_string(r.micro),
                         r.stages == 1 ? std::string("-") : std::string(mode_name(r.schedule)), r.invalid);
      continue;
    }
    out += row_text(r, fmt::format("{}/{}", r.worst_stage, r.stages), r.plan,
                    known ? (r.plan.total() <= limit.bytes ? "  yes" : "  no") : "");
  }
  out += "  P: pipeline stages, each of W/P data-parallel ranks (ZeRO shards over those, ep groups lie within them);\n"
         "  micro: M micro-batches of batch/M sequences, stage s keeping min(P-s, M) in flight under 1f1b, M under "
         "gpipe, what its table holds under interleaved and dualpipev (2 chunks per stage);\n"
         "  stage: the worst stage s/P; the layers cut into P (x V) runs, the first L mod P one layer longer; the "
         "embedding's stage adds it, the head's the final norm, the head, the MTP modules and, where that is not the "
         "embedding's, the embedding's copy they read\n";
  const PlanRow* smallest = known ? smallest_fitting_row(rows, limit.bytes) : nullptr;
  // The stages of the combination named: the smallest that fits, else the valid one needing the least.
  const PlanRow* shown = smallest;
  if (!shown)
    for (const auto& r : rows)
      if (r.invalid.empty() && (!shown || r.plan.total() < shown->plan.total())) shown = &r;
  if (!known) out += fmt::format("\n# -plan verdict: no memory limit known ({}); pass -device-gb G\n", limit.source);
  else if (smallest)
    out += fmt::format("\n# -plan verdict: limit {} per rank ({})\n  smallest that fits (the fewest stages, then the "
                       "least recompute, sharding, ep, micro-batches, bytes): P {} ep {} shard {} recompute {}{}: {}\n",
                       format_bytes(limit.bytes), limit.source, smallest->stages, smallest->ep, smallest->shard,
                       smallest->recompute,
                       smallest->stages > 1 ? fmt::format(" micro {} {}", smallest->micro, smallest->schedule) : "",
                       format_bytes(smallest->plan.total()));
  else
    out += fmt::format("\n# -plan verdict: limit {} per rank ({})\n  no combination fits{}\n", format_bytes(limit.bytes),
                       limit.source,
                       shown ? fmt::format(": the least needs {} ({} over)", format_bytes(shown->plan.total()),
                                           format_bytes(shown->plan.total() - limit.bytes))
                             : "");
  if (!shown || shown->stages == 1) return out;
  // Every stage of it, so the cut can be read.
  Program variant = program;
  for (Phase& phase : variant.phases) {
    if (c.model.moe.enabled()) phase.config.model.moe.ep = shown->ep;
    phase.config.model.recompute = shown->recompute;
    phase.config.shard.level = shown->shard;
  }
  const int V = chunks_planned(shown->schedule, deck_pipeline(c));
  const PipelinePlan pipe{shown->stages, shown->schedule, shown->micro,
                          shown->stages == c.pipeline.stages && V == c.pipeline.virtual_stages ? c.pipeline.cut
                                                                                                : std::vector<int>{},
                          V};
  out += fmt::format("\n# its stages: P {} ep {} shard {} recompute {} micro {} {}\n", shown->stages, shown->ep,
                     shown->shard, shown->recompute, shown->micro, shown->schedule);
  out += fmt::format("  {:>5} {:>9} {:>9} {:>11} {:>11} {:>11} {:>11} {:>12} {:>13} {:>11}\n", "stage", "layers",
                     "in flight", "params", "weights", "gradients", "optimizer", "activations", "communication", "total");
  for (int s = 0; s < shown->stages; ++s) {
    const PlanBasis b = plan_basis(variant, ranks, pipe, s);
    const MemoryPlan p = plan_level(b, shown->shard);
    out += fmt::format("  {:>5} {:>9} {:>9} {:>11} {:>11} {:>11} {:>11} {:>12} {:>13} {:>11}{}\n", s,
                       b.layers_text(), pipe.in_flight(s),
                       format_count(double(b.params)), format_bytes(p.weights), format_bytes(p.gradients),
                       format_bytes(p.optimizer), format_bytes(p.activations), format_bytes(p.communication),
                       format_bytes(p.total()),
                       fmt::format("{}{}", b.runs.front().first ? "  + embedding" : "",
                                   !b.runs.back().last ? ""
                                   : fmt::format("  + norm, head{}{}",
                                                 c.model.mtp.depth ? fmt::format(", {} MTP", c.model.mtp.depth) : "",
                                                 b.embed_copy ? ", embedding copy" : "")));
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

// What a model would cost before anything is allocated: parameter counts and
// the memory one rank needs, per precision and per sharding level (for
// `xuanxue -dry-run`, and for refusing a deck that cannot fit).
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>
#include "core/modes.h"
#include "deck/config.h"
#include "deck/deck.h"

namespace xx {

struct MemoryEstimate {
  int64_t params = 0, active = 0;  // the whole model; used per token (no embedding table, only topk routed experts)
  // For one rank's batch, in elements: activations kept for the backward in
  // 16 bits under mixed precision (model/store.h KeptActivation), the other
  // kept ones (always 32 bits), the scratch shared by all blocks, and the
  // extra 32-bit scratch mixed precision writes KeptActivations through.
  int64_t halvable_elements = 0, other_elements = 0, scratch_elements = 0, mixed_scratch_elements = 0;
  // ep: the rows this rank's experts run per MoE layer, and the fp32 scratch
  // the all-to-all moves them through (outputs going home, output gradients
  // arriving; shared by the layers).
  int64_t expert_rows = 0, exchange_elements = 0;
  // recompute selective/full: the one set of a block's recomputed activations
  // all blocks share (of halvable/other above: selective's is 16-bit, full's a
  // whole block's set).
  int64_t recomputed_elements = 0;
  int64_t activation_elements() const { return halvable_elements + other_elements + scratch_elements; }
};

// Under expert parallelism (moe ... ep N) the rank that holds an expert runs
// the rows every rank of its group sends it: N_tok K rows per MoE layer on
// average over its E/N experts (N_tok tokens per rank, top-K), more on a step
// whose tokens favour its experts, and its buffers keep the largest size they
// reached. `expert_load` is those rows over the even load: 1 is what the
// model allocates at first; the plan takes kExpertLoadPlanned, headroom for a
// balanced router's spread (the aux loss or the bias keeps loads near even;
// metrics.jsonl's expert_tokens shows them). The worst case, every token of
// the group picking this rank's experts, is N min(K, E/N) / K.
inline constexpr double kExpertLoadPlanned = 1.25;
MemoryEstimate estimate_memory(const ModelConfig& m, int batch, double expert_load = 1.0);

// Recompute (m.recompute, core/modes.h) changes what each block keeps:
//   off:       every block keeps its activations (the counts above);
//   selective: a block no longer keeps its RMSNorm outputs (xn, xn2; MLA's
//              cn, qan), its MLA up-projections (q, k, v) and its SwiGLU
//              activation (dense FFN, shared experts, routed rows; MHA's q,
//              k, v stay kept): one set of those is shared by all blocks, its
//              norms' and attention's part and one feed-forward part per kind
//              (dense, MoE), as the model's Workspace shares them;
//   full:      a block keeps only its input (the residual stream, kept
//              anyway: L+1 streams of N x C) and its router's indices and
//              gradients; one set of a block's activations (the same parts)
//              serves its recompute.
//
// Pipeline stages (PipelinePlan): each run of a stage's layers [begin, end)
// (its chunks: one, or V with virtual stages; stage_layers), whether it is
// the first chunk (the embedding) or the last (final norm, head, MTP), and
// the micro-batches it keeps in flight; batch is then the micro-batch. What
// a block keeps counts once per micro-batch in flight in its run; the
// recomputed set and the scratch once for the stage, or once per run where
// its runs overlap (scratch_per_run: dualpipev under ep, train/pass_pair.h).
struct StageSpan {
  int begin = 0, end = 0;
  bool first = true, last = true;
  int in_flight = 1;
};
MemoryEstimate estimate_stage(const ModelConfig& m, int batch, const std::vector<StageSpan>& runs,
                              double expert_load = 1.0, bool scratch_per_run = false);
// K contiguous runs of layers [begin, end), one per chunk (P x V): the deck's
// `cut` (each chunk's blocks) where given, else L = qK + r, the first r
// taking q + 1 layers and the rest q (61 over 16: 13 stages of 4, then 3 of
// 3; the deck needs that cut written out where K does not divide L).
std::vector<std::pair<int, int>> stage_layers(int layers, int stages, const std::vector<int>& cut = {});

// Pipeline parallelism, planned (training with P > 1 is built elsewhere): W
// ranks form P stages of W / P data-parallel ranks each (ZeRO shards over
// those W / P; ep groups lie within them). B, the deck's `data batch`, is the
// sequences one pipeline (one data-parallel replica) trains per step, split
// into M micro-batches of B / M. Each run of a stage keeps in flight what
// its schedule's table holds between a micro-batch's forward and backward
// (core/pipeline_schedule.h, the trainer's own tables): min(P - s, M) under
// 1F1B, M under GPipe. At P = 1 there is no pipeline: the rank runs its
// whole batch at once (M is taken as 1).
// The deck's `pipeline stages P [schedule S] [virtual V] [micro M]` is what
// -dry-run plans (plan_basis(program, ranks): its worst stage) and -plan's
// default.
struct PipelinePlan {
  int stages = 1;  // P
  PipelineSchedule schedule = PipelineSchedule::one_f_one_b;
  int micro = 1;   // M
  std::vector<int> cut = {};  // each chunk's blocks (the deck's pipeline ... cut), or empty
  int virtual_stages = 1;     // V: chunks per stage (interleaved, dualpipev)
  // Stage s's runs of layers over a model of `layers` blocks, in model order.
  std::vector<StageSpan> runs(int layers, int stage) const;
  int in_flight(int stage) const;  // micro-batches kept in flight, over its runs
  int chunks() const { return stages * virtual_stages; }
  // dualpipev under ep: a stage's F&B pairs run interleaved, each run with its own scratch
  bool overlapped(const ModelConfig& m) const {
    return schedule == PipelineSchedule::dualpipev && m.moe.enabled() && m.moe.ep > 1;
  }
};
// The deck's pipeline (P = 1: none).
PipelinePlan deck_pipeline(const Config& c);

// Sharding over the data-parallel ranks (ZeRO 1/2/3; deck: shard, built in
// comm/sync_sharded.cpp), planned here so that a deck that cannot fit is
// refused with the level that would.
//   optimizer: each rank owns 1/W of AdamW's moments, and all-gathers the
//              updated weights;
//   gradients: also 1/W of the gradients, reduced into their owners;
//   params:    also 1/W of the weights, gathered unit by unit.
// Under ep the routed experts are held by D = W/N ranks each, so what is
// sharded of them is shared by those D: 1/D where replicated tensors have 1/W.
inline constexpr std::array<ShardLevel, 4> kShardLevels{ShardLevel::off, ShardLevel::optimizer, ShardLevel::gradients, ShardLevel::params};

// What every level is built from, for one rank of `ranks`.
struct PlanBasis {
  int ranks = 1;                // W
  int ep = 1;                   // N: ranks of an expert-parallel group; D = W / N hold each expert
  Precision precision = Precision::fp32;
  int64_t model_params = 0;     // the whole model
  int64_t params = 0;           // P: what this rank holds (under ep: the replicated tensors and its experts)
  int64_t experts = 0;          // X: of P, this rank's routed experts (E/N of each MoE layer's; 0 without ep)
  int64_t shard = 0;            // ceil((P - X) / W) + ceil(X / D): what an owner keeps of a sharded buffer
  int64_t largest_layer = 0;    // parameters of the largest layer (the unit params gathers at once)
  std::string largest_name;     // its name: embed, layers.K, norm + head (tied: norm), mtp.D
  int copy_bytes = 0;           // per weight, the GEMMs' 16-bit copy: 0 under fp32 (they read the master)
  int moment_bytes = 8;         // o: AdamW's two moments per owned weight, 8 (fp32) or 4 (optimizer ... moments bf16)
  double bucket_bytes = 0;      // sync's bucket_mb, at most the whole gradient
  double activations = 0;       // bytes; the same at every level (the batch per rank does not change)
  double exchange = 0;          // bytes: ep's all-to-all scratch, whole at every level
  int64_t expert_rows = 0;      // ep: the rows planned per MoE layer for this rank's experts (kExpertLoadPlanned)
  double sync_buffers = 0;      // bytes the phase's sync strategy keeps beside the model, whole at every level
  std::string sync_what;        // what those are ("" when none)
  std::string phase;            // the phase planned ("DECK:LINE" of its run)
  int held_units = 2;           // params: units gathered at once (2; 4 with MTP: the embedding and head held; 3 tied)
  ShardLevel deck_level = ShardLevel::off;  // the deck's shard level
  int64_t fp32_read = 0;        // M: weights the model reads in fp32 (embedding, norms, router gates)
  // Pipeline stages: this basis is stage `stage` of pipe.stages, its runs of
  // layers `runs` (one chunk, or V); ranks above is then the stage's W / P
  // data-parallel ranks, params its tensors (and embed_copy: the embedding the
  // last stage keeps for MTP or a tied head), activations its micro-batches in
  // flight, and pipe_buffers the fp32 activation and gradient of one
  // micro-batch per neighbouring stage (communication, at every level).
  PipelinePlan pipe;
  int stage = 0;
  std::vector<StageSpan> runs;
  std::string layers_text() const;  // "0-3", or the runs' "0, 7" with virtual stages
  int64_t embed_copy = 0;
  double pipe_buffers = 0;
};

// Bytes one rank holds at one level.
struct MemoryPlan {
  ShardLevel level = ShardLevel::off;
  double weights = 0, gradients = 0, optimizer = 0, activations = 0, communication = 0;
  double total() const { return weights + gradients + optimizer + activations + communication; }
};

// The basis for a program: model, data and precision are per job; of the
// phases, the one whose sync strategy keeps the most beside the model.
// Throws InputError, naming the moe line, when ep does not divide `ranks`.
PlanBasis plan_basis(const Program& program, int ranks);  // the deck's pipeline, its worst stage
// Stage `stage` of `pipe` over `ranks` = W.
PlanBasis plan_basis(const Program& program, int ranks, const PipelinePlan& pipe, int stage);
MemoryPlan plan_level(const PlanBasis& basis, ShardLevel level);
// Whether a level keeps the fp32 master as this rank's pieces below params
// (16-bit precision at W > 1: the GEMMs read the whole 16-bit copy instead).
bool pieces_of_master(const PlanBasis& basis, ShardLevel level);

// A limit per rank to hold plans against; bytes <= 0: none known.
struct MemoryLimit {
  double bytes = 0;
  std::string source;  // e.g. "-device-gb 80", "MemAvailable 120.3 GiB / 4 ranks on this node"
};

// What `-dry-run` prints: counts; bytes per rank at level off in fp32, bf16
// and fp16; every level in the deck's precision; the verdict against limit.
std::string dry_run_report(const Program& program, int ranks, const MemoryLimit& limit);
// The grid -dry-run -plan prints (app.cpp): one row per combination of
// pipeline stages P, expert-parallel ep, shard level, recompute mode,
// micro-batches M and schedule, each the worst stage's bytes per rank. Its
// text is space-separated KEY=V1,V2,... with keys P, ep, shard, recompute,
// micro, schedule; a key left out takes the deck's value (its pipeline line:
// P 1 without one), e.g. "P=1,2,4 ep=1,8 shard=optimizer,params recompute=off,selective micro=8".
struct PlanGrid {
  std::vector<int> stages, ep, micro;
  std::vector<ShardLevel> shard;
  std::vector<Recompute> recompute;
  std::vector<PipelineSchedule> schedule;
};
// Throws InputError naming -plan and what was expected.
PlanGrid parse_plan_grid(const std::string& text);

// One combination of the grid: valid with its worst stage's plan, or why not.
struct PlanRow {
  int stages = 1, ep = 1, micro = 1;
  ShardLevel shard = ShardLevel::off;
  Recompute recompute = Recompute::off;
  PipelineSchedule schedule = PipelineSchedule::one_f_one_b;
  std::string invalid;    // why the combination cannot run ("" when it can)
  int worst_stage = 0;    // the stage whose rank needs the most
  MemoryPlan plan;        // that rank's bytes at `shard`
};
std::vector<PlanRow> plan_rows(const Program& program, int ranks, const PlanGrid& grid);
// The smallest combination that fits limit (nullptr: none): the fewest
// pipeline stages, then the least recompute (off, selective, full), then the
// least sharding (off, optimizer, gradients, params), then the smallest ep,
// then the fewest micro-batches, then the smallest total. Each step of that
// order trades memory for time: a pipeline's bubble, the forward run again,
// more communication, a wider all-to-all, smaller GEMMs.
const PlanRow* smallest_fitting_row(const std::vector<PlanRow>& rows, double limit);
std::string plan_grid_report(const Program& program, int ranks, const PlanGrid& grid, const MemoryLimit& limit);

// "" when the deck's shard level fits in limit, else the one message a run
// stops with (naming the least sharded level that would fit).
std::string memory_refusal(const Program& program, int ranks, const MemoryLimit& limit);

}  // namespace xx

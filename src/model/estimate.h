// What a model would cost before anything is allocated: parameter counts and
// the memory one rank needs, per precision and per sharding level (for
// `xuanxue -dry-run`, and for refusing a deck that cannot fit).
#pragma once
#include <array>
#include <cstdint>
#include <string>
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
PlanBasis plan_basis(const Program& program, int ranks);
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
// "" when the deck's shard level fits in limit, else the one message a run
// stops with (naming the least sharded level that would fit).
std::string memory_refusal(const Program& program, int ranks, const MemoryLimit& limit);

}  // namespace xx

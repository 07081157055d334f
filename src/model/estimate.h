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
  int64_t params = 0, active = 0;  // total; used per token (no embedding table, only topk routed experts)
  // For one rank's batch, in elements: activations kept for the backward in
  // 16 bits under mixed precision (model/store.h KeptActivation), the other
  // kept ones (always 32 bits), the scratch shared by all blocks, and the
  // extra 32-bit scratch mixed precision writes KeptActivations through.
  int64_t halvable_elements = 0, other_elements = 0, scratch_elements = 0, mixed_scratch_elements = 0;
  int64_t activation_elements() const { return halvable_elements + other_elements + scratch_elements; }
};

MemoryEstimate estimate_memory(const ModelConfig& m, int batch);

// Sharding over the data-parallel ranks (ZeRO 1/2/3; deck: shard, built in
// comm/sync_sharded.cpp), planned here so that a deck that cannot fit is
// refused with the level that would.
//   optimizer: each rank owns 1/W of AdamW's moments (and of the fp32 master
//              under bf16/fp16), and all-gathers the updated weights;
//   gradients: also 1/W of the gradients, reduce-scattered into their owners;
//   params:    also 1/W of the weights, gathered unit by unit.
enum class Shard { off, optimizer, gradients, params };
inline constexpr std::array<Shard, 4> kShardLevels{Shard::off, Shard::optimizer, Shard::gradients, Shard::params};
const char* shard_name(Shard level);

// What every level is built from, for one rank of `ranks`.
struct PlanBasis {
  int ranks = 1;
  std::string precision;        // fp32 | bf16 | fp16
  int64_t params = 0;           // P
  int64_t shard = 0;            // ceil(P / ranks): what an owner keeps of a sharded buffer
  int64_t largest_layer = 0;    // parameters of the largest layer (the unit params gathers at once)
  std::string largest_name;     // its name: embed, layers.K, norm + head, mtp.D
  int copy_bytes = 0;           // per weight, the GEMMs' 16-bit copy: 0 under fp32 (they read the master)
  double bucket_bytes = 0;      // sync's bucket_mb, at most the whole gradient
  double activations = 0;       // bytes; the same at every level (the batch per rank does not change)
  double sync_buffers = 0;      // bytes the phase's sync strategy keeps beside the model, whole at every level
  std::string sync_what;        // what those are ("" when none)
  std::string phase;            // the phase planned ("DECK:LINE" of its run)
  int held_units = 2;           // params: units gathered at once (2; 4 with MTP: the embedding and head held)
  std::string deck_level = "off";  // the deck's shard level
};

// Bytes one rank holds at one level.
struct MemoryPlan {
  Shard level = Shard::off;
  double weights = 0, gradients = 0, optimizer = 0, activations = 0, communication = 0;
  double total() const { return weights + gradients + optimizer + activations + communication; }
};

// The basis for a program: model, data and precision are per job; of the
// phases, the one whose sync strategy keeps the most beside the model.
PlanBasis plan_basis(const Program& program, int ranks);
MemoryPlan plan_level(const PlanBasis& basis, Shard level);

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

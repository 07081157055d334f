// What a model would cost before anything is allocated: parameter counts and
// the memory one rank needs, per precision (for `xuanxue -dry-run`).
#pragma once
#include <cstdint>
#include <string>
#include "deck/config.h"

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

// The table `-dry-run` prints: counts, and bytes per rank for weights,
// gradients, optimizer state and activations in fp32, bf16 and fp16.
std::string dry_run_report(const ModelConfig& m, int batch, int world);

}  // namespace xx

// What a model would cost before anything is allocated: parameter counts and
// the memory one rank needs, per precision (for `xuanxue -dry-run`).
#pragma once
#include <cstdint>
#include <string>
#include "deck/config.h"

namespace xx {

struct MemoryEstimate {
  int64_t params = 0, active = 0;  // total; used per token (no embedding table, only topk routed experts)
  int64_t activation_elements = 0;  // kept for backward plus scratch, for one rank's batch
};

MemoryEstimate estimate_memory(const ModelConfig& m, int batch);

// The table `-dry-run` prints: counts, and bytes per rank for weights,
// gradients, optimizer state and activations in fp32, bf16 and fp16.
std::string dry_run_report(const ModelConfig& m, int batch, int world);

}  // namespace xx

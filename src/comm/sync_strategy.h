// How the ranks combine their work (deck: sync, topology, compress): one
// interface, one implementation per mode, chosen per phase from a registry
// that says at start-up what runs and why the others were passed over, as
// Communicator does for transports.
//
//   compressed-update    compress topk ... target update   each rank steps its own AdamW; the
//                                                         group averages the compressed changes
//   compressed-gradient  compress topk                     top-k gradient exchange after the backward
//   local                sync local K [outer ...]          no gradient traffic; parameters averaged
//                                                         (or an outer step) every K steps
//   gossip               topology ring                     gradients averaged with the two neighbours
//   sharded              shard optimizer|gradients|params  ZeRO 1/2/3: each rank updates its pieces of the
//                                                         buffer; the weights all-gathered after the update,
//                                                         or (params) unit by unit as the model asks
//   dense                sync dense | accumulate K         bucketed all-reduce overlapped with the backward
//
// A step, as the trainer drives it:
//   1. begin_step(step)          before the first forward (topologies redraw here);
//      zero_gradients()          the backward accumulates into zeros
//   2. micro_batches()           forward and backward passes this step
//   3. gradients_ready(offset)   from the last backward: gradients in [offset, end) are final here
//   4. reduce_gradients(step)    after the backward: the gradients become what the optimizer applies,
//      reduced_gradients()       and this is where they are (the whole buffer, or this rank's shard)
//   5. before_update, the optimizer, after_update(step)
//   6. after_step(step)          the step counter has moved (local: average every K)
//   7. end_phase(step)           at a phase's last step: every rank leaves with the same state
// A strategy owns its state (anchors, outer momentum, residuals), names it
// for checkpoints (register_state), and alone answers whether the ranks now
// hold the same bits (agreement).
#pragma once
#include <mpi.h>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>
#include "comm/compressed_sync.h"
#include "comm/bucket_reducer.h"
#include "comm/ops.h"
#include "comm/topology.h"
#include "core/ownership.h"
#include "core/weight_gate.h"
#include "deck/config.h"
#include "core/state.h"
#include "core/views.h"
#include "deck/deck.h"
#include "kernels/moments.h"
#include "kernels/precision.h"

namespace xx {

// What a strategy works on: flat buffers laid out like the parameters.
struct SyncBuffers {
  MPI_Comm world = MPI_COMM_WORLD;
  Buffer<float> params, grads;
  std::vector<kernels::Moments> optimizer_state;  // AdamW's moments (fp32 or bf16): averaged in fp32 where a phase let them differ
  Communicator* ops = nullptr;
  uint64_t seed = 0;  // draws the clusters
  // Builds the top-k compressor over `target` (it knows the tensor list).
  std::function<std::unique_ptr<CompressedSync>(Buffer<float> target, const CompressConfig&, double bucket_mb)>
      make_compressor;
  // The pieces of the buffers this rank owns (deck: shard; the optimizer's
  // moments are the shard's): the whole buffer unless sharded.
  Ownership owned;
  // shard params: the model's weight units [begin, end), in buffer order
  // (the gate's unit numbers; the ownership's buckets lie inside them).
  std::vector<std::pair<int64_t, int64_t>> units;
  // moe ... ep N: this rank's routed-expert runs and the ranks holding the
  // same experts (sync dense averages them over those alone).
  ExpertRuns experts;
  // The gradient buffer is huge_page_memory's (core/host_memory.h): shard
  // gradients hands it back in huge pages.
  bool grads_in_huge_pages = false;
  // Mixed precision: the model's 16-bit copy of the weights that the GEMMs
  // read (empty under fp32), and the runs of weights the model reads in fp32
  // (ParamLayout::fp32_read_runs). shard optimizer and gradients then keep the
  // fp32 master only of this rank's pieces and those runs, and gather the
  // 16-bit copy (core/weight_gate.h, HalfWeightSource).
  Buffer<uint16_t> half_params{};
  kernels::Precision half_type = kernels::Precision::fp32;
  std::vector<std::pair<int64_t, int64_t>> fp32_read{};
};

// The phase's settings a strategy reads.
struct SyncSettings {
  SyncConfig sync;
  TopologyConfig topology;
  CompressConfig compress;
  ShardLevel shard = ShardLevel::off;  // the job's shard level
  int64_t phase_start = 0;  // steps before this phase (clusters draw afresh each phase)
  bool operator==(const SyncSettings&) const = default;
};

// The sparse transport a deck asks for: its compress topk setting's (the
// deck allows one), or none when no phase compresses.
inline std::optional<SparseTransport> sparse_transport(const std::vector<Phase>& phases) {
  for (const auto& p : phases)
    if (p.config.compress.kind == CompressKind::topk) return p.config.compress.transport;
  return std::nullopt;
}

inline SyncSettings sync_settings(const Config& c, int64_t phase_start) {
  return {c.sync, c.topology, c.compress, c.shard.level, phase_start};
}

// Do the ranks hold the same bits? Parameters (the health check compares
// their fingerprints) and optimizer state (a checkpoint base then needs no
// averaging).
struct Agreement {
  bool params = false, optimizer = false;
  bool all() const { return params && optimizer; }
};

class SyncStrategy {
 public:
  explicit SyncStrategy(const SyncSettings& settings) : settings_(settings) {}
  virtual ~SyncStrategy() = default;
  virtual std::string describe() const = 0;  // the start-up line
  // Forward and backward passes per step (accumulate K; 1 otherwise).
  int micro_batches() const { return settings_.sync.micro_batches(); }
  // The next phase has the same settings: the strategy goes on, state and all.
  virtual void continue_into(int64_t phase_start) { settings_.phase_start = phase_start; }
  virtual void begin_step(int64_t step) {}
  virtual void zero_gradients() = 0;
  virtual void gradients_ready(int64_t offset) {}
  virtual void reduce_gradients(int64_t step, CommStats& stats) {}
  // Where the averaged gradients are after reduce_gradients: the whole
  // buffer, or from shard gradients up this rank's shard (its pieces back to
  // back; core/placement.h says which).
  virtual Vec<float> reduced_gradients() = 0;
  virtual void before_update() {}
  virtual void after_update(int64_t step, CommStats& stats) {}
  virtual void after_step(int64_t step, CommStats& stats) {}
  virtual void end_phase(int64_t step, CommStats& stats) {}
  // After the step `steps_done` (the counter after it).
  virtual Agreement agreement(int64_t steps_done) const = 0;
  virtual void register_state(StateRegistry& registry) {}
  // RMS distance of the ranks' parameters from their mean at the last
  // averaging of this phase; -1 before any.
  double consensus_distance() const { return consensus_; }
  // shard params: the gate the model asks for each unit's weights; else null.
  virtual WeightGate* weight_gate() { return nullptr; }
  // shard optimizer|gradients under 16-bit precision: what makes the model's
  // whole 16-bit weights from the ranks' pieces; else null.
  virtual HalfWeightSource* half_weight_source() { return nullptr; }
  // The top-k compressor, when this strategy has one (metrics, tests).
  virtual const CompressedSync* compressor() const { return nullptr; }

 protected:
  SyncSettings settings_;
  double consensus_ = -1;
};

// The first strategy in the order above that serves `settings`; `report`
// receives the start-up line: the choice and why each one before it was
// passed over. Collective over buffers.world (topologies split communicators).
std::unique_ptr<SyncStrategy> choose_sync_strategy(const SyncBuffers& buffers, const SyncSettings& settings,
                                                   std::string* report = nullptr);

}  // namespace xx

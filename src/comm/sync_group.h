// Inside the sync strategies (comm/sync_strategy.h): what they share, and
// the factories the registry calls. Not for use outside src/comm/sync_*.cpp.
#pragma once
#include <fmt/format.h>
#include <memory>
#include <string>
#include "comm/sync_strategy.h"

namespace xx::sync_detail {

// A strategy over the phase's topology, with the averaging every mode needs
// at some point: of the parameters within the group or over the world (the
// consensus distance measured before), and of the optimizer state.
class GroupSync : public SyncStrategy {
 public:
  GroupSync(const SyncBuffers& buffers, const SyncSettings& settings);
  void begin_step(int64_t step) override;
  void zero_gradients() override { Kokkos::deep_copy(buffers_.grads, 0.0f); }
  Vec<float> reduced_gradients() override {  // every strategy but sharded keeps them whole
    return Vec<float>(buffers_.grads.data(), buffers_.grads.extent(0));
  }
  // Every phase ends in consensus: a phase that averaged in groups ends with
  // one global average of the parameters and of the optimizer state.
  void end_phase(int64_t step, CommStats& stats) override;

 protected:
  bool full() const { return settings_.topology.kind == TopologyKind::full; }
  // mean_ = the parameters averaged over the group (or the ring
  // neighbourhood), or over the world; sets consensus_.
  void measure_mean(bool global, CommStats& stats);
  // The phase-end consensus: every rank takes the global mean.
  virtual void take_global_mean(CommStats& stats);
  void average_optimizer_state(CommStats& stats);
  // In place: buffer averaged over the world through the dense transport.
  void world_average(Buffer<float>& buffer, CommStats& stats);

  SyncBuffers buffers_;
  Topology topology_;
  int rank_ = 0, world_ = 1;
  Buffer<float> mean_;  // scratch: the averaged parameters
};

// The start-up line's note on accumulation: ", one round per K micro-batches", or nothing.
inline std::string micro_text(const SyncConfig& s) {
  return s.kind == SyncKind::accumulate ? fmt::format(", one round per {} micro-batches", s.every) : "";
}

std::unique_ptr<SyncStrategy> make_dense(const SyncBuffers&, const SyncSettings&);
std::unique_ptr<SyncStrategy> make_gossip(const SyncBuffers&, const SyncSettings&);
std::unique_ptr<SyncStrategy> make_local(const SyncBuffers&, const SyncSettings&);
std::unique_ptr<SyncStrategy> make_compressed_gradient(const SyncBuffers&, const SyncSettings&);
std::unique_ptr<SyncStrategy> make_compressed_update(const SyncBuffers&, const SyncSettings&);
std::unique_ptr<SyncStrategy> make_sharded(const SyncBuffers&, const SyncSettings&);

}  // namespace xx::sync_detail

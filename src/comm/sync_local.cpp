// Local SGD and DiLoCo (sync local K [outer average|sgd|nesterov]): no
// gradient traffic; each rank steps its own AdamW, and every K steps the
// parameters are averaged over the group, or the change since the last sync
// (anchor - mean) is a pseudo-gradient for an outer SGD/Nesterov step.
#include <fmt/format.h>
#include "comm/sync_group.h"
#include "kernels/sync.h"

namespace xx::sync_detail {
namespace {

class LocalSync final : public GroupSync {
 public:
  LocalSync(const SyncBuffers& b, const SyncSettings& s) : GroupSync(b, s) {
    if (!outer()) return;
    // The anchor starts where the phase starts (every phase begins in
    // consensus) and moves only at syncs; the outer momentum starts at zero.
    const int64_t P = b.params.extent(0);
    anchor_ = Buffer<float>("Sync::anchor", P);
    momentum_ = Buffer<float>("Sync::momentum", P);
    Kokkos::deep_copy(anchor_, b.params);
  }
  std::string describe() const override {
    const auto& s = settings_.sync;
    const std::string group = settings_.topology.kind == TopologyKind::full ? "all ranks" : "the topology's groups";
    if (!outer()) return fmt::format("no gradient traffic; parameters averaged over {} every {} steps", group, s.every);
    return fmt::format("no gradient traffic; every {} steps an outer {} step (lr {}, momentum {}) on the change "
                       "averaged over {}", s.every, s.outer, s.outer_lr, s.momentum, group);
  }
  void after_step(int64_t done, CommStats& stats) override {
    if (done % settings_.sync.every == 0) sync_group(stats);
  }
  // A last sync in the group when the phase ends between two, then the
  // global consensus, and the moments every rank's own AdamW moved.
  void end_phase(int64_t done, CommStats& stats) override {
    if (done % settings_.sync.every != 0) sync_group(stats);
    if (!full()) {
      measure_mean(true, stats);
      take_global_mean(stats);
      ExecSpace().fence();
    }
    average_optimizer_state(stats);
  }
  // Right after a sync over everyone the parameters agree; AdamW's moments never do.
  Agreement agreement(int64_t done) const override {
    return {full() && done % settings_.sync.every == 0, false};
  }
  void register_state(StateRegistry& registry) override {
    if (!outer()) return;
    // Checkpoints of 419efe6 taken before the first sync hold the anchor's start as outer.initial.
    StateEntry initial = buffer_entry("outer.initial", StatePlace::rank_buffer, anchor_, false);
    initial.save_floats = nullptr;  // read, never written
    registry.add(std::move(initial));
    registry.add(buffer_entry("outer.anchor", StatePlace::rank_buffer, anchor_, false));
    registry.add(buffer_entry("outer.momentum", StatePlace::rank_buffer, momentum_, false));
  }

 private:
  bool outer() const { return settings_.sync.outer != Outer::average; }
  void sync_group(CommStats& stats) {
    measure_mean(false, stats);
    auto& params = buffers_.params;
    const int64_t P = params.extent(0);
    if (!outer()) {
      Kokkos::deep_copy(params, mean_);
    } else {
      const auto& s = settings_.sync;
      kernels::outer_step(Vec<float>(params.data(), P), Vec<float>(anchor_.data(), P),
                          Vec<float>(momentum_.data(), P), Vec<const float>(mean_.data(), P), float(s.outer_lr),
                          float(s.momentum), s.outer == Outer::nesterov);
    }
    ExecSpace().fence();
  }
  // The phase-end consensus moves the anchor (and the outer momenta, taken
  // per group) to it too: a later sync starts its outer loop from there.
  void take_global_mean(CommStats& stats) override {
    Kokkos::deep_copy(buffers_.params, mean_);
    if (!outer()) return;
    Kokkos::deep_copy(anchor_, mean_);
    world_average(momentum_, stats);
  }
  Buffer<float> anchor_, momentum_;
};

}  // namespace

std::unique_ptr<SyncStrategy> make_local(const SyncBuffers& b, const SyncSettings& s) {
  return std::make_unique<LocalSync>(b, s);
}

}  // namespace xx::sync_detail

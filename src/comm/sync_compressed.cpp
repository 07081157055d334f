// Top-k compressed averaging (compress topk ..., comm/compressed_sync.h):
// of the gradients after the backward (target gradient), or of the change
// each rank's own optimizer step made (target update), over all ranks or the
// clusters of the topology.
#include <fmt/format.h>
#include "comm/sync_group.h"
#include "kernels/elementwise.h"
#include "kernels/sync.h"

namespace xx::sync_detail {
namespace {

// exchange partitioned: what the owners held back of the sums over their
// ranges, saved as one vector of the sparse part in packed order (the ranks'
// ranges tile it; gathered from every rank, so saving is collective, as the
// snapshot is) and re-split on load: a resume at any world size takes it back
// exactly. Optional (a checkpoint of an allgather run has none: nothing was
// held back; one of an older build has a per-rank one, which is not read:
// the owners start from zero, with a console line).
StateEntry owner_residual_entry(CompressedSync* c, MPI_Comm world) {
  StateEntry e{"compress.owner_residual", StatePlace::shared_buffer, c->sparse_size(), false};
  e.save_floats = [c, world] { return c->owner_residual_whole(world); };
  e.load_floats = [c](const std::vector<float>& v) {
    if (!c->load_owner_residual_whole(v))
      fmt::print("compress: the checkpoint's owner residual has {} values, the sparse part {}: starting from "
                 "zero\n", v.size(), c->sparse_size());
  };
  return e;
}

class CompressedSyncBase : public GroupSync {
 public:
  CompressedSyncBase(const SyncBuffers& b, const SyncSettings& s, Buffer<float> target)
      : GroupSync(b, s), compressor_(b.make_compressor(target, s.compress, s.sync.bucket_mb)) {
    compressor_->own_pieces(world_, rank_);  // partitioned: topology full, the group is the world (deck check)
  }
  std::string describe() const override {
    const std::string group = full() ? "all ranks" : fmt::format("clusters of {}", settings_.topology.size);
    return fmt::format("{} over {}", compressor_->describe(), group);
  }
  // Each rank's residual (what it has not sent yet) and local momentum.
  void register_state(StateRegistry& registry) override {
    registry.add(buffer_entry("compress.residual", StatePlace::rank_buffer, compressor_->residual()));
    if (compressor_->momentum().extent(0) > 0)
      registry.add(buffer_entry("compress.momentum", StatePlace::rank_buffer, compressor_->momentum()));
    if (compressor_->exchange() == Exchange::partitioned)
      registry.add(owner_residual_entry(compressor_.get(), buffers_.world));
  }
  const CompressedSync* compressor() const override { return compressor_.get(); }

 protected:
  void exchange(int64_t step, int micro, CommStats& stats) {
    compressor_->reduce(topology_.members(), topology_.group(), step, micro, *buffers_.ops, stats);
  }
  std::unique_ptr<CompressedSync> compressor_;
};

// Every member decodes the same payloads in group order: the same bits.
class CompressedGradientSync final : public CompressedSyncBase {
 public:
  CompressedGradientSync(const SyncBuffers& b, const SyncSettings& s) : CompressedSyncBase(b, s, b.grads) {}
  void reduce_gradients(int64_t step, CommStats& stats) override { exchange(step, micro_batches(), stats); }
  Agreement agreement(int64_t) const override { return full() ? Agreement{true, true} : Agreement{}; }
};

// Each rank steps its own AdamW; the group averages the compressed changes
// (what was not sent stays in the residual) and applies the mean.
class CompressedUpdateSync final : public CompressedSyncBase {
 public:
  // delta: the buffer the compressor reads, made by the factory so the base can take it
  CompressedUpdateSync(const SyncBuffers& b, const SyncSettings& s, Buffer<float> delta)
      : CompressedSyncBase(b, s, delta), delta_(delta), before_("Sync::update_before", b.params.extent(0)) {}
  void reduce_gradients(int64_t, CommStats&) override {  // the local mean; the updates are averaged below
    auto& g = buffers_.grads;
    if (micro_batches() > 1)
      kernels::scale_inplace<float>(Vec<float>(g.data(), g.extent(0)), 1.0f / float(micro_batches()));
  }
  void before_update() override { Kokkos::deep_copy(before_, buffers_.params); }
  void after_update(int64_t step, CommStats& stats) override {
    const int64_t P = buffers_.params.extent(0);
    Vec<float> params(buffers_.params.data(), P), delta(delta_.data(), P);
    Vec<const float> before(before_.data(), P);
    kernels::update_delta(delta, params, before);
    exchange(step, 1, stats);
    kernels::apply_delta(params, before, delta);
  }
  Agreement agreement(int64_t) const override { return {}; }

 private:
  Buffer<float> delta_, before_;  // this rank's change, then the group's mean; the parameters before the step
};

}  // namespace

std::unique_ptr<SyncStrategy> make_compressed_gradient(const SyncBuffers& b, const SyncSettings& s) {
  return std::make_unique<CompressedGradientSync>(b, s);
}
std::unique_ptr<SyncStrategy> make_compressed_update(const SyncBuffers& b, const SyncSettings& s) {
  return std::make_unique<CompressedUpdateSync>(b, s, Buffer<float>("Sync::update_delta", b.params.extent(0)));
}

}  // namespace xx::sync_detail

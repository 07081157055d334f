// Gradient averaging by all-reduce (sync dense | accumulate K over topology
// full or clusters), overlapped with the backward, and its gossip variant
// over the ring (after the backward: each rank with its two neighbours).
#include <fmt/format.h>
#include "comm/sync_group.h"
#include "kernels/elementwise.h"

namespace xx::sync_detail {
namespace {

std::string group_text(const TopologyConfig& t) {
  if (t.kind == TopologyKind::clusters)
    return t.redraw > 0 ? fmt::format("clusters of {} (redrawn every {} steps)", t.size, t.redraw)
                        : fmt::format("clusters of {}", t.size);
  return t.kind == TopologyKind::ring ? "the two ring neighbours" : "all ranks";
}

std::string micro_text(const SyncConfig& s) {
  return s.kind == SyncKind::accumulate ? fmt::format(", one round per {} micro-batches", s.every) : "";
}

class DenseSync final : public GroupSync {
 public:
  DenseSync(const SyncBuffers& b, const SyncSettings& s) : GroupSync(b, s), sync_(b.world, b.grads, s.sync.bucket_mb, b.experts) {
    // NCCL where built for a device; otherwise MPI's nonblocking sums (staged
    // through the host where MPI cannot read kernel memory)
    if (b.ops->dense().transport() != DenseTransport::mpi) sync_.use_device_allreduce(b.ops->dense());
  }
  std::string describe() const override {
    return fmt::format("{} buckets of {} MB all-reduced during the backward over {}{}", sync_.buckets(),
                       settings_.sync.bucket_mb, group_text(settings_.topology), micro_text(settings_.sync));
  }
  int micro_batches() const override { return settings_.sync.micro_batches(); }
  void begin_step(int64_t step) override {
    GroupSync::begin_step(step);
    sync_.begin(topology_.group());
  }
  void gradients_ready(int64_t offset) override { sync_.ready(offset); }
  void reduce_gradients(int64_t, CommStats& stats) override {
    sync_.finish(micro_batches());
    stats += sync_.stats();
  }
  // One collective per bucket gives every member the same bits.
  Agreement agreement(int64_t) const override { return full() ? Agreement{true, true} : Agreement{}; }

 private:
  GradientSync sync_;
};

class GossipSync final : public GroupSync {
 public:
  using GroupSync::GroupSync;
  std::string describe() const override {
    return fmt::format("gradients averaged with {} after the backward{}", group_text(settings_.topology),
                       micro_text(settings_.sync));
  }
  int micro_batches() const override { return settings_.sync.micro_batches(); }
  void reduce_gradients(int64_t, CommStats& stats) override {
    auto& g = buffers_.grads;
    if (micro_batches() > 1)
      kernels::scale_inplace<float>(Vec<float>(g.data(), g.extent(0)), 1.0f / float(micro_batches()));
    topology_.average(g.data(), g.extent(0), stats);
  }
  Agreement agreement(int64_t) const override { return {}; }
};

}  // namespace

std::unique_ptr<SyncStrategy> make_dense(const SyncBuffers& b, const SyncSettings& s) {
  return std::make_unique<DenseSync>(b, s);
}
std::unique_ptr<SyncStrategy> make_gossip(const SyncBuffers& b, const SyncSettings& s) {
  return std::make_unique<GossipSync>(b, s);
}

}  // namespace xx::sync_detail

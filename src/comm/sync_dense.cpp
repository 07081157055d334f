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

class DenseSync final : public GroupSync {
 public:
  DenseSync(const SyncBuffers& b, const SyncSettings& s)
      : GroupSync(b, s),
        reducer_(b.grads, cut_from_end(b.grads.extent(0), int64_t(s.sync.bucket_mb * 1024 * 1024 / sizeof(float)), b.experts.runs),
                 b.experts.holders) {
    // NCCL where built for a device; otherwise MPI's nonblocking sums (staged
    // through the host where MPI cannot read kernel memory)
    if (b.ops->dense().transport() != DenseTransport::mpi) reducer_.use_device_allreduce(b.ops->dense());
  }
  std::string describe() const override {
    return fmt::format("{} buckets of {} MB all-reduced during the backward over {}{}", reducer_.size(),
                       settings_.sync.bucket_mb, group_text(settings_.topology), micro_text(settings_.sync));
  }
  void begin_step(int64_t step) override {
    GroupSync::begin_step(step);
    reducer_.begin(topology_.group());
  }
  void gradients_ready(int64_t offset) override { reducer_.ready(offset); }
  void reduce_gradients(int64_t, CommStats& stats) override {
    reducer_.finish();
    // A sum over the group (and micro-batches) of mean gradients becomes their mean.
    const int ranks = reducer_.group_size();
    if (ranks * micro_batches() > 1)
      kernels::scale_inplace<float>(reduced_gradients(), 1.0f / float(ranks * micro_batches()));
    stats += reducer_.stats();
  }
  // One collective per bucket gives every member the same bits.
  Agreement agreement(int64_t) const override { return full() ? Agreement{true, true} : Agreement{}; }

 private:
  BucketReducer reducer_;
};

class GossipSync final : public GroupSync {
 public:
  using GroupSync::GroupSync;
  std::string describe() const override {
    return fmt::format("gradients averaged with {} after the backward{}", group_text(settings_.topology),
                       micro_text(settings_.sync));
  }
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

// Sharded data parallelism over all ranks (deck: shard optimizer|gradients|
// params; ZeRO 1, 2 and 3). The ownership (core/ownership.h) gives each rank
// 1/W of every gradient bucket, and the optimizer updates only those pieces.
// Below params each bucket's pieces are all-gathered after the update, so
// every rank starts the next forward with the same whole weights. Under
// 16-bit precision (bf16, fp16) what is gathered is the 16-bit copy the GEMMs
// read (half the bytes): each rank keeps the fp32 master only of its own
// pieces, plus the few tensors the model reads in fp32 (the embedding, the
// norms, the router's gates), whose owners' pieces are all-gathered beside.
//   optimizer  the gradients are all-reduced as under sync dense (the same
//              buckets, the same collectives: the same bits; at most 2 at
//              once, so MPI's temporaries stay bounded), and only AdamW's
//              moments are sharded;
//   gradients  each bucket is reduced as soon as the backward finishes it
//              (sync dense's all-reduce), each rank copies its piece into its
//              shard, and the bucket's whole-size gradients are handed back to
//              the kernel (host memory): a rank keeps only its shard.
//   params     also the weights: the buckets are cut inside the model's weight
//              units (embedding, blocks, head, MTP modules); the model asks for a
//              unit before it computes with it (the forward's and again the
//              backward's), the unit is all-gathered (the next one already
//              on its way), and its other ranks' pieces are released when
//              the model lets go. No all-gather after the update: each rank's
//              pieces are its part of the weights.
// Three small strategies over the one BucketReducer that sync dense uses:
//   ZeroOne    the reducer (at most kShardBucketsInFlight buckets at once) and
//              the all-gather after the update;
//   ZeroTwo    ZeroOne whose "reduced" hook keeps this rank's piece of each
//              bucket and hands the bucket's pages back;
//   ZeroThree  ZeroTwo and the WeightGate the model asks for each unit.
// Under ep (moe ... ep N) an expert bucket is cut over the ranks holding the
// same experts, and reduced and gathered over them alone (each owner's
// gradient already sums its group's tokens; all are divided by the world).
#include <fmt/format.h>
#include <functional>
#include <type_traits>
#include "comm/kernel_memory_mpi.h"
#include "comm/sync_group.h"
#include "core/device_memory.h"
#include "core/host_memory.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"

namespace xx::sync_detail {
namespace {

// ZeRO-1, and what ZeRO-2 and -3 build on: the ownership, the reducer, the gathers.
class ZeroOne : public SyncStrategy, public HalfWeightSource {
 public:
  ZeroOne(const SyncBuffers& b, const SyncSettings& s)
      : SyncStrategy(s),
        buffers_(b),
        owned_(b.owned),
        reducer_(b.grads, reduce_buckets(b.owned), b.experts.holders, kShardBucketsInFlight,
                 [this](size_t bucket) { reduced(bucket); }) {
    MPI_Comm_size(b.world, &world_);
    MPI_Comm_rank(b.world, &rank_);
    if (owned_.total() != int64_t(b.grads.extent(0)))
      throw std::logic_error("shard: the ownership does not cover the gradient buffer");
    // Below params under 16-bit precision the fp32 master is this rank's pieces (and the fp32-read runs).
    if (s.shard != ShardLevel::params && world_ > 1 && b.half_params.extent(0) > 0) plan_master_pieces();
  }

  std::string describe() const override {
    // Its reductions and all-gathers are MPI's, whatever carries sync dense's sums (comm/ops.h).
    const std::string staged = reducer_.staged() ? "; each collective over MPI, staged through host memory (this MPI "
                                                   "cannot read kernel memory)" : "; each collective over MPI";
    return describe_level() + staged;
  }

  void begin_step(int64_t) override {
    stats_ = CommStats{};
    if (master_sharded()) release_others_master();
    reducer_.begin(buffers_.world);
  }
  void zero_gradients() override { Kokkos::deep_copy(buffers_.grads, 0.0f); }
  void gradients_ready(int64_t offset) override { reducer_.ready(offset); }

  void reduce_gradients(int64_t, CommStats& stats) override {
    reducer_.finish();
    // A sum over ranks (and micro-steps) of mean gradients becomes their mean, as sync dense's.
    if (world_ * micro_batches() > 1) kernels::scale_inplace<float>(reduced_gradients(), 1.0f / float(world_ * micro_batches()));
    stats += stats_;
    stats += reducer_.stats();
    stats_ = CommStats{};
  }
  Vec<float> reduced_gradients() override { return Vec<float>(buffers_.grads.data(), buffers_.grads.extent(0)); }

  // The updated pieces, bucket by bucket, to every rank (the 16-bit copy: refresh_half_weights).
  void after_update(int64_t, CommStats& stats) override {
    if (world_ == 1 || master_sharded()) return;
    ExecSpace().fence();
    const double t0 = MPI_Wtime();
    gather_all(buffers_.params.data(), stats);
    stats.seconds += MPI_Wtime() - t0;
  }

  // Every rank holds one model: whole weights after the all-gather, or its
  // pieces of them (core/placement.h, master_sharded); the moments are
  // sharded, and a checkpoint gathers them whole.
  Agreement agreement(int64_t) const override { return {true, true}; }

  HalfWeightSource* half_weight_source() override { return master_sharded() ? this : nullptr; }

  // This rank's pieces to 16 bits; every bucket's 16-bit pieces all-gathered,
  // and beside them every rank's pieces of the fp32 runs the model reads.
  // The same bits as packing the whole gathered fp32 weights: the rounding is per element.
  void refresh_half_weights() override {
    ExecSpace().fence();  // AdamW (or a restore) has written this rank's pieces
    const double t0 = MPI_Wtime();
    uint16_t* half = buffers_.half_params.data();
    const float* params = buffers_.params.data();
    for (const auto& p : owned_.pieces())
      kernels::pack_half(half + p.begin, params + p.begin, p.size(), buffers_.half_type);
    ExecSpace().fence();
    gather_all(half, stats_, [&] { gather_read_runs(); });
    stats_.seconds += MPI_Wtime() - t0;
  }

 protected:
  // The reducer's hook: bucket b's sum is in place (ZeRO-1 keeps the whole gradients).
  virtual void reduced(size_t b) {}

  // What the level does (describe adds the staging).
  virtual std::string describe_level() const {
    return fmt::format("ZeRO-1: {} buckets of {} MB all-reduced during the backward over the {} ranks holding "
                       "them, at most {} at once{}{}",
                       owned_.buckets().size(), settings_.sync.bucket_mb, world_, kShardBucketsInFlight,
                       micro_text(settings_.sync), gather_text());
  }
  std::string gather_text() const {
    return master_sharded()
               ? fmt::format("; each rank updates its 1/{} of AdamW's state and keeps the fp32 master weights of "
                             "those pieces only (and the {} the model reads in fp32: embedding, norms, router "
                             "gates), and the 16-bit weights are all-gathered per bucket", world_, read_total_)
               : fmt::format("; each rank updates its 1/{} of AdamW's state (the pieces of every bucket it owns) "
                             "and the weights are all-gathered per bucket", world_);
  }

  bool master_sharded() const { return !read_parts_.empty(); }

  // The ranks bucket b is cut over: all, or under ep an expert bucket's holders.
  MPI_Comm group_of(const Ownership::Bucket& bucket) const {
    return bucket.expert ? buffers_.experts.holders : buffers_.world;
  }

  // Every rank's piece of bucket b of the weights (or of their 16-bit copy), to every rank, in place.
  template <class Weight>
  void start_gather_bucket(size_t b, MPI_Request& request, CommStats& stats, Weight* weights) {
    static_assert(std::is_same_v<Weight, float> || std::is_same_v<Weight, uint16_t>);
    const auto& bucket = owned_.buckets()[b];
    const int ranks = int(bucket.counts.size());
    if (ranks == 1) return;  // (an expert's only holder)
    const MPI_Datatype type = std::is_same_v<Weight, float> ? MPI_FLOAT : MPI_UINT16_T;
    mpi_.iallgatherv(weights + bucket.begin, bucket.counts.data(), bucket.displs.data(), type, group_of(bucket),
                     &request);
    stats.rounds += 1;
    stats.bytes_sent += int64_t(bucket.counts[owned_.index_in(bucket)]) * int64_t(sizeof(Weight)) * (ranks - 1);
    stats.wire_bytes += gather_wire_bytes((bucket.end - bucket.begin) * int64_t(sizeof(Weight)), ranks);
  }

  SyncBuffers buffers_;
  Ownership owned_;
  BucketReducer reducer_;
  KernelMemoryMpi mpi_;  // the gathers: each through a host copy where MPI cannot read kernel memory
  int world_ = 1, rank_ = 0;
  CommStats stats_;  // the gathers' since the step began

 private:
  static std::vector<ReduceBucket> reduce_buckets(const Ownership& owned) {
    std::vector<ReduceBucket> out;
    for (const auto& b : owned.buckets()) out.push_back({b.begin, b.end, b.expert});
    return out;
  }

  // Every bucket's pieces all-gathered in place, at most kShardBucketsInFlight at
  // once so MPI's temporaries stay bounded too; `beside` runs while the last are in flight.
  template <class Weight>
  void gather_all(Weight* weights, CommStats& stats, const std::function<void()>& beside = {}) {
    const auto& buckets = owned_.buckets();
    std::vector<MPI_Request> gathers(buckets.size(), MPI_REQUEST_NULL);
    for (size_t b = 0; b < buckets.size(); ++b) {
      if (b >= size_t(kShardBucketsInFlight)) mpi_.wait(&gathers[b - kShardBucketsInFlight]);
      start_gather_bucket(b, gathers[b], stats, weights);
    }
    if (beside) beside();
    mpi_.wait_all(gathers);
  }

  // Where every rank's pieces meet the fp32-read runs (each rank computes
  // every rank's: the ownership says them all), and what this rank may
  // release: the other ranks' pieces outside those runs.
  void plan_master_pieces() {
    read_parts_.assign(world_, {});
    for (const auto& bucket : owned_.buckets()) {
      for (int r = 0; r < int(bucket.counts.size()); ++r) {
        const int64_t begin = bucket.begin + bucket.displs[r], end = begin + bucket.counts[r];
        const bool mine = r == owned_.index_in(bucket);
        int64_t at = begin;  // the other ranks' pieces, less the runs, may go
        for (const auto& [lo, hi] : buffers_.fp32_read) {
          const int64_t a = std::max(lo, begin), z = std::min(hi, end);
          if (a >= z) continue;
          if (bucket.expert)  // (the runs are embedding, norms and gates: never a routed expert's)
            throw std::logic_error("shard: an fp32-read tensor inside an expert bucket");
          read_parts_[r].emplace_back(a, z);
          if (!mine && a > at) others_.emplace_back(at, a);
          at = z;
        }
        if (!mine && end > at) others_.emplace_back(at, end);
      }
    }
    read_counts_.assign(world_, 0), read_displs_.assign(world_, 0);
    for (int r = 0; r < world_; ++r) {
      for (const auto& [a, z] : read_parts_[r]) read_counts_[r] += int(z - a);
      if (r > 0) read_displs_[r] = read_displs_[r - 1] + read_counts_[r - 1];
    }
    read_total_ = read_displs_.back() + read_counts_.back();
    read_values_ = Buffer<float>("Sync::fp32_read", read_total_);
  }

  // Every rank's pieces of the fp32-read runs, to every rank (one all-gather).
  void gather_read_runs() {
    if (read_total_ == 0) return;
    float* params = buffers_.params.data();
    auto copy_parts = [&](int r, bool to_params) {
      int64_t at = read_displs_[r];
      for (const auto& [a, z] : read_parts_[r]) {
        const Vec<float> in_params(params + a, z - a), in_values(read_values_.data() + at, z - a);
        if (to_params) Kokkos::deep_copy(in_params, in_values);
        else Kokkos::deep_copy(in_values, in_params);
        at += z - a;
      }
    };
    copy_parts(rank_, false);
    ExecSpace().fence();
    mpi_.allgatherv(read_values_.data(), read_counts_.data(), read_displs_.data(), MPI_FLOAT, buffers_.world);
    for (int r = 0; r < world_; ++r)
      if (r != rank_) copy_parts(r, true);
    stats_.rounds += 1;
    stats_.bytes_sent += int64_t(read_counts_[rank_]) * int64_t(sizeof(float)) * (world_ - 1);
    stats_.wire_bytes += gather_wire_bytes(read_total_ * int64_t(sizeof(float)), world_);
  }

  // The other ranks' fp32 pieces go back to the kernel (init, a restore or a warm restart may have written them).
  void release_others_master() {
    if (kernel_memory_on_host()) {
      ExecSpace().fence();
      for (const auto& [a, z] : others_)
        release_whole_pages(buffers_.params.data() + a, (z - a) * int64_t(sizeof(float)));
    }
  }

  // master sharded (16-bit precision below params; empty otherwise):
  std::vector<std::vector<std::pair<int64_t, int64_t>>> read_parts_;  // each rank's pieces of the fp32-read runs
  std::vector<int> read_counts_, read_displs_;                         // their sizes and places in read_values_
  int64_t read_total_ = 0;
  Buffer<float> read_values_;                         // all of them, rank after rank
  std::vector<std::pair<int64_t, int64_t>> others_;   // the other ranks' pieces outside those runs
};

// ZeRO-2: a rank keeps only its shard of the averaged gradients.
class ZeroTwo : public ZeroOne {
 public:
  ZeroTwo(const SyncBuffers& b, const SyncSettings& s)
      : ZeroOne(b, s), shard_grads_("Sync::shard_grads", owned_.shard_size()) {
    if (kernel_memory_on_host())
      grad_pages_ = PageReleaser(b.grads.data(), int64_t(b.grads.extent(0) * sizeof(float)), b.grads_in_huge_pages);
  }
  void zero_gradients() override {
    if (!kernel_memory_on_host()) return ZeroOne::zero_gradients();
    // Pages released after the last step's reductions stay released until the backward writes them.
    auto& g = buffers_.grads;
    ExecSpace().fence();
    zero_and_release(g.data(), g.extent(0) * int64_t(sizeof(float)));
    grad_pages_.reset();
  }
  Vec<float> reduced_gradients() override { return Vec<float>(shard_grads_.data(), shard_grads_.extent(0)); }

 protected:
  // Bucket b is reduced: this rank's piece goes to its shard, and the
  // bucket's whole-size gradients back to the kernel.
  void reduced(size_t b) override {
    const OwnedPiece mine = owned_.piece_of(b);
    Kokkos::deep_copy(Vec<float>(shard_grads_.data() + mine.at, mine.size()),
                      Vec<float>(buffers_.grads.data() + mine.begin, mine.size()));
    ExecSpace().fence();
    if (kernel_memory_on_host()) {
      const auto& bucket = owned_.buckets()[b];
      grad_pages_.done(bucket.begin * int64_t(sizeof(float)), bucket.end * int64_t(sizeof(float)));
    }
  }
  std::string describe_level() const override {
    return fmt::format("ZeRO-2: {} buckets of {} MB reduced during the backward, each rank keeping "
                       "its piece of each ({} of {} gradients) and releasing the rest{}{}",
                       owned_.buckets().size(), settings_.sync.bucket_mb, owned_.shard_size(), owned_.total(),
                       micro_text(settings_.sync), gather_text());
  }

  Buffer<float> shard_grads_;  // this rank's averaged pieces, in shard order
  PageReleaser grad_pages_;    // the buffer's pages, back to the kernel as their buckets are reduced
};

// ZeRO-3: the weights too. The buckets lie inside the model's weight units
// (the trainer cut them there); the model asks for a unit before it computes
// with it, the unit is all-gathered (the next one already on its way), and
// its other ranks' pieces are released when the model lets go.
class ZeroThree final : public ZeroTwo, public WeightGate {
 public:
  ZeroThree(const SyncBuffers& b, const SyncSettings& s)
      : ZeroTwo(b, s), gathers_(owned_.buckets().size(), MPI_REQUEST_NULL), unit_buckets_(b.units.size()),
        whole_(b.units.size(), false), gathering_(b.units.size(), false) {
    for (size_t k = 0; k < owned_.buckets().size(); ++k)
      for (size_t u = 0; u < b.units.size(); ++u)
        if (owned_.buckets()[k].begin >= b.units[u].first && owned_.buckets()[k].end <= b.units[u].second)
          unit_buckets_[u].push_back(k);
  }
  ~ZeroThree() override {
    for (auto& r : gathers_) mpi_.wait(&r);
  }

  void begin_step(int64_t step) override {
    // after init, a restore or a warm restart: only this rank's pieces stay
    for (size_t u = 0; u < whole_.size(); ++u) release_weights(int(u));
    ZeroTwo::begin_step(step);
  }
  // No all-gather after the update: each rank's pieces are its part of the weights.
  void after_update(int64_t, CommStats&) override {}
  WeightGate* weight_gate() override { return this; }

  void need(int unit, int next) override {
    if (!whole_[unit]) {
      if (!gathering_[unit]) start_gather(unit);
      const double t0 = MPI_Wtime();
      for (size_t b : unit_buckets_[unit]) mpi_.wait(&gathers_[b]);
      stats_.seconds += MPI_Wtime() - t0;
      whole_[unit] = true, gathering_[unit] = false;
    }
    if (next >= 0 && !whole_[next] && !gathering_[next]) start_gather(next);
  }
  void done(int unit) override { release_weights(unit); }

 private:
  std::string describe_level() const override {
    return fmt::format("ZeRO-3: {} weight units in {} buckets of at most {} MB, each unit all-gathered before the "
                       "forward and the backward use it (the next one prefetched) and released after, its "
                       "gradients reduced bucket by bucket during the backward and kept as this rank's piece; "
                       "each rank keeps {} of {} weights, gradients and moments{}",
                       unit_buckets_.size(), owned_.buckets().size(), settings_.sync.bucket_mb,
                       owned_.shard_size(), owned_.total(), micro_text(settings_.sync));
  }

  // Every bucket of the unit, all-gathered in place.
  void start_gather(int unit) {
    gathering_[unit] = true;
    if (world_ == 1) return;
    ExecSpace().fence();  // this rank's pieces are written (AdamW) before MPI reads them
    const double t0 = MPI_Wtime();
    for (size_t b : unit_buckets_[unit]) start_gather_bucket(b, gathers_[b], stats_, buffers_.params.data());
    stats_.seconds += MPI_Wtime() - t0;
  }

  // The other ranks' pieces of the unit go back to the kernel (this rank's stay).
  void release_weights(int unit) {
    for (size_t b : unit_buckets_[unit]) mpi_.wait(&gathers_[b]);
    whole_[unit] = false, gathering_[unit] = false;
    if (world_ == 1 || !kernel_memory_on_host()) return;
    ExecSpace().fence();  // the kernels that read the unit are done
    for (size_t b : unit_buckets_[unit]) {
      const auto& bucket = owned_.buckets()[b];
      for (int r = 0; r < int(bucket.counts.size()); ++r)
        if (r != owned_.index_in(bucket))
          release_whole_pages(buffers_.params.data() + bucket.begin + bucket.displs[r],
                              int64_t(bucket.counts[r]) * int64_t(sizeof(float)));
    }
  }

  std::vector<MPI_Request> gathers_;               // each bucket's all-gather in flight
  std::vector<std::vector<size_t>> unit_buckets_;  // the buckets inside each weight unit
  std::vector<bool> whole_, gathering_;            // per unit: gathered (the model holds it); on its way
};

}  // namespace

std::unique_ptr<SyncStrategy> make_sharded(const SyncBuffers& b, const SyncSettings& s) {
  switch (s.shard) {
    case ShardLevel::optimizer: return std::make_unique<ZeroOne>(b, s);
    case ShardLevel::gradients: return std::make_unique<ZeroTwo>(b, s);
    case ShardLevel::params: return std::make_unique<ZeroThree>(b, s);
    case ShardLevel::off: break;
  }
  throw std::logic_error("make_sharded: shard off");
}

}  // namespace xx::sync_detail

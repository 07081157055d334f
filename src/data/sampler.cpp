// Distributed sampler. Everything here is integer arithmetic on splitmix64
// (core/permutation.h), so every rank on every platform computes the same
// samples from the same seed.
#include "data/sampler.h"
#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include "core/permutation.h"

namespace xx {

namespace {

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;
// Tags that keep the seeds of the pool choice, the pool order and the
// independent streams apart from the epoch seeds and from each other.
constexpr uint64_t kPoolTag = 0x706f6f6c5f736565ULL;  // "pool_see"
constexpr uint64_t kRankTag = 0x72616e6b5f737472ULL;  // "rank_str"
constexpr uint64_t kSliceTag = 0x736c6963655f7365ULL;  // "slice_se"

// Seed of one epoch's permutation: mixed, so neighbouring (seed, epoch) pairs
// (seed+1 at epoch 0 vs seed at epoch 1) give unrelated shuffles.
uint64_t epoch_seed(uint64_t seed, int64_t epoch) { return mix64(seed ^ mix64(uint64_t(epoch) + kGolden)); }

}  // namespace

DistributedSampler::DistributedSampler(int64_t windows, int world, int rank, uint64_t seed)
    : DistributedSampler(windows, world, rank, [seed] {
        SamplerOptions o;
        o.seed = seed;  // shuffle fixed, no pool
        return o;
      }()) {}

DistributedSampler::DistributedSampler(int64_t windows, int world, int rank, const SamplerOptions& options)
    : windows_(windows), world_(world), rank_(rank), options_(options) {
  if (windows < 1 || world < 1 || rank < 0 || rank >= world)
    throw std::invalid_argument("DistributedSampler: windows " + std::to_string(windows) + ", world " +
                                std::to_string(world) + ", rank " + std::to_string(rank) +
                                " (expected windows >= 1 and 0 <= rank < world)");
  if (!(options.common >= 0 && options.common < 1) || !(options.common_rate >= 0 && options.common_rate < 1))
    throw std::invalid_argument("DistributedSampler: common " + std::to_string(options.common) + ", common_rate " +
                                std::to_string(options.common_rate) + " (expected both in [0, 1))");
  shard_count_ = windows;
  if (options.common > 0) {
    // Pool size: round half away from zero, at least one window.
    const int64_t pool = std::max<int64_t>(1, int64_t(std::llround(double(windows) * options.common)));
    if (pool >= windows)
      throw std::invalid_argument("common " + (std::ostringstream() << options.common).str() + " puts all " +
                                  std::to_string(windows) +
                                  " training windows in the pool (expected a smaller fraction, leaving at least one "
                                  "window for the shards)");
    // A seeded choice rather than a slice: corpora are often sorted (by file,
    // by date), and a slice would make the pool one corner of the data.
    const std::vector<int64_t> order = permutation(windows, mix64(options.seed ^ kPoolTag));
    pool_.assign(order.begin(), order.begin() + pool);
    std::sort(pool_.begin(), pool_.end());
    std::vector<char> in_pool(size_t(windows), 0);
    for (int64_t w : pool_) in_pool[size_t(w)] = 1;
    shard_.reserve(size_t(windows - pool));
    for (int64_t w = 0; w < windows; ++w)
      if (!in_pool[size_t(w)]) shard_.push_back(w);
    shard_count_ = windows - pool;
    rate_q32_ = uint64_t(std::llround(std::ldexp(options.common_rate, 32)));
  }
  if (options.contiguous && options.shuffle == Shuffle::independent)
    throw std::invalid_argument("partition contiguous with shuffle independent (expected shuffle fixed or chaos: "
                                "independent streams have no partition)");
  if (options.contiguous && shard_count_ < world)
    throw std::invalid_argument("partition contiguous over " + std::to_string(shard_count_) + " windows and " +
                                std::to_string(world) + " ranks (expected at least one window per rank)");
  per_rank_ = options.shuffle == Shuffle::independent ? shard_count_ : (shard_count_ + world - 1) / world;
  // partition contiguous: this rank's slice [begin, begin + size) of the shard windows.
  slice_begin_ = shard_count_ * rank / world;
  slice_size_ = shard_count_ * (rank + 1) / world - slice_begin_;
  const auto& c = options.start;
  if (c.epoch < 0 || c.position < 0 || c.position >= shard_count_ ||
      (!(c == Continuation{}) && (options.shuffle == Shuffle::independent || options.contiguous)))
    throw std::invalid_argument("DistributedSampler: continue epoch " + std::to_string(c.epoch) + " at position " +
                                std::to_string(c.position) + " (expected a position in [0, " +
                                std::to_string(shard_count_) + ") under shuffle fixed or chaos, partition shuffled)");
  first_epoch_left_ = (shard_count_ - c.position + world - 1) / world;
}

// The epoch and position of shard sample s of this rank: first the rest of
// the continued epoch, then whole epochs.
std::pair<int64_t, int64_t> DistributedSampler::epoch_position(int64_t s) const {
  const auto& c = options_.start;
  if (s < first_epoch_left_) return {c.epoch, c.position + rank_ + s * world_};
  const int64_t t = s - first_epoch_left_;
  return {c.epoch + 1 + t / per_rank_, rank_ + (t % per_rank_) * world_};
}

Continuation DistributedSampler::after(int64_t k) const {
  const int64_t s = k - pool_draws_before(k);
  const auto& c = options_.start;
  Continuation out = s < first_epoch_left_ ? Continuation{c.epoch, c.position + s * world_}
                                           : Continuation{c.epoch + 1 + (s - first_epoch_left_) / per_rank_,
                                                          ((s - first_epoch_left_) % per_rank_) * world_};
  if (out.position >= shard_count_) out = {out.epoch + 1, 0};  // only the padding was left
  return out;
}

int64_t DistributedSampler::pool_draws_before(int64_t k) const {
  return int64_t(((unsigned __int128)uint64_t(k) * rate_q32_) >> 32);
}

int64_t DistributedSampler::shard_window(int64_t s) {
  if (options_.contiguous) {
    // This rank's slice, in its own order each epoch; ceil(M/W) samples per
    // epoch on every rank (lock-step), a shorter slice wrapping to its start.
    const int64_t e = s / per_rank_, i = s % per_rank_;
    if (e != cached_epoch_) {
      perm_ = permutation(slice_size_, epoch_seed(mix64(options_.seed ^ mix64(uint64_t(rank_) + kSliceTag)), e));
      cached_epoch_ = e;
    }
    const int64_t index = slice_begin_ + perm_[i % slice_size_];
    return shard_.empty() ? index : shard_[index];
  }
  const bool independent = options_.shuffle == Shuffle::independent;
  const auto [e, position] = independent ? std::pair{s / per_rank_, s % per_rank_} : epoch_position(s);
  if (e != cached_epoch_) {
    // fixed and chaos: one permutation per epoch shared by all ranks;
    // independent: this rank's own, from a seed that mixes in the rank.
    const uint64_t seed = options_.shuffle == Shuffle::independent
                              ? mix64(options_.seed ^ mix64(uint64_t(rank_) + kRankTag))
                              : options_.seed;
    perm_ = permutation(shard_count_, epoch_seed(seed, e));
    cached_epoch_ = e;
  }
  // independent: the whole permutation in order. Otherwise the position in the
  // padded permutation; past the end it wraps to the start.
  const int64_t index = perm_[position % shard_count_];
  return shard_.empty() ? index : shard_[index];
}

int64_t DistributedSampler::pool_slot(int64_t j) {
  // Every rank walks the whole pool once per cycle, each in its own order.
  const int64_t pool = int64_t(pool_.size());
  const int64_t cycle = j / pool;
  if (cycle != cached_cycle_) {
    pool_perm_ = permutation(pool, epoch_seed(mix64(options_.seed ^ mix64(uint64_t(rank_) + kPoolTag)), cycle));
    cached_cycle_ = cycle;
  }
  return pool_perm_[j % pool];
}

Sample DistributedSampler::sample(int64_t k) {
  if (k < 0) throw std::invalid_argument("DistributedSampler: sample " + std::to_string(k) + " (expected >= 0)");
  const int64_t pooled = pool_draws_before(k);
  if (!pool_.empty() && pool_draws_before(k + 1) > pooled) {
    const int64_t slot = pool_slot(pooled);
    return {pool_[slot], slot};
  }
  return {shard_window(k - pooled), -1};
}

}  // namespace xx

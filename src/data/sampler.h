// Which training window each rank reads next (docs/DATA.md, "Sampler").
//
// fixed (DistributedSampler semantics): each epoch one permutation of the
// training windows, shared by all ranks (seeded by the run seed and the
// epoch); rank r takes positions r, r+W, r+2W, ... of it. The permutation is
// padded by wrapping to a multiple of W, so every rank gets ceil(N/W) windows
// per epoch: an epoch is complete, and disjoint except for the padding.
// chaos: the same, seeded by a chaos seed drawn at start-up (src/data/chaos.h).
// independent: every rank walks its own permutations, seeded by the chaos
// seed and its rank; ranks may overlap.
// common pool: a seeded fraction of the windows is taken out of the shards;
// every rank draws from all of it, mixed into its shard stream at a fixed rate.
// partition contiguous (fixed, chaos): rank r reads only its own contiguous
// slice of the (shard) windows, reshuffled each epoch by its own seed, so the
// ranks' data really differ, as nodes with their own data do.
//
// A rank's samples form one endless stream across epochs; sample k is a pure
// function of (seed, N, W, r, k) and the pool settings, so a run resumes from
// a single counter.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/modes.h"  // Shuffle

namespace xx {

// Where this world's streams pick up an epoch that another world size began
// (a resume on a different number of ranks): positions [0, position) of
// epoch `epoch`'s permutation are done; rank r's first shard samples take
// positions position + r, position + r + W, ... to the epoch's end, and the
// next epochs follow the plain rule. {0, 0} is a fresh start.
struct Continuation {
  int64_t epoch = 0, position = 0;
  bool operator==(const Continuation&) const = default;
};

struct SamplerOptions {
  Shuffle shuffle = Shuffle::fixed;
  uint64_t seed = 0;         // fixed: the run seed; chaos, independent: the chaos seed
  double common = 0.0;       // fraction of the windows in the common pool (0: none)
  double common_rate = 0.0;  // fraction of each rank's samples drawn from the pool
  Continuation start;        // fixed and chaos only: a resume at another world size
  bool contiguous = false;   // partition contiguous: each rank its own slice of the windows
};

// One sample of a rank's stream.
struct Sample {
  int64_t window = 0;      // training window, in [0, N)
  int64_t pool_slot = -1;  // its slot in the common pool, or -1: a shard sample
};

class DistributedSampler {
 public:
  DistributedSampler(int64_t windows, int world, int rank, uint64_t seed);  // fixed, no pool
  // Throws std::invalid_argument for a pool that leaves no shard window.
  DistributedSampler(int64_t windows, int world, int rank, const SamplerOptions& options);

  // Shard samples of one rank per epoch: ceil(M/W) (fixed, chaos) or M
  // (independent: one pass over its own permutation), M = N - pool size.
  int64_t per_rank_per_epoch() const { return per_rank_; }
  int64_t windows() const { return windows_; }  // N: windows in [0, N)
  // Training windows in the common pool, ascending; slot i holds pool_windows()[i].
  const std::vector<int64_t>& pool_windows() const { return pool_; }
  const SamplerOptions& options() const { return options_; }

  // This rank's k-th sample (k counts across epochs). Caches one epoch: not thread-safe.
  Sample sample(int64_t k);
  int64_t window(int64_t k) { return sample(k).window; }
  // Pool samples among samples [0, k): floor(k * rate) with the rate rounded to 32 bits.
  int64_t pool_draws_before(int64_t k) const;
  // Epoch of the shard stream at sample k.
  int64_t epoch(int64_t k) const { return (k - pool_draws_before(k)) / per_rank_; }
  // fixed, chaos: where the epoch stands once every rank has taken k samples
  // (what another world size continues from).
  Continuation after(int64_t k) const;

 private:
  int64_t shard_window(int64_t s);  // s-th shard sample
  std::pair<int64_t, int64_t> epoch_position(int64_t s) const;  // fixed, chaos: (epoch, position) of shard sample s
  int64_t pool_slot(int64_t j);     // j-th pool sample

  int64_t windows_, per_rank_ = 0;
  int world_, rank_;
  SamplerOptions options_;
  uint64_t rate_q32_ = 0;       // common_rate * 2^32, rounded
  std::vector<int64_t> pool_;   // pool windows, ascending
  std::vector<int64_t> shard_;  // windows outside the pool, ascending (empty: all N, no pool)
  int64_t shard_count_ = 0;     // M
  int64_t slice_begin_ = 0, slice_size_ = 0;  // partition contiguous: this rank's shard windows
  int64_t first_epoch_left_ = 0;  // shard samples per rank left in the continued epoch
  int64_t cached_epoch_ = -1, cached_cycle_ = -1;
  std::vector<int64_t> perm_;       // shard permutation of the cached epoch
  std::vector<int64_t> pool_perm_;  // pool permutation of the cached cycle
};

}  // namespace xx

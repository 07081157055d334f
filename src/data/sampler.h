// DistributedSampler semantics: each epoch one permutation of the training
// windows, shared by all ranks (seeded by the run seed and the epoch); rank r
// takes positions r, r+W, r+2W, ... of it. The permutation is padded by
// wrapping to a multiple of W, so every rank gets ceil(N/W) windows per epoch:
// an epoch is complete, and disjoint except for the padding.
// A rank's samples form one endless stream across epochs; sample k of the
// stream is a pure function of (seed, N, W, r, k), so a run resumes from a
// single counter.
#pragma once
#include <cstdint>
#include <vector>

namespace xx {

class DistributedSampler {
 public:
  DistributedSampler(int64_t windows, int world, int rank, uint64_t seed);

  int64_t per_rank_per_epoch() const { return per_rank_; }
  int64_t windows() const { return windows_; }  // N: windows in [0, N)
  // Window index of this rank's k-th sample (k counts across epochs).
  int64_t window(int64_t k);
  // Epoch of sample k.
  int64_t epoch(int64_t k) const { return k / per_rank_; }

 private:
  int64_t windows_, per_rank_;
  int world_, rank_;
  uint64_t seed_;
  int64_t cached_epoch_ = -1;
  std::vector<int64_t> perm_;  // permutation of the cached epoch
};

// Deterministic permutation of [0, n) from a seed (own Fisher-Yates: the
// standard library's shuffle differs between implementations).
std::vector<int64_t> permutation(int64_t n, uint64_t seed);

}  // namespace xx

// Distributed sampler and the portable permutation behind it. Everything here
// is integer arithmetic on a splitmix64 stream, so every rank on every
// platform computes the same permutation from the same seed.
#include "data/sampler.h"
#include <stdexcept>
#include <string>
#include <utility>

namespace xx {

namespace {

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;

// splitmix64 finalizer: a bijective mix of 64 bits.
uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

struct SplitMix64 {
  uint64_t state;
  uint64_t next() { return mix64(state += kGolden); }
  // Unbiased integer in [0, s), Lemire's multiply-and-reject method.
  uint64_t below(uint64_t s) {
    unsigned __int128 m = (unsigned __int128)next() * s;
    uint64_t low = uint64_t(m);
    if (low < s) {
      const uint64_t threshold = (0 - s) % s;  // 2^64 mod s
      while (low < threshold) {
        m = (unsigned __int128)next() * s;
        low = uint64_t(m);
      }
    }
    return uint64_t(m >> 64);
  }
};

// Seed of one epoch's permutation: mixed, so neighbouring (seed, epoch) pairs
// (seed+1 at epoch 0 vs seed at epoch 1) give unrelated shuffles.
uint64_t epoch_seed(uint64_t seed, int64_t epoch) { return mix64(seed ^ mix64(uint64_t(epoch) + kGolden)); }

}  // namespace

std::vector<int64_t> permutation(int64_t n, uint64_t seed) {
  std::vector<int64_t> p(size_t(n > 0 ? n : 0));
  for (int64_t i = 0; i < n; ++i) p[i] = i;
  SplitMix64 rng{seed};
  for (int64_t i = n - 1; i > 0; --i) std::swap(p[i], p[rng.below(uint64_t(i) + 1)]);
  return p;
}

DistributedSampler::DistributedSampler(int64_t windows, int world, int rank, uint64_t seed)
    : windows_(windows), per_rank_(0), world_(world), rank_(rank), seed_(seed) {
  if (windows < 1 || world < 1 || rank < 0 || rank >= world)
    throw std::invalid_argument("DistributedSampler: windows " + std::to_string(windows) + ", world " +
                                std::to_string(world) + ", rank " + std::to_string(rank) +
                                " (expected windows >= 1 and 0 <= rank < world)");
  per_rank_ = (windows + world - 1) / world;
}

int64_t DistributedSampler::window(int64_t k) {
  if (k < 0) throw std::invalid_argument("DistributedSampler: sample " + std::to_string(k) + " (expected >= 0)");
  const int64_t e = epoch(k);
  if (e != cached_epoch_) {
    perm_ = permutation(windows_, epoch_seed(seed_, e));
    cached_epoch_ = e;
  }
  // Position in the padded permutation; past the end it wraps to the start.
  const int64_t pos = rank_ + (k % per_rank_) * world_;
  return perm_[pos % windows_];
}

}  // namespace xx

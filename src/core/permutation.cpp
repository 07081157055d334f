#include "core/permutation.h"
#include <cstddef>
#include <utility>

namespace xx {

namespace {

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;

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

}  // namespace

std::vector<int64_t> permutation(int64_t n, uint64_t seed) {
  std::vector<int64_t> p(size_t(n > 0 ? n : 0));
  for (int64_t i = 0; i < n; ++i) p[i] = i;
  SplitMix64 rng{seed};
  for (int64_t i = n - 1; i > 0; --i) std::swap(p[i], p[rng.below(uint64_t(i) + 1)]);
  return p;
}

}  // namespace xx

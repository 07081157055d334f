// The portable permutation behind the data sampler and the topology's
// clusters: our own Fisher-Yates on a splitmix64 stream, integer arithmetic
// only, so every rank on every platform draws the same permutation from the
// same seed (the standard library's shuffle differs between implementations).
#pragma once
#include <cstdint>
#include <vector>

namespace xx {

// splitmix64 finalizer: a bijective mix of 64 bits.
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Deterministic permutation of [0, n) from a seed.
std::vector<int64_t> permutation(int64_t n, uint64_t seed);

}  // namespace xx

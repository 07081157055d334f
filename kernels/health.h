// Health kernels: a fingerprint of a buffer's bits, so ranks that should
// hold the same parameters can compare 8 bytes instead of the buffer.
#pragma once
#include <bit>
#include <cstdint>
#include "core/views.h"
#include "kernels/math.h"

namespace xx::kernels {

// Order-independent hash of the bit patterns: a sum over i of a mix of
// (index, bits). Integer sums commute, so the result does not depend on how
// the reduction is split; any flipped bit changes it with high probability.
inline uint64_t fingerprint(Vec<const float> x) {
  const int64_t n = x.extent(0);
  const float* px = x.data();
  uint64_t hash = 0;
  Kokkos::parallel_reduce(
      "fingerprint", Kokkos::RangePolicy<ExecSpace>(0, n),
      KOKKOS_LAMBDA(int64_t i, uint64_t& acc) {
        uint64_t z = (uint64_t(i) << 32 | kmath::bit_cast<uint32_t>(px[i])) + 0x9e3779b97f4a7c15ull;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;  // splitmix64's finaliser
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        acc += z ^ (z >> 31);
      },
      hash);
  return hash;
}

}  // namespace xx::kernels

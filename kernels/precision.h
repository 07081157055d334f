// 16-bit floating-point types (deck: precision): their bit patterns, to and from float.
// bf16: 1 sign, 8 exponent, 7 mantissa bits (float's range, 3 significant
// digits). fp16 (IEEE binary16): 1, 5, 10 (max 65504, subnormals down to
// 2^-24). Conversions from float round to nearest, ties to even, as CUDA's
// __float2bfloat16_rn / __float2half_rn do; NaN stays NaN (quiet), values
// past the largest finite one become inf. (The GEMM seam packs buffers of
// them: kernels/gemm.h.)
#pragma once
#include <bit>
#include <cstdint>
#include <string>
#include "core/modes.h"  // Precision
#include "core/views.h"
#include "kernels/math.h"
#include "kernels/team.h"

namespace xx::kernels {

using xx::Precision;

// ---------------------------------------------------------------------------
// bf16: the top 16 bits of a float, rounded

KOKKOS_INLINE_FUNCTION uint16_t float_to_bf16_bits(float f) {
  const uint32_t u = kmath::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x0040u);  // NaN: keep sign, force quiet
  // Adding 0x7fff plus the lowest kept bit rounds half to even; a carry out
  // of the largest finite value lands on inf, which is the right overflow.
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

KOKKOS_INLINE_FUNCTION float bf16_bits_to_float(uint16_t b) { return kmath::bit_cast<float>(uint32_t(b) << 16); }

// ---------------------------------------------------------------------------
// fp16 (IEEE binary16)

KOKKOS_INLINE_FUNCTION uint16_t float_to_fp16_bits(float f) {
  const uint32_t u = kmath::bit_cast<uint32_t>(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;  // |f|
  if (a > 0x7f800000u) return uint16_t(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // NaN, quiet
  // 65520 = 0x477ff000 is halfway between 65504 (odd mantissa) and 2^16: it
  // and everything above round to inf.
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);
  if (a >= 0x38800000u) {  // normal in fp16 (>= 2^-14): rebias 127 -> 15, drop 13 bits
    const uint32_t rounded = a + 0xfffu + ((a >> 13) & 1u);
    return uint16_t(sign | ((rounded - (112u << 23)) >> 13));
  }
  // Subnormal in fp16: a count of 2^-24 units. |f| < 2^-25 rounds to zero
  // (exactly 2^-25 is a tie and goes to the even 0 as well).
  const int e = int(a >> 23);  // float's biased exponent, < 113 here
  if (e < 102) return uint16_t(sign);
  const uint32_t m = (a & 0x7fffffu) | 0x800000u;  // |f| = m * 2^(e - 150)
  const int shift = 126 - e;                        // in [14, 24]
  uint32_t q = m >> shift;
  const uint32_t rest = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
  if (rest > half || (rest == half && (q & 1u))) ++q;  // q == 1024 is the smallest normal: still right
  return uint16_t(sign | q);
}

KOKKOS_INLINE_FUNCTION float fp16_bits_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) return kmath::bit_cast<float>(sign | 0x7f800000u | (m << 13));  // inf, NaN
  if (e == 0) {  // zero or subnormal: m * 2^-24, exact in float
    const float v = float(m) * 5.9604644775390625e-08f;
    return sign ? -v : v;
  }
  return kmath::bit_cast<float>(sign | ((e + 112u) << 23) | (m << 13));
}

// The float value of a 16-bit pattern of type p (bf16 or fp16).
KOKKOS_INLINE_FUNCTION float half_bits_to_float(uint16_t h, Precision p) {
  return p == Precision::bf16 ? bf16_bits_to_float(h) : fp16_bits_to_float(h);
}

// The nearest value of type p (ties to even), as a float.
KOKKOS_INLINE_FUNCTION float round_to(float x, Precision p) {
  if (p == Precision::bf16) return bf16_bits_to_float(float_to_bf16_bits(x));
  if (p == Precision::fp16) return fp16_bits_to_float(float_to_fp16_bits(x));
  return x;
}

// ---------------------------------------------------------------------------
// kernels over buffers

// True when any entry is inf or NaN (all exponent bits set). A bit test, so
// it holds whatever floating-point flags the compiler was given.
// A functor, not a KOKKOS_LAMBDA: an extended lambda inside a non-template
// inline function, compiled into several translation units, left nvcc's
// host-side copy of it a null function on the GPU build (docs/GPU.md, "What
// the first GPU runs found"): the bf16 loss scaler crashed at its first check.
struct NonfiniteCount {
  const float* x;
  int64_t n;
  KOKKOS_INLINE_FUNCTION void operator()(const TeamMember& m, int64_t& acc) const {
    const float* px = x;
    flat_sum(
        m, n,
        [&](int64_t i) {
          return (kmath::bit_cast<uint32_t>(px[i]) & 0x7f800000u) == 0x7f800000u ? int64_t(1) : int64_t(0);
        },
        acc);
  }
};
inline bool has_nonfinite(Vec<const float> x) {
  const int64_t n = x.extent(0);
  int64_t bad = 0;
  Kokkos::parallel_reduce("has_nonfinite", flat_policy(n), NonfiniteCount{x.data(), n}, bad);
  return bad > 0;
}

}  // namespace xx::kernels

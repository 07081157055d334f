// Element functions the kernels share. exp_of<float> is a vectorizable
// exp (Cephes-style range reduction and a degree-6 polynomial, within 2 ulp of
// expf over the whole float range): glibc's expf is a scalar call that
// the compiler cannot vectorize without -ffast-math, and it dominated the
// softmax, cross-entropy and SwiGLU kernels. Doubles (the gradient checks)
// keep the library exp.
#pragma once
#include <Kokkos_Core.hpp>
#include <bit>
#include <cstdint>
#include <cstring>

// kmath: the math functions kernels call inside parallel regions, on the host
// or the device. Kokkos 4 moved them from Kokkos::Experimental (Kokkos 3.4,
// Debian's host build) to Kokkos (the cuda preset); this is the one place that
// knows which Kokkos it was built against. The numeric constants (infinity)
// stayed in Kokkos::Experimental in both.
namespace xx::kernels::kmath {
#if KOKKOS_VERSION >= 40000
using Kokkos::cos;
using Kokkos::exp;
using Kokkos::fabs;
using Kokkos::floor;
using Kokkos::fmax;
using Kokkos::isfinite;
using Kokkos::log;
using Kokkos::sin;
using Kokkos::sqrt;
#else
using Kokkos::Experimental::cos;
using Kokkos::Experimental::exp;
using Kokkos::Experimental::fabs;
using Kokkos::Experimental::floor;
using Kokkos::Experimental::fmax;
using Kokkos::Experimental::isfinite;
using Kokkos::Experimental::log;
using Kokkos::Experimental::sin;
using Kokkos::Experimental::sqrt;
#endif
// The bits of a value as another type of its size; std::bit_cast is a host
// function to nvcc, Kokkos::bit_cast (4.1 on) runs on both.
#if KOKKOS_VERSION >= 40100
using Kokkos::bit_cast;
#else
using std::bit_cast;
#endif
// +inf of T, in device code too (std::numeric_limits is host-only under nvcc).
template <class T>
KOKKOS_INLINE_FUNCTION constexpr T infinity() {
  return Kokkos::Experimental::infinity<T>::value;
}
}  // namespace xx::kernels::kmath

namespace xx::kernels {

KOKKOS_INLINE_FUNCTION float fast_exp(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);  // 2^n stays a normal float (and the integer small)
  const float fn = kmath::floor(x * 1.44269504088896341f + 0.5f);  // n = round(x / ln 2)
  float r = x - fn * 0.693359375f;                                                // x - n ln2, in two parts
  r -= fn * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (int32_t(fn) + 127) << 23;  // 2^n
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return x <= -87.0f ? 0.0f : p * scale;  // below e^-87 the result is (nearly) subnormal: flush to zero
}

template <class T>
KOKKOS_INLINE_FUNCTION T exp_of(T x) {
  if constexpr (std::is_same_v<T, float>) return fast_exp(x);
  else return kmath::exp(x);
}

template <class T>
KOKKOS_INLINE_FUNCTION T sigmoid_of(T x) {
  return T(1) / (T(1) + exp_of(-x));
}

}  // namespace xx::kernels

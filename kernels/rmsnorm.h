// RMSNorm: out = x / sqrt(mean(x^2) + eps) * weight.
// Parameter gradients accumulate (+=); activation gradients are written (=).
#pragma once
#include "core/views.h"
#include "kernels/math.h"

namespace xx::kernels {

// out (N, C), rstd (N), inp (N, C), weight (C)
template <class T>
void rmsnorm_forward(Mat<T> out, Vec<T> rstd, Mat<const T> inp, Vec<const T> weight, double eps) {
  const int64_t C = inp.extent(1);
  Kokkos::parallel_for(
      "rmsnorm_forward", Kokkos::RangePolicy<ExecSpace>(0, inp.extent(0)), KOKKOS_LAMBDA(int64_t i) {
        const T* x = &inp(i, 0);
        T* y = &out(i, 0);
        T ss = 0;
#pragma omp simd reduction(+ : ss)
        for (int64_t c = 0; c < C; ++c) ss += x[c] * x[c];
        const T r = T(1) / kmath::sqrt(ss / T(C) + T(eps));
        rstd(i) = r;
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) y[c] = x[c] * r * weight(c);
      });
}

// dinp (N, C) = d/dx;   dweight (C) += sum_i dout * x * rstd
template <class T>
void rmsnorm_backward(Mat<T> dinp, Vec<T> dweight, Mat<const T> dout, Mat<const T> inp,
                      Vec<const T> weight, Vec<const T> rstd) {
  const int64_t N = inp.extent(0), C = inp.extent(1);
  Kokkos::parallel_for(
      "rmsnorm_backward_input", Kokkos::RangePolicy<ExecSpace>(0, N), KOKKOS_LAMBDA(int64_t i) {
        const T r = rstd(i);
        const T *x = &inp(i, 0), *dy = &dout(i, 0);
        T* dx = &dinp(i, 0);
        T dot = 0;  // sum_c dxhat * xhat
#pragma omp simd reduction(+ : dot)
        for (int64_t c = 0; c < C; ++c) dot += dy[c] * weight(c) * x[c] * r;
        dot /= T(C);
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) dx[c] = r * (dy[c] * weight(c) - x[c] * r * dot);
      });
  // One thread per block of channels, rows in order: deterministic without
  // atomics, and the inner loop runs along a row.
  constexpr int64_t kChunk = 32;
  Kokkos::parallel_for(
      "rmsnorm_backward_weight", Kokkos::RangePolicy<ExecSpace>(0, (C + kChunk - 1) / kChunk),
      KOKKOS_LAMBDA(int64_t chunk) {
        const int64_t c0 = chunk * kChunk, n = C - c0 < kChunk ? C - c0 : kChunk;
        T acc[kChunk] = {};
        for (int64_t i = 0; i < N; ++i) {
          const T r = rstd(i);
          const T *x = &inp(i, c0), *dy = &dout(i, c0);
#pragma omp simd
          for (int64_t c = 0; c < n; ++c) acc[c] += dy[c] * x[c] * r;
        }
        for (int64_t c = 0; c < n; ++c) dweight(c0 + c) += acc[c];
      });
}

}  // namespace xx::kernels

// RMSNorm: out = x / sqrt(mean(x^2) + eps) * weight.
// Parameter gradients accumulate (+=); activation gradients are written (=).
#pragma once
#include "core/views.h"

namespace xx::kernels {

// out (N, C), rstd (N), inp (N, C), weight (C)
template <class T>
void rmsnorm_forward(Mat<T> out, Vec<T> rstd, Mat<const T> inp, Vec<const T> weight, double eps) {
  const int64_t C = inp.extent(1);
  Kokkos::parallel_for(
      "rmsnorm_forward", Kokkos::RangePolicy<ExecSpace>(0, inp.extent(0)), KOKKOS_LAMBDA(int64_t i) {
        T ss = 0;
        for (int64_t c = 0; c < C; ++c) ss += inp(i, c) * inp(i, c);
        const T r = T(1) / Kokkos::Experimental::sqrt(ss / T(C) + T(eps));
        rstd(i) = r;
        for (int64_t c = 0; c < C; ++c) out(i, c) = inp(i, c) * r * weight(c);
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
        T dot = 0;  // sum_c dxhat * xhat
        for (int64_t c = 0; c < C; ++c) dot += dout(i, c) * weight(c) * inp(i, c) * r;
        dot /= T(C);
        for (int64_t c = 0; c < C; ++c) dinp(i, c) = r * (dout(i, c) * weight(c) - inp(i, c) * r * dot);
      });
  // One thread per channel, rows in order: deterministic without atomics.
  Kokkos::parallel_for(
      "rmsnorm_backward_weight", Kokkos::RangePolicy<ExecSpace>(0, C), KOKKOS_LAMBDA(int64_t c) {
        T acc = 0;
        for (int64_t i = 0; i < N; ++i) acc += dout(i, c) * inp(i, c) * rstd(i);
        dweight(c) += acc;
      });
}

}  // namespace xx::kernels

// RMSNorm: out = x / sqrt(mean(x^2) + eps) * weight.
// Parameter gradients accumulate (+=); activation gradients are written (=).
// Team-shaped (kernels/team.h): a row per team thread, the channels its vector lanes.
#pragma once
#include "core/views.h"
#include "kernels/math.h"
#include "kernels/team.h"

namespace xx::kernels {

// out (N, C), rstd (N), inp (N, C), weight (C)
template <class T>
void rmsnorm_forward(Mat<T> out, Vec<T> rstd, Mat<const T> inp, Vec<const T> weight, double eps) {
  const int64_t N = inp.extent(0), C = inp.extent(1);
  Kokkos::parallel_for(
      "rmsnorm::forward", row_policy(N), KOKKOS_LAMBDA(const TeamMember& m) {
        for_rows(m, N, [&](int64_t i) {
          const T* x = &inp(i, 0);
          T* y = &out(i, 0);
          const T ss = row_sum(m, C, [&](int64_t c) { return x[c] * x[c]; });
          const T r = T(1) / kmath::sqrt(ss / T(C) + T(eps));
          row_single(m, [&] { rstd(i) = r; });
          row_for(m, C, [&](int64_t c) { y[c] = x[c] * r * weight(c); });
        });
      });
}

// dinp (N, C) = d/dx;   dweight (C) += sum_i dout * x * rstd
template <class T>
void rmsnorm_backward(Mat<T> dinp, Vec<T> dweight, Mat<const T> dout, Mat<const T> inp,
                      Vec<const T> weight, Vec<const T> rstd) {
  const int64_t N = inp.extent(0), C = inp.extent(1);
  Kokkos::parallel_for(
      "rmsnorm::backward_input", row_policy(N), KOKKOS_LAMBDA(const TeamMember& m) {
        for_rows(m, N, [&](int64_t i) {
          const T r = rstd(i);
          const T *x = &inp(i, 0), *dy = &dout(i, 0);
          T* dx = &dinp(i, 0);
          // sum_c dxhat * xhat
          const T dot = row_sum(m, C, [&](int64_t c) { return dy[c] * weight(c) * x[c] * r; }) / T(C);
          row_for(m, C, [&](int64_t c) { dx[c] = r * (dy[c] * weight(c) - x[c] * r * dot); });
        });
      });
  // A team per block of channels, each channel's rows summed in order:
  // deterministic without atomics.
  Kokkos::parallel_for(
      "rmsnorm::backward_weight", column_sum_policy<T>(C), KOKKOS_LAMBDA(const TeamMember& m) {
        column_sums(
            m, N, C, [&](int64_t i, int64_t c) { return dout(i, c) * inp(i, c) * rstd(i); },
            [&](int64_t c, T s) { dweight(c) += s; });
      });
}

}  // namespace xx::kernels

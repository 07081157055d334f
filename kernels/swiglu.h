// SwiGLU activation: a = silu(gate) * up, where h = [gate | up] comes from one
// fused GEMM with weights w1 (gate) and w3 (up) stacked.
// Activation gradients are written (=).
// Team-shaped (kernels/team.h): a row per team thread, its F columns the vector lanes.
#pragma once
#include "core/views.h"
#include "kernels/math.h"
#include "kernels/team.h"

namespace xx::kernels {

// out (N, F) = silu(h[:, :F]) * h[:, F:];   h (N, 2F)
template <class T>
void swiglu_forward(Mat<T> out, Mat<const T> h) {
  const int64_t N = out.extent(0), F = out.extent(1);
  Kokkos::parallel_for(
      "swiglu::forward", row_policy(N), KOKKOS_LAMBDA(const TeamMember& m) {
        for_rows(m, N, [&](int64_t i) {
          const T* hrow = &h(i, 0);
          T* orow = &out(i, 0);
          row_for(m, F, [&](int64_t j) { orow[j] = hrow[j] * sigmoid_of(hrow[j]) * hrow[F + j]; });
        });
      });
}

// dh (N, 2F) from dout (N, F) and h
template <class T>
void swiglu_backward(Mat<T> dh, Mat<const T> dout, Mat<const T> h) {
  const int64_t N = dout.extent(0), F = dout.extent(1);
  Kokkos::parallel_for(
      "swiglu::backward", row_policy(N), KOKKOS_LAMBDA(const TeamMember& m) {
        for_rows(m, N, [&](int64_t i) {
          const T *hrow = &h(i, 0), *dorow = &dout(i, 0);
          T* dhrow = &dh(i, 0);
          row_for(m, F, [&](int64_t j) {
            const T g = hrow[j], u = hrow[F + j], sig = sigmoid_of(g);
            dhrow[j] = dorow[j] * u * sig * (T(1) + g * (T(1) - sig));
            dhrow[F + j] = dorow[j] * g * sig;
          });
        });
      });
}

}  // namespace xx::kernels

// SwiGLU activation: a = silu(gate) * up, where h = [gate | up] comes from one
// fused GEMM with weights w1 (gate) and w3 (up) stacked.
// Activation gradients are written (=).
#pragma once
#include "core/views.h"

namespace xx::kernels {

// out (N, F) = silu(h[:, :F]) * h[:, F:];   h (N, 2F)
template <class T>
void swiglu_forward(Mat<T> out, Mat<const T> h) {
  const int64_t F = out.extent(1);
  Kokkos::parallel_for(
      "swiglu_forward", Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>>({0, 0}, {int64_t(out.extent(0)), F}),
      KOKKOS_LAMBDA(int64_t i, int64_t j) {
        const T g = h(i, j);
        const T sig = T(1) / (T(1) + Kokkos::Experimental::exp(-g));
        out(i, j) = g * sig * h(i, F + j);
      });
}

// dh (N, 2F) from dout (N, F) and h
template <class T>
void swiglu_backward(Mat<T> dh, Mat<const T> dout, Mat<const T> h) {
  const int64_t F = dout.extent(1);
  Kokkos::parallel_for(
      "swiglu_backward", Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>>({0, 0}, {int64_t(dout.extent(0)), F}),
      KOKKOS_LAMBDA(int64_t i, int64_t j) {
        const T g = h(i, j), u = h(i, F + j);
        const T sig = T(1) / (T(1) + Kokkos::Experimental::exp(-g));
        dh(i, j) = dout(i, j) * u * sig * (T(1) + g * (T(1) - sig));
        dh(i, F + j) = dout(i, j) * g * sig;
      });
}

}  // namespace xx::kernels

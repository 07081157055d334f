// SwiGLU activation: a = silu(gate) * up, where h = [gate | up] comes from one
// fused GEMM with weights w1 (gate) and w3 (up) stacked.
// Activation gradients are written (=).
#pragma once
#include "core/views.h"
#include "kernels/math.h"

namespace xx::kernels {

// out (N, F) = silu(h[:, :F]) * h[:, F:];   h (N, 2F)
template <class T>
void swiglu_forward(Mat<T> out, Mat<const T> h) {
  const int64_t F = out.extent(1);
  Kokkos::parallel_for(
      "swiglu_forward", Kokkos::RangePolicy<ExecSpace>(0, out.extent(0)), KOKKOS_LAMBDA(int64_t i) {
        const T* hrow = &h(i, 0);
        T* orow = &out(i, 0);
#pragma omp simd
        for (int64_t j = 0; j < F; ++j) orow[j] = hrow[j] * sigmoid_of(hrow[j]) * hrow[F + j];
      });
}

// dh (N, 2F) from dout (N, F) and h
template <class T>
void swiglu_backward(Mat<T> dh, Mat<const T> dout, Mat<const T> h) {
  const int64_t F = dout.extent(1);
  Kokkos::parallel_for(
      "swiglu_backward", Kokkos::RangePolicy<ExecSpace>(0, dout.extent(0)), KOKKOS_LAMBDA(int64_t i) {
        const T *hrow = &h(i, 0), *dorow = &dout(i, 0);
        T* dhrow = &dh(i, 0);
#pragma omp simd
        for (int64_t j = 0; j < F; ++j) {
          const T g = hrow[j], u = hrow[F + j], sig = sigmoid_of(g);
          dhrow[j] = dorow[j] * u * sig * (T(1) + g * (T(1) - sig));
          dhrow[F + j] = dorow[j] * g * sig;
        }
      });
}

}  // namespace xx::kernels

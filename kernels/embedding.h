// Token embedding lookup. The backward is a scatter-add made deterministic
// without atomics: each thread owns a block of channels and walks the tokens in order.
// Parameter gradients accumulate (+=); activation gradients are written (=).
#pragma once
#include "core/views.h"
#include "kernels/elementwise.h"

namespace xx::kernels {

// out (N, C) = wte[tokens];   wte (V, C)
template <class T>
void embedding_forward(Mat<T> out, Tokens tokens, Mat<const T> wte) {
  gather_rows<T>("embedding_forward", out, wte, tokens);
}

// dwte (V, C) += sum over i with tokens(i) = v of dout(i, :)
// One thread per block of channels walks the tokens in order.
template <class T>
void embedding_backward(Mat<T> dwte, Mat<const T> dout, Tokens tokens) {
  const int64_t N = dout.extent(0), C = dout.extent(1);
  constexpr int64_t kChunk = 32;
  Kokkos::parallel_for(
      "embedding_backward", Kokkos::RangePolicy<ExecSpace>(0, (C + kChunk - 1) / kChunk), KOKKOS_LAMBDA(int64_t chunk) {
        const int64_t c0 = chunk * kChunk, n = C - c0 < kChunk ? C - c0 : kChunk;
        for (int64_t i = 0; i < N; ++i) {
          T* dst = &dwte(tokens(i), c0);
          const T* src = &dout(i, c0);
#pragma omp simd
          for (int64_t c = 0; c < n; ++c) dst[c] += src[c];
        }
      });
}

// out (B*T): the sequence shifted left by `shift` within each row of
// `tokens` (B*T), `fill` where it runs past the end.
inline void shift_tokens(Kokkos::View<int32_t*, MemSpace> out, Tokens tokens, int64_t Tn, int64_t shift, int32_t fill) {
  Kokkos::parallel_for(
      "shift_tokens", Kokkos::RangePolicy<ExecSpace>(0, out.extent(0)), KOKKOS_LAMBDA(int64_t i) {
        const int64_t t = i % Tn;
        out(i) = t + shift < Tn ? tokens(i + shift) : fill;
      });
}

}  // namespace xx::kernels

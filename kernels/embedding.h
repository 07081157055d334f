// Token embedding lookup. The backward is a scatter-add made deterministic
// without atomics: each team owns a block of channels and walks the tokens in order.
// Parameter gradients accumulate (+=); activation gradients are written (=).
#pragma once
#include "core/views.h"
#include "kernels/elementwise.h"
#include "kernels/team.h"

namespace xx::kernels {

// out (N, C) = wte[tokens];   wte (V, C)
template <class T>
void embedding_forward(Mat<T> out, Tokens tokens, Mat<const T> wte) {
  gather_rows<T>("embedding::forward", out, wte, tokens);
}

// dwte (V, C) += sum over i with tokens(i) = v of dout(i, :)
// A team per block of channels walks the tokens in order (kernels/team.h,
// column_rows): each entry of dwte gets its tokens' rows in token order.
template <class T>
void embedding_backward(Mat<T> dwte, Mat<const T> dout, Tokens tokens) {
  const int64_t N = dout.extent(0), C = dout.extent(1);
  Kokkos::parallel_for(
      "embedding::backward", column_policy(C), KOKKOS_LAMBDA(const TeamMember& m) {
        column_rows(m, N, C, [&](int64_t i, int64_t c) { dwte(tokens(i), c) += dout(i, c); });
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

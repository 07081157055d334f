// Rotary position embedding fused with the split of the QKV projection into
// heads. Pairs (2i, 2i+1) of each head are rotated by angle t * theta^(-2i/D),
// the interleaved convention of the DeepSeek and Llama reference models.
// Activation gradients are written (=).
#pragma once
#include <cmath>
#include "core/views.h"

namespace xx::kernels {

// cos, sin (T, D/2), computed in double on the host, then copied.
template <class T>
void rope_tables(Mat<T> cos_t, Mat<T> sin_t, double theta) {
  const int64_t Tn = cos_t.extent(0), half = cos_t.extent(1);
  auto hc = Kokkos::create_mirror_view(cos_t);
  auto hs = Kokkos::create_mirror_view(sin_t);
  for (int64_t t = 0; t < Tn; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const double angle = double(t) * std::pow(theta, -double(2 * i) / double(2 * half));
      hc(t, i) = T(std::cos(angle));
      hs(t, i) = T(std::sin(angle));
    }
  Kokkos::deep_copy(cos_t, hc);
  Kokkos::deep_copy(sin_t, hs);
}

// q, k, v (B*H*T, D) head-major; qkv (B*T, 3*H*D) as [q | k | v] per token.
template <class T>
void split_heads_rope_forward(Mat<T> q, Mat<T> k, Mat<T> v, Mat<const T> qkv, Mat<const T> cos_t,
                              Mat<const T> sin_t, int64_t B, int64_t Tn, int64_t H) {
  const int64_t D = q.extent(1), C = H * D;
  Kokkos::parallel_for(
      "split_heads_rope_forward", Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>>({0, 0}, {B * H * Tn, D / 2}),
      KOKKOS_LAMBDA(int64_t row, int64_t i) {
        const int64_t t = row % Tn, h = (row / Tn) % H, b = row / (Tn * H);
        const int64_t src = b * Tn + t, col = h * D + 2 * i;
        const T c = cos_t(t, i), s = sin_t(t, i);
        const T q0 = qkv(src, col), q1 = qkv(src, col + 1);
        const T k0 = qkv(src, C + col), k1 = qkv(src, C + col + 1);
        q(row, 2 * i) = q0 * c - q1 * s;
        q(row, 2 * i + 1) = q0 * s + q1 * c;
        k(row, 2 * i) = k0 * c - k1 * s;
        k(row, 2 * i + 1) = k0 * s + k1 * c;
        v(row, 2 * i) = qkv(src, 2 * C + col);
        v(row, 2 * i + 1) = qkv(src, 2 * C + col + 1);
      });
}

// dqkv (B*T, 3C) from dq, dk, dv (B*H*T, D): the inverse rotation.
template <class T>
void split_heads_rope_backward(Mat<T> dqkv, Mat<const T> dq, Mat<const T> dk, Mat<const T> dv,
                               Mat<const T> cos_t, Mat<const T> sin_t, int64_t B, int64_t Tn, int64_t H) {
  const int64_t D = dq.extent(1), C = H * D;
  Kokkos::parallel_for(
      "split_heads_rope_backward", Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>>({0, 0}, {B * H * Tn, D / 2}),
      KOKKOS_LAMBDA(int64_t row, int64_t i) {
        const int64_t t = row % Tn, h = (row / Tn) % H, b = row / (Tn * H);
        const int64_t dst = b * Tn + t, col = h * D + 2 * i;
        const T c = cos_t(t, i), s = sin_t(t, i);
        const T q0 = dq(row, 2 * i), q1 = dq(row, 2 * i + 1);
        const T k0 = dk(row, 2 * i), k1 = dk(row, 2 * i + 1);
        dqkv(dst, col) = q0 * c + q1 * s;
        dqkv(dst, col + 1) = -q0 * s + q1 * c;
        dqkv(dst, C + col) = k0 * c + k1 * s;
        dqkv(dst, C + col + 1) = -k0 * s + k1 * c;
        dqkv(dst, 2 * C + col) = dv(row, 2 * i);
        dqkv(dst, 2 * C + col + 1) = dv(row, 2 * i + 1);
      });
}

}  // namespace xx::kernels

// Rotary position embedding fused with the split of the QKV projection into
// heads. Pairs (2i, 2i+1) of each head are rotated by angle t * inv_freq[i],
// the interleaved convention of the DeepSeek and Llama reference models:
// index i of the tables is frequency i, pair i. The plain embedding's
// frequencies are theta^(-2i/D); YaRN (deck `rope_scaling yarn`) blends them
// with theta^(-2i/D) / factor and multiplies the tables by its mscale, both
// from one owner (model/attention.h rope_frequencies), for training and decoding.
// Activation gradients are written (=).
// Team-shaped (kernels/team.h): a row per team thread, the pairs its vector lanes.
#pragma once
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>
#include "core/device_memory.h"
#include "core/views.h"
#include "kernels/team.h"

namespace xx::kernels {

// The frequency of each pair i < D/2, and the factor the cos and sin tables
// are multiplied by (1 for the plain embedding).
struct RopeFrequencies {
  std::vector<double> inv_freq;  // (D/2)
  double table_scale = 1;
};

// theta^(-2i/D), i < D/2: the plain rotary embedding's frequencies.
inline std::vector<double> rope_inverse_frequencies(double theta, int64_t D) {
  std::vector<double> f(size_t(D / 2));
  for (int64_t i = 0; i < D / 2; ++i) f[size_t(i)] = std::pow(theta, -double(2 * i) / double(D));
  return f;
}

// cos, sin (T, D/2): cos and sin of t * inv_freq[i], times table_scale,
// computed in double on the host, then copied.
template <class T>
void rope_tables(Mat<T> cos_t, Mat<T> sin_t, const RopeFrequencies& f) {
  const int64_t Tn = cos_t.extent(0), half = cos_t.extent(1);
  if (f.inv_freq.size() != size_t(half))
    throw std::logic_error("rope_tables: " + std::to_string(f.inv_freq.size()) + " frequencies for tables of " +
                           std::to_string(half) + " pairs");
  auto hc = host_staging(cos_t);
  auto hs = host_staging(sin_t);
  for (int64_t t = 0; t < Tn; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const double angle = double(t) * f.inv_freq[size_t(i)];
      hc(t, i) = T(std::cos(angle) * f.table_scale);
      hs(t, i) = T(std::sin(angle) * f.table_scale);
    }
  Kokkos::deep_copy(cos_t, hc);
  Kokkos::deep_copy(sin_t, hs);
}

// q, k, v (B*H*T, D) head-major; qkv (B*T, 3*H*D) as [q | k | v] per token.
// One (batch, head, position) row per team thread, pairs in its vector lanes.
template <class T>
void split_heads_rope_forward(Mat<T> q, Mat<T> k, Mat<T> v, Mat<const T> qkv, Mat<const T> cos_t,
                              Mat<const T> sin_t, int64_t B, int64_t Tn, int64_t H) {
  const int64_t D = q.extent(1), C = H * D, rows = B * H * Tn;
  Kokkos::parallel_for(
      "rope::split_heads_forward", row_policy(rows), KOKKOS_LAMBDA(const TeamMember& m) {
        for_rows(m, rows, [&](int64_t row) {
          const int64_t t = row % Tn, h = (row / Tn) % H, b = row / (Tn * H);
          const T* src = &qkv(b * Tn + t, h * D);
          const T *c = &cos_t(t, 0), *s = &sin_t(t, 0);
          T *qr = &q(row, 0), *kr = &k(row, 0), *vr = &v(row, 0);
          row_for(m, D / 2, [&](int64_t i) {
            const T q0 = src[2 * i], q1 = src[2 * i + 1], k0 = src[C + 2 * i], k1 = src[C + 2 * i + 1];
            qr[2 * i] = q0 * c[i] - q1 * s[i];
            qr[2 * i + 1] = q0 * s[i] + q1 * c[i];
            kr[2 * i] = k0 * c[i] - k1 * s[i];
            kr[2 * i + 1] = k0 * s[i] + k1 * c[i];
          });
          row_for(m, D, [&](int64_t d) { vr[d] = src[2 * C + d]; });
        });
      });
}

// dqkv (B*T, 3C) from dq, dk, dv (B*H*T, D): the inverse rotation.
template <class T>
void split_heads_rope_backward(Mat<T> dqkv, Mat<const T> dq, Mat<const T> dk, Mat<const T> dv,
                               Mat<const T> cos_t, Mat<const T> sin_t, int64_t B, int64_t Tn, int64_t H) {
  const int64_t D = dq.extent(1), C = H * D, rows = B * H * Tn;
  Kokkos::parallel_for(
      "rope::split_heads_backward", row_policy(rows), KOKKOS_LAMBDA(const TeamMember& m) {
        for_rows(m, rows, [&](int64_t row) {
          const int64_t t = row % Tn, h = (row / Tn) % H, b = row / (Tn * H);
          T* dst = &dqkv(b * Tn + t, h * D);
          const T *c = &cos_t(t, 0), *s = &sin_t(t, 0);
          const T *qr = &dq(row, 0), *kr = &dk(row, 0), *vr = &dv(row, 0);
          row_for(m, D / 2, [&](int64_t i) {
            const T q0 = qr[2 * i], q1 = qr[2 * i + 1], k0 = kr[2 * i], k1 = kr[2 * i + 1];
            dst[2 * i] = q0 * c[i] + q1 * s[i];
            dst[2 * i + 1] = -q0 * s[i] + q1 * c[i];
            dst[C + 2 * i] = k0 * c[i] + k1 * s[i];
            dst[C + 2 * i + 1] = -k0 * s[i] + k1 * c[i];
          });
          row_for(m, D, [&](int64_t d) { dst[2 * C + d] = vr[d]; });
        });
      });
}

}  // namespace xx::kernels

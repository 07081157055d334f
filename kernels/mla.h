// Multi-head latent attention (DeepSeek-V2/V3): the split of the projected
// queries and keys/values into heads, with rotary embedding on the rope part
// only. Each head's query is [q_nope | rope(q_rope)], its key
// [k_nope | rope(k_rope)] where k_rope is one vector shared by all heads, and
// its value comes from the same up-projection as k_nope.
// Activation gradients are written (=).
// Team-shaped (kernels/team.h): a row per team thread, channels in its vector lanes.
#pragma once
#include "core/views.h"
#include "kernels/team.h"

namespace xx::kernels {

struct MlaDims {
  int64_t heads, nope, rope, v;  // H, qk_nope_dim, rope_dim, v_dim
  int64_t qk() const { return nope + rope; }
};

// qh, kh (B*H*T, nope+rope), vh (B*H*T, v) from
//   q (B*T, H*(nope+rope)), kv (B*T, H*(nope+v)), k_rope (B*T, rope); cos, sin (T, rope/2)
// One (batch, head, position) row per team thread, channels in its vector lanes.
template <class T>
void mla_split_heads_forward(Mat<T> qh, Mat<T> kh, Mat<T> vh, Mat<const T> q, Mat<const T> kv, Mat<const T> k_rope,
                             Mat<const T> cos_t, Mat<const T> sin_t, int64_t B, int64_t Tn, MlaDims m) {
  const int64_t H = m.heads, qk = m.qk(), nope = m.nope, half = m.rope / 2, vd = m.v, rows = B * H * Tn;
  Kokkos::parallel_for(
      "mla::split_heads_forward", row_policy(rows), KOKKOS_LAMBDA(const TeamMember& tm) {
        for_rows(tm, rows, [&](int64_t row) {
          const int64_t t = row % Tn, h = (row / Tn) % H, b = row / (Tn * H), src = b * Tn + t;
          const int64_t qcol = h * qk, kvcol = h * (nope + vd);
          row_for(tm, nope, [&](int64_t d) {
            qh(row, d) = q(src, qcol + d);
            kh(row, d) = kv(src, kvcol + d);
          });
          row_for(tm, half, [&](int64_t i) {
            const T c = cos_t(t, i), s = sin_t(t, i);
            const T q0 = q(src, qcol + nope + 2 * i), q1 = q(src, qcol + nope + 2 * i + 1);
            const T k0 = k_rope(src, 2 * i), k1 = k_rope(src, 2 * i + 1);
            qh(row, nope + 2 * i) = q0 * c - q1 * s;
            qh(row, nope + 2 * i + 1) = q0 * s + q1 * c;
            kh(row, nope + 2 * i) = k0 * c - k1 * s;
            kh(row, nope + 2 * i + 1) = k0 * s + k1 * c;
          });
          row_for(tm, vd, [&](int64_t d) { vh(row, d) = kv(src, kvcol + nope + d); });
        });
      });
}

// dq (B*T, H*(nope+rope)), dkv (B*T, H*(nope+v)), dk_rope (B*T, rope) from dqh, dkh, dvh.
// One token per team thread; the shared rope key sums its gradient over the
// heads, in head order (each pair stays with one lane across the heads).
template <class T>
void mla_split_heads_backward(Mat<T> dq, Mat<T> dkv, Mat<T> dk_rope, Mat<const T> dqh, Mat<const T> dkh,
                              Mat<const T> dvh, Mat<const T> cos_t, Mat<const T> sin_t, int64_t B, int64_t Tn,
                              MlaDims m) {
  const int64_t H = m.heads, qk = m.qk(), nope = m.nope, half = m.rope / 2, vd = m.v, tokens = B * Tn;
  Kokkos::parallel_for(
      "mla::split_heads_backward", row_policy(tokens), KOKKOS_LAMBDA(const TeamMember& tm) {
        for_rows(tm, tokens, [&](int64_t src) {
          const int64_t b = src / Tn, t = src % Tn;
          row_for(tm, 2 * half, [&](int64_t i) { dk_rope(src, i) = T(0); });
          for (int64_t h = 0; h < H; ++h) {
            const int64_t row = (b * H + h) * Tn + t, qcol = h * qk, kvcol = h * (nope + vd);
            row_for(tm, nope, [&](int64_t d) {
              dq(src, qcol + d) = dqh(row, d);
              dkv(src, kvcol + d) = dkh(row, d);
            });
            row_for(tm, half, [&](int64_t i) {
              const T c = cos_t(t, i), s = sin_t(t, i);
              const T q0 = dqh(row, nope + 2 * i), q1 = dqh(row, nope + 2 * i + 1);
              const T k0 = dkh(row, nope + 2 * i), k1 = dkh(row, nope + 2 * i + 1);
              dq(src, qcol + nope + 2 * i) = q0 * c + q1 * s;
              dq(src, qcol + nope + 2 * i + 1) = -q0 * s + q1 * c;
              dk_rope(src, 2 * i) += k0 * c + k1 * s;
              dk_rope(src, 2 * i + 1) += -k0 * s + k1 * c;
            });
            row_for(tm, vd, [&](int64_t d) { dkv(src, kvcol + nope + d) = dvh(row, d); });
          }
        });
      });
}

}  // namespace xx::kernels

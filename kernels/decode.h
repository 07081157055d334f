// Inference kernels: one new token attends to a KV cache (src/model/decoder.h).
// Forward only: generation never differentiates. Team-shaped
// (kernels/team.h): a team row per head, its cached positions (for scores)
// or channels (for outputs) in the vector lanes; each lane's sums run in
// the order the one-thread-per-head loops had. A lane loop ends with its
// writes visible to the row's other lanes (Kokkos syncs the vector), which
// the next loop reads.
//   MHA: the cache holds every past position's rotated keys and values,
//        k, v (L, H*D), (L, H*Dv); 2*H*D numbers per token and layer.
//   MLA: the cache holds only the normed latent (L, R) and the shared rotated
//        rope key (L, P); R + P numbers per token and layer. The up-projection
//        is absorbed: the query's nope part is mapped into latent space once,
//        q_lat = q_nope . Wk_h (R), so scores are q_lat . c_j + q_rope . kr_j,
//        and the output leaves latent space after the weighted sum,
//        o_h = Wv_h . sum_j p_j c_j. No key or value is ever expanded.
#pragma once
#include <cmath>
#include "core/views.h"
#include "kernels/math.h"
#include "kernels/team.h"

namespace xx::kernels {

// x (rows, 2*half) rotated in place by position pos: pairs (2i, 2i+1), as
// kernels/rope.h; cos_t, sin_t (T, half) are the training tables.
template <class T>
void rope_rotate_rows(Mat<T> x, Mat<const T> cos_t, Mat<const T> sin_t, int64_t pos, int64_t col0, int64_t half) {
  const int64_t rows = x.extent(0);
  Kokkos::parallel_for(
      "decode::rope", row_policy(rows), KOKKOS_LAMBDA(const TeamMember& m) {
        for_rows(m, rows, [&](int64_t r) {
          row_for(m, half, [&](int64_t i) {
            const T c = cos_t(pos, i), s = sin_t(pos, i);
            const T a = x(r, col0 + 2 * i), b = x(r, col0 + 2 * i + 1);
            x(r, col0 + 2 * i) = a * c - b * s;
            x(r, col0 + 2 * i + 1) = a * s + b * c;
          });
        });
      });
}

// Softmax over the first n entries of one team row, in place (max-subtracted).
template <class Member, class T>
KOKKOS_INLINE_FUNCTION void softmax_prefix(const Member& m, T* row, int64_t n) {
  const T top = row_max(m, n, [&](int64_t j) { return row[j]; });
  const T sum = row_sum_ordered(m, n, [&](int64_t j) { return row[j] = exp_of(row[j] - top); });
  const T inv = T(1) / sum;
  row_for(m, n, [&](int64_t j) { row[j] *= inv; });
}

// out (1, H*Dv) = per head softmax(q k^T scale) v over cached positions [0, len);
// scale: the model's attention_score_scale (model/attention.h), as in training.
// q (H, D) this token's rotated query; k (L, H*D), v (L, H*Dv); p (H, L) scratch.
template <class T>
void mha_decode_attention(Mat<T> out, Mat<const T> q, Mat<const T> k, Mat<const T> v, Mat<T> p, int64_t len,
                          T scale) {
  const int64_t H = q.extent(0), D = q.extent(1), Dv = v.extent(1) / H;
  Kokkos::parallel_for(
      "decode::mha_attention", row_policy(H), KOKKOS_LAMBDA(const TeamMember& m) {
        for_rows(m, H, [&](int64_t h) {
          T* ph = &p(h, 0);
          row_for(m, len, [&](int64_t j) {
            T s = 0;
            for (int64_t d = 0; d < D; ++d) s += q(h, d) * k(j, h * D + d);
            ph[j] = s * scale;
          });
          softmax_prefix(m, ph, len);
          row_for(m, Dv, [&](int64_t d) {
            T o = 0;
            for (int64_t j = 0; j < len; ++j) o += ph[j] * v(j, h * Dv + d);
            out(0, h * Dv + d) = o;
          });
        });
      });
}

// MLA with the absorbed up-projection (top of file).
//   out (1, H*Dv); q (1, H*(N+P)) this token's query, rope part rotated;
//   c (L, R) normed latents, kr (L, P) rotated rope keys;
//   wkv_b (H*(N+Dv), R): per head N rows of Wk then Dv rows of Wv;
//   scratch: p (H, L), lat (H, 2*R) for q_lat and the weighted latent;
//   scale: the model's attention_score_scale (model/attention.h), as in training.
template <class T>
void mla_decode_attention(Mat<T> out, Mat<const T> q, Mat<const T> c, Mat<const T> kr, Mat<const T> wkv_b, Mat<T> p,
                          Mat<T> lat, int64_t len, int64_t H, int64_t N, int64_t P, int64_t Dv, T scale) {
  const int64_t R = c.extent(1), QK = N + P;
  Kokkos::parallel_for(
      "decode::mla_attention", row_policy(H), KOKKOS_LAMBDA(const TeamMember& m) {
        for_rows(m, H, [&](int64_t h) {
          T* ql = &lat(h, 0);
          T* ol = &lat(h, R);
          const int64_t wk = h * (N + Dv), wv = wk + N;
          row_for(m, R, [&](int64_t r) {  // q_lat(r), summed over i in order
            T acc = 0;
            for (int64_t i = 0; i < N; ++i) acc += q(0, h * QK + i) * wkv_b(wk + i, r);
            ql[r] = acc;
          });
          T* ph = &p(h, 0);
          row_for(m, len, [&](int64_t j) {
            T s = 0;
            for (int64_t r = 0; r < R; ++r) s += ql[r] * c(j, r);
            for (int64_t i = 0; i < P; ++i) s += q(0, h * QK + N + i) * kr(j, i);
            ph[j] = s * scale;
          });
          softmax_prefix(m, ph, len);
          row_for(m, R, [&](int64_t r) {  // the weighted latent, summed over positions in order
            T acc = 0;
            for (int64_t j = 0; j < len; ++j) acc += ph[j] * c(j, r);
            ol[r] = acc;
          });
          row_for(m, Dv, [&](int64_t d) {
            T o = 0;
            for (int64_t r = 0; r < R; ++r) o += wkv_b(wv + d, r) * ol[r];
            out(0, h * Dv + d) = o;
          });
        });
      });
}

}  // namespace xx::kernels

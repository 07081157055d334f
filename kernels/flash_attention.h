// Causal self-attention that never holds the T x T probabilities: tiled,
// with an online softmax (the idea of FlashAttention, Dao et al. 2022).
// Query block i meets key blocks j <= i, Bk rows each (CausalBlocks); every
// GEMM runs once per block pair over all BH heads (gemm_batched). Per row the
// forward keeps only the log-sum-exp of its scaled scores; the backward
// recomputes each block's probabilities from it. Memory: BH * T values kept
// (against BH * T^2 / 2 for kernels/attention.h) and BH * Bk * (2 Bk + 2) of
// scratch, whatever T.
//
// Forward, for each query block i:
//   1. m = -inf, l = 0, O_i = 0                       (running max, sum, output)
//   2. for j = 0..i: S = scale Q_i K_j^T; m' = max(m, rowmax S);
//      P = exp(S - m'); l = l exp(m - m') + rowsum P; O_i = O_i exp(m - m') + P V_j
//   3. O_i /= l; lse = m + log l
// Backward, with D = rowsum(dO o O) per row (flash_attention_delta):
//   for each i, for j = 0..i: P = exp(scale Q_i K_j^T - lse); dV_j += P^T dO_i;
//   dP = dO_i V_j^T; dS = P o (dP - D) scale; dQ_i += dS K_j; dK_j += dS^T Q_i.
// Deterministic: the loops run in this fixed order and every sum is one
// thread's or one GEMM's; no atomics. Only the diagonal blocks mask.
// Under mixed precision q, k, v and dO are 16-bit GEMM inputs, and P and dS
// are packed to 16 bits before the GEMMs that read them (as the packed kernel
// keeps its probabilities); m, l, lse, S, dP and the outputs stay in T.
// Team-shaped (kernels/team.h): every row kernel is a team row per (head,
// query), its keys or channels the vector lanes.
// Parameter gradients accumulate (+=); activation gradients are written (=).
#pragma once
#include <cmath>
#include "core/views.h"
#include "kernels/attention.h"
#include "kernels/gemm.h"
#include "kernels/math.h"
#include "kernels/team.h"

namespace xx::kernels {

// Elements of T the scratch of both passes needs: two (Bk, Bk) blocks per head
// (scores or probabilities, and dP) and two values per row (m, l).
inline int64_t flash_scratch_size(int64_t BH, int64_t block) { return BH * block * (2 * block + 2); }

// Head 0's (rows, cols) block as a batched GEMM's operand, where `in` holds
// every head's block back to back (BH*rows rows; head h's is h*rows*cols on).
template <class T>
GemmIn<T> per_head(GemmIn<T> in, int64_t rows) {
  in.rows = rows;
  return in;
}

// Rows of a query block, head by head: s (BH*rows, cols) holds scaled scores
// of queries r0.., keys c0.. (`diagonal`: c0 == r0, keys past the query are
// masked). m and l (BH*rows) carry the running max and sum; o is the head
// output (BH*T, Dv), whose rows r0.. are rescaled to the new max. On return s
// holds exp(S - m_new), zero where masked.
template <class T>
void flash_online_softmax(Mat<T> s, Vec<T> m, Vec<T> l, Mat<T> o, int64_t r0, int64_t rows, int64_t Tn, bool diagonal) {
  const int64_t cols = s.extent(1), Dv = o.extent(1), n = s.extent(0);
  Kokkos::parallel_for(
      "attention::flash_online_softmax", row_policy(n), KOKKOS_LAMBDA(const TeamMember& tm) {
        for_rows(tm, n, [&](int64_t hr) {
          const int64_t bh = hr / rows, r = hr % rows, valid = diagonal ? r + 1 : cols;
          T* row = &s(hr, 0);
          const T before = m(hr), block_top = row_max(tm, valid, [&](int64_t c) { return row[c]; });
          const T top = block_top > before ? block_top : before;  // a max is exact: any order gives it
          const T shrink = exp_of(before - top);  // 0 on the first block (m = -inf)
          const T sum = row_sum(tm, valid, [&](int64_t c) {
            const T e = exp_of(row[c] - top);
            row[c] = e;
            return e;
          });
          row_for(tm, cols - valid, [&](int64_t c) { row[valid + c] = T(0); });
          T* orow = &o(bh * Tn + r0 + r, 0);
          row_for(tm, Dv, [&](int64_t d) { orow[d] *= shrink; });
          const T kept = l(hr) * shrink + sum;
          row_single(tm, [&] { m(hr) = top, l(hr) = kept; });
        });
      });
}

// out (BH*T, Dv), lse (BH*T) from q, k (BH*T, D) and v (BH*T, Dv), head-major;
// scores scaled by 1/sqrt(D); scratch >= flash_scratch_size(BH, blocks.block).
template <class T>
void flash_attention_forward(Mat<T> out, Vec<T> lse, GemmIn<T> q, GemmIn<T> k, GemmIn<T> v, Vec<T> scratch,
                             const CausalBlocks& blocks, int64_t BH) {
  const int64_t Tn = blocks.seq, D = q.cols, Dv = v.cols, Bk = blocks.block;
  const T scale = T(1) / T(std::sqrt(double(D)));
  T* s = scratch.data();
  Vec<T> m(s + BH * Bk * Bk, BH * Bk), l(s + BH * Bk * Bk + BH * Bk, BH * Bk);
  for (int64_t i = 0; i < blocks.count; ++i) {
    const int64_t r0 = i * Bk, rows = blocks.rows(i);
    Kokkos::parallel_for(
        "attention::flash_start", row_policy(BH * rows), KOKKOS_LAMBDA(const TeamMember& tm) {
          for_rows(tm, BH * rows, [&](int64_t hr) {
            T* orow = &out((hr / rows) * Tn + r0 + hr % rows, 0);
            row_for(tm, Dv, [&](int64_t d) { orow[d] = T(0); });
            row_single(tm, [&] { m(hr) = -kmath::infinity<T>(), l(hr) = T(0); });
          });
        });
    const GemmIn<T> qi = q.rows_from(r0, rows);
    for (int64_t j = 0; j <= i; ++j) {
      const int64_t c0 = j * Bk, cols = blocks.rows(j);
      Mat<T> sij(s, rows, cols);  // head 0's block; head h's is rows * cols further
      gemm_batched<T>("N", qi, "T", k.rows_from(c0, cols), scale, T(0), sij,
                      {BH, Tn * D, Tn * D, rows * cols});
      flash_online_softmax<T>(Mat<T>(s, BH * rows, cols), m, l, out, r0, rows, Tn, i == j);
      const GemmIn<T> p = per_head(as_gemm_input_like<T>(Mat<const T>(s, BH * rows, cols), q, 2), rows);
      gemm_batched<T>("N", p, "N", v.rows_from(c0, cols), T(1), T(1),
                      Mat<T>(out.data() + r0 * Dv, rows, Dv), {BH, rows * cols, Tn * Dv, Tn * Dv});
    }
    Kokkos::parallel_for(
        "attention::flash_finish", row_policy(BH * rows), KOKKOS_LAMBDA(const TeamMember& tm) {
          for_rows(tm, BH * rows, [&](int64_t hr) {
            const int64_t row = (hr / rows) * Tn + r0 + hr % rows;
            const T inv = T(1) / l(hr);
            T* orow = &out(row, 0);
            row_for(tm, Dv, [&](int64_t d) { orow[d] *= inv; });
            row_single(tm, [&] { lse(row) = m(hr) + kmath::log(l(hr)); });
          });
        });
  }
}

// delta (BH*T) = rowsum(dO o O) per head row, from dout and out in the merged
// layout (B*T, H*Dv): out as the model keeps it (16-bit under mixed precision).
template <class T>
void flash_attention_delta(Vec<T> delta, Mat<const T> dout, GemmIn<T> out, int64_t B, int64_t Tn, int64_t H) {
  const int64_t Dv = dout.extent(1) / H, width = dout.extent(1);
  const T* o = out.values;
  const uint16_t* half = out.half;
  const Precision type = out.type;
  const int64_t rows = B * H * Tn;
  Kokkos::parallel_for(
      "attention::flash_delta", row_policy(rows), KOKKOS_LAMBDA(const TeamMember& tm) {
        for_rows(tm, rows, [&](int64_t row) {
          const int64_t b = row / (H * Tn), h = (row / Tn) % H, t = row % Tn;
          const int64_t at = (b * Tn + t) * width + h * Dv;
          const T* drow = &dout(b * Tn + t, h * Dv);
          const T sum = half ? row_sum(tm, Dv, [&](int64_t d) { return drow[d] * T(half_bits_to_float(half[at + d], type)); })
                             : row_sum(tm, Dv, [&](int64_t d) { return drow[d] * o[at + d]; });
          row_single(tm, [&] { delta(row) = sum; });
        });
      });
}

// s (BH*rows, cols) = exp(s - lse) of queries r0.., zero where masked.
template <class T>
void flash_probabilities(Mat<T> s, Vec<const T> lse, int64_t r0, int64_t rows, int64_t Tn, bool diagonal) {
  const int64_t cols = s.extent(1), n = s.extent(0);
  Kokkos::parallel_for(
      "attention::flash_probabilities", row_policy(n), KOKKOS_LAMBDA(const TeamMember& tm) {
        for_rows(tm, n, [&](int64_t hr) {
          const int64_t r = hr % rows, valid = diagonal ? r + 1 : cols;
          const T top = lse((hr / rows) * Tn + r0 + r);
          T* row = &s(hr, 0);
          row_for(tm, valid, [&](int64_t c) { row[c] = exp_of(row[c] - top); });
          row_for(tm, cols - valid, [&](int64_t c) { row[valid + c] = T(0); });
        });
      });
}

// dp (BH*rows, cols) <- p o (dp - delta) scale, in place: the scores' gradient.
template <class T>
void flash_score_gradient(Mat<T> dp, Mat<const T> p, Vec<const T> delta, int64_t r0, int64_t rows, int64_t Tn,
                          T scale) {
  const int64_t cols = dp.extent(1), n = dp.extent(0);
  Kokkos::parallel_for(
      "attention::flash_score_gradient", row_policy(n), KOKKOS_LAMBDA(const TeamMember& tm) {
        for_rows(tm, n, [&](int64_t hr) {
          const T dot = delta((hr / rows) * Tn + r0 + hr % rows);
          T* drow = &dp(hr, 0);
          const T* prow = &p(hr, 0);
          row_for(tm, cols, [&](int64_t c) { drow[c] = prow[c] * (drow[c] - dot) * scale; });
        });
      });
}

// dq, dk (BH*T, D), dv (BH*T, Dv) = gradients, from dout (BH*T, Dv), delta
// and lse (BH*T) and the forward's inputs; scratch as the forward's.
template <class T>
void flash_attention_backward(Mat<T> dq, Mat<T> dk, Mat<T> dv, Vec<T> scratch, Mat<const T> dout, Vec<const T> delta,
                              Vec<const T> lse, GemmIn<T> q, GemmIn<T> k, GemmIn<T> v, const CausalBlocks& blocks,
                              int64_t BH) {
  const int64_t Tn = blocks.seq, D = q.cols, Dv = v.cols, Bk = blocks.block;
  const T scale = T(1) / T(std::sqrt(double(D)));
  Kokkos::deep_copy(dq, T(0));
  Kokkos::deep_copy(dk, T(0));
  Kokkos::deep_copy(dv, T(0));
  const GemmIn<T> dO = as_gemm_input_like<T>(dout, q, 1);  // 16 bits once, when q is
  T* s = scratch.data();
  T* dp = s + BH * Bk * Bk;
  for (int64_t i = 0; i < blocks.count; ++i) {
    const int64_t r0 = i * Bk, rows = blocks.rows(i);
    const GemmIn<T> qi = q.rows_from(r0, rows);
    const GemmIn<T> doi = dO.rows_from(r0, rows);
    for (int64_t j = 0; j <= i; ++j) {
      const int64_t c0 = j * Bk, cols = blocks.rows(j);
      const GemmIn<T> kj = k.rows_from(c0, cols);
      const GemmIn<T> vj = v.rows_from(c0, cols);
      const GemmBatch scores{BH, Tn * D, Tn * D, rows * cols}, values{BH, Tn * Dv, Tn * Dv, rows * cols};
      gemm_batched<T>("N", qi, "T", kj, scale, T(0), Mat<T>(s, rows, cols), scores);  // S = scale Q K^T
      flash_probabilities<T>(Mat<T>(s, BH * rows, cols), lse, r0, rows, Tn, i == j);  // P = exp(S - lse)
      const GemmIn<T> p = per_head(as_gemm_input_like<T>(Mat<const T>(s, BH * rows, cols), q, 2), rows);
      gemm_batched<T>("T", p, "N", doi, T(1), T(1), Mat<T>(dv.data() + c0 * Dv, cols, Dv),
                      {BH, rows * cols, Tn * Dv, Tn * Dv});  // dV_j += P^T dO_i
      gemm_batched<T>("N", doi, "T", vj, T(1), T(0), Mat<T>(dp, rows, cols), values);  // dP = dO_i V_j^T
      flash_score_gradient<T>(Mat<T>(dp, BH * rows, cols), Mat<const T>(s, BH * rows, cols), delta, r0, rows, Tn,
                              scale);  // dS = P (dP - D) scale
      const GemmIn<T> ds = per_head(as_gemm_input_like<T>(Mat<const T>(dp, BH * rows, cols), q, 3), rows);
      gemm_batched<T>("N", ds, "N", kj, T(1), T(1), Mat<T>(dq.data() + r0 * D, rows, D),
                      {BH, rows * cols, Tn * D, Tn * D});  // dQ_i += dS K_j
      gemm_batched<T>("T", ds, "N", qi, T(1), T(1), Mat<T>(dk.data() + c0 * D, cols, D),
                      {BH, rows * cols, Tn * D, Tn * D});  // dK_j += dS^T Q_i
    }
  }
}

}  // namespace xx::kernels

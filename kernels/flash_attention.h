// Causal self-attention that never holds the T x T probabilities: tiled,
// with an online softmax (the idea of FlashAttention, Dao et al. 2022).
// Keys come in blocks of Bk rows (CausalBlocks). Key block j meets every
// query at or after its first row, so each GEMM takes one key block against
// all those queries of every head at once: Q[j Bk, T) K_j^T over BH heads is
// one batched GEMM (at most kFlashSpan query rows per call, to bound the
// scratch). Per layer that is T/Bk steps of two GEMMs forward and five
// backward, not one call per block pair. Per row the forward keeps only the
// log-sum-exp of its scaled scores; the backward recomputes the
// probabilities from it. Memory: BH * T values kept (against BH * T^2 / 2 for
// kernels/attention_packed.h) and flash_scratch_size of scratch, linear in T.
//
// Forward, for each query row: m = -inf, l = 0, O = 0; then for each key
// block j = 0, 1, ... up to its own, in that order:
//   S = scale Q K_j^T; m' = max(m, rowmax S); P = exp(S - m');
//   l = l exp(m - m') + rowsum P; O = O exp(m - m') + P V_j
// and last O /= l, lse = m + log l.
// Backward, with D = rowsum(dO o O) per row (flash_attention_delta), for each
// key block j over the queries at or after it: P = exp(scale Q K_j^T - lse);
// dV_j += P^T dO; dP = dO V_j^T; dS = P o (dP - D) scale; dQ += dS K_j;
// dK_j += dS^T Q.
// Deterministic: the loops run in this fixed order and every sum is one
// thread's or one GEMM's; no atomics. Only a key block's first Bk query rows
// mask (keys past the query).
// Under mixed precision q, k, v and dO are 16-bit GEMM inputs, and P and dS
// are packed to 16 bits before the GEMMs that read them (as the packed kernel
// keeps its probabilities); m, l, lse, S, dP and the outputs stay in T.
// Team-shaped (kernels/team.h): every row kernel is a team row per (head,
// query), its keys or channels the vector lanes.
// Parameter gradients accumulate (+=); activation gradients are written (=).
#pragma once
#include <cmath>
#include "core/views.h"
#include "kernels/attention_packed.h"
#include "kernels/gemm.h"
#include "kernels/math.h"
#include "kernels/team.h"

namespace xx::kernels {

// Query rows per GEMM call: a key block meets at most this many queries of
// every head at once (T may be far longer), which bounds the scratch.
constexpr int64_t kFlashSpan = 2048;

// Query rows of the longest GEMM call at sequence length Tn.
inline int64_t flash_span(int64_t Tn) { return Tn < kFlashSpan ? Tn : kFlashSpan; }

// Elements of T the scratch of both passes needs: two (span, Bk) blocks per
// head (scores or probabilities, and dP) and the running max and sum of
// every row (m, l), in that order.
inline int64_t flash_scratch_size(int64_t BH, int64_t Tn, int64_t block) {
  return 2 * BH * flash_span(Tn) * block + 2 * BH * Tn;
}

// Query rows [r0, r0 + rows) against key block [c0, c0 + cols), for each of
// the BH heads: head h's (rows, cols) block lies h * rows * cols into the
// scratch. A query sees the keys up to itself: its first valid(r) keys.
struct FlashTile {
  int64_t r0, rows, c0, cols;
  KOKKOS_INLINE_FUNCTION int64_t valid(int64_t r) const {
    const int64_t upto = r0 + r - c0 + 1;  // >= 1: queries start at or after the block
    return upto < cols ? upto : cols;
  }
  // The (BH*T)-row index of the tile's row hr (head hr / rows, query r0 + hr % rows).
  KOKKOS_INLINE_FUNCTION int64_t row_of(int64_t hr, int64_t Tn) const { return (hr / rows) * Tn + r0 + hr % rows; }
};

// Head 0's (rows, cols) block as a batched GEMM's operand, where `in` holds
// every head's block back to back (BH*rows rows; head h's is h*rows*cols on).
template <class T>
GemmIn<T> per_head(GemmIn<T> in, int64_t rows) {
  in.rows = rows;
  return in;
}

// The tile's scaled scores s (BH*rows, cols) become exp(S - m_new), zero
// where masked; m and l (BH*T) carry each row's running max and sum; o (BH*T,
// Dv), the head output, has the tile's rows rescaled to the new max.
template <class T>
void flash_online_softmax(Mat<T> s, Vec<T> m, Vec<T> l, Mat<T> o, FlashTile tile, int64_t Tn) {
  const int64_t cols = s.extent(1), Dv = o.extent(1), n = s.extent(0), rows = tile.rows;
  Kokkos::parallel_for(
      "attention::flash_online_softmax", row_policy(n), KOKKOS_LAMBDA(const TeamMember& tm) {
        for_rows(tm, n, [&](int64_t hr) {
          const int64_t valid = tile.valid(hr % rows), row_id = tile.row_of(hr, Tn);
          T* row = &s(hr, 0);
          const T before = m(row_id), block_top = row_max(tm, valid, [&](int64_t c) { return row[c]; });
          const T top = block_top > before ? block_top : before;  // a max is exact: any order gives it
          const T shrink = exp_of(before - top);  // 0 on the first block (m = -inf)
          const T sum = row_sum(tm, valid, [&](int64_t c) {
            const T e = exp_of(row[c] - top);
            row[c] = e;
            return e;
          });
          row_for(tm, cols - valid, [&](int64_t c) { row[valid + c] = T(0); });
          T* orow = &o(row_id, 0);
          row_for(tm, Dv, [&](int64_t d) { orow[d] *= shrink; });
          const T kept = l(row_id) * shrink + sum;
          row_single(tm, [&] { m(row_id) = top, l(row_id) = kept; });
        });
      });
}

// The query spans of key block j: [j Bk, T) in pieces of at most kFlashSpan rows.
template <class F>
void for_each_tile(const CausalBlocks& blocks, int64_t j, const F& f) {
  const int64_t c0 = j * blocks.block, cols = blocks.rows(j);
  for (int64_t r0 = c0; r0 < blocks.seq; r0 += kFlashSpan) f(FlashTile{r0, flash_span(blocks.seq - r0), c0, cols});
}

// out (BH*T, Dv), lse (BH*T) from q, k (BH*T, D) and v (BH*T, Dv), head-major;
// scores scaled by `scale` (the model's attention_score_scale, model/attention.h);
// scratch >= flash_scratch_size(BH, T, blocks.block).
template <class T>
void flash_attention_forward(Mat<T> out, Vec<T> lse, GemmIn<T> q, GemmIn<T> k, GemmIn<T> v, Vec<T> scratch,
                             const CausalBlocks& blocks, int64_t BH, T scale) {
  const int64_t Tn = blocks.seq, D = q.cols, Dv = v.cols, n = BH * Tn;
  T* s = scratch.data();
  T* ml = s + 2 * BH * flash_span(Tn) * blocks.block;  // past the two blocks (flash_scratch_size)
  Vec<T> m(ml, n), l(ml + n, n);
  Kokkos::parallel_for(
      "attention::flash_start", row_policy(n), KOKKOS_LAMBDA(const TeamMember& tm) {
        for_rows(tm, n, [&](int64_t row) {
          T* orow = &out(row, 0);
          row_for(tm, Dv, [&](int64_t d) { orow[d] = T(0); });
          row_single(tm, [&] { m(row) = -kmath::infinity<T>(), l(row) = T(0); });
        });
      });
  for (int64_t j = 0; j < blocks.count; ++j) {
    for_each_tile(blocks, j, [&](const FlashTile& t) {
      const int64_t tile = t.rows * t.cols;
      gemm_batched<T>("N", q.rows_from(t.r0, t.rows), "T", k.rows_from(t.c0, t.cols), scale, T(0),
                      Mat<T>(s, t.rows, t.cols), {BH, Tn * D, Tn * D, tile});  // S = scale Q K_j^T
      flash_online_softmax<T>(Mat<T>(s, BH * t.rows, t.cols), m, l, out, t, Tn);
      const GemmIn<T> p = per_head(as_gemm_input_like<T>(Mat<const T>(s, BH * t.rows, t.cols), q, 2), t.rows);
      gemm_batched<T>("N", p, "N", v.rows_from(t.c0, t.cols), T(1), T(1), Mat<T>(out.data() + t.r0 * Dv, t.rows, Dv),
                      {BH, tile, Tn * Dv, Tn * Dv});  // O += P V_j
    });
  }
  Kokkos::parallel_for(
      "attention::flash_finish", row_policy(n), KOKKOS_LAMBDA(const TeamMember& tm) {
        for_rows(tm, n, [&](int64_t row) {
          const T inv = T(1) / l(row);
          T* orow = &out(row, 0);
          row_for(tm, Dv, [&](int64_t d) { orow[d] *= inv; });
          row_single(tm, [&] { lse(row) = m(row) + kmath::log(l(row)); });
        });
      });
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
          const T sum =
              half ? row_sum(tm, Dv, [&](int64_t d) { return drow[d] * T(half_bits_to_float(half[at + d], type)); })
                   : row_sum(tm, Dv, [&](int64_t d) { return drow[d] * o[at + d]; });
          row_single(tm, [&] { delta(row) = sum; });
        });
      });
}

// The tile's scores s (BH*rows, cols) become exp(s - lse), zero where masked.
template <class T>
void flash_probabilities(Mat<T> s, Vec<const T> lse, FlashTile tile, int64_t Tn) {
  const int64_t cols = s.extent(1), n = s.extent(0), rows = tile.rows;
  Kokkos::parallel_for(
      "attention::flash_probabilities", row_policy(n), KOKKOS_LAMBDA(const TeamMember& tm) {
        for_rows(tm, n, [&](int64_t hr) {
          const int64_t valid = tile.valid(hr % rows);
          const T top = lse(tile.row_of(hr, Tn));
          T* row = &s(hr, 0);
          row_for(tm, valid, [&](int64_t c) { row[c] = exp_of(row[c] - top); });
          row_for(tm, cols - valid, [&](int64_t c) { row[valid + c] = T(0); });
        });
      });
}

// dp (BH*rows, cols) <- p o (dp - delta) scale, in place: the scores' gradient.
template <class T>
void flash_score_gradient(Mat<T> dp, Mat<const T> p, Vec<const T> delta, FlashTile tile, int64_t Tn, T scale) {
  const int64_t cols = dp.extent(1), n = dp.extent(0);
  Kokkos::parallel_for(
      "attention::flash_score_gradient", row_policy(n), KOKKOS_LAMBDA(const TeamMember& tm) {
        for_rows(tm, n, [&](int64_t hr) {
          const T dot = delta(tile.row_of(hr, Tn));
          T* drow = &dp(hr, 0);
          const T* prow = &p(hr, 0);
          row_for(tm, cols, [&](int64_t c) { drow[c] = prow[c] * (drow[c] - dot) * scale; });
        });
      });
}

// dq, dk (BH*T, D), dv (BH*T, Dv) = gradients, from dout (BH*T, Dv), delta
// and lse (BH*T) and the forward's inputs; scratch and scale as the forward's.
template <class T>
void flash_attention_backward(Mat<T> dq, Mat<T> dk, Mat<T> dv, Vec<T> scratch, Mat<const T> dout, Vec<const T> delta,
                              Vec<const T> lse, GemmIn<T> q, GemmIn<T> k, GemmIn<T> v, const CausalBlocks& blocks,
                              int64_t BH, T scale) {
  const int64_t Tn = blocks.seq, D = q.cols, Dv = v.cols;
  Kokkos::deep_copy(dq, T(0));
  Kokkos::deep_copy(dk, T(0));
  Kokkos::deep_copy(dv, T(0));
  const GemmIn<T> dO = as_gemm_input_like<T>(dout, q, 1);  // 16 bits once, when q is
  T* s = scratch.data();
  T* dp = s + BH * flash_span(Tn) * blocks.block;
  for (int64_t j = 0; j < blocks.count; ++j) {
    for_each_tile(blocks, j, [&](const FlashTile& t) {
      const int64_t tile = t.rows * t.cols;
      const GemmIn<T> qt = q.rows_from(t.r0, t.rows), dot = dO.rows_from(t.r0, t.rows);
      const GemmIn<T> kj = k.rows_from(t.c0, t.cols), vj = v.rows_from(t.c0, t.cols);
      const GemmBatch by_query{BH, Tn * D, Tn * D, tile}, by_value{BH, Tn * Dv, Tn * Dv, tile};
      gemm_batched<T>("N", qt, "T", kj, scale, T(0), Mat<T>(s, t.rows, t.cols), by_query);  // S = scale Q K_j^T
      flash_probabilities<T>(Mat<T>(s, BH * t.rows, t.cols), lse, t, Tn);                   // P = exp(S - lse)
      const GemmIn<T> p = per_head(as_gemm_input_like<T>(Mat<const T>(s, BH * t.rows, t.cols), q, 2), t.rows);
      gemm_batched<T>("T", p, "N", dot, T(1), T(1), Mat<T>(dv.data() + t.c0 * Dv, t.cols, Dv),
                      {BH, tile, Tn * Dv, Tn * Dv});  // dV_j += P^T dO
      gemm_batched<T>("N", dot, "T", vj, T(1), T(0), Mat<T>(dp, t.rows, t.cols), by_value);  // dP = dO V_j^T
      flash_score_gradient<T>(Mat<T>(dp, BH * t.rows, t.cols), Mat<const T>(s, BH * t.rows, t.cols), delta, t, Tn,
                              scale);  // dS = P (dP - D) scale
      const GemmIn<T> ds = per_head(as_gemm_input_like<T>(Mat<const T>(dp, BH * t.rows, t.cols), q, 3), t.rows);
      gemm_batched<T>("N", ds, "N", kj, T(1), T(1), Mat<T>(dq.data() + t.r0 * D, t.rows, D),
                      {BH, tile, Tn * D, Tn * D});  // dQ += dS K_j
      gemm_batched<T>("T", ds, "N", qt, T(1), T(1), Mat<T>(dk.data() + t.c0 * D, t.cols, D),
                      {BH, tile, Tn * D, Tn * D});  // dK_j += dS^T Q
    });
  }
}

}  // namespace xx::kernels

// Causal self-attention, block by block, so that the masked upper triangle is
// never computed: query block i (rows [i*Bk, i*Bk + Bk)) only meets keys
// [0, (i+1)*Bk). Scores and probabilities live in a packed lower block
// triangle per (batch, head); GEMMs go through the seam (kernels/gemm.h). Only the
// diagonal blocks compute masked entries (a fraction Bk / (2T) of the work);
// they are zeroed after the softmax.
// Team-shaped (kernels/team.h): the softmax rows and head merges are team
// rows, a row's keys (or channels) its vector lanes.
// Parameter gradients accumulate (+=); activation gradients are written (=).
#pragma once
#include <cmath>
#include <vector>
#include "core/views.h"
#include "kernels/gemm.h"
#include "kernels/math.h"
#include "kernels/team.h"

namespace xx::kernels {

// Packed lower block triangle of one (batch, head): block i holds rows(i) x cols(i).
struct CausalBlocks {
  int64_t seq, block, count;
  std::vector<int64_t> offset;  // start of block i; offset[count] = size of one head
  CausalBlocks(int64_t seq_, int64_t block_) : seq(seq_), block(block_), count((seq_ + block_ - 1) / block_) {
    offset.assign(count + 1, 0);
    for (int64_t i = 0; i < count; ++i) offset[i + 1] = offset[i] + rows(i) * cols(i);
  }
  int64_t rows(int64_t i) const { return std::min(block, seq - i * block); }
  int64_t cols(int64_t i) const { return std::min((i + 1) * block, seq); }
  int64_t per_head() const { return offset[count]; }
};

// p (rows, cols) holds scaled scores of queries first_row.. ; softmax over keys <= query.
template <class T>
void causal_softmax_rows(Mat<T> p, int64_t first_row) {
  const int64_t rows = p.extent(0), cols = p.extent(1);
  Kokkos::parallel_for(
      "attention::softmax", row_policy(rows), KOKKOS_LAMBDA(const TeamMember& tm) {
        for_rows(tm, rows, [&](int64_t r) {
          const int64_t valid = first_row + r + 1;
          T* row = &p(r, 0);
          const T m = row_max(tm, valid, [&](int64_t s) { return row[s]; });
          const T sum = row_sum(tm, valid, [&](int64_t s) {
            const T e = exp_of(row[s] - m);
            row[s] = e;
            return e;
          });
          const T inv = T(1) / sum;
          row_for(tm, valid, [&](int64_t s) { row[s] *= inv; });
          row_for(tm, cols - valid, [&](int64_t s) { row[valid + s] = T(0); });
        });
      });
}

// dp (rows, cols) <- p * (dp - sum_s p * dp) * scale, in place; p is read
// from its T values, or from its 16-bit copy (`half`, of `type`).
template <class T>
void causal_softmax_rows_backward(Mat<T> dp, const T* p, const uint16_t* half, Precision type, T scale) {
  const int64_t rows = dp.extent(0), cols = dp.extent(1);
  Kokkos::parallel_for(
      "attention::softmax_backward", row_policy(rows), KOKKOS_LAMBDA(const TeamMember& tm) {
        for_rows(tm, rows, [&](int64_t r) {
          T* drow = &dp(r, 0);
          if (half) {
            const uint16_t* prow = half + r * cols;
            const auto p_at = [&](int64_t s) { return T(half_bits_to_float(prow[s], type)); };
            const T dot = row_sum(tm, cols, [&](int64_t s) { return p_at(s) * drow[s]; });
            row_for(tm, cols, [&](int64_t s) { drow[s] = p_at(s) * (drow[s] - dot) * scale; });
          } else {
            const T* prow = p + r * cols;
            const T dot = row_sum(tm, cols, [&](int64_t s) { return prow[s] * drow[s]; });
            row_for(tm, cols, [&](int64_t s) { drow[s] = prow[s] * (drow[s] - dot) * scale; });
          }
        });
      });
}

// The probabilities kept for the backward: T values, or (mixed precision)
// only their 16-bit copy; BH * blocks.per_head() of either.
template <class T>
struct KeptProbabilities {
  T* values = nullptr;
  uint16_t* half = nullptr;
  Precision type = Precision::fp32;
  GemmIn<T> block(int64_t offset, int64_t rows, int64_t cols) const {
    return half ? GemmIn<T>::of_half(half + offset, rows, cols, type) : GemmIn<T>(Mat<const T>(values + offset, rows, cols));
  }
};

// out (BH*T, Dv), att from q, k (BH*T, D) and v (BH*T, Dv), head-major.
// Scores are scaled by `scale` (the model's attention_score_scale,
// model/attention.h: 1/sqrt(D), times YaRN's mscale^2 under rope_scaling yarn).
// With 16-bit probabilities, each block's scores and softmax are computed in
// T in `scratch` (>= Bk * T) and then kept as 16 bits.
template <class T>
void attention_forward(Mat<T> out, const KeptProbabilities<T>& att, GemmIn<T> q, GemmIn<T> k, GemmIn<T> v,
                       Vec<T> scratch, const CausalBlocks& blocks, int64_t BH, T scale) {
  const int64_t Tn = blocks.seq, Dv = v.cols;
  for (int64_t bh = 0; bh < BH; ++bh) {
    for (int64_t i = 0; i < blocks.count; ++i) {
      const int64_t r0 = i * blocks.block, rows = blocks.rows(i), cols = blocks.cols(i);
      const int64_t offset = bh * blocks.per_head() + blocks.offset[i];
      Mat<T> p(att.half ? scratch.data() : att.values + offset, rows, cols);
      Mat<T> oi(out.data() + (bh * Tn + r0) * Dv, rows, Dv);
      gemm<T>("N", q.rows_from(bh * Tn + r0, rows), "T", k.rows_from(bh * Tn, cols), scale, T(0), p);
      causal_softmax_rows(p, r0);
      if (att.half) pack_half(att.half + offset, p.data(), rows * cols, att.type);
      gemm<T>("N", att.block(offset, rows, cols), "N", v.rows_from(bh * Tn, cols), T(1), T(0), oi);
    }
  }
}

// dq, dk (BH*T, D), dv (BH*T, Dv) = gradients; scratch holds one block of dp
// (>= Bk * T); scale: the forward's.
template <class T>
void attention_backward(Mat<T> dq, Mat<T> dk, Mat<T> dv, Vec<T> scratch, Mat<const T> dout,
                        const KeptProbabilities<T>& att, GemmIn<T> q, GemmIn<T> k, GemmIn<T> v,
                        const CausalBlocks& blocks, int64_t BH, T scale) {
  const int64_t Tn = blocks.seq, D = q.cols, Dv = v.cols;
  Kokkos::deep_copy(dk, T(0));
  Kokkos::deep_copy(dv, T(0));
  const GemmIn<T> dO = as_gemm_input_like<T>(dout, q, 1);  // 16 bits once, when q is
  for (int64_t bh = 0; bh < BH; ++bh) {
    const int64_t head = bh * Tn * D, vhead = bh * Tn * Dv;
    for (int64_t i = 0; i < blocks.count; ++i) {
      const int64_t r0 = i * blocks.block, rows = blocks.rows(i), cols = blocks.cols(i);
      const int64_t offset = bh * blocks.per_head() + blocks.offset[i];
      const GemmIn<T> p = att.block(offset, rows, cols), doi = dO.rows_from(bh * Tn + r0, rows);
      const GemmIn<T> qi = q.rows_from(bh * Tn + r0, rows), keys = k.rows_from(bh * Tn, cols);
      Mat<T> dp(scratch.data(), rows, cols);
      Mat<T> dqi(dq.data() + head + r0 * D, rows, D);
      Mat<T> dkeys(dk.data() + head, cols, D);
      Mat<T> dvalues(dv.data() + vhead, cols, Dv);
      gemm<T>("N", doi, "T", v.rows_from(bh * Tn, cols), T(1), T(0), dp);  // dp = dO V^T
      gemm<T>("T", p, "N", doi, T(1), T(1), dvalues);                      // dV += P^T dO
      causal_softmax_rows_backward<T>(dp, p.values, p.half, p.type, scale);  // dS = P (dP - rowsum) * scale
      const GemmIn<T> ds = as_gemm_input_like<T>(Mat<const T>(dp), q, 2);
      gemm<T>("N", ds, "N", keys, T(1), T(0), dqi);   // dQ = dS K
      gemm<T>("T", ds, "N", qi, T(1), T(1), dkeys);   // dK += dS^T Q
    }
  }
}

// out (B*T, H*D) from heads (B*H*T, D): a token per team row, its heads in turn
template <class T>
void merge_heads_forward(Mat<T> out, Mat<const T> heads, int64_t B, int64_t Tn, int64_t H) {
  const int64_t D = heads.extent(1), N = B * Tn;
  Kokkos::parallel_for(
      "attention::merge_heads", row_policy(N), KOKKOS_LAMBDA(const TeamMember& tm) {
        for_rows(tm, N, [&](int64_t row) {
          const int64_t b = row / Tn, t = row % Tn;
          for (int64_t h = 0; h < H; ++h) {
            const T* src = &heads((b * H + h) * Tn + t, 0);
            T* dst = &out(row, h * D);
            row_for(tm, D, [&](int64_t d) { dst[d] = src[d]; });
          }
        });
      });
}

// dheads (B*H*T, D) from dout (B*T, H*D)
template <class T>
void merge_heads_backward(Mat<T> dheads, Mat<const T> dout, int64_t B, int64_t Tn, int64_t H) {
  const int64_t D = dheads.extent(1), N = B * Tn;
  Kokkos::parallel_for(
      "attention::merge_heads_backward", row_policy(N), KOKKOS_LAMBDA(const TeamMember& tm) {
        for_rows(tm, N, [&](int64_t row) {
          const int64_t b = row / Tn, t = row % Tn;
          for (int64_t h = 0; h < H; ++h) {
            const T* src = &dout(row, h * D);
            T* dst = &dheads((b * H + h) * Tn + t, 0);
            row_for(tm, D, [&](int64_t d) { dst[d] = src[d]; });
          }
        });
      });
}

}  // namespace xx::kernels

// Softmax cross-entropy over the vocabulary, fused with its backward.
// A negative target marks a position without a label (the tail of a window
// for multi-token prediction): its loss and gradient are zero.
// Activation gradients are written (=).
// Team-shaped (kernels/team.h): a row per team thread, the vocabulary its vector lanes.
#pragma once
#include "core/views.h"
#include "kernels/math.h"
#include "kernels/team.h"

namespace xx::kernels {

// losses (N) = logsumexp(logits(i, :)) - logits(i, target(i))
template <class T>
void cross_entropy_forward(Vec<T> losses, Mat<const T> logits, Tokens targets) {
  const int64_t N = logits.extent(0), V = logits.extent(1);
  Kokkos::parallel_for(
      "cross_entropy::forward", row_policy(N), KOKKOS_LAMBDA(const TeamMember& m) {
        for_rows(m, N, [&](int64_t i) {
          const T* row = &logits(i, 0);
          const T mx = row_max(m, V, [&](int64_t j) { return row[j]; });
          const T sum = row_sum(m, V, [&](int64_t j) { return exp_of(row[j] - mx); });
          row_single(m, [&] { losses(i) = targets(i) < 0 ? T(0) : mx + kmath::log(sum) - logits(i, targets(i)); });
        });
      });
}

// dlogits (N, V) = (softmax(logits) - onehot(target)) * dloss. dlogits may alias logits.
template <class T>
void cross_entropy_backward(Mat<T> dlogits, Mat<const T> logits, Tokens targets, T dloss) {
  const int64_t N = logits.extent(0), V = logits.extent(1);
  Kokkos::parallel_for(
      "cross_entropy::backward", row_policy(N), KOKKOS_LAMBDA(const TeamMember& m) {
        for_rows(m, N, [&](int64_t i) {
          const T* row = &logits(i, 0);
          T* drow = &dlogits(i, 0);
          const T mx = row_max(m, V, [&](int64_t j) { return row[j]; });
          const T sum = row_sum(m, V, [&](int64_t j) { return exp_of(row[j] - mx); });
          const int32_t target = targets(i);
          const T scale = target < 0 ? T(0) : dloss / sum;
          row_for(m, V, [&](int64_t j) { drow[j] = exp_of(row[j] - mx) * scale; });
          // after the lanes' writes (row_for ends with them), one lane subtracts
          row_single(m, [&] {
            if (target >= 0) drow[target] -= dloss;
          });
        });
      });
}

}  // namespace xx::kernels

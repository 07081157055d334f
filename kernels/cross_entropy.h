// Softmax cross-entropy over the vocabulary, fused with its backward.
// A negative target marks a position without a label (the tail of a window
// for multi-token prediction): its loss and gradient are zero.
// Activation gradients are written (=).
#pragma once
#include "core/views.h"
#include "kernels/math.h"

namespace xx::kernels {

// losses (N) = logsumexp(logits(i, :)) - logits(i, target(i))
template <class T>
void cross_entropy_forward(Vec<T> losses, Mat<const T> logits, Tokens targets) {
  const int64_t V = logits.extent(1);
  Kokkos::parallel_for(
      "cross_entropy_forward", Kokkos::RangePolicy<ExecSpace>(0, logits.extent(0)), KOKKOS_LAMBDA(int64_t i) {
        const T* row = &logits(i, 0);
        T m = row[0];
#pragma omp simd reduction(max : m)
        for (int64_t j = 1; j < V; ++j) m = row[j] > m ? row[j] : m;
        T sum = 0;
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < V; ++j) sum += exp_of(row[j] - m);
        losses(i) = targets(i) < 0 ? T(0) : m + kmath::log(sum) - logits(i, targets(i));
      });
}

// dlogits (N, V) = (softmax(logits) - onehot(target)) * dloss. dlogits may alias logits.
template <class T>
void cross_entropy_backward(Mat<T> dlogits, Mat<const T> logits, Tokens targets, T dloss) {
  const int64_t V = logits.extent(1);
  Kokkos::parallel_for(
      "cross_entropy_backward", Kokkos::RangePolicy<ExecSpace>(0, logits.extent(0)), KOKKOS_LAMBDA(int64_t i) {
        const T* row = &logits(i, 0);
        T* drow = &dlogits(i, 0);
        T m = row[0];
#pragma omp simd reduction(max : m)
        for (int64_t j = 1; j < V; ++j) m = row[j] > m ? row[j] : m;
        T sum = 0;
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < V; ++j) sum += exp_of(row[j] - m);
        const int32_t target = targets(i);
        const T scale = target < 0 ? T(0) : dloss / sum;
#pragma omp simd
        for (int64_t j = 0; j < V; ++j) drow[j] = exp_of(row[j] - m) * scale;
        if (target >= 0) drow[target] -= dloss;
      });
}

}  // namespace xx::kernels

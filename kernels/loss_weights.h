// Multi-view loss aggregation (deck: lossagg): from every rank's losses and
// token counts, gathered in rank order, the weight of each rank's gradient in
// the average, and for `uncertainty` the learned weight of each kind of loss.
// Legend: R ranks, K loss kinds (columns: main, mtp, aux, as they enter the
// total loss). The rank weighting is forward only: no gradient flows through
// the weights. The uncertainty objective has one closed-form gradient, with
// respect to its log-variances; it sits next to its forward below.
// Every kernel is deterministic: fixed order, no atomics, so every rank that
// runs it on the same gathered matrix gets the same bits.
#pragma once
#include <cmath>
#include "core/views.h"
#include "kernels/math.h"

namespace xx::kernels {

enum class RankWeighting { mean, robust, softmax };

struct RankWeightingParams {
  RankWeighting kind = RankWeighting::mean;
  double trim = 0.25;          // robust: at most floor(trim * R) ranks lose their weight
  double temperature = 1.0;    // softmax: T
  double outlier_mads = 3.0;   // robust: a main loss this many scaled MADs from the median is an outlier
};

// Ranks weigh `share_r` (a_r below) of the total; weights_r = a_r / S and
// multipliers_r = R * a_r / S, computed in that order so that equal shares
// give a multiplier of exactly 1 (the plain data-parallel average).
//   mean:    a_r = n_r (token-weighted)
//   robust:  a_r = n_r, or 0 for a trimmed rank. With L the main losses, m
//            their median, s = 1.4826 * median|L - m| (floored at
//            1e-3 * |m| + 1e-12, so equal losses flag nobody), a rank is an
//            outlier when |L_r - m| > outlier_mads * s; the floor(trim * R)
//            farthest outliers (ties: lower rank first) are trimmed.
//            A non-finite loss counts as infinitely far.
//   softmax: a_r = n_r * exp((L_r - max L) / T): harder views weigh more.
template <class T>
void rank_weights(Vec<T> weights,           // (R)
                  Vec<T> multipliers,       // (R)
                  Mat<const T> losses,      // (R, K); column 0 is the main loss
                  Vec<const T> tokens,      // (R) labelled tokens of each rank
                  const RankWeightingParams& p) {
  const int64_t R = losses.extent(0);
  Kokkos::View<double*, MemSpace> key("lossagg::key", R), sorted("lossagg::sorted", R), share("lossagg::share", R);
  Kokkos::View<double[2], MemSpace> stats("lossagg::stats");  // median, then max or scale
  using Range = Kokkos::RangePolicy<ExecSpace>;
  using Single = Kokkos::RangePolicy<ExecSpace>;
  const auto kind = p.kind;

  // Sorts key into sorted: each rank's position is the number of keys before
  // it (ties by rank index), so no two ranks write the same slot.
  auto sort_keys = [=]() {
    Kokkos::parallel_for(
        "lossagg::sort", Range(0, R), KOKKOS_LAMBDA(int64_t r) {
          int64_t before = 0;
          for (int64_t q = 0; q < R; ++q) before += key(q) < key(r) || (key(q) == key(r) && q < r);
          sorted(before) = key(r);
        });
  };
  auto median_into = [=](int slot) {
    Kokkos::parallel_for(
        "lossagg::median", Single(0, 1),
        KOKKOS_LAMBDA(int64_t) { stats(slot) = R % 2 ? sorted(R / 2) : 0.5 * (sorted(R / 2 - 1) + sorted(R / 2)); });
  };

  if (kind == RankWeighting::mean) {
    Kokkos::parallel_for(
        "lossagg::mean_share", Range(0, R), KOKKOS_LAMBDA(int64_t r) { share(r) = double(tokens(r)); });
  } else if (kind == RankWeighting::robust) {
    // 1. the median of the main losses (a non-finite loss sorts last)
    Kokkos::parallel_for(
        "lossagg::robust_key", Range(0, R), KOKKOS_LAMBDA(int64_t r) {
          const double l = double(losses(r, 0));
          key(r) = kmath::isfinite(l) ? l : kmath::infinity<double>();
        });
    sort_keys();
    median_into(0);
    // 2. the scaled median absolute deviation
    Kokkos::parallel_for(
        "lossagg::robust_deviation", Range(0, R), KOKKOS_LAMBDA(int64_t r) {
          const double d = key(r) - stats(0);
          key(r) = d < 0 ? -d : d;
        });
    sort_keys();
    median_into(1);
    const double mads = p.outlier_mads;
    const int64_t max_trimmed = int64_t(p.trim * double(R));
    // 3. trim the farthest outliers: rank by deviation, descending
    Kokkos::parallel_for(
        "lossagg::robust_trim", Range(0, R), KOKKOS_LAMBDA(int64_t r) {
          const double m = stats(0) < 0 ? -stats(0) : stats(0);
          const double scale = kmath::fmax(1.4826 * stats(1), 1e-3 * m + 1e-12);
          int64_t farther = 0;
          for (int64_t q = 0; q < R; ++q) farther += key(q) > key(r) || (key(q) == key(r) && q < r);
          const bool trimmed = key(r) > mads * scale && farther < max_trimmed;
          share(r) = trimmed ? 0.0 : double(tokens(r));
        });
  } else {
    const double temperature = p.temperature;
    Kokkos::parallel_for(
        "lossagg::softmax_max", Single(0, 1), KOKKOS_LAMBDA(int64_t) {
          double hi = double(losses(0, 0));
          for (int64_t r = 1; r < R; ++r) hi = kmath::fmax(hi, double(losses(r, 0)));
          stats(1) = hi;
        });
    Kokkos::parallel_for(
        "lossagg::softmax_share", Range(0, R), KOKKOS_LAMBDA(int64_t r) {
          share(r) = double(tokens(r)) * kmath::exp((double(losses(r, 0)) - stats(1)) / temperature);
        });
  }
  // The total in rank order, then the weights.
  Kokkos::parallel_for(
      "lossagg::total", Single(0, 1), KOKKOS_LAMBDA(int64_t) {
        double total = 0;
        for (int64_t r = 0; r < R; ++r) total += share(r);
        stats(0) = total;
      });
  Kokkos::parallel_for(
      "lossagg::normalise", Range(0, R), KOKKOS_LAMBDA(int64_t r) {
        weights(r) = T(share(r) / stats(0));
        multipliers(r) = T(double(R) * share(r) / stats(0));
      });
}

// Uncertainty weighting (Kendall, Gal & Cipolla 2018), classification form
// without the 1/2 factors: with rank weights w and log-variances s,
//   objective = sum_i active_i * (exp(-s_i) * Lbar_i + s_i),  Lbar_i = sum_r w_r L_{r,i}
// Writes loss_weights_i = exp(-s_i) (1 for an inactive kind) and returns the objective.
template <class T>
double uncertainty_forward(Vec<T> loss_weights,      // (K)
                           Mat<const T> losses,      // (R, K)
                           Vec<const T> rank_weights,  // (R)
                           Vec<const T> log_var,     // (K)
                           Vec<const T> active) {    // (K) 1 or 0
  const int64_t R = losses.extent(0), K = losses.extent(1);
  double objective = 0;
  Kokkos::parallel_for(
      "lossagg::uncertainty_weights", Kokkos::RangePolicy<ExecSpace>(0, K),
      KOKKOS_LAMBDA(int64_t i) {
        loss_weights(i) = active(i) != T(0) ? T(kmath::exp(-double(log_var(i)))) : T(1);
      });
  Kokkos::parallel_reduce(
      "lossagg::uncertainty_objective", Kokkos::RangePolicy<ExecSpace>(0, 1),
      KOKKOS_LAMBDA(int64_t, double& acc) {
        for (int64_t i = 0; i < K; ++i) {
          if (active(i) == T(0)) continue;
          double mean = 0;
          for (int64_t r = 0; r < R; ++r) mean += double(rank_weights(r)) * double(losses(r, i));
          acc += kmath::exp(-double(log_var(i))) * mean + double(log_var(i));
        }
      },
      objective);
  return objective;
}

// d objective / d s_i = active_i * (1 - exp(-s_i) * Lbar_i); written (=).
template <class T>
void uncertainty_backward(Vec<T> dlog_var,          // (K)
                          Mat<const T> losses,      // (R, K)
                          Vec<const T> rank_weights,  // (R)
                          Vec<const T> log_var,     // (K)
                          Vec<const T> active) {    // (K)
  const int64_t R = losses.extent(0);
  Kokkos::parallel_for(
      "lossagg::uncertainty_backward", Kokkos::RangePolicy<ExecSpace>(0, dlog_var.extent(0)), KOKKOS_LAMBDA(int64_t i) {
        double mean = 0;
        for (int64_t r = 0; r < R; ++r) mean += double(rank_weights(r)) * double(losses(r, i));
        dlog_var(i) = active(i) != T(0) ? T(1.0 - kmath::exp(-double(log_var(i))) * mean) : T(0);
      });
}

}  // namespace xx::kernels

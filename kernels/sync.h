// Parameter synchronisation for local SGD / DiLoCo (sync local K): the
// consensus distance before averaging and the outer optimizer step.
#pragma once
#include "core/views.h"

namespace xx::kernels {

// sum_i (params_i - mean_i)^2, accumulated in double
inline double squared_distance(Vec<const float> params, Vec<const float> mean) {
  double s = 0;
  Kokkos::parallel_reduce(
      "sync::squared_distance", Kokkos::RangePolicy<ExecSpace>(0, params.extent(0)),
      KOKKOS_LAMBDA(int64_t i, double& acc) {
        const double d = double(params(i)) - double(mean(i));
        acc += d * d;
      },
      s);
  return s;
}

// compress target update: the change one optimizer step made on this rank
// (delta = after - before), and the step actually taken, before + the group's
// averaged, compressed delta.
inline void update_delta(Vec<float> delta, Vec<const float> after, Vec<const float> before) {
  Kokkos::parallel_for(
      "sync::update_delta", Kokkos::RangePolicy<ExecSpace>(0, delta.extent(0)),
      KOKKOS_LAMBDA(int64_t i) { delta(i) = after(i) - before(i); });
}
inline void apply_delta(Vec<float> params, Vec<const float> before, Vec<const float> delta) {
  Kokkos::parallel_for(
      "sync::apply_delta", Kokkos::RangePolicy<ExecSpace>(0, params.extent(0)),
      KOKKOS_LAMBDA(int64_t i) { params(i) = before(i) + delta(i); });
}

// Outer step on the pseudo-gradient delta = anchor - mean (DiLoCo):
//   momentum = mu * momentum + delta
//   anchor  -= lr * (nesterov ? delta + mu * momentum : momentum)
// then params = anchor. With lr 1 and mu 0 this is plain averaging.
inline void outer_step(Vec<float> params, Vec<float> anchor, Vec<float> momentum, Vec<const float> mean, float lr,
                       float mu, bool nesterov) {
  Kokkos::parallel_for(
      "sync::outer_step", Kokkos::RangePolicy<ExecSpace>(0, params.extent(0)), KOKKOS_LAMBDA(int64_t i) {
        const float delta = anchor(i) - mean(i);
        const float m = mu * momentum(i) + delta;
        momentum(i) = m;
        anchor(i) -= lr * (nesterov ? delta + mu * m : m);
        params(i) = anchor(i);
      });
}

}  // namespace xx::kernels

// AdamW with decoupled weight decay (Loshchilov & Hutter), fused over one
// tensor. Moments are fp32 whatever the parameter type.
#pragma once
#include "core/views.h"

namespace xx::kernels {

struct AdamWStep {
  float lr, beta1, beta2, eps, weight_decay;
  float bias1, bias2;  // 1 - beta^t
  float grad_scale;    // clipping factor (and 1 / world size where needed)
};

// param, m, v (n) updated from grad (n)
template <class T>
void adamw_update(Vec<T> param, Vec<float> m, Vec<float> v, Vec<const T> grad, AdamWStep s) {
  Kokkos::parallel_for(
      "adamw_update", Kokkos::RangePolicy<ExecSpace>(0, param.extent(0)), KOKKOS_LAMBDA(int64_t i) {
        const float g = float(grad(i)) * s.grad_scale;
        const float mi = s.beta1 * m(i) + (1.0f - s.beta1) * g;
        const float vi = s.beta2 * v(i) + (1.0f - s.beta2) * g * g;
        m(i) = mi;
        v(i) = vi;
        const float mhat = mi / s.bias1, vhat = vi / s.bias2;
        float p = float(param(i));
        p -= s.lr * (mhat / (Kokkos::Experimental::sqrt(vhat) + s.eps) + s.weight_decay * p);
        param(i) = T(p);
      });
}

}  // namespace xx::kernels

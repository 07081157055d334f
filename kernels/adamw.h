// AdamW with decoupled weight decay (Loshchilov & Hutter), fused over one
// tensor. The arithmetic is fp32 whatever the parameter type; the moments are
// stored as S (kernels/moments.h): float, or uint16_t bf16 patterns read to
// fp32 and written back rounded to nearest even. Under bf16 the step uses the
// fp32 moments it just computed; only what it keeps is rounded.
#pragma once
#include "core/views.h"
#include "kernels/math.h"
#include "kernels/moments.h"
#include "kernels/team.h"

namespace xx::kernels {

struct AdamWStep {
  float lr, beta1, beta2, eps, weight_decay;
  float bias1, bias2;  // 1 - beta^t
  float grad_scale;    // clipping factor (and 1 / world size where needed)
};

// param, m, v (n) updated from grad (n); chunks of the flat arrays as team
// rows (kernels/team.h), a vector loop inside each
template <class T, class S>
void adamw_update(Vec<T> param, Vec<S> m, Vec<S> v, Vec<const T> grad, AdamWStep s) {
  using M = MomentStore<S>;
  const int64_t n = param.extent(0);
  T* p = param.data();
  S *pm = m.data(), *pv = v.data();
  const T* g = grad.data();
  Kokkos::parallel_for(
      "adamw::update", flat_policy(n), KOKKOS_LAMBDA(const TeamMember& member) {
        for_flat(member, n, [&](int64_t i) {
          const float gi = float(g[i]) * s.grad_scale;
          const float mi = s.beta1 * M::load(pm[i]) + (1.0f - s.beta1) * gi;
          const float vi = s.beta2 * M::load(pv[i]) + (1.0f - s.beta2) * gi * gi;
          pm[i] = M::store(mi);
          pv[i] = M::store(vi);
          const float mhat = mi / s.bias1, vhat = vi / s.bias2;
          const float pi = float(p[i]);
          p[i] = T(pi - s.lr * (mhat / (kmath::sqrt(vhat) + s.eps) + s.weight_decay * pi));
        });
      });
}

}  // namespace xx::kernels

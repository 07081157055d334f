#include "train/optimizer.h"
#include <cmath>
#include <stdexcept>
#include "kernels/adamw.h"

namespace xx {

double clip_factor(double norm, double clip) {
  if (clip <= 0 || !(norm > clip)) return 1.0;
  return clip / norm;
}

template <class T>
AdamW<T>::AdamW(const ParamLayout& layout)
    : layout_(layout), m_("AdamW::m", layout.total()), v_("AdamW::v", layout.total()) {}

template <class T>
void AdamW<T>::step(Buffer<T>& params, const Buffer<T>& grads, const OptimizerConfig& cfg, double lr,
                    double grad_scale) {
  ++t_;
  kernels::AdamWStep s;
  s.lr = float(lr);
  s.beta1 = float(cfg.beta1);
  s.beta2 = float(cfg.beta2);
  s.eps = float(cfg.eps);
  s.bias1 = float(1.0 - std::pow(cfg.beta1, double(t_)));
  s.bias2 = float(1.0 - std::pow(cfg.beta2, double(t_)));
  s.grad_scale = float(grad_scale);
  for (const auto& t : layout_.tensors()) {
    s.weight_decay = t.decay ? float(cfg.weight_decay) : 0.0f;
    kernels::adamw_update<T>(Vec<T>(params.data() + t.offset, t.size), Vec<float>(m_.data() + t.offset, t.size),
                             Vec<float>(v_.data() + t.offset, t.size),
                             Vec<const T>(grads.data() + t.offset, t.size), s);
  }
}

template class AdamW<float>;
template class AdamW<double>;

}  // namespace xx

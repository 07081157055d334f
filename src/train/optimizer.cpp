#include "train/optimizer.h"
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include "kernels/adamw.h"

namespace xx {

double clip_factor(double norm, double clip) {
  if (clip <= 0 || !(norm > clip)) return 1.0;
  return clip / norm;
}

template <class T>
AdamW<T>::AdamW(const ParamLayout& layout, Ownership owned, bool grads_in_shard, Precision moments)
    : layout_(layout), owned_(std::move(owned)), grads_in_shard_(grads_in_shard),
      m_("AdamW::m", owned_.shard_size(), moments), v_("AdamW::v", owned_.shard_size(), moments) {}

template <class T>
void AdamW<T>::step(Buffer<T>& params, const T* grads, const OptimizerConfig& cfg, double lr, double grad_scale) {
  ++t_;
  kernels::AdamWStep s;
  s.lr = float(lr);
  s.beta1 = float(cfg.beta1);
  s.beta2 = float(cfg.beta2);
  s.eps = float(cfg.eps);
  s.bias1 = float(1.0 - std::pow(cfg.beta1, double(t_)));
  s.bias2 = float(1.0 - std::pow(cfg.beta2, double(t_)));
  s.grad_scale = float(grad_scale);
  // Each tensor's part in each owned piece (unsharded: one piece, every tensor
  // whole), with the update compiled for the moments' storage (S: float or
  // bf16 patterns), chosen once per step.
  visit_pair(m_, v_, [&]<class S>(Buffer<S>& ms, Buffer<S>& vs) {
    const auto& pieces = owned_.pieces();
    size_t i = 0;
    for (const auto& t : layout_.tensors()) {
      s.weight_decay = t.decay ? float(cfg.weight_decay) : 0.0f;
      const int64_t t_end = t.offset + t.size;
      while (i < pieces.size() && pieces[i].end <= t.offset) ++i;
      for (size_t j = i; j < pieces.size() && pieces[j].begin < t_end; ++j) {
        const OwnedPiece& p = pieces[j];
        const int64_t a = std::max(p.begin, t.offset), n = std::min(p.end, t_end) - a;
        if (n <= 0) continue;
        const int64_t at = p.at + (a - p.begin);  // in the shard
        kernels::adamw_update<T, S>(Vec<T>(params.data() + a, n), Vec<S>(ms.data() + at, n), Vec<S>(vs.data() + at, n),
                                    Vec<const T>(grads + (grads_in_shard_ ? at : a), n), s);
      }
    }
  });
}

template class AdamW<float>;
template class AdamW<double>;

}  // namespace xx

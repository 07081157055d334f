// AdamW over the flat parameter buffer and global-norm clipping. The
// learning-rate schedule (cosine, sgdr, step) is Schedule in train/schedule.h.
#pragma once
#include <cstdint>
#include "deck/config.h"
#include "core/views.h"
#include "model/params.h"
#include "train/schedule.h"

namespace xx {

// Factor that scales gradients of global norm `norm` down to `clip` (1 when below or when clip is 0).
double clip_factor(double norm, double clip);

template <class T>
class AdamW {
 public:
  explicit AdamW(const ParamLayout& layout);

  // One update of every tensor with the gradients scaled by grad_scale.
  void step(Buffer<T>& params, const Buffer<T>& grads, const OptimizerConfig& cfg, double lr, double grad_scale);

  int64_t steps_taken() const { return t_; }
  void set_steps_taken(int64_t t) { t_ = t; }
  Buffer<float>& m() { return m_; }  // first moments, laid out like the parameters
  Buffer<float>& v() { return v_; }  // second moments

 private:
  const ParamLayout& layout_;
  Buffer<float> m_, v_;
  int64_t t_ = 0;
};

}  // namespace xx

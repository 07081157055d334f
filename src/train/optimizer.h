// AdamW over the flat parameter buffer, global-norm clipping, and the
// learning-rate schedule (linear warmup, then cosine to min_lr).
#pragma once
#include <cstdint>
#include "config.h"
#include "core/views.h"
#include "model/params.h"

namespace xx {

// Learning rate for optimizer step `step` (1-based).
double learning_rate(const OptimizerConfig& opt, const ScheduleConfig& schedule, int64_t step);

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

// AdamW over the flat parameter buffer, or over the pieces of it this rank
// owns under `shard optimizer|gradients|params` (core/ownership.h: the moments are
// then only the shard's), and global-norm clipping. The learning-rate
// schedule (cosine, sgdr, step) is Schedule in train/schedule.h. The moments
// are fp32 or bf16 (deck: optimizer adamw ... moments), chosen at construction:
// kernels/moments.h owns them.
#pragma once
#include <cstdint>
#include "deck/config.h"
#include "kernels/moments.h"
#include "core/ownership.h"
#include "core/views.h"
#include "model/params.h"
#include "train/schedule.h"

namespace xx {

// Factor that scales gradients of global norm `norm` down to `clip` (1 when below or when clip is 0).
double clip_factor(double norm, double clip);

template <class T>
class AdamW {
 public:
  explicit AdamW(const ParamLayout& layout, Precision moments = Precision::fp32)
      : AdamW(layout, Ownership::whole(layout.total()), false, moments) {}
  // Under shard (core/placement.h): this rank's pieces, and from shard
  // gradients up the gradients it is handed are its shard (its pieces back
  // to back); else the whole buffer.
  AdamW(const ParamLayout& layout, const Placement& placement, Precision moments = Precision::fp32)
      : AdamW(layout, placement.owned(), placement.gradients_sharded(), moments) {}

  // One update of every owned piece with its gradients scaled by grad_scale.
  void step(Buffer<T>& params, const T* grads, const OptimizerConfig& cfg, double lr, double grad_scale);
  void step(Buffer<T>& params, const Buffer<T>& grads, const OptimizerConfig& cfg, double lr, double grad_scale) {
    step(params, grads.data(), cfg, lr, grad_scale);
  }

  int64_t steps_taken() const { return t_; }
  void set_steps_taken(int64_t t) { t_ = t; }
  const Ownership& owned() const { return owned_; }
  kernels::Moments& m() { return m_; }  // first moments of the shard (the whole buffer unsharded)
  kernels::Moments& v() { return v_; }  // second moments
  Precision moments_type() const { return m_.type(); }

 private:
  AdamW(const ParamLayout& layout, Ownership owned, bool grads_in_shard, Precision moments);
  const ParamLayout& layout_;
  Ownership owned_;
  bool grads_in_shard_ = false;
  kernels::Moments m_, v_;
  int64_t t_ = 0;
};

}  // namespace xx

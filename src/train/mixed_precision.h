// Mixed precision (deck: precision fp32|bf16|fp16; docs/DYNAMICS.md): the
// forward and backward read the weights rounded to the type while AdamW
// updates the fp32 master copy; gradients are rounded once final; under a
// loss scaler the backward starts from the scaled loss, a step whose
// gradients overflowed on any rank is skipped on every rank, and the others
// are unscaled before clipping. Everything is a no-op under fp32.
#pragma once
#include <mpi.h>
#include <memory>
#include "deck/config.h"
#include "core/state.h"
#include "kernels/precision.h"
#include "model/transformer.h"
#include "train/loss_scale.h"

namespace xx {

class MixedPrecision {
 public:
  MixedPrecision(const PrecisionConfig& cfg, Transformer<float>& model);

  kernels::Precision type() const { return type_; }
  const LossScaler* scaler() const { return scaler_.get(); }
  // Before a step's forward: working weights, and the loss scale the backward starts from.
  void begin_step();
  void use_working_weights();    // master = params, then params rounded to the type
  void restore_master_weights();  // params = master
  void round_gradients(float* grads, int64_t n) const;  // in place, to the type
  // After the gradients are averaged: true when the step must be skipped on
  // every rank (one all-reduce of the overflow flag); otherwise the
  // gradients are unscaled, so clipping sees the true ones.
  bool skip_or_unscale(MPI_Comm comm);
  void register_state(StateRegistry& registry);

 private:
  kernels::Precision type_;
  Transformer<float>& model_;
  Buffer<float> master_;                // fp32 master weights while params hold their rounded copy
  std::unique_ptr<LossScaler> scaler_;  // bf16, fp16; null under fp32
  double step_scale_ = 1.0;             // the scale of the step being taken
};

}  // namespace xx

// Mixed precision (deck: precision fp32|bf16|fp16; docs/DYNAMICS.md): every
// GEMM multiplies 16-bit operands (the model's KeptActivations and a 16-bit copy
// of the weights, made once per step from the fp32 master weights that AdamW
// updates) and accumulates in fp32. Under a loss scaler the backward starts
// from the scaled loss, a step whose gradients overflowed on any rank is
// skipped on every rank, and the others are unscaled before clipping.
// Everything is a no-op under fp32.
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
  // Before a step's forward: the 16-bit weights, and the loss scale the backward starts from.
  void begin_step();
  void refresh_weights();  // the 16-bit copy of the weights, from the master weights
  // After the gradients are averaged (`grads`: all of them, or this rank's
  // shard): true when the step must be skipped on every rank (one
  // all-reduce of the overflow flag); otherwise they are unscaled, so
  // clipping sees the true ones.
  bool skip_or_unscale(MPI_Comm comm, Vec<float> grads);
  double step_scale() const { return step_scale_; }  // the loss scale of the step being taken (1: none)
  void register_state(StateRegistry& registry);

 private:
  kernels::Precision type_;
  Transformer<float>& model_;
  std::unique_ptr<LossScaler> scaler_;  // bf16, fp16; null under fp32
  double step_scale_ = 1.0;             // the scale of the step being taken
};

}  // namespace xx

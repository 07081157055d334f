// Under shard params (ZeRO-3) a rank keeps only its pieces of the weights.
// The model asks for each unit (ParamLayout::weight_units: the embedding, a
// block, the head, an MTP module) before it computes with it and lets go of
// it after; the sharded sync strategy gathers and releases. The model knows
// what it needs next, so each request names it and its gathering starts
// while this unit computes.
#pragma once

namespace xx {

class WeightGate {
 public:
  virtual ~WeightGate() = default;
  // On return unit's weights are whole in the parameter buffer; `next`
  // (-1: none) starts gathering.
  virtual void need(int unit, int next) = 0;
  // The model is done with unit until it asks again: its pieces owned by
  // other ranks may go.
  virtual void done(int unit) = 0;
};

// Under shard optimizer|gradients with 16-bit precision a rank keeps the fp32
// master weights only of its own pieces (and of the tensors the model reads
// in fp32: ParamLayout::fp32_read_runs), while the 16-bit copy the GEMMs read
// stays whole. The model cannot pack that copy from its own fp32 buffer, so
// it asks the source, which packs every rank's pieces and all-gathers them.
class HalfWeightSource {
 public:
  virtual ~HalfWeightSource() = default;
  // Collective. On return the 16-bit copy (and the fp32 the model reads) is
  // whole and current: after an update, a restore or any write of the pieces.
  virtual void refresh_half_weights() = 0;
};

}  // namespace xx

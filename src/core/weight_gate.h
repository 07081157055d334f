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

}  // namespace xx

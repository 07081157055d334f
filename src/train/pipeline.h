// One step of a pipeline stage (deck: pipeline stages P schedule S micro M):
// the stage's passes in the schedule's order (core/pipeline_schedule.h),
// each forward fed by the previous chunk's activation and each backward by
// the next chunk's gradient, through comm/pipeline_mpi.h. What a pass
// computes is the stage's own (StagePasses): the executor knows only the
// order, the messages and the clock.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>
#include "comm/pipeline_mpi.h"
#include "core/pipeline_schedule.h"
#include "train/pass_pair.h"

namespace xx {

// A stage's work on one micro-batch in one of its runs of layers (`run`:
// StageCut::runs). `width`: floats in one micro-batch's activation (the same
// at every cut: B * T * C). A forward reads `in` (null in chunk 0: its
// tokens) and writes `out` (null in the last chunk: it ends in the loss); a
// backward reads `dout` (null in the last chunk) and writes `din` (null in
// chunk 0). A run keeps what its backward of a micro-batch needs until that
// backward (gpipe: M micro-batches, 1f1b: up to P - s;
// PipelineExecutor::in_flight).
struct StagePasses {
  int64_t width = 0;
  std::function<void(int run, int micro, const float* in, float* out)> forward;
  std::function<void(int run, int micro, const float* dout, float* din)> backward;
};

// Which of a stage's sets of activations (Transformer::use_activations)
// holds each micro-batch in flight: the lowest free one from its forward,
// free again after its backward. As many sets as the schedule keeps
// micro-batches in flight (most_in_flight) never run out.
class ActivationSets {
 public:
  explicit ActivationSets(int sets = 1) : holder_(size_t(sets), -1) {}
  int take(int micro);     // throws when every set is held
  int release(int micro);  // micro's set; throws when micro holds none

 private:
  std::vector<int> holder_;  // per set: the micro-batch it holds, or -1
};

// A step's clock on this stage: its length, the part spent waiting for a
// neighbour (the measured bubble), and the schedule's theory beside it.
struct PipelineStepTimes {
  double seconds = 0, waited = 0, theory = 0;
  double bubble() const { return seconds > 0 ? waited / seconds : 0.0; }
};

class PipelineExecutor {
 public:
  // overlap: a paired F&B step's two passes run interleaved (pair()); else one after the other.
  PipelineExecutor(PipelineSchedule schedule, int micro, StageLink& link, bool overlap = false);
  const std::vector<PipeOp>& order() const { return order_; }
  // per run: the micro-batches it holds at once
  std::vector<int> in_flight() const { return in_flight_per_run(order_, int(link_.cut().runs.size())); }
  // Runs every pass of the step on this stage; every send has left on return.
  PipelineStepTimes step(const StagePasses& passes);
  bool overlaps() const { return overlap_; }
  // Where the paired passes hand over (PairedExchange), under overlap.
  PassPair& pair() { return pair_; }

 private:
  void receive(const StagePasses& p, const PipeOp& op);
  void pass(const StagePasses& p, const PipeOp& op);
  PipelineSchedule schedule_;
  int micro_;
  StageLink& link_;
  std::vector<PipeOp> order_;
  bool overlap_ = false;
  PassPair pair_;
  // per run: one micro-batch's activation or gradient, received or to send
  std::vector<std::vector<float>> in_, out_;
};

}  // namespace xx

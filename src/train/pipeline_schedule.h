// Pipeline schedules (deck: pipeline ... schedule): the order in which one
// stage runs the forward (F) and backward (B) passes of a step's M
// micro-batches. One small table per schedule; one executor runs any of them
// (train/pipeline.h). Stage s receives micro-batch m's activation from stage
// s - 1 before F(s, m) and its gradient from stage s + 1 before B(s, m); the
// last stage turns F into B itself (the loss).
//
//   gpipe   F0 F1 .. F(M-1) B0 B1 .. B(M-1) on every stage: M activations kept.
//   1f1b    stage s: min(P - s, M) warm-up forwards, then B and F alternate
//           (B0 F(P-s) B1 ...), then the remaining backwards: at most P - s
//           activations kept, the same bubble as gpipe.
// With equal times per pass, both idle a stage (P - 1) / (M + P - 1) of the
// step (the bubble, theory_bubble); simulate() replays a table on a clock.
#pragma once
#include <vector>
#include "core/modes.h"

namespace xx {

struct PipeOp {
  enum Kind { forward, backward } kind = forward;
  int micro = 0;
  bool operator==(const PipeOp&) const = default;
};

// Stage `stage`'s order of passes (0 <= stage < stages, micro >= 1); gpipe and
// 1f1b only (the deck refuses the others).
std::vector<PipeOp> stage_order(PipelineSchedule schedule, int stages, int micro, int stage);

// The most micro-batches an order holds between their forward and backward:
// the sets of activations its stage keeps (gpipe M, 1f1b min(P - s, M)).
int most_in_flight(const std::vector<PipeOp>& order);

// The idle fraction of every stage with equal pass times: (P - 1) / (M + P - 1).
double theory_bubble(PipelineSchedule schedule, int stages, int micro);

// A table replayed on a clock, each forward taking `f` and each backward `b`
// (units of time), each pass starting when its stage is free and its input
// has arrived (no transfer time).
struct PipelineTimeline {
  bool complete = false;             // false: a stage waits forever (the tables disagree)
  double makespan = 0;               // the step's length
  std::vector<double> bubble;        // per stage: 1 - busy / makespan
  std::vector<int> max_in_flight;    // per stage: activations kept at once (forwarded, not yet backwarded)
};
PipelineTimeline simulate(PipelineSchedule schedule, int stages, int micro, double f = 1, double b = 1);

}  // namespace xx

// Pipeline schedules (deck: pipeline ... schedule): the order in which one
// stage runs the forward (F) and backward (B) passes of a step's M
// micro-batches over its runs of layers (core/placement.h, StageCut: one
// chunk, or V of the P x V chunks). One small table per schedule; one
// executor runs any of them (train/pipeline.h). Chunk k of micro-batch m
// takes its activation from chunk k - 1 before F and its gradient from
// chunk k + 1 before B; the last chunk turns F into B itself (the loss).
// Every table runs each chunk's backwards in micro-batch order, as the
// unsplit model adds their gradients: the same bits at any P.
//
//   gpipe        F0 F1 .. F(M-1) B0 B1 .. B(M-1) on every stage: M activations kept.
//   1f1b         stage s: min(P - s, M) warm-up forwards, then B and F alternate
//                (B0 F(P-s) B1 ...), then the remaining backwards: at most
//                P - s activations kept, the same bubble as gpipe.
//   interleaved  V chunks per stage (s, s + P, ...), Megatron's order: micro-
//                batches in groups of P, each group through the stage's chunks
//                in turn; warm-up 2 (P - s - 1) + (V - 1) P forwards, then 1F1B
//                (M a multiple of P). The bubble shrinks V-fold.
//   dualpipev    chunks s and 2P - 1 - s (a V): DeepSeek's DualPipeV phases
//                (nF0, nF0F1, nB1F1, nF0B1F1B0, nB1F1B0, nB1B0, nB0) with the
//                backward whole (no split weight pass). M >= 2P. Its F&B
//                steps pair a forward of one run with a backward of the
//                other (PipeOp::paired), which may run overlapped
//                (train/pass_pair.h).
// simulate() replays a table on a clock; theory_bubble is the schedule's
// stated idle fraction.
#pragma once
#include <vector>
#include "core/modes.h"

namespace xx {

struct PipeOp {
  enum Kind { forward, backward } kind = forward;
  int micro = 0;
  int run = 0;  // which of the stage's runs of layers (its chunks, in model order)
  // A forward whose next op is a backward of the other run, the two one
  // F&B step (dualpipev): both inputs arrive before it, and the two passes
  // may run interleaved; each sends its output as it ends.
  bool paired = false;
  bool operator==(const PipeOp&) const = default;
};

// Stage `stage`'s order of passes (0 <= stage < stages, micro >= 1; V:
// chunks per stage, 1 but for interleaved (>= 1) and dualpipev (2)).
std::vector<PipeOp> stage_order(PipelineSchedule schedule, int stages, int micro, int stage, int virtual_stages = 1);

// The most micro-batches an order holds in run `run` between their forward
// and backward: the sets of activations that run keeps (gpipe M, 1f1b
// min(P - s, M)).
int most_in_flight(const std::vector<PipeOp>& order, int run = 0);
// ... for each of its V runs
std::vector<int> in_flight_per_run(const std::vector<PipeOp>& order, int virtual_stages);

// The idle fraction of every stage with equal forward and backward times
// per chunk, as each schedule's authors state it: gpipe and 1f1b
// (P - 1) / (M + P - 1); interleaved (P - 1) / (V M + P - 1); dualpipev
// DeepSeek's bubble (P - 1)(F&B + B - 3W) with F&B = F + B and W = 0 (no
// overlap, a whole backward) against 2 M (F + B) of work: 3 (P - 1) /
// (4 M + 3 (P - 1)).
double theory_bubble(PipelineSchedule schedule, int stages, int micro, int virtual_stages = 1);

// A table replayed on a clock, each forward of a chunk taking `f` and each
// backward `b` (units of time), each pass starting when its stage is free and
// its input has arrived (no transfer time). paired: a paired F&B step
// (PipeOp::paired) starts once both its inputs are there, as the executor
// runs it under overlap, and takes f + b (no time hidden).
struct PipelineTimeline {
  bool complete = false;             // false: a stage waits forever (the tables disagree)
  double makespan = 0;               // the step's length
  std::vector<double> bubble;        // per stage: 1 - busy / makespan
  std::vector<int> max_in_flight;    // per stage: activations kept at once over its runs (forwarded, not yet backwarded)
};
PipelineTimeline simulate(PipelineSchedule schedule, int stages, int micro, int virtual_stages = 1, double f = 1,
                          double b = 1, bool paired = false);

}  // namespace xx

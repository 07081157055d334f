// The learning-rate schedule: a linear warmup, then one of
//   cosine  one half-cosine from the peak down to min_lr at step `total`;
//   sgdr    cosine with warm restarts (Loshchilov & Hutter, SGDR, 2017): cycles
//           of P, P*M, P*M^2, ... steps, each from its peak down to min_lr;
//   step    step decay, peak * F^level with a new level every S steps.
// The peak is the optimizer's lr; `jitter J` scales the peak of each restart
// (sgdr) or the value of each level (step) by a factor in [1-J, 1+J], a
// counter-based hash of (seed, cycle) (src/core/rng.h).
//
// Steps are the 1-based optimizer steps of the whole deck (the trainer's
// step_ + 1). Every value here is a pure function of (OptimizerConfig,
// ScheduleConfig, seed, step): no state, so all ranks agree and a run resumed
// at step N continues with the LR it would have had.
//
// Cycle c (sgdr) or level c (step) covers the post-warmup steps
// [start_c, start_{c+1}); start_0 = W + 1. sgdr: start_c = W + 1 +
// round(P * (1 + M + ... + M^(c-1))), so P=10, M=2 restarts 10, 30 and 70
// steps after the warmup. Within a cycle of L steps the position t runs
// 0 .. L-1 and
//   lr = min_lr + (peak_c - min_lr) * (1 + cos(pi * t / (L - 1))) / 2,
// so the first step of a cycle is exactly at its peak and the last exactly at
// min_lr (a one-step cycle stays at its peak).
#pragma once
#include <cstdint>
#include "deck/config.h"

namespace xx {

class Schedule {
 public:
  Schedule(const OptimizerConfig& opt, const ScheduleConfig& cfg, uint64_t seed);

  // The learning rate of optimizer step `step` (1-based).
  double lr(int64_t step) const;

  // sgdr: the cycle `step` belongs to (0 for the warmup and the first cycle);
  // step: the decay level; cosine: 0.
  int cycle(int64_t step) const;

  // True at the first step of every sgdr cycle after the first: the LR jumps
  // back up there. Never true for cosine and step.
  bool is_restart(int64_t step) const;

  // The first step (1-based) of cycle (level) `c`; 1 for cycle 0 of cosine.
  int64_t cycle_start(int c) const;

  // The factor in [1-J, 1+J] that scales the peak of cycle (level) c; 1 for
  // c == 0 (the warmup ends at the optimizer's lr) and when jitter is 0.
  double jitter_factor(int c) const;

  // sgdr with restart_from best: at a restart the trainer goes back to the
  // best validation point of the cycle that just ended.
  bool restart_from_best() const;

  const ScheduleConfig& config() const { return cfg_; }

 private:
  // Post-warmup steps before cycle c starts (sgdr, step); saturates.
  int64_t offset(int c) const;
  // Cycle (level) of the 0-based post-warmup step s >= 0.
  int cycle_at(int64_t s) const;

  OptimizerConfig opt_;
  ScheduleConfig cfg_;
  uint64_t stream_;  // jitter stream: mix_seed(seed, purpose)
};

}  // namespace xx

// Multi-view loss aggregation (deck: lossagg; docs/DYNAMICS.md). After each
// forward every rank all-gathers its losses and labelled tokens; the same
// kernel (kernels/loss_weights.h) on the same gathered matrix gives every rank the
// same weights. Rank r's backward seeds are then multiplied by W * w_r (the
// gradient average divides by W), and under `uncertainty` by each loss's
// learned weight exp(-s_i).
#pragma once
#include <mpi.h>
#include <array>
#include <string>
#include <vector>
#include "deck/config.h"
#include "model/transformer.h"

namespace xx {

class LossAggregator {
 public:
  static constexpr int kKinds = 3;  // columns: main, mtp, aux
  static constexpr const char* kLogVarSeries = "lossagg_log_var";  // checkpoint dataset /train/<this>

  // active: which kinds of loss this model has (main always; mtp, aux when present).
  LossAggregator(MPI_Comm comm, std::array<bool, kKinds> active);

  // Collective over comm. `parts`: this rank's main, mtp and aux losses as
  // they enter its total (mtp already times its lambda); `tokens`: its
  // labelled tokens. Returns this rank's seed multipliers.
  LossWeights weigh(const LossAggConfig& cfg, std::array<double, kKinds> parts, double tokens);

  // uncertainty: one SGD step s -= lr * mean gradient over the micro-batches
  // weighed since the last call; nothing for the other kinds.
  void end_step(double lr);

  // Figures of the last weigh(), identical on every rank.
  const std::vector<double>& rank_weights() const { return weights_; }    // (W), sums to one
  const std::vector<double>& gathered_losses() const { return losses_; }  // (W, kKinds), row-major
  double own_multiplier() const { return multipliers_[rank_]; }            // W * w_rank
  std::array<double, kKinds> loss_weights() const;                         // exp(-s_i), 1 for inactive kinds
  const std::vector<double>& log_var() const { return log_var_; }          // (kKinds), s_i
  void set_log_var(const std::vector<double>& s);                          // from a checkpoint
  std::array<bool, kKinds> active() const { return active_; }

 private:
  MPI_Comm comm_;
  int rank_ = 0, world_ = 1;
  std::array<bool, kKinds> active_;
  std::vector<double> losses_, tokens_, weights_, multipliers_;
  std::vector<double> log_var_, dlog_var_sum_;
  int pending_ = 0;  // micro-batches whose s-gradient waits in dlog_var_sum_
};

}  // namespace xx

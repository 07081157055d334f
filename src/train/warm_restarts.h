// Warm restarts (schedule sgdr ...; docs/DYNAMICS.md): every restart is
// recorded (RUN_DIR/lr_history.jsonl, /train/lr_restarts in checkpoints),
// and under restart_from best the state at the cycle's lowest validation
// loss is kept, so a restart can go back to it: parameters, both AdamW
// moments, AdamW's count and the MoE selection biases. The step counter, the
// LR schedule and the data stream go on.
#pragma once
#include <mpi.h>
#include <map>
#include <optional>
#include <string>
#include <vector>
#include "comm/placement_mpi.h"
#include "core/state.h"
#include "deck/deck.h"
#include "io/log.h"
#include "model/transformer.h"
#include "train/optimizer.h"
#include "train/schedule.h"

namespace xx {

class WarmRestarts {
 public:
  // Keeps a best state only when some phase restarts from the best.
  // `comm`: the ranks that share the optimizer (under shard the best moments are
  // this rank's pieces, gathered whole for a checkpoint).
  WarmRestarts(const PlacementMpi& placed, const Program& program, Transformer<float>& model, AdamW<float>& optimizer);

  // The schedule of the phase that takes 1-based step `step`; none past the deck's end.
  std::optional<Schedule> schedule_of(int64_t step) const;
  // True when step `next` (1-based) starts a new cycle.
  bool due(int64_t next) const;
  // restart_from best: after a validation at `step`, remember it if it is the cycle's best.
  void note_validation(double val, int64_t step);
  // Before step `next` (due): records the restart and, under restart_from
  // best, goes back to the cycle's best state. `val`: the validation loss at
  // the end of the cycle that ended.
  void restart(int64_t next, double val, RunLog& log);
  void register_state(StateRegistry& registry);

 private:
  struct Record {
    int64_t step = 0;             // the first step of the new cycle (1-based)
    double lr = 0, val_loss = 0;  // the new peak; validation loss at the end of the cycle that ended
    int cycle = 0;
    int64_t restored_from = -1;   // restart_from best: the step training went back to (-1: none)
  };
  struct Best {
    int64_t step = -1;  // -1: no validation in this cycle yet
    double val_loss = 0;
    int64_t adam_steps = 0;
    Buffer<float> params;
    kernels::Moments adam_m, adam_v;
    std::map<std::string, std::vector<float>> gate_bias;  // MoE selection biases by layer prefix
  };
  const PlacementMpi& placed_;  // the best moments are gathered whole for a checkpoint
  const Program& program_;
  Transformer<float>& model_;
  AdamW<float>& optimizer_;
  std::vector<Record> records_;
  Best best_;
  bool pieces_ = false;  // the fp32 weights, and so the best copy, are this rank's pieces (fp32_weights_in_pieces)
  void copy_best_weights(bool keep);
};

}  // namespace xx

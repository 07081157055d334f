// The training loop: one Trainer per rank runs every `run` phase of a deck.
#pragma once
#include <mpi.h>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>
#include <map>
#include <limits>
#include <optional>
#include <thread>
#include "ckpt/checkpoint.h"
#include "comm/compressed_sync.h"
#include "comm/grad_sync.h"
#include "comm/ops.h"
#include "comm/topology.h"
#include "data/corpus.h"
#include "data/loader.h"
#include "deck/deck.h"
#include "io/log.h"
#include "io/peak_file.h"
#include "model/transformer.h"
#include "resilience/watchdog.h"
#include "train/loss_scale.h"
#include "train/lossagg.h"
#include "train/optimizer.h"

namespace xx {

struct RunOptions {
  std::string resume;  // "" (fresh), "auto" (newest complete checkpoint, if any) or a path
  bool quiet = false;  // no console output (tests)
};

// Names of the tensors starting in [begin, end) whose gradient is all zero:
// no gradient reached them in this backward.
// `excused(t)` names tensors that may legitimately miss out (idle experts).
std::vector<std::string> tensors_without_gradient(const ParamLayout& layout, const Buffer<float>& grads,
                                                  int64_t begin, int64_t end,
                                                  const std::function<bool(const TensorInfo&)>& excused = {});

class Trainer {
 public:
  // Loads the data, builds the model and optimizer, restores a checkpoint when
  // asked. Collective over comm. Throws InputError for bad data or checkpoints.
  Trainer(MPI_Comm comm, const Program& program, const RunOptions& options);
  ~Trainer();

  void run();  // every phase of the deck, from wherever the checkpoint left off
  double train_step();  // one optimizer step; returns the global mean loss
  // Waits for the checkpoint being written in the background (checkpoint ...
  // async on), logs it, and rethrows its error; after save_checkpoint, the
  // file is durably on disk once this returns. Collective; cheap when idle.
  void finish_checkpoint();  // (not collective: every rank waits for its own writer)

  // Read-outs for tests and tools.
  Transformer<float>& model() { return *model_; }
  int64_t step() const { return step_; }
  const std::vector<double>& losses() const { return losses_; }  // global mean loss of each step taken here
  std::string backends() const;
  const CommStats& last_comm() const { return step_comm_; }  // communication of the last step
  double consensus_distance() const { return consensus_; }   // at the last sync local, -1 before
  const CompressedSync* compressed() const { return compressed_.get(); }  // null without compress topk
  Continuation data_start() const { return sampler_start_; }  // where this world's data streams began
  const LossScaler* loss_scaler() const { return scaler_.get(); }         // null under precision fp32
  const LossAggregator* lossagg() const { return lossagg_.get(); }       // null when no phase sets lossagg
  // Testing hook (kept out of the deck): rank `rank` trains on random tokens
  // instead of its batches (a bad shard), for the lossagg robust tests.
  void poison_batches_for_testing(int rank) { poison_rank_ = rank; }

  // Testing hook (kept out of the deck): at optimizer step `step` (1-based,
  // as logged) rank `rank` sets one gradient entry to inf after its backward,
  // before the gradients are averaged. Issue 6/6's `fault nan` can reuse it.
  void inject_gradient_fault(int64_t step, int rank) { fault_step_ = step, fault_rank_ = rank; }

 private:
  double evaluate();
  void check_missing_gradients(int64_t begin, int64_t end);
  void save_checkpoint(double loss);
  void restore(const std::string& path);
  std::string resolve_resume(const std::string& resume) const;
  // Checkpoint writer (docs/CHECKPOINT.md): the chain's base for diff across
  // time, and under async on one background write at a time (HDF5 is not
  // thread-safe), on its own communicator.
  ChainBase chain_;
  std::thread writer_;
  MPI_Comm writer_comm_ = MPI_COMM_NULL;  // dup of comm_: the writer's collectives never meet the training's
  std::exception_ptr writer_error_;       // the background write's failure, rethrown by finish_checkpoint
  struct PendingWrite {
    std::string path, kind, how;  // file, chain kind, "diff lossless" / "full copies"
    double stall = 0, write_s = 0; // training-thread seconds in save_checkpoint; seconds the write took
    double waited = 0;             // of the stall: waiting for the previous write (async on)
    bool async = false;
  };
  PendingWrite pending_;
  bool async_checked_ = false, async_ok_ = false;
  void write_checkpoint_now(MPI_Comm comm, const std::string& dir, const EncodedCheckpoint& encoded, int64_t keep);
  void log_checkpoint();

  MPI_Comm comm_;
  int rank_ = 0, world_ = 1;
  const Program program_;  // a copy: callers may pass a temporary
  RunOptions options_;
  Config cfg_;  // the configuration of the phase being run
  Corpus corpus_;
  WindowSplit split_;
  std::unique_ptr<RunLog> log_;
  std::unique_ptr<Watchdog> watchdog_;  // deck: timeout; names a hung rank (docs/RESILIENCE.md)
  std::unique_ptr<Transformer<float>> model_;
  std::unique_ptr<AdamW<float>> optimizer_;
  std::unique_ptr<Communicator> comm_ops_;  // which transport serves which traffic
  std::unique_ptr<GradientSync> sync_;
  std::unique_ptr<CompressedSync> compressed_;  // compress topk in the deck
  Buffer<float> update_before_, update_delta_;  // compress target update: parameters before the step, the change
  std::unique_ptr<Topology> topology_;
  int64_t phase_start_ = 0;
  uint64_t chaos_seed_ = 0;                // shuffle chaos|independent: the run's seed (checkpointed), else 0
  std::unique_ptr<CommonPool> pool_;       // data common F: the node's shared copy; outlives loader_
  std::unique_ptr<BatchLoader> loader_;
  Kokkos::View<int32_t*, MemSpace> inputs_, targets_;
  int64_t step_ = 0, last_saved_ = -1;
  double flops_per_token_ = 0;
  MfuMeter mfu_;  // against the deck's or the peak file's peak (io/peak_file.h); none: MFU n/a
  // Figures of the last step, for the log.
  double last_norm_ = 0, last_lr_ = 0;
  LossParts last_loss_;
  std::vector<double> expert_load_;  // tokens per routed expert, summed over MoE layers and ranks
  std::map<std::string, int64_t> model_buffers();  // the base's state buffers a checkpoint must hold
  std::map<std::string, int64_t> rank_buffers();   // each rank's own buffers in /ranks/<r>
  RankState merged_rank_state(const std::string& path, const CheckpointData& base, int old_world);
  Continuation sampler_start_;  // where this world's data streams begin (another world size left an epoch)
  std::string log_note_;        // said once the log exists
  void balance_experts();
  void average_parameters(bool global);  // sync local every K steps (in the group), or globally at a phase end
  void average_moments();                // AdamW's moments over all ranks, at the end of a phase that let them differ
  CommStats step_comm_;                 // this step's communication, all kinds
  double consensus_ = -1;              // RMS distance of the ranks' parameters from their mean at the last sync
  Buffer<float> anchor_, momentum_, mean_;  // sync local: parameters at the last sync, outer momentum, scratch
  Buffer<float> initial_params_;        // sync local with an outer optimizer: the first anchor
  int64_t start_batch_ = 0;            // loader position to resume from
  std::vector<double> losses_;
  // sgdr warm restarts (train/schedule.h): each restart's record, and under
  // restart_from best the best validation point of the current cycle.
  struct Restart {
    int64_t step = 0;             // the first step of the new cycle (1-based)
    double lr = 0, val_loss = 0;  // the new peak; validation loss at the end of the cycle that ended
    int cycle = 0;
    int64_t restored_from = -1;   // restart_from best: the step training went back to (-1: none)
  };
  struct CycleBest {
    int64_t step = -1;  // -1: no validation in this cycle yet
    double val_loss = 0;
    int64_t adam_steps = 0;
    Buffer<float> params, adam_m, adam_v;
    std::map<std::string, std::vector<float>> gate_bias;  // MoE selection biases by layer prefix
  };
  void note_validation(double val);  // restart_from best: remember the cycle's best state
  void warm_restart(const Schedule& next, double val);  // after the last step of a cycle, before the next one
  std::optional<Schedule> schedule_of(int64_t step) const;
  std::vector<Restart> restarts_;
  CycleBest best_;
  // Mixed precision (deck: precision; docs/DYNAMICS.md).
  kernels::Precision precision_ = kernels::Precision::fp32;
  Buffer<float> master_;                // fp32 master weights while params hold their rounded copy
  std::unique_ptr<LossScaler> scaler_;  // bf16, fp16; null under fp32
  void use_working_weights();           // master_ = params, then params rounded to the type
  void restore_master_weights();        // params = master_
  bool gradients_overflowed();          // inf or NaN in any rank's gradients (one all-reduce)
  int64_t fault_step_ = -1;             // inject_gradient_fault, fault nan
  int fault_rank_ = -1;
  float fault_value_ = std::numeric_limits<float>::infinity();
  // Resilience (deck: health, fault, preempt; docs/RESILIENCE.md).
  double own_loss_ = 0;            // this rank's loss of the last step
  bool last_skipped_ = false;      // the last step was skipped for an inf or NaN (health nan skip)
  int64_t nonfinite_in_row_ = 0, nonfinite_skipped_ = 0;
  int stop_signal_ = 0;            // the stop signal the ranks agreed on
  bool resumed_ = false;           // restored from a checkpoint: fault injection is off
  void run_phases();
  void check_health_now();
  bool stop_requested();           // collective: a stop signal reached any rank
  void stop_on_signal(double loss);
  void inject_fault(int64_t step);
  // Multi-view loss aggregation (deck: lossagg; docs/DYNAMICS.md).
  std::unique_ptr<LossAggregator> lossagg_;
  int poison_rank_ = -1;  // poison_batches_for_testing
};

}  // namespace xx

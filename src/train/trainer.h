// The training loop: one Trainer per rank runs every `run` phase of a deck.
// It is assembled from parts, each owning its state and registering it for
// checkpoints (core/state.h): the model and AdamW, the phase's sync strategy
// (comm/sync_strategy.h), mixed precision, loss aggregation, warm restarts,
// the data stream. trainer.cpp holds the loop; trainer_checkpoint.cpp save
// and resume; trainer_resilience.cpp health, stop signals and faults;
// trainer_stages.cpp a pipeline stage's passes.
#pragma once
#include <mpi.h>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>
#include "ckpt/checkpoint.h"
#include "comm/expert_exchange_mpi.h"
#include "comm/ops.h"
#include "comm/placement_mpi.h"
#include "comm/sync_strategy.h"
#include "core/state.h"
#include "data/corpus.h"
#include "data/loader.h"
#include "data/tokenizer.h"
#include "deck/deck.h"
#include "io/log.h"
#include "io/peak_file.h"
#include "model/decoder.h"
#include "model/transformer.h"
#include "resilience/watchdog.h"
#include "train/checkpoint_saver.h"
#include "train/lossagg.h"
#include "train/mixed_precision.h"
#include "train/optimizer.h"
#include "train/pipeline.h"
#include "train/step_report.h"
#include "train/training_data.h"
#include "train/warm_restarts.h"

namespace xx {

struct RunOptions {
  ResumeFrom resume;   // -resume: fresh, auto (the newest complete checkpoint, if any) or a file
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

  void run();           // every phase of the deck, from wherever the checkpoint left off
  double train_step();  // one optimizer step of the current phase; returns the global mean loss
  // Waits for the checkpoint being written in the background (checkpoint ...
  // async on), logs it, and rethrows its error. Not collective.
  void finish_checkpoint();

  // Read-outs for tests and tools.
  Transformer<float>& model() { return *model_; }
  // Collective: the whole weights on the host (under shard params gathered
  // from every rank's pieces; else this rank's buffer).
  std::vector<float> whole_params();
  AdamW<float>& optimizer() { return *optimizer_; }  // its moments are this rank's shard under `shard`
  int64_t step() const { return step_; }
  const std::vector<double>& losses() const { return losses_; }  // global mean loss of each step taken here
  std::string backends() const;
  const CommStats& last_comm() const { return last_.comm; }  // communication of the last step
  double consensus_distance() const { return last_.consensus; }   // at the last parameter averaging, -1 before
  const CompressedSync* compressed() const { return strategy_->compressor(); }  // null without compress topk
  Continuation data_start() const { return data_->start(); }  // where this world's data streams began
  const LossScaler* loss_scaler() const { return precision_->scaler(); }  // null under precision fp32
  const LossAggregator* lossagg() const { return lossagg_.get(); }        // null when no phase sets lossagg
  // At optimizer step `step` (1-based) rank `rank` sets one gradient entry to
  // inf after its backward, before the gradients are averaged (fault nan uses it).
  void inject_gradient_fault(int64_t step, int rank, float value = std::numeric_limits<float>::infinity());

 private:
  // set-up (trainer_setup.cpp) and the loop (trainer.cpp)
  void build_model(bool fresh);  // fresh: no checkpoint to resume (init hf reads its weights then)
  // init hf DIR: the weights this rank keeps (`mine`, ranges of its buffer) from the HF files
  void import_hf(const std::vector<std::pair<int64_t, int64_t>>& mine);
  void check_expert_groups(const std::string& resume_path);  // moe ... ep N: the world splits into groups
  void check_pipeline_stages() const;  // pipeline stages P: the world splits into P stages
  void build_stages();                 // ... their messages and executor (pipeline stages P > 1)
  void register_state();
  void enter_phase(size_t phase);  // the phase's settings and sync strategy
  bool keeps_strategy(size_t phase) const;  // its sync settings equal the phase before's
  std::function<void(int64_t)> gradient_hook(bool last);
  // A step's forward and backward passes, chosen once (build_stages): every
  // micro-batch through the whole model, or this stage's passes in its
  // schedule's order. The step's mean losses (the same on every rank of a chain).
  LossParts micro_batch_passes();
  LossParts stage_passes();
  LossParts (Trainer::*passes_)() = &Trainer::micro_batch_passes;
  SyncSettings phase_sync(const Config& c, int64_t phase_start) const;
  void share_embedding(Vec<float> reduced);  // pipeline stages: the embedding's gradient, one on the first and last stage
  LossWeights weigh_losses(const LossParts& parts);
  bool agree_on_losses(const LossParts& mine);  // the global loss; true: skip (health nan skip)
  void count_expert_load(int run = -1);  // after a training forward (of one run of a stage's layers): its expert load joins the step's
  void balance_experts();
  CommStats expert_traffic();  // this step's all-to-alls (ep), read and reset
  Validation evaluate();  // collective: the loss (and bits per byte) on validation windows
  void run_phases();
  void after_step(double loss, double seconds);
  void write_sample();  // rank 0 (deck: sample every N)
  void check_missing_gradients(int64_t begin, int64_t end);
  StepFigures figures(double loss) const;
  // Collective: each rank's peak resident memory (MiB), then each one's before the model was built.
  std::vector<double> peak_resident_mib() const;

  // checkpoints (trainer_checkpoint.cpp)
  std::string resolve_resume(const ResumeFrom& resume) const;
  void restore(const std::string& path);
  std::map<std::string, int64_t> required_buffers(StatePlace place) const;
  CheckpointData snapshot(double loss, RankState& mine);  // collective: the base and this rank's own state
  // Sharded runs write and read their own slabs of the file's tensors (docs/CHECKPOINT.md, "Sharded runs").
  bool writes_slabs() const;
  void save_checkpoint(double loss);

  // resilience (trainer_resilience.cpp)
  void check_health_now();
  bool stop_requested();  // collective: a stop signal reached any rank
  void stop_on_signal(double loss);
  void inject_fault(int64_t step);

  MPI_Comm comm_;
  int rank_ = 0, world_ = 1;
  // pipeline stages P > 1 (train/pipeline.h): this rank's stage, its
  // neighbours' messages and the schedule; replicas_ is the communicator
  // averaging this rank's gradients and splitting the data (the world, or
  // its stage's data-parallel replicas).
  std::unique_ptr<StageLink> stages_;
  std::unique_ptr<PipelineExecutor> pipeline_;
  MPI_Comm replicas_ = MPI_COMM_NULL;
  int micro_ = 1;                    // sequences per pass: data batch / pipeline micro
  std::vector<Buffer<float>> stage_in_, stage_out_;  // per run: a micro-batch's activation (or gradient) in kernel memory
  Buffer<float> lookups_;               // MTP across stages: a micro-batch's lookup gradients (stage 0)
  std::vector<float> stage_lookups_;    // ... as they travel, on the host
  bool mtp_travels_ = false;            // P > 1 with MTP: the last stage's lookups go to stage 0
  std::vector<ActivationSets> stage_sets_;  // per run of the stage: which of its sets of activations holds each micro-batch
  std::vector<float> stage_host_;       // a validation run's activation as it travels, on the host
  const Program program_;  // a copy: callers may pass a temporary
  RunOptions options_;
  Config cfg_;             // the settings of the phase being run
  size_t phase_ = 0;       // its index
  int64_t phase_start_ = 0, phase_end_ = 0;

  std::unique_ptr<TrainingData> data_;  // the corpora, the split, the training stream and its batch

  // the parts
  std::unique_ptr<RunLog> log_;
  std::unique_ptr<Watchdog> watchdog_;  // deck: timeout; names a hung rank (docs/RESILIENCE.md)
  std::unique_ptr<Transformer<float>> model_;
  // Where every float lives (core/placement.h): the whole model's frame,
  // this rank's expert share and its pieces; and its collectives.
  Placement placement_;
  std::unique_ptr<PlacementMpi> placed_;
  // moe ... ep N: the tokens' all-to-alls, one; or under dualpipev one per
  // run, whose waits hand over to the paired pass (train/pass_pair.h)
  std::vector<std::unique_ptr<ExpertExchange>> exchanges_;
  ExchangeStats exchange_total_;              // the run's all-to-alls (how much the shared experts hid)
  std::unique_ptr<Decoder> decoder_;  // rank 0, made at the first sample
  std::unique_ptr<AdamW<float>> optimizer_;
  std::unique_ptr<MixedPrecision> precision_;
  std::unique_ptr<LossAggregator> lossagg_;
  std::unique_ptr<WarmRestarts> restarts_;
  std::unique_ptr<Communicator> comm_ops_;  // which transport serves which traffic
  std::unique_ptr<SyncStrategy> strategy_;  // the phase's
  std::string strategy_report_;             // its start-up line
  StateRegistry state_;                     // every part's checkpointed state but the strategy's
  StateRegistry strategy_state_;
  std::unique_ptr<StepReport> report_;

  // the step
  int64_t step_ = 0, last_saved_ = -1;
  std::vector<double> losses_;
  double flops_per_token_ = 0;
  double resident_before_model_ = 0;  // MiB: the process before the model, its optimizer and buffers
  MfuMeter mfu_;  // against the deck's or the peak file's peak (io/peak_file.h); none: MFU n/a
  // The last step's figures for its line and metrics record (figures() adds
  // the rest): norm, LR, losses, communication, consensus, expert load, and
  // the count of steps skipped for an inf or NaN.
  StepFigures last_;
  double seed_main_ = 1;              // this micro-batch's main-loss weight (0: lossagg robust trimmed this rank)
  bool lossagg_on_ = false;           // this phase weighs the losses (lossagg other than off)
  std::vector<std::function<void(int64_t, int64_t)>> on_gradients_;  // on each final range [begin, end)
  std::vector<double> step_load_;     // MoE: this step's tokens per layer and routed expert, then rows dropped

  // resilience (deck: health, fault, preempt; docs/RESILIENCE.md)
  struct Nonfinite {
    bool own = false;           // inf or NaN in this rank's loss or gradients (without a loss scaler)
    bool last_skipped = false;  // the last step was skipped for one (health nan skip)
    int64_t in_row = 0;         // steps skipped in a row
  } nonfinite_;
  struct InjectedFault {        // inject_gradient_fault
    int64_t step = -1;
    int rank = -1;
    float value = 0;
  } injected_;
  int stop_signal_ = 0;        // the stop signal the ranks agreed on
  bool resumed_ = false;       // restored from a checkpoint: fault injection is off

  std::unique_ptr<CheckpointSaver> saver_;  // encodes and writes them, in place or in the background
  std::string log_note_;  // said once the log exists
};

}  // namespace xx

// The training loop: one Trainer per rank runs every `run` phase of a deck.
#pragma once
#include <mpi.h>
#include <functional>
#include <memory>
#include <string>
#include <vector>
#include <map>
#include "ckpt/checkpoint.h"
#include "comm/compressed_sync.h"
#include "comm/grad_sync.h"
#include "comm/ops.h"
#include "comm/topology.h"
#include "data/corpus.h"
#include "data/loader.h"
#include "deck/deck.h"
#include "io/log.h"
#include "model/transformer.h"
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

  // Read-outs for tests and tools.
  Transformer<float>& model() { return *model_; }
  int64_t step() const { return step_; }
  const std::vector<double>& losses() const { return losses_; }  // global mean loss of each step taken here
  std::string backends() const;
  const CommStats& last_comm() const { return step_comm_; }  // communication of the last step
  double consensus_distance() const { return consensus_; }   // at the last sync local, -1 before
  const CompressedSync* compressed() const { return compressed_.get(); }  // null without compress topk

 private:
  double evaluate();
  void check_missing_gradients(int64_t begin, int64_t end);
  void save_checkpoint(double loss);
  void restore(const std::string& path);
  std::string resolve_resume(const std::string& resume) const;

  MPI_Comm comm_;
  int rank_ = 0, world_ = 1;
  const Program program_;  // a copy: callers may pass a temporary
  RunOptions options_;
  Config cfg_;  // the configuration of the phase being run
  Corpus corpus_;
  WindowSplit split_;
  std::unique_ptr<RunLog> log_;
  std::unique_ptr<Transformer<float>> model_;
  std::unique_ptr<AdamW<float>> optimizer_;
  std::unique_ptr<Communicator> comm_ops_;  // which transport serves which traffic
  std::unique_ptr<GradientSync> sync_;
  std::unique_ptr<CompressedSync> compressed_;  // compress topk in the deck
  Buffer<float> update_before_, update_delta_;  // compress target update: parameters before the step, the change
  std::unique_ptr<Topology> topology_;
  int64_t phase_start_ = 0;
  std::unique_ptr<BatchLoader> loader_;
  Kokkos::View<int32_t*, MemSpace> inputs_, targets_;
  int64_t step_ = 0, last_saved_ = -1;
  double peak_gflops_ = 0, flops_per_token_ = 0;
  // Figures of the last step, for the log.
  double last_norm_ = 0, last_lr_ = 0;
  LossParts last_loss_;
  std::vector<double> expert_load_;  // tokens per routed expert, summed over MoE layers and ranks
  std::map<std::string, int64_t> model_buffers() ;
  void balance_experts();
  void average_parameters(bool global);  // sync local every K steps (in the group), or globally at a phase end
  CommStats step_comm_;                 // this step's communication, all kinds
  double consensus_ = -1;              // RMS distance of the ranks' parameters from their mean at the last sync
  Buffer<float> anchor_, momentum_, mean_;  // sync local: parameters at the last sync, outer momentum, scratch
  Buffer<float> initial_params_;        // sync local with an outer optimizer: the first anchor
  int64_t start_batch_ = 0;            // loader position to resume from
  bool checkpoint_due_ = false;        // sync local: a checkpoint waits for the next sync
  std::vector<double> losses_;
};

}  // namespace xx

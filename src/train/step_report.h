// What a step tells the user: rank 0's progress line, the step line every
// log_every steps and at each phase's end, metrics.jsonl, TensorBoard
// scalars, the rank logs, and the run's closing PERFORMANCE line.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>
#include "comm/comm_stats.h"
#include "io/log.h"
#include "io/peak_file.h"
#include "model/transformer.h"
#include "train/loss_scale.h"
#include "train/lossagg.h"

namespace xx {

// One validation pass: the mean loss in nats per token, bits per byte of the
// text predicted (NaN where tokens have no known byte length), and the
// fraction of tokens whose argmax is the target (next-token accuracy).
struct Validation {
  double loss = 0, bpb = 0, acc = 0;
};

// The figures of the step just taken.
struct StepFigures {
  int64_t step = 0, phase_end = 0;
  double loss = 0, own_loss = 0, lr = 0, norm = 0;
  LossParts parts;
  bool mtp = false;
  CommStats comm;
  double consensus = -1;                  // RMS distance at the last averaging; -1: never
  std::vector<double> expert_load;        // tokens per routed expert, all MoE layers and ranks
  double expert_dropped = -1;             // rows past the experts' capacity (moe ... capacity_factor); -1: dropless
  int64_t nonfinite_skipped = 0;          // health nan skip
  std::optional<double> compress_ratio;   // compress topk
  const LossScaler* scaler = nullptr;
  const LossAggregator* lossagg = nullptr;
  LossAggKind lossagg_kind = LossAggKind::off;
  int64_t batch_position = 0;             // batches this rank's loader handed out
  std::vector<double> bubble;             // pipeline stages: each stage's idle fraction this step (replica 0's)
  double bubble_theory = 0;               // ... the schedule's, with equal pass times
};

class StepReport {
 public:
  // mfu: against the deck's or the peak file's peak; none: MFU n/a (rank 0 only reports one).
  StepReport(RunLog& log, int rank, int world, double flops_per_token, MfuMeter& mfu, int64_t total_steps);

  // Every step: its wall time and the tokens it trained (all ranks).
  void step_done(int64_t step, double loss, double seconds, int64_t tokens);
  void log_step(const StepFigures& f);  // the step line; the interval starts again
  void log_validation(int64_t step, int64_t phase_end, const Validation& v);
  void flush();                         // this step's metrics record, if any
  // The closing line; peak_rss_mib: every rank's peak resident memory (their
  // maximum is in the line), then every rank's before the model.
  void performance(double final_loss, const std::vector<double>& peak_rss_mib);

 private:
  RunLog& log_;
  int rank_, world_;
  double flops_per_token_;
  MfuMeter& mfu_;
  int64_t total_steps_;
  int64_t steps_ = 0, tokens_ = 0, interval_steps_ = 0, interval_tokens_ = 0;
  double seconds_ = 0, interval_seconds_ = 0, smoothed_ = 0;
  nlohmann::json record_;
};

}  // namespace xx

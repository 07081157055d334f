// Everything a run is told by its deck, as plain values. The deck parser
// (src/deck/) fills these; nothing else writes them. Defaults live here.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace xx {

// model dense vocab V dim C layers L heads H ffn F seq T [rope_theta X] [norm_eps X] [init_std X]
struct ModelConfig {
  std::string kind = "dense";
  int vocab = 256;          // V
  int dim = 128;            // C
  int layers = 4;           // L
  int heads = 4;            // H, head_dim = C / H
  int ffn = 384;            // F, SwiGLU hidden width
  int seq = 128;            // T, training context
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;
  double init_std = 0.02;
  int head_dim() const { return dim / heads; }
};

// data bytes|shard PATH [valid F] [batch B] [workers N] [queue Q]
struct DataConfig {
  std::string format = "bytes";  // bytes: raw text, one token per byte; shard: see docs/DATA.md
  std::string path;
  double valid_fraction = 0.05;  // tail of the token stream held out for validation
  int batch = 8;                 // B, sequences per rank per step
  int workers = 2;               // prefetch threads
  int queue = 4;                 // ready batches held ahead of the trainer
};

// optimizer adamw lr X [beta1 X] [beta2 X] [eps X] [weight_decay X] [clip X]
struct OptimizerConfig {
  double lr = 3e-3;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;  // decoupled; never applied to norm weights
  double clip = 1.0;          // global gradient norm; 0 disables
};

// schedule cosine [warmup W] [min_lr X] [total S]
struct ScheduleConfig {
  std::string kind = "cosine";
  int64_t warmup = 0;
  double min_lr = 0.0;
  int64_t total = 0;  // 0: the sum of every `run` in the deck
};

// sync dense [bucket_mb X]
struct SyncConfig {
  std::string kind = "dense";
  double bucket_mb = 1.0;  // gradient bucket size for the overlapped all-reduce
};

// output dir PATH [log_every N] [progress auto|on|off]
struct OutputConfig {
  std::string dir = "runs/default";
  int64_t log_every = 10;
};

// eval every N [batches K]
struct EvalConfig {
  int64_t every = 0;  // 0: only at the end of each run
  int batches = 8;
};

// checkpoint every N
struct CheckpointConfig {
  int64_t every = 0;  // 0: only at the end of each run
  bool at_end = true;
};

// grad_check missing warn|error|off
struct GradCheckConfig {
  std::string missing = "error";
};

struct Config {
  uint64_t seed = 1234;
  double peak_gflops = 0.0;  // 0: measure one core's SGEMM on the model's shapes at start-up
  ModelConfig model;
  DataConfig data;
  OptimizerConfig optimizer;
  ScheduleConfig schedule;
  SyncConfig sync;
  OutputConfig output;
  EvalConfig eval;
  CheckpointConfig checkpoint;
  GradCheckConfig grad_check;
};

}  // namespace xx

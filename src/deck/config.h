// Everything a run is told by its deck, as plain values. The deck parser
// (src/deck/) fills these; nothing else writes them. Defaults live here.
#pragma once
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>
#include "core/modes.h"

namespace xx {

// attention mha | mla kv_lora_rank R q_lora_rank Q qk_nope_dim N rope_dim P v_dim V [latent_eps X]
struct AttentionConfig {
  AttentionKind kind = AttentionKind::mha;  // mha: per-head q, k, v of width C/H; mla: multi-head latent attention
  int kv_lora_rank = 0;      // R, width of the compressed key/value latent
  int q_lora_rank = 0;       // Q, 0: queries projected directly from the hidden state
  int qk_nope_dim = 0;       // per-head query/key width without rotary embedding
  int rope_dim = 0;          // per-head rotary width; the rope key is shared by all heads
  int v_dim = 0;             // per-head value width
  // eps of the q and kv latent RMSNorms; 0 (unset): the model's norm_eps.
  // HF's DeepSeek codes build them with 1e-6 whatever rms_norm_eps says.
  double latent_eps = 0;
  // attention_kernel auto | packed | flash: the causal-attention kernel
  // (model/attention.h: uses_flash_attention says which auto picks)
  AttentionKernel kernel = AttentionKernel::automatic;
  bool mla() const { return kind == AttentionKind::mla; }
};

// The most expert groups group-limited routing takes (kernels/moe.h keeps a
// token's chosen groups as one 64-bit mask).
constexpr int kMaxExpertGroups = 64;

// moe off | on dense_layers K shared S routed E topk k ffn F [gate softmax|sigmoid]
//              [balance aux|bias] [balance_coef X] [aux_scope batch|sequence] [seq_aux X] [route_scale X]
//              [groups G] [topk_groups g] [layer_freq N] [ep N] [capacity_factor C]
// (aux_scope belongs to balance aux, seq_aux to balance bias)
// groups: group-limited routing (DeepSeek-V2's group_limited_greedy, V3's
// noaux_tc): the routed experts fall into G groups of E/G in index order; a
// token keeps its best g groups (softmax: by their largest score; sigmoid: by
// the sum of their two largest score + bias) and picks its k experts in them.
// layer_freq: HF's moe_layer_freq, MoE on the blocks (MTP's included, counted
// layers + d) at or past dense_layers whose index is a multiple of N.
struct MoeConfig {
  MoeMode mode = MoeMode::off;
  int dense_layers = 1;            // the first K blocks keep a dense FFN
  int shared = 0;                  // always-on experts
  int routed = 0;                  // E routed experts
  int topk = 0;                    // experts per token
  int ffn = 0;                     // width of every expert's SwiGLU
  Gate gate = Gate::softmax;      // softmax (V2) or sigmoid with normalisation (V3)
  Balance balance = Balance::aux;  // aux: expert-level auxiliary loss (V2); bias: auxiliary-loss-free (V3)
  double balance_coef = 0.001;     // aux: loss coefficient alpha; bias: update step gamma
  AuxScope aux_scope = AuxScope::batch;  // aux: the loss over the rank's batch, or per sequence (V2's seq_aux)
  double seq_aux = 0;              // bias: V3's complementary sequence-wise loss, its alpha (0: none)
  double route_scale = 1.0;        // scales the combine weights
  int ep = 1;                      // expert parallelism: the routed experts spread over groups of ep ranks
  double capacity_factor = 0;      // 0: dropless; C: an expert runs at most C x its group's mean load, drops the rest
  int groups = 1;                  // G expert groups for group-limited routing; 1: no grouping
  int topk_groups = 0;             // g groups a token routes to; 0 (not given): all G (kept_groups)
  int layer_freq = 1;              // MoE on every N-th block past dense_layers (HF's moe_layer_freq)
  // The balance loss's alpha over the rank's whole batch, and per sequence
  // (at most one of them is not zero).
  double batch_loss_coef() const {
    return balance == Balance::aux && aux_scope == AuxScope::batch ? balance_coef : 0;
  }
  double sequence_loss_coef() const {
    return balance == Balance::aux ? (aux_scope == AuxScope::sequence ? balance_coef : 0) : seq_aux;
  }
  bool enabled() const { return mode == MoeMode::on; }
  int kept_groups() const { return topk_groups > 0 ? topk_groups : groups; }
  // The one rule for which blocks are MoE (HF's: layer_idx >= first_k_dense_replace
  // and layer_idx % moe_layer_freq == 0); MTP module d is block layers + d.
  bool is_moe_layer(int layer) const { return enabled() && layer >= dense_layers && layer % layer_freq == 0; }
};

// rope_scaling off | yarn factor F original_seq T [beta_fast X] [beta_slow X] [mscale X] [mscale_all_dim X]
// yarn: DeepSeek-V2's YaRN, as its model code and transformers'
// _compute_yarn_parameters define it (model/attention.h rope_frequencies,
// attention_score_scale): the rotary frequencies of the pairs that turn
// fewer than beta_slow times over T positions are divided by F, those that
// turn more than beta_fast times kept, a linear ramp between; the cos and sin
// tables times mscale(F, mscale) / mscale(F, mscale_all_dim), the attention
// scores times mscale(F, mscale_all_dim)^2, where mscale(s, m) = 0.1 m ln s + 1
// (1 for s <= 1: an F in (0, 1] scales neither, only the frequencies by 1/F).
struct RopeScalingConfig {
  RopeScalingKind kind = RopeScalingKind::off;
  double factor = 1;          // F, the context extension (> 0)
  int original_seq = 0;       // T, the context the model was trained for before the extension (>= 2)
  double beta_fast = 32;      // rotations over T above which a pair keeps its frequency
  double beta_slow = 1;       // rotations over T below which it is divided by F (0 < beta_slow < beta_fast)
  double mscale = 1;          // the tables' mscale coefficient
  double mscale_all_dim = 0;  // the scores' (and the tables' divisor); 0: 1
  bool yarn() const { return kind == RopeScalingKind::yarn; }
};

// YaRN's get_mscale(s, m): 0.1 m ln s + 1, and 1 for s <= 1 (DeepSeek's and
// transformers' definition; the model's tables and scores, and init hf's
// reading of config.json, use this one).
inline double yarn_mscale(double s, double m) { return s <= 1 ? 1.0 : 0.1 * m * std::log(s) + 1.0; }

// mtp depth D weight W
struct MtpConfig {
  int depth = 0;        // extra modules predicting tokens t+2 .. t+1+D; 0: off
  double weight = 0.3;  // lambda: the MTP loss is lambda/D * sum of their cross-entropies
};

// init random | hf DIR [seq T] [expanded yes|no]
// hf: the weights of a fresh run come from a Hugging Face directory (config.json,
// model.safetensors or its index); rank 0 turns config.json into the model,
// attention, moe, mtp (and rope_scaling) lines that follow this one (src/hf/config.h), so the
// resolved deck describes the model alone. A run with its own checkpoint
// resumes from it instead (-resume auto).
struct InitConfig {
  InitKind kind = InitKind::random;
  std::string dir;  // hf: the directory
  int seq = 0;      // hf: the training context (0: config.json's, see src/hf/config.h)
  bool expanded = false;  // hf: the model lines that follow were made from config.json (src/hf/config.h)
};

// model dense|deepseek vocab V dim C layers L heads H ffn F seq T [rope_theta X] [norm_eps X] [init_std X]
// (deepseek is dense plus whatever `attention`, `moe` and `mtp` say)
struct ModelConfig {
  ModelKind kind = ModelKind::dense;
  int vocab = 256;          // V
  int dim = 128;            // C
  int layers = 4;           // L
  int heads = 4;            // H; MHA head_dim = C / H
  int ffn = 384;            // F, SwiGLU hidden width of the dense FFN
  int seq = 128;            // T, training context
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;
  double init_std = 0.02;
  // tie_embeddings yes: one (V, C) tensor is the embedding and the LM head
  // (HF's tie_word_embeddings); the head's gradient sums into it. no: the head
  // is its own tensor. ParamLayout::head_name says which the head reads.
  bool tie_embeddings = false;
  // recompute off | selective | full (core/modes.h): activations kept for the
  // backward, or recomputed in it. Losses and gradients are the same bits.
  Recompute recompute = Recompute::off;
  AttentionConfig attention;
  MoeConfig moe;
  MtpConfig mtp;
  RopeScalingConfig rope_scaling;
  int head_dim() const { return dim / heads; }
  // the rotary width: MLA's rope part, else the whole head
  int rope_width() const { return attention.mla() ? attention.rope_dim : head_dim(); }
  double latent_eps() const { return attention.latent_eps > 0 ? attention.latent_eps : norm_eps; }
  int qk_dim() const { return attention.mla() ? attention.qk_nope_dim + attention.rope_dim : head_dim(); }
  int v_dim() const { return attention.mla() ? attention.v_dim : head_dim(); }
};

// data bytes|shard PATH [valid F|FILE] [tokenizer MODEL] [batch B] [workers N] [queue Q]
//      [shuffle fixed|chaos|independent] [chaos_seed S] [common F] [common_rate R]
//      [partition shuffled|contiguous]
// docs/DATA.md: shuffle modes, chaos seed replay, the common pool, partitions.
struct DataConfig {
  DataFormat format = DataFormat::bytes;  // bytes: raw text, one token per byte; shard: see docs/DATA.md
  std::string path;              // a file, or (shard) a glob of shards: 'DIR/train_*.bin'
  std::string valid = "0.05";    // as written: a fraction, or a validation file
  double valid_fraction = 0.05;  // tail of the training windows held out for validation (0 with valid_path)
  std::string valid_path;        // the validation shard(s), when `valid` names a file
  std::string tokenizer;         // SentencePiece model the shards were made with ("" : bytes, or unchecked)
  int batch = 8;                 // B, sequences per rank per step
  int workers = 2;               // prefetch threads
  int queue = 4;                 // ready batches held ahead of the trainer
  Shuffle shuffle = Shuffle::fixed;  // fixed: run seed; chaos: a drawn seed, shared; independent: per-rank streams
  uint64_t chaos_seed = 0;        // chaos, independent: replay this seed (0: draw one at start-up)
  double common = 0.0;            // fraction of the training windows in the common pool (0: no pool)
  double common_rate = 0.1;       // with a pool: fraction of each rank's samples drawn from it
  Partition partition = Partition::shuffled;  // shuffled: all ranks share each epoch's permutation; contiguous: own slices
  int noise_rank = -1;            // this rank trains on uniformly random tokens (a bad shard, for lossagg robust)
};

// optimizer adamw lr X [beta1 X] [beta2 X] [eps X] [weight_decay X] [clip X]
struct OptimizerConfig {
  double lr = 3e-3;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;  // decoupled; never applied to norm weights
  double clip = 1.0;          // global gradient norm; 0 disables
  // Where AdamW keeps its moments: fp32, or bf16 (DeepSeek-V3: half the
  // moments' bytes; the update's arithmetic stays fp32, each moment read from
  // bf16 and written back rounded to nearest even). kernels/moments.h owns the storage.
  Precision moments = Precision::fp32;
};

// schedule cosine [warmup W] [min_lr X] [total S]
//        | sgdr period P [mult M] [min_lr X] [warmup W] [jitter J] [restart_from last|best]
//        | step every S factor F [jitter J] [warmup W]
// Steps count from 1 across every run of the deck; the peak is the optimizer's
// lr. The LR is a pure function of this, the lr, the seed and the step
// (src/train/schedule.h), so every rank and every resume sees the same value.
struct ScheduleConfig {
  ScheduleKind kind = ScheduleKind::cosine;  // cosine: one decay; sgdr: cosine with warm restarts; step: step decay
  int64_t warmup = 0;           // W: linear warmup steps before any of them
  double min_lr = 0.0;          // cosine, sgdr: the value at the end of the decay (of each cycle)
  int64_t total = 0;            // cosine: steps to min_lr, warmup included; 0: the sum of every `run` in the deck
  int64_t period = 1;           // sgdr: P, steps in the first cycle
  double mult = 1.0;            // sgdr: M, each cycle is M times as long as the one before
  int64_t every = 1;            // step: S, steps per decay level
  double factor = 0.1;          // step: F, the lr is multiplied by F once per level
  double jitter = 0.0;          // sgdr, step: J, each restart's peak (level) times a seeded factor in [1-J, 1+J]
  RestartFrom restart_from = RestartFrom::last;  // sgdr: a restart goes on from the last weights or the cycle's best val_loss
};

// sync dense [bucket_mb X] [transport auto|nccl|mpi]
//    | accumulate K [bucket_mb X] [transport auto|nccl|mpi]
//    | local K [outer average|sgd|nesterov] [lr X] [momentum X] [transport auto|nccl|mpi]
struct SyncConfig {
  SyncKind kind = SyncKind::dense;  // dense: all-reduce every step; accumulate: every K micro-steps; local: average every K steps
  double bucket_mb = 1.0;      // gradient bucket size for the overlapped all-reduce
  int every = 1;               // K
  Outer outer = Outer::average;  // local: what a sync does with the averaged change since the last one
  double outer_lr = 1.0;          // outer sgd/nesterov step on the pseudo-gradient (anchor - average)
  double momentum = 0.0;          // outer momentum
  // The dense collectives: auto (NCCL where the buffers are on a GPU and
  // every rank of a node has its own, else MPI), nccl, or mpi (comm/ops.h).
  DenseTransport transport = DenseTransport::automatic;
  // Forward and backward passes per optimizer step: K under accumulate, else 1.
  int micro_batches() const { return kind == SyncKind::accumulate ? every : 1; }
  bool operator==(const SyncConfig&) const = default;
};

// topology full | clusters N [redraw S] | ring
struct TopologyConfig {
  TopologyKind kind = TopologyKind::full;  // full: everyone; clusters: random groups of N; ring: each rank and its two neighbours
  int size = 4;               // N
  int64_t redraw = 0;         // clusters: draw a new partition every S steps (0: once per phase)
  bool operator==(const TopologyConfig&) const = default;
};

// compress off
//        | topk RATIO [quant none|int8|int4|bf16] [feedback on|off] [momentum M]
//                     [min_size N] [warmup STEPS] [block B] [target gradient|update]
//                     [transport auto|ucx|mpi] [exchange allgather|partitioned]
// Gradient compression under sync dense|accumulate (docs/COMMUNICATION.md).
struct CompressConfig {
  CompressKind kind = CompressKind::off;  // off: dense all-reduce; topk: sparse exchange of the top RATIO per bucket
  double ratio = 0.01;             // fraction of each bucket sent (1: every entry, through the sparse path)
  Quant quant = Quant::none;       // how the selected values travel: fp32, int8/int4 with block scales, bf16
  bool feedback = true;            // error feedback: what was not sent is added to the next gradient
  double momentum = 0.0;           // DGC momentum correction (0: off)
  int64_t min_size = 0;            // tensors smaller than this go dense
  int64_t warmup = 0;              // steps over which the ratio falls from 1 to RATIO (exponentially)
  int64_t block = 64;              // values per quantization scale
  SparseTransport transport = SparseTransport::automatic;  // sparse exchange: auto (UCX if it starts, else MPI), ucx, mpi
  // What is compressed and averaged: the gradient (Deep Gradient Compression),
  // or the change this rank's own optimizer step made (for AdamW, whose
  // per-element normalisation undoes sparse gradients; see docs/COMMUNICATION.md).
  CompressTarget target = CompressTarget::gradient;
  // How the payloads travel (docs/COMPRESSION.md): allgather, every rank's
  // payload to every member ((R-1) payloads per rank); partitioned, a sparse
  // reduce-scatter to the owner of each piece, then a sparse all-gather of the
  // owners' pieces (about 2 (R-1)/R payloads per rank).
  Exchange exchange = Exchange::allgather;
  bool operator==(const CompressConfig&) const = default;
};

// output dir PATH [log_every N] [progress auto|on|off] [tensorboard on|off]
struct OutputConfig {
  std::string dir = "runs/default";
  int64_t log_every = 10;
  Progress progress = Progress::automatic;  // rank 0's live progress line: auto (stdout a terminal, not under mpirun), on, off
  bool tensorboard = true;        // RUN_DIR/tb/events.out.tfevents.* (docs/OBSERVABILITY.md)
  bool barrier = false;           // an MPI_Barrier after each logged step (folklore: "a barrier after logging")
};

// eval every N [batches K]
struct EvalConfig {
  int64_t every = 0;  // 0: only at the end of each run
  int batches = 8;
};

// sample every N [prompt TEXT] [tokens K] [temperature T] [top_k K] [top_p P] [seed S]:
// rank 0 prints a sample of the model every N steps, as llm.c does
// (rank log, console, TensorBoard text). TEXT with spaces goes in quotes.
struct SampleConfig {
  int64_t every = 0;              // 0: never
  std::string prompt = "The";
  int tokens = 64;
  double temperature = 1.0;       // 0: greedy
  int top_k = 40;                 // 0: all tokens
  double top_p = 1.0;
  uint64_t seed = 1234;
};

// checkpoint [every N] [at_end yes|no] [mode full|diff] [codec lossless|int8|topk] [ratio R] [block B] [keep K]
//            [base_every M] [async on|off] [writer collective|rank0]
// (docs/CHECKPOINT.md). Every rank's own state goes in /ranks/<r>: as it is
// (full) or as its difference from the ranks' average (diff, by the codec).
struct CheckpointConfig {
  int64_t every = 0;  // 0: only at the end of each run
  bool at_end = true;
  CheckpointMode mode = CheckpointMode::full;
  Codec codec = Codec::lossless;   // diff: lossless (XOR, bit-exact) | int8 (per-block scale) | topk (largest R)
  double ratio = 0.01;             // codec topk: R, the fraction kept
  int64_t block = 64;              // codec int8: values per scale
  int64_t keep = 0;                // keep the newest K checkpoint files (0: all); never breaks a chain
  int64_t base_every = 1;          // diff across time: a full base every M checkpoints, in between the change since it
  bool async = false;              // snapshot at the step boundary, write from a background thread
  CheckpointWriter writer = CheckpointWriter::collective;  // collective (parallel HDF5) | rank0 (gathered, rank 0 writes alone): the same file
};

// health every N [nan skip|stop] [max_skips K]
// Every N steps one all-reduce of each rank's health (finite loss and
// gradients, step counter, free memory); a failure stops every rank with one
// message naming the ranks. A non-finite loss or gradient is checked every
// step: `skip` drops the step on all ranks (at most K in a row), `stop` ends the job.
struct HealthConfig {
  int64_t every = 0;  // 0: no periodic health all-reduce (the NaN check still runs every step)
  NanPolicy nan = NanPolicy::stop;
  int64_t max_skips = 10;
};

// timeout S: the watchdog's limit on one collective (seconds; 0: no watchdog).
// preempt requeue on|off: after the signal checkpoint, rank 0 runs `scontrol requeue $SLURM_JOB_ID`.
struct ResilienceConfig {
  double timeout = 600;
  bool requeue = false;
};

// fault kill|hang|nan|signal|throw|detach rank R step S (tests only; docs/RESILIENCE.md):
// at optimizer step S (1-based) rank R is SIGKILLed, hangs, puts a NaN in its
// gradients, sends itself SIGTERM, or throws (a failure of that rank alone);
// detach: from step S on, rank R's last tensor gets no gradient (a parameter
// its forward no longer uses), what `grad_check missing` is there to catch.
// A resumed run injects nothing.
struct FaultConfig {
  FaultKind kind = FaultKind::off;
  int rank = 0;
  int64_t step = 0;
};

// grad_check missing warn|error|off
struct GradCheckConfig {
  MissingGradient missing = MissingGradient::error;
};

// precision fp32 | bf16 [loss_scale S|dynamic] [scale_window N] | fp16 [loss_scale dynamic|S] [scale_window N]
// Master weights and AdamW state stay fp32; the weights the forward reads, the
// residual stream, the logits and the gradients carry the type's values (round
// to nearest even; emulated in float storage on the CPU; docs/DYNAMICS.md).
// One precision per deck.
struct PrecisionConfig {
  Precision kind = Precision::fp32;
  std::string loss_scale = "auto";  // as written: auto (dynamic for fp16, 1 for bf16), dynamic, or a scale S > 0
  LossScaleKind loss_scale_kind = LossScaleKind::automatic;  // the deck resolves loss_scale into these two
  double loss_scale_value = 1;                               // fixed: S
  int64_t scale_window = 1000;      // dynamic: clean steps before the scale doubles
  // native: 16-bit GEMM operands go to the backend's 16-bit kernel; widened:
  // to its fp32 kernel, widened first (the same products; faster where the
  // 16-bit kernel is slower, e.g. AVX512_BF16 without AMX on Intel). Under
  // fp32, native is strict fp32 products; tf32: fp32 operands as TF32 on the
  // tensor cores where the GEMM backend has them (cuBLAS), strict elsewhere.
  Products products = Products::native;
  // unscaled: the gradient norm is clipped after unscaling (right); scaled:
  // as if clipped before unscaling, against the scaled norm (the wrong order,
  // to measure its harm: 10/13's B4). Matters only under a loss scale.
  ClipOrder clip_order = ClipOrder::unscaled;
};

// lossagg off | mean | robust [trim F] | softmax T | uncertainty
// How the ranks' losses are weighted in the gradient average (docs/DYNAMICS.md).
struct LossAggConfig {
  LossAggKind kind = LossAggKind::off;  // off: plain average, no gather; mean: token-weighted; robust; softmax; uncertainty
  double trim = 0.25;         // robust: at most this fraction of the ranks is trimmed as outliers
  double temperature = 1.0;   // softmax: T, w_r proportional to tokens_r * exp(loss_r / T)
};

// shard off | optimizer | gradients | params (one per job): the training
// state sharded over the data-parallel ranks, ZeRO 1/2/3 (comm/sync_sharded.cpp).
// optimizer: each rank updates 1/W of the flat buffer and keeps that much of
// AdamW's moments; gradients: also keeps only its 1/W of the averaged
// gradients; params: also of the weights, gathered unit by unit as used.
struct ShardConfig {
  ShardLevel level = ShardLevel::off;
};

// pipeline stages P [schedule gpipe|1f1b|interleaved|dualpipev] [virtual V]
// [micro M] (one per job): the layers cut into P x V chunks of consecutive
// blocks, V a stage on P groups of ranks (chunk 0 adds the embedding, the last
// the final norm and head), activations and their gradients sent between
// neighbouring chunks, M micro-batches ordered by the schedule (core/pipeline_schedule.h).
// P = 1: no pipeline, nothing changes. What runs and what is refused:
// docs/SCALING.md, "Pipeline parallelism".
struct PipelineConfig {
  int stages = 1;
  PipelineSchedule schedule = PipelineSchedule::gpipe;
  int virtual_stages = 1;  // chunks per stage (interleaved, dualpipev)
  int micro = 1;           // M: a pipeline's data batch (its sequences per step) cut into M micro-batches of batch / M
  std::string cut_text;    // cut N0,N1,...: each chunk's blocks, as written ("": L / (P V) each)
  std::vector<int> cut;    // ... read once by the deck (empty: L / P each)
  bool operator==(const PipelineConfig&) const = default;
};

struct Config {
  uint64_t seed = 1234;
  GemmChoice gemm = GemmChoice::automatic;  // GEMM backend: auto | onednn | cublas | blas (kernels/gemm.h)
  double peak_gflops = 0.0;  // MFU denominator; 0: the peak file's entry for this machine, else none (io/peak_file.h)
  InitConfig init;
  ModelConfig model;
  DataConfig data;
  OptimizerConfig optimizer;
  ScheduleConfig schedule;
  SyncConfig sync;
  TopologyConfig topology;
  CompressConfig compress;
  ShardConfig shard;
  PipelineConfig pipeline;
  OutputConfig output;
  EvalConfig eval;
  SampleConfig sample;
  CheckpointConfig checkpoint;
  GradCheckConfig grad_check;
  LossAggConfig lossagg;
  PrecisionConfig precision;
  HealthConfig health;
  ResilienceConfig resilience;
  FaultConfig fault;
};

// The command line's -resume: a fresh run, the newest complete checkpoint
// of RUN_DIR/ckpt (auto), or one file. The word is resolved here, once.
struct ResumeFrom {
  enum class Kind { fresh, latest, file } kind = Kind::fresh;
  std::string path;  // file
  ResumeFrom() = default;
  ResumeFrom(const std::string& word)  // "" (fresh), "auto" or a path
      : kind(word.empty() ? Kind::fresh : word == "auto" ? Kind::latest : Kind::file), path(kind == Kind::file ? word : "") {}
  ResumeFrom(const char* word) : ResumeFrom(std::string(word)) {}
};

// Whether a rank's fp32 weights are only its pieces of them at `ranks`
// ranks: under shard params, and under shard optimizer or gradients with
// 16-bit precision (whose whole 16-bit copy the GEMMs read instead;
// comm/sync_sharded.cpp).
inline bool fp32_weights_in_pieces(const Config& c, int ranks) {
  if (ranks <= 1 || c.shard.level == ShardLevel::off) return false;
  return c.shard.level == ShardLevel::params || c.precision.kind != Precision::fp32;
}

}  // namespace xx

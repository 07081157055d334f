// The DeepSeek-style decoder: token embedding; L blocks of
//   x += attention(rmsnorm(x))      (MHA with RoPE, or MLA)
//   x += ffn(rmsnorm(x))            (dense SwiGLU, or DeepSeekMoE)
// a final RMSNorm and the LM head (its own tensor, or tied: the embedding,
// model ... tie_embeddings yes); optionally D multi-token-prediction modules
// sharing the embedding and the head.
// Parameters and gradients each live in one flat buffer (model/params.h).
// Templated on the scalar type: float for training, double for gradient checks.
#pragma once
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>
#include "deck/config.h"
#include "core/views.h"
#include "core/weight_gate.h"
#include "kernels/precision.h"
#include "model/attention.h"
#include "model/ffn.h"
#include "model/params.h"

namespace xx {

// The parts of the loss; total = main + mtp_weight * mtp + aux.
struct LossParts {
  double total = 0, main = 0, mtp = 0, aux = 0;
};

// Multipliers on each loss's backward seed (lossagg: rank and per-loss
// weights); 1 leaves every bit as it was.
struct LossWeights {
  double main = 1, mtp = 1, aux = 1;
};

// Which activations a block's recompute mode makes one set shared by all
// blocks (Workspace::share_kept): what the backward remakes before reading it.
// selective: the normed inputs, MLA's normed latents and up-projected heads,
// the SwiGLU outputs; full: all of them. The one owner of these names.
std::set<std::string> recomputed_activations(const ModelConfig& m);
// The backends table's line: which recompute runs and what it recomputes.
std::string recompute_report(const ModelConfig& m);

// x_out = x_in + attention(norm(x_in)); then x_out += ffn(norm(x_out)).
template <class T>
class Block {
 public:
  Block(const ModelConfig& m, const ParamStore<T>& store, const std::string& prefix, bool moe, int64_t batch,
        Workspace<T>& ws);
  void forward(Mat<T> x_out, Mat<const T> x_in);
  // dx: d/dx_out on entry, d/dx_in on exit. Under recompute it first remakes
  // what the block did not keep (restore_), from x_in and what it kept.
  void backward(Mat<T> dx, Mat<const T> x_in);
  FeedForward<T>& ffn() { return ffn_; }

 private:
  // What the backward remakes first (recompute, chosen once at construction):
  // nothing (off); the two normed inputs (selective); the whole forward, its
  // side effects left out (full).
  using Restore = void (Block::*)(Mat<const T> x_in);
  void norm_input(Mat<const T> x_in);
  void norm_middle();
  void attention_half(Mat<const T> x_in);
  void restore_nothing(Mat<const T>) {}
  void restore_norms(Mat<const T> x_in);
  void restore_forward(Mat<const T> x_in);
  Restore restore_ = &Block::restore_nothing;
  int64_t N_, C_;
  double eps_;
  Workspace<T>& ws_;
  Param<T> attn_norm_, ffn_norm_;
  Attention<T> attn_;
  FeedForward<T> ffn_;
  KeptActivation<T> xn_, xn2_;
  Buffer<T> rstd1_, xmid_, rstd2_;
};

template <class T>
class Transformer {
 public:
  // Allocates parameters, gradients and the activations of a batch of B
  // sequences. gemm_type: what GEMM inputs are stored and multiplied as
  // (mixed precision; float only, a Transformer<double> runs double).
  // ep_rank: this rank's place in its expert-parallel group (moe ... ep N):
  // which routed experts it holds (ParamLayout). stage: under pipeline
  // stages, the one stage this model holds and runs (forward_stage,
  // backward_stage); its other layers exist nowhere in this process.
  // activation_sets: per run of the stage's layers (StageCut::runs, one
  // without virtual stages), the micro-batches it holds between their
  // forward and backward at once (its schedule's in-flight count), each in a
  // set of its own (use_activations); empty: 1 each. scratch_per_run: each
  // run its own scratch (and recomputed set), so that a forward of one run
  // and a backward of another may run interleaved (train/pass_pair.h); else
  // one for the model.
  Transformer(const ModelConfig& config, int batch, kernels::Precision gemm_type = kernels::Precision::fp32,
              int ep_rank = 0, const StageCut& stage = {}, const std::vector<int>& activation_sets = {},
              bool scratch_per_run = false);

  const ModelConfig& config() const { return cfg_; }
  const ParamLayout& layout() const { return layout_; }
  Buffer<T>& params() { return params_; }
  Buffer<T>& grads() { return grads_; }
  bool grads_in_huge_pages() const { return grads_memory_ != nullptr; }
  Vec<T> param(const std::string& name) { return window(params_, name); }
  Vec<T> grad(const std::string& name) { return window(grads_, name); }

  // normal(0, std) weights and unit norms, from a counter-based stream: the
  // same seed gives the same bits on every rank and thread count.
  void init(uint64_t seed);
  // Sharded set-up (deck: shard gradients|params): only `ranges` of the
  // weights are written (this rank's pieces under params, all under
  // gradients), the 16-bit copy is left to the step, and the gradients are
  // zero without being touched: no rank takes memory it will not keep.
  void init_sharded(uint64_t seed, const std::vector<std::pair<int64_t, int64_t>>& ranges);
  void zero_grads();

  // Loss of a batch (mean over tokens); keeps what backward needs.
  LossParts forward(Tokens inputs, Tokens targets);
  // The main head's logits (B*T, V) of the last forward (the backward overwrites them).
  Mat<const T> logits() const { return Mat<const T>(in_use_.back()->logits.data(), N_, cfg_.vocab); }

  // grads += d(total loss)/d(params) for the last forward. `ready(offset)` is
  // called whenever every gradient from `offset` to the end of the buffer is
  // final, so the caller can start reducing those buckets.
  void backward(Tokens inputs, Tokens targets, const std::function<void(int64_t)>& ready = {});

  // Pipeline stages (deck: pipeline stages P; core/placement.h, StageCut):
  // the passes of one run of blocks [begin, end) on one micro-batch (a run
  // of StageCut::runs: the stage's only one without virtual stages). forward_stage
  // starts from the tokens where begin is 0, else from `in` (N x C floats in
  // kernel memory, the previous stage's activation), and ends in the losses
  // where end is L (the final norm, the head, the MTP modules), else writes
  // the activation to `out`; aux is this stage's MoE layers' alone. Only the
  // forward's activations land in its run's set in use (use_activations), where
  // that micro-batch's backward_stage reads them. backward_stage
  // starts from the losses where end is L, else from `dout` (d/d out), and
  // ends in the embedding's gradient where begin is 0, else writes d/d in to
  // `din`. The passes of every stage, in order, are forward and backward's
  // kernel calls: the same bits. A model built for one stage runs that
  // stage's blocks only, and not forward or backward.
  LossParts forward_stage(int begin, int end, Tokens inputs, Tokens targets, const T* in, T* out);
  void backward_stage(int begin, int end, Tokens inputs, Tokens targets, const T* dout, T* din);
  // The set of activations run `run`'s passes use from now on (0 <= set < activation_sets(run)).
  void use_activations(int run, int set);
  int activation_sets(int run) const { return int(sets_.at(size_t(run)).size()); }
  // The MTP modules' lookups of the embedding, on a last stage that is not
  // the first: their gradients (D x N x C, deepest first after the backward)
  // are not added to its embedding's but kept here, for stage 0 to add them
  // (add_mtp_lookups) where the unsplit backward does, before its own
  // lookup's: the one embedding gradient, in the unsplit model's order.
  Buffer<T>& mtp_lookups() { return in_use_.back()->mtp_lookups; }
  void add_mtp_lookups(Tokens targets, const T* lookups);  // stage 0, before backward_stage
  int64_t mtp_lookups_size() const { return int64_t(cfg_.mtp.depth) * N_ * cfg_.dim; }

  // Mixed precision (deck: precision): GEMMs read a 16-bit copy of the
  // parameters, made from them here (once per step, after the update), and
  // 16-bit copies of the activations they multiply; their products
  // accumulate in fp32 into fp32 results. Everything else stays T.
  kernels::Precision gemm_type() const { return gemm_type_; }
  void refresh_half_weights();  // all of them; per unit as gathered under a weight gate
  // shard params (core/weight_gate.h): the forward and backward ask `gate`
  // for each unit's weights and let go of them after; null: all always here.
  void set_weight_gate(WeightGate* gate) { gate_ = gate; }
  // shard optimizer|gradients under 16-bit precision (core/weight_gate.h):
  // the fp32 weights are this rank's pieces, and `source` makes the whole
  // 16-bit copy; null: packed here from the whole fp32 weights.
  void set_half_weight_source(HalfWeightSource* source) { half_source_ = source; }
  Buffer<uint16_t>& half_params() { return params_half_; }  // empty under fp32
  // Loss scaling: the backward starts from d(scale * loss) (main, MTP and aux
  // seeds alike); 1 leaves every bit as it was.
  void set_loss_scale(double scale);
  // Multi-view loss aggregation: set after the forward, read by the next backward.
  void set_loss_weights(const LossWeights& w) { loss_weights_ = w; }

  // Expert parallelism (moe ... ep N): every MoE layer moves its tokens
  // through `exchange` (null: this rank holds every expert); run >= 0: run
  // `run`'s layers alone (each run its own, where runs overlap).
  void set_expert_exchange(ExpertExchange* exchange, int run = -1);
  // MoE: the feed-forward layers with routed experts and their name prefixes
  // ("layers.3.", "mtp.0."), main blocks first: those of each run's set in
  // use (a layer's sets share its selection bias, so any set's bias is the
  // layer's); moe_layers(run): that run's alone, the same objects.
  std::vector<std::pair<std::string, FeedForward<T>*>> moe_layers();
  std::vector<std::pair<std::string, FeedForward<T>*>> moe_layers(int run) { return moe_layers(*in_use_.at(size_t(run))); }
  // True when tensor t belongs to a routed expert that got no token in the
  // last forward (of the set in use): it legitimately has no gradient.
  bool idle_expert(const TensorInfo& t) const;

 private:
  struct Activations;
  Vec<T> window(Buffer<T>& b, const std::string& name);
  LossParts head_forward(Activations& a, Tokens targets);              // final norm, head, MTP: the last chunk's forward
  void head_backward(Activations& a, Tokens targets, Mat<T> dresid);  // ... its backward, d/d resid_[L] into dresid
  int run_of(int begin, int end) const;  // the run of blocks [begin, end); throws where it is no run of this model
  void check_whole(const char* pass) const;  // forward and backward run every layer
  void write_weights(uint64_t seed, const std::vector<std::pair<int64_t, int64_t>>& ranges);
  // Unit u's weights (ParamLayout::weight_units) are needed, then not.
  void use(int unit, int next);
  void let_go(int unit);
  int block_unit(int l) const { return 1 + l; }
  int final_unit() const { return 1 + cfg_.layers; }
  int mtp_unit(int d) const { return 2 + cfg_.layers + d; }
  struct MtpModule {
    Param<T> hnorm, enorm, proj, norm;
    std::unique_ptr<Block<T>> block;
    Buffer<T> hn, rstd_h, e, en, rstd_e, x0, h, rstd_f, logits, losses;
    KeptActivation<T> cat, hf;
    Kokkos::View<int32_t*, MemSpace> in, target;  // tokens t+d+1 and labels t+d+2 (-1 past the end)
    int64_t labelled = 0;
  };
  // One micro-batch's activations between its forward and backward, with the
  // blocks that keep them (over the one set of parameters and gradients).
  struct Activations {
    std::vector<std::unique_ptr<Block<T>>> blocks;  // another stage's stay null
    std::vector<MtpModule> mtp;
    std::vector<Buffer<T>> resid;  // L+1 residual streams, each (N, C): the stage's own
    KeptActivation<T> xf;
    Buffer<T> rstdf, logits, losses;
    Buffer<T> mtp_lookups;  // a later stage: the MTP lookups' gradients for stage 0
    Workspace<T>* ws = nullptr;  // the scratch its blocks share (scratch_): its run's, or the model's
  };
  void build_activations(Activations& a, const ParamStore<T>& store, int batch, const LayerRun& run);
  std::vector<std::pair<std::string, FeedForward<T>*>> moe_layers(Activations& a);

  ModelConfig cfg_;
  ParamLayout layout_;
  int64_t B_, T_, N_;
  Buffer<T> params_, grads_;
  std::shared_ptr<void> grads_memory_;  // host: grads_'s memory (huge_page_memory), which grads_ views
  std::vector<std::unique_ptr<Workspace<T>>> scratch_;  // one, or one per run (scratch_per_run)
  Param<T> embed_, norm_, head_;  // tied: head_ is embed_ (ParamLayout::head_name)
  bool hold_embed_ = false;       // shard params: the embedding's unit held through the forward (MTP, tied)
  bool lookups_elsewhere_ = false;  // a later stage: the MTP lookups' gradients go to stage 0 (mtp_lookups)
  Kokkos::View<int32_t*, MemSpace> mtp_in_;  // stage 0: the MTP lookups' tokens, depth by depth
  // per run of the stage (one without virtual stages): its sets, one or its micro-batches in flight
  std::vector<std::vector<std::unique_ptr<Activations>>> sets_;
  std::vector<Activations*> in_use_;  // per run: the set in use
  const Activations& holding(int layer) const;  // the set in use of the run of block `layer` (>= L: the head's)
  kernels::Precision gemm_type_ = kernels::Precision::fp32;
  Buffer<uint16_t> params_half_;  // the 16-bit copy GEMMs read (mixed precision), else empty
  double loss_scale_ = 1.0;
  LossWeights loss_weights_;
  WeightGate* gate_ = nullptr;
  HalfWeightSource* half_source_ = nullptr;
  std::vector<WeightUnit> units_;
};

}  // namespace xx

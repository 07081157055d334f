// Parameter layout: every tensor of the model is a named window into one flat
// buffer, so one collective moves all gradients and a checkpoint writes them
// in one pass. Tensors are laid out in forward order (embedding, blocks
// 0..L-1, final norm, head, MTP modules); the backward finishes them from the
// end of the buffer towards the start, which lets the all-reduce start early.
#pragma once
#include <cstdint>
#include <string>
#include <vector>
#include "core/placement.h"
#include "core/tensor_span.h"
#include "deck/config.h"

namespace xx {

struct TensorInfo {
  std::string name;            // e.g. "layers.3.attn.wq"
  std::vector<int64_t> shape;  // real shape, e.g. {C, C}
  int64_t offset = 0;          // into the flat buffer, in elements
  int64_t size = 0;
  bool decay = true;           // weight decay applies (not to norm weights)
  bool is_norm = false;        // initialised to one
  bool matmul = false;         // takes part in a matrix product (FLOP count)
  // The model reads its fp32 values, not only the GEMMs' 16-bit copy: the
  // embedding (a lookup), the norms and the router's gate (its scores stay
  // fp32). Under 16-bit precision a sharded master keeps these whole.
  bool reads_fp32 = false;
  int layer = -1;              // block index (MTP blocks count on after the last layer), -1 outside
  int expert = -1;             // routed expert index; such a tensor gets no gradient when no token picks it
  int64_t full_offset = 0;     // where it lies in the whole model's buffer (the file's frame; = offset without ep)
  double init_std = 0;         // normal(0, init_std) when not a norm
};

// What shard params gathers at once: the embedding, each block, the final
// norm with the head (tied: the norm alone; the head is the embedding's
// unit), each MTP module (runs of tensors of one layer).
struct WeightUnit {
  std::string name;  // embed, layers.K, norm + head (tied: norm), mtp.D
  int64_t begin = 0, end = 0;
};

class ParamLayout {
 public:
  // The tensors rank `ep_rank` of an expert-parallel group holds (moe ... ep
  // N): every tensor but the routed experts of the other ranks, which hold
  // experts [ep_rank * E/N, (ep_rank + 1) * E/N) of each MoE layer. With ep 1
  // it is the whole model. Under pipeline stages (`stage`, core/placement.h)
  // only the stage's tensors: its blocks; the embedding on the first stage,
  // and on the last where the MTP modules or a tied head read it too; the
  // final norm, the head and the MTP modules on the last.
  explicit ParamLayout(const ModelConfig& m, int ep_rank = 0, const StageCut& stage = {});

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  std::vector<TensorSpan> spans() const;  // (name, offset, size) of every tensor, in layout order
  // Runs [begin, end) of the tensors whose fp32 values the model reads (TensorInfo::reads_fp32).
  std::vector<std::pair<int64_t, int64_t>> fp32_read_runs() const;
  int64_t total() const { return total_; }
  int64_t full_total() const { return full_total_; }  // the whole model's size (= total without ep)
  bool holds_all() const { return total_ == full_total_; }
  const StageCut& stage() const { return stage_; }
  // Runs [begin, end) of this rank's routed-expert tensors (one per MoE layer): empty without ep.
  std::vector<std::pair<int64_t, int64_t>> expert_runs() const;
  // Between this rank's buffer and the whole model's (full_offset): every tensor copied.
  void to_full(const float* mine, float* full) const;
  void from_full(const float* full, float* mine) const;
  const TensorInfo& at(const std::string& name) const;  // throws std::out_of_range
  // The tensor the LM head (main and every MTP depth) multiplies by: "head",
  // or "embed" when tied (model ... tie_embeddings yes): one tensor, whose
  // gradient sums the lookup's and the head's.
  const std::string& head_name() const { return head_; }
  bool tied() const { return head_ == "embed"; }
  bool has(const std::string& name) const;
  // Offset where block l's tensors begin; layer_begin(L) is where the final norm begins.
  int64_t layer_begin(int layer) const { return layer_begin_[layer]; }
  // The units in buffer order: 0 the embedding, 1 + l block l, L + 1 the
  // final norm and head (tied: the norm), L + 2 + d MTP module d.
  std::vector<WeightUnit> weight_units() const;
  // Parameters a token uses: all but the embedding table (a lookup; tied, it
  // is the head and counts) and the routed experts it does not pick.
  int64_t active_per_token() const { return active_; }
  // Multiply-accumulates per token in matrix products, forward (the head
  // counts once per output it feeds: main and each MTP depth).
  int64_t matmul_per_token() const { return matmul_active_; }

 private:
  void add(const std::string& name, std::vector<int64_t> shape, int layer, bool is_norm, double init_std,
           bool matmul, int expert = -1);
  void add_block(const std::string& prefix, const ModelConfig& m, int layer, bool moe);
  bool on_stage(const std::string& name, int layer) const;
  std::vector<TensorInfo> tensors_;
  std::vector<int64_t> layer_begin_;
  int64_t total_ = 0, full_total_ = 0, active_ = 0, matmul_active_ = 0;
  int ep_ = 1, ep_rank_ = 0, experts_per_rank_ = 1;
  StageCut stage_;
  int layers_ = 0;
  bool embed_on_last_ = false;  // MTP or a tied head: the last stage reads the embedding too
  std::string head_;
};

// The whole model's frame of a layout that holds every tensor (one process:
// tools, tests; a training job's is its Placement's), as checkpoints hold it.
Frame whole_frame(const ParamLayout& whole);

// The job's placement (core/placement.h) for rank `rank` of `world`: the
// whole model's frame with `mine` (this rank's layout, under ep its expert
// share) in it, and this rank's pieces at `level`, cut into buckets of
// `bucket` elements from the buffer's end (under params inside the weight
// units; under ep an expert bucket over the ranks holding its experts).
// `master_in_pieces`: the fp32 weights are only this rank's pieces.
Placement place_model(const ModelConfig& m, const ParamLayout& mine, ShardLevel level, int64_t bucket, int world,
                      int rank, bool master_in_pieces);

// Training FLOPs per token (../shared/MEASURING.md): 6 * N_matmul + 12 * L * T
// * d_attn, where for MLA d_attn averages the QK width H*(nope+rope) and the
// AV width H*v_dim, and MTP blocks count as layers.
double flops_per_token(const ModelConfig& m, const ParamLayout& layout);

}  // namespace xx

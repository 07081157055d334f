// The feed-forward branch of a block: out += FFN(xn), either a dense SwiGLU
// or DeepSeekMoE (shared experts always on, plus the top-k of the routed
// experts, with a balance loss or a balance bias). Forward and backward side
// by side in ffn.cpp.
#pragma once
#include <string>
#include <vector>
#include "core/expert_exchange.h"
#include "deck/config.h"
#include "kernels/moe.h"
#include "model/store.h"

namespace xx {

template <class T>
class FeedForward {
 public:
  FeedForward(const ModelConfig& m, const ParamStore<T>& store, const std::string& prefix, bool moe, int64_t batch,
              Workspace<T>& ws);
  using In = kernels::GemmIn<T>;
  void forward(Mat<T> out, In xn);                     // out += ffn(xn)
  // recompute full: the forward again for the backward, without its side
  // effects (the balance loss's value and seeds stay the forward's; the
  // routing and counts it sets again are the same).
  void replay(Mat<T> out, In xn);
  void backward(Mat<T> dxn, Mat<const T> dout, In xn);  // dxn = d/dxn

  bool is_moe() const { return moe_; }
  double aux_loss() const { return aux_loss_; }  // balance loss of the last forward (batch- or sequence-wise)
  void set_loss_scale(double s) { loss_scale_ = s; }          // the aux gradient is seeded with coef * scale
  void scale_balance_gradient(double factor);                  // lossagg: after the forward, before the backward
  const std::vector<int32_t>& expert_counts() const { return counts_host_; }  // tokens per routed expert, last forward
  // Tokens per routed expert in the last forward, counting only tokens whose
  // label is not negative (MTP positions past a window's end carry -1).
  std::vector<int32_t> labelled_expert_counts(Tokens labels) const;
  Buffer<float>& bias() { return bias_; }                       // top-k selection bias (bias mode)
  // bias_e += gamma * sign(mean load - load_e), from the load summed over all ranks
  void update_bias(const std::vector<double>& global_load, double gamma);

  // Expert parallelism (moe ... ep N): this rank holds routed experts
  // [first_held(), first_held() + held()) and runs them over the tokens of
  // its whole group, which `exchange` brings and takes back.
  void set_exchange(ExpertExchange* exchange) { exchange_ = exchange; }
  int64_t first_held() const { return first_; }
  int64_t held() const { return int64_t(ew1_.size()); }
  // Rows the held expert x (0-based among the held) ran over in the last
  // forward, from every rank of the group; and of those, rows with a label.
  int32_t held_rows(int64_t x) const { return exchange_ ? held_counts_[x] : counts_host_[first_ + x]; }
  int32_t held_labelled_rows(int64_t x) const { return held_labelled_[x]; }
  // MTP blocks: the labels of the rows (-1: none), counted per expert when sent.
  void set_row_labels(Tokens labels) { labels_ = labels; }
  // moe ... capacity_factor C: rows this rank's experts dropped in the last forward.
  int64_t dropped_rows() const { return dropped_; }

 private:
  // The sequence-wise balance loss: its value into aux_loss_, its coefficients into seq_coef_grad_.
  void sequence_balance_forward();
  void run(Mat<T> out, In xn);  // forward less the balance loss
  void balance_forward();
  // recompute selective remakes SwiGLU's output before its backward; off: nothing (chosen at construction)
  using Remake = void (FeedForward::*)(In, Param<T>, int64_t, KeptActivation<T>&, KeptActivation<T>&);
  using RemakeExperts = void (FeedForward::*)(KeptActivation<T>&, KeptActivation<T>&, KeptActivation<T>&);
  void remake_nothing(In, Param<T>, int64_t, KeptActivation<T>&, KeptActivation<T>&) {}
  void remake_swiglu(In x, Param<T> w13, int64_t width, KeptActivation<T>& h, KeptActivation<T>& a);
  void remake_experts_nothing(KeptActivation<T>&, KeptActivation<T>&, KeptActivation<T>&) {}
  void remake_experts_swiglu(KeptActivation<T>& in, KeptActivation<T>& h, KeptActivation<T>& a);
  Remake remake_ = &FeedForward::remake_nothing;
  RemakeExperts remake_experts_ = &FeedForward::remake_experts_nothing;
  // ep 1, selective: the routed rows (xe_), their SwiGLU output (ae_) and
  // their outputs (ye_) were not kept; before the combine's backward they
  // are made again (a gather from the remade xn, SwiGLU, the down GEMM: the
  // same bits). Under ep the holders keep what they ran, and ye_ came home.
  using RemakeRouted = void (FeedForward::*)(In);
  void gather_rows(In xn);
  void remake_routed_nothing(In) {}
  void remake_routed(In xn);
  RemakeRouted remake_routed_ = &FeedForward::remake_routed_nothing;
  void swiglu_forward(Mat<T> out, In x, Param<T> w13, Param<T> w2, int64_t width, KeptActivation<T>& h,
                      KeptActivation<T>& a);
  void swiglu_backward(Mat<T> dx, Mat<const T> dout, In x, Param<T> w13, Param<T> w2, int64_t width,
                       KeptActivation<T>& h, KeptActivation<T>& a, T dx_beta);

  const ModelConfig m_;
  bool moe_;
  int64_t N_, C_, F_, E_ = 0, K_ = 0;
  Workspace<T>& ws_;
  Param<T> w1_, w2_;                          // dense, or the shared experts (w1|w3 fused)
  Param<T> gate_;
  std::vector<Param<T>> ew1_, ew2_;            // routed experts
  kernels::GateKind gate_kind_;
  KeptActivation<T> h_, a_;                    // dense or shared SwiGLU: gate/up (N, 2F), output (N, F)
  Buffer<T> logits_, scores_, weights_, ye_, score_grad_;
  KeptActivation<T> xe_, he_, ae_;             // routed experts' inputs, gate/up and SwiGLU outputs (ep: xe_ only)
  kernels::Index2 idx_, pos_;
  kernels::Index1 counts_, offsets_, token_of_;
  Buffer<float> bias_;
  std::vector<int32_t> counts_host_, offsets_host_;
  // The rows each expert runs, as blocks: under ep 1 one per expert of the
  // expert-sorted rows; under ep one per (source rank, held expert) of the
  // received rows, in the order they arrive. Under ep also the rows per rank each way.
  void exchange_counts();
  void parallel_forward(Mat<T> out, In xn);
  void parallel_backward(Mat<T> dxn, Mat<const T> dout, In xn, Mat<T> dye, Mat<T> dxe);
  int64_t held_counts_total() const { return blocks_.empty() ? 0 : blocks_.back().row0 + blocks_.back().rows; }
  struct Block {
    int64_t row0, rows, expert;
    int64_t kept = 0;  // of them, the rows within the expert's capacity (all, dropless)
  };
  // The rows an expert runs at most in one forward (capacity_factor C: C x
  // the mean load of the rows `group` ranks routed), or no limit.
  int64_t capacity(int group) const;
  void zero_rows(Mat<T> m, int64_t from, int64_t to);
  void experts_forward(Mat<T> out, KeptActivation<T>& in, KeptActivation<T>& h, KeptActivation<T>& a);
  void experts_down(Mat<T> out, KeptActivation<T>& a);  // out = W2 . a over blocks_ (dropped rows zero)
  void experts_up(KeptActivation<T>& in, KeptActivation<T>& h);
  void experts_backward(Mat<T> din, Mat<const T> dout, KeptActivation<T>& in, KeptActivation<T>& h,
                        KeptActivation<T>& a);
  int64_t dropped_ = 0;
  ExpertExchange* exchange_ = nullptr;
  int64_t first_ = 0;
  Tokens labels_;
  std::vector<int64_t> send_rows_, recv_rows_;
  std::vector<int32_t> held_counts_, held_labelled_;
  std::vector<Block> blocks_;
  // the held experts' rows, kept for the backward: inputs (as they arrive),
  // gate/up, SwiGLU outputs (their outputs and output gradients only pass
  // through the workspace: moe_held_out, moe_held_dy)
  KeptActivation<T> ox_, oh_, oa_;
  double aux_loss_ = 0;
  double aux_coef_ = 0;    // balance aux over the batch: its alpha; else 0 (resolved at construction)
  // aux_scope sequence, or balance bias seq_aux X: the sequence-wise loss's alpha (0: none; resolved at
  // construction), the rank's B sequences, each sequence's counts (B, E) and
  // coefficients alpha f(b, e) / B x loss scale (B, E), seeded in the forward
  double seq_coef_ = 0;
  int64_t B_ = 0;
  kernels::Index2 seq_counts_;
  Buffer<T> seq_coef_grad_;
  double loss_scale_ = 1;  // mixed precision: loss scaling (Transformer::set_loss_scale)
};

}  // namespace xx

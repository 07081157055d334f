#include "core/device_memory.h"
#include "model/ffn.h"
#include <algorithm>
#include <cmath>
#include <limits>
#include "kernels/elementwise.h"
#include "kernels/linear.h"
#include "kernels/swiglu.h"

namespace xx {
namespace k = kernels;

template <class T>
FeedForward<T>::FeedForward(const ModelConfig& m, const ParamStore<T>& store, const std::string& p, bool moe,
                            int64_t batch, Workspace<T>& ws)
    : m_(m), moe_(moe), N_(batch * m.seq), C_(m.dim), ws_(ws) {
  if (!moe) {
    F_ = m.ffn;
    w1_ = store(p + "ffn.w1");  // w1|w3: the fused (2F, C) weight
    w2_ = store(p + "ffn.w2");
  } else {
    const auto& e = m.moe;
    E_ = e.routed, K_ = e.topk, F_ = int64_t(e.shared) * e.ffn;
    gate_ = store(p + "ffn.gate");
    if (e.shared > 0) w1_ = store(p + "ffn.shared.w1"), w2_ = store(p + "ffn.shared.w2");
    // the routed experts this rank holds (all, or its share under ep)
    first_ = -1;
    for (int x = 0; x < e.routed; ++x) {
      const std::string q = p + "ffn.experts." + std::to_string(x) + ".";
      if (!store.layout->has(q + "w1")) continue;
      if (first_ < 0) first_ = x;
      ew1_.push_back(store(q + "w1"));
      ew2_.push_back(store(q + "w2"));
    }
    gate_kind_ = {e.gate == Gate::sigmoid, e.gate == Gate::sigmoid, e.route_scale};
    static_assert(kMaxExpertGroups <= k::kMaxRouterGroups, "the deck admits more groups than the router keeps");
    gate_kind_.groups = e.groups, gate_kind_.topk_groups = e.kept_groups();
    aux_coef_ = e.batch_loss_coef();
    seq_coef_ = e.sequence_loss_coef(), B_ = batch;
    if (seq_coef_ > 0) {
      seq_counts_ = k::Index2("Moe::sequence_counts", B_, E_);
      seq_coef_grad_ = activation<T>("router_sequence_coef", B_, E_);
    }
    logits_ = ws.activation("router_logits", N_, E_);
    scores_ = ws.activation("router_scores", N_, E_);
    weights_ = ws.activation("router_weights", N_, K_);
    score_grad_ = activation<T>("router_score_grad", E_);
    idx_ = k::Index2("Moe::idx", N_, K_);
    pos_ = k::Index2("Moe::pos", N_, K_);
    counts_ = k::Index1("Moe::counts", E_);
    offsets_ = k::Index1("Moe::offsets", E_ + 1);
    token_of_ = k::Index1("Moe::token_of", N_ * K_);
    xe_ = KeptActivation<T>("expert_in", N_ * K_, C_, store.type, ws);
    ye_ = ws.activation("expert_out", N_ * K_, C_);
    bias_ = Buffer<float>("Moe::bias", E_);
    counts_host_.assign(E_, 0);
    offsets_host_.assign(E_ + 1, 0);
    if (held() == E_) {
      he_ = KeptActivation<T>("expert_h", N_ * K_, 2 * e.ffn, store.type, ws, 1);  // read with ae_ written: slot 1
      ae_ = KeptActivation<T>("expert_a", N_ * K_, e.ffn, store.type, ws);
    } else {  // ep: the owner side, sized for an even load; it grows when a step brings more
      const int64_t rows = N_ * K_;
      ox_ = KeptActivation<T>("held_in", rows, C_, store.type, ws);
      oh_ = KeptActivation<T>("held_h", rows, 2 * e.ffn, store.type, ws, 1);
      oa_ = KeptActivation<T>("held_a", rows, e.ffn, store.type, ws);
      held_counts_.assign(held(), 0), held_labelled_.assign(held(), 0);
    }
  }
  if (F_ > 0)
    h_ = KeptActivation<T>("ffn_h", N_, 2 * F_, store.type, ws, 1), a_ = KeptActivation<T>("ffn_a", N_, F_, store.type, ws);
  if (m.recompute == Recompute::selective) {
    remake_ = &FeedForward::remake_swiglu, remake_experts_ = &FeedForward::remake_experts_swiglu;
    if (moe_ && held() == E_) remake_routed_ = &FeedForward::remake_routed;  // ep 1 (under ep the holders keep theirs)
  }
}

// Each routed row's input, the normed input's row of its token (16-bit
// inputs gathered as they are: a copy, no rounding twice).
template <class T>
void FeedForward<T>::gather_rows(In xn) {
  if (xn.is_half()) k::dispatch_forward<uint16_t>(Mat<uint16_t>(xe_.half(), N_ * K_, C_), Mat<const uint16_t>(xn.half, N_, C_), token_of_);
  else k::dispatch_forward<T>(xe_.target(), Mat<const T>(xn.values, N_, C_), token_of_);
}

template <class T>
void FeedForward<T>::remake_routed(In xn) {
  gather_rows(xn);
  remake_experts_swiglu(xe_, he_, ae_);
  experts_down(mat(ye_, N_ * K_, C_), ae_);
}

// recompute selective: SwiGLU's output a was not kept (one set shared by all
// blocks); made again before its backward reads it. Under fp32 from the kept
// gate/up h; under 16 bits the forward made a from h's fp32 values before h
// was packed, so h's GEMM runs again into scratch to give the same bits.
template <class T>
void FeedForward<T>::remake_swiglu(In x, Param<T> w13, int64_t width, KeptActivation<T>& h, KeptActivation<T>& a) {
  if (h.is_half()) {
    k::linear_forward<T>(h.target(), x, w13.in(2 * width, C_));
    k::swiglu_forward<T>(a.target(), h.target());
  } else {
    k::swiglu_forward<T>(a.target(), h.values());
  }
  a.keep();
}

// The same for the routed experts over blocks_ (their inputs kept).
template <class T>
void FeedForward<T>::remake_experts_swiglu(KeptActivation<T>& in, KeptActivation<T>& h, KeptActivation<T>& a) {
  if (h.is_half()) {
    experts_up(in, h);
    k::swiglu_forward<T>(a.target(), h.target());
  } else {
    k::swiglu_forward<T>(a.target(), h.values());
  }
  a.keep();
}

// out += W2 . swiglu(W13 . x), keeping h = W13 . x and a = swiglu(h)
template <class T>
void FeedForward<T>::swiglu_forward(Mat<T> out, In x, Param<T> w13, Param<T> w2, int64_t width,
                                    KeptActivation<T>& h, KeptActivation<T>& a) {
  k::linear_forward<T>(h.target(), x, w13.in(2 * width, C_));
  k::swiglu_forward<T>(a.target(), h.target());
  h.keep(), a.keep();
  k::linear_forward<T>(out, a.in(), w2.in(C_, width), T(1));
}

template <class T>
void FeedForward<T>::swiglu_backward(Mat<T> dx, Mat<const T> dout, In x, Param<T> w13, Param<T> w2,
                                     int64_t width, KeptActivation<T>& h, KeptActivation<T>& a, T dx_beta) {
  const int64_t rows = x.rows;
  (this->*remake_)(x, w13, width, h, a);
  auto da = ws_.mat("ffn_da", rows, width), dh = ws_.mat("ffn_dh", rows, 2 * width);
  k::linear_backward<T>(da, w2.dmat(C_, width), dout, a.in(), w2.in(C_, width));
  k::swiglu_backward<T>(dh, da, h.values());
  k::linear_backward<T>(dx, w13.dmat(2 * width, C_), dh, x, w13.in(2 * width, C_), dx_beta);
}

template <class T>
std::vector<int32_t> FeedForward<T>::labelled_expert_counts(Tokens labels) const {
  std::vector<int32_t> out(E_, 0);
  if (!moe_) return out;
  auto token_of = host_copy(token_of_);
  auto label = host_copy(labels);
  for (int64_t x = 0; x < E_; ++x)
    for (int64_t r = offsets_host_[x]; r < offsets_host_[x] + counts_host_[x]; ++r) out[x] += label(token_of(r)) >= 0;
  return out;
}

template <class T>
void FeedForward<T>::forward(Mat<T> out, In xn) {
  run(out, xn);
  if (moe_) balance_forward();
}

template <class T>
void FeedForward<T>::replay(Mat<T> out, In xn) {
  run(out, xn);
}

template <class T>
void FeedForward<T>::run(Mat<T> out, In xn) {
  // (under ep the shared experts run while the tokens travel: parallel_forward)
  if (F_ > 0 && !exchange_) swiglu_forward(out, xn, w1_, w2_, F_, h_, a_);
  if (!moe_) return;
  // route: scores, top-k, positions in the expert-sorted batch
  // The router multiplies fp32 gate weights (DeepSeek-V3 keeps it in full
  // precision: a rounded logit flips near-tied top-k choices); under mixed
  // precision the normed input is its 16-bit copy, widened.
  k::linear_forward<T>(mat(logits_, N_, E_), xn, gate_.mat(E_, C_));
  k::router_scores_forward<T>(mat(scores_, N_, E_), mat(logits_, N_, E_), gate_kind_);
  // (the bias stays zero unless balance is bias)
  k::router_topk<T>(idx_, mat(weights_, N_, K_), mat(scores_, N_, E_), Vec<const float>(bias_.data(), E_), gate_kind_);
  k::route_positions(counts_, offsets_, pos_, token_of_, idx_);
  Kokkos::deep_copy(Kokkos::View<int32_t*, Kokkos::HostSpace, Unmanaged>(counts_host_.data(), E_), counts_);
  Kokkos::deep_copy(Kokkos::View<int32_t*, Kokkos::HostSpace, Unmanaged>(offsets_host_.data(), E_ + 1), offsets_);
  // dispatch, one grouped GEMM pass over the experts that got tokens, combine
  gather_rows(xn);
  if (exchange_) {
    parallel_forward(out, xn);
  } else {
    // capacity: an expert runs its first rows in token order, the rest are dropped
    blocks_.clear(), dropped_ = 0;
    for (int64_t x = 0; x < E_; ++x) {
      const int64_t n = counts_host_[x], kept = std::min<int64_t>(n, capacity(1));
      blocks_.push_back({offsets_host_[x], n, x, kept});
      dropped_ += n - kept;
    }
    experts_forward(mat(ye_, N_ * K_, C_), xe_, he_, ae_);
  }
  k::combine_forward<T>(out, mat(ye_, N_ * K_, C_), mat(weights_, N_, K_), pos_);
}

// The balance loss of the forward's routing: its value, and the seeds its backward starts from.
template <class T>
void FeedForward<T>::balance_forward() {
  // V2 expert-level balance loss: alpha * sum_i f_i P_i, f_i = E/(K N) * count_i,
  // P_i = mean score; its gradient alpha f_i / N reaches every token's score i.
  aux_loss_ = 0;
  auto grad = host_staging(score_grad_);
  for (int64_t x = 0; x < E_; ++x) grad(x) = T(0);
  if (aux_coef_ > 0) {
    auto mean = ws_.vec("moe_mean", E_);
    k::score_means<T>(mean, mat(scores_, N_, E_));
    auto hmean = host_copy(mean);
    for (int64_t x = 0; x < E_; ++x) {
      const double f = double(E_) / double(K_ * N_) * counts_host_[x];
      aux_loss_ += aux_coef_ * f * double(hmean(x));
      grad(x) = T(loss_scale_ * aux_coef_ * f / double(N_));
    }
  }
  Kokkos::deep_copy(score_grad_, grad);
  if (seq_coef_ > 0) sequence_balance_forward();
}

// The sequence-wise balance loss over this rank's B sequences, rows b*T ..
// b*T + T-1 as the batch lays them out (routed here, before any expert
// exchange; an MTP block's rows alike): L = alpha / B sum_b sum_i f(b, i) P(b, i)
// (kernels/moe.h). The backward seeds sequence b's scores with its coefficients.
template <class T>
void FeedForward<T>::sequence_balance_forward() {
  const int64_t seq = m_.seq;
  auto mean = ws_.mat("moe_sequence_mean", B_, E_);
  k::sequence_expert_counts(seq_counts_, idx_);
  k::sequence_score_means<T>(mean, ws_.vec("moe_score_sums", N_), mat(scores_, N_, E_), gate_kind_.sigmoid);
  auto hmean = host_copy(mean);
  auto hcounts = host_copy(seq_counts_);
  auto coef = host_staging(seq_coef_grad_);
  for (int64_t b = 0; b < B_; ++b)
    for (int64_t x = 0; x < E_; ++x) {
      const double f = double(E_) / double(K_ * seq) * hcounts(b, x);
      aux_loss_ += seq_coef_ / double(B_) * f * double(hmean(b, x));
      coef(b * E_ + x) = T(loss_scale_ * seq_coef_ * f / double(B_));
    }
  Kokkos::deep_copy(seq_coef_grad_, coef);
}

template <class T>
void FeedForward<T>::scale_balance_gradient(double factor) {
  if (moe_) k::scale_inplace<T>(Vec<T>(score_grad_.data(), E_), T(factor));
  if (seq_coef_ > 0) k::scale_inplace<T>(Vec<T>(seq_coef_grad_.data(), B_ * E_), T(factor));
}

template <class T>
void FeedForward<T>::backward(Mat<T> dxn, Mat<const T> dout, In xn) {
  if (!moe_) {
    swiglu_backward(dxn, dout, xn, w1_, w2_, F_, h_, a_, T(0));
    return;
  }
  if (F_ > 0 && !exchange_) swiglu_backward(dxn, dout, xn, w1_, w2_, F_, h_, a_, T(0));
  // combine, then each expert's SwiGLU in reverse, then back to the tokens
  (this->*remake_routed_)(xn);
  auto dye = ws_.mat("moe_dye", N_ * K_, C_), dw = ws_.mat("moe_dw", N_, K_);
  k::combine_backward<T>(dye, dw, dout, mat(ye_, N_ * K_, C_), mat(weights_, N_, K_), pos_);
  auto dxe = ws_.mat("moe_dxe", N_ * K_, C_);
  if (exchange_) {
    parallel_backward(dxn, dout, xn, dye, dxe);
  } else {
    experts_backward(dxe, dye, xe_, he_, ae_);
  }
  auto dx_routed = ws_.mat("moe_dx", N_, C_);
  k::dispatch_backward<T>(dx_routed, dxe, pos_);
  if (F_ > 0) k::add_inplace<T>(Vec<T>(dxn.data(), N_ * C_), Vec<const T>(dx_routed.data(), N_ * C_));
  else Kokkos::deep_copy(dxn, dx_routed);
  // the router: combine weights and balance loss back to the gate logits
  auto dlogits = ws_.mat("moe_dlogits", N_, E_);
  if (seq_coef_ > 0) {  // the sequence-wise balance loss: a gradient of its own per token
    auto dscores = ws_.mat("moe_dscores", N_, E_);
    k::sequence_balance_backward<T>(dscores, mat(seq_coef_grad_, B_, E_), mat(scores_, N_, E_), gate_kind_.sigmoid);
    k::router_backward<T>(dlogits, dw, mat(scores_, N_, E_), idx_, Mat<const T>(dscores), gate_kind_);
  } else {
    k::router_backward<T>(dlogits, dw, mat(scores_, N_, E_), idx_, Vec<const T>(score_grad_.data(), E_), gate_kind_);
  }
  k::linear_backward<T>(dxn, gate_.dmat(E_, C_), dlogits, xn, gate_.mat(E_, C_), T(1));
}

// capacity_factor C: C x the mean load of the rows `group` ranks routed
// (N tokens x top-k each, over E experts), rounded up; 0: dropless.
template <class T>
int64_t FeedForward<T>::capacity(int group) const {
  const double c = m_.moe.capacity_factor;
  if (c <= 0) return std::numeric_limits<int64_t>::max();
  return int64_t(std::ceil(c * double(group) * double(N_ * K_) / double(E_)));
}

template <class T>
void FeedForward<T>::zero_rows(Mat<T> m, int64_t from, int64_t to) {
  Kokkos::deep_copy(Kokkos::subview(m, std::pair<int64_t, int64_t>(from, to), Kokkos::ALL), T(0));
}

// The routed experts over blocks_ (each a run of rows for one expert), as
// out = W2 . swiglu(W13 . in), keeping h and a; rows past a block's capacity
// are dropped: nothing in, nothing out. Every expert's rows under ep 1, each
// source's rows per held expert under ep.
template <class T>
void FeedForward<T>::experts_forward(Mat<T> out, KeptActivation<T>& in, KeptActivation<T>& h, KeptActivation<T>& a) {
  experts_up(in, h);
  k::swiglu_forward<T>(a.target(), h.target());
  h.keep(), a.keep();
  experts_down(out, a);
}

template <class T>
void FeedForward<T>::experts_down(Mat<T> out, KeptActivation<T>& a) {
  const int64_t Fm = m_.moe.ffn;
  for (const auto& b : blocks_) {
    if (b.kept > 0)
      k::linear_forward<T>(Mat<T>(out.data() + b.row0 * C_, b.kept, C_), a.in().rows_from(b.row0, b.kept).varying_rows(),
                           ew2_[b.expert].in(C_, Fm));
    if (b.kept < b.rows) zero_rows(out, b.row0 + b.kept, b.row0 + b.rows);
  }
}

// h = W13 . in over blocks_, as T values in h.target() (dropped rows zero).
template <class T>
void FeedForward<T>::experts_up(KeptActivation<T>& in, KeptActivation<T>& h) {
  const int64_t Fm = m_.moe.ffn;
  for (const auto& b : blocks_) {
    if (b.kept > 0)
      k::linear_forward<T>(Mat<T>(h.target().data() + b.row0 * 2 * Fm, b.kept, 2 * Fm),
                           in.in().rows_from(b.row0, b.kept).varying_rows(), ew1_[b.expert].in(2 * Fm, C_));
    if (b.kept < b.rows) zero_rows(h.target(), b.row0 + b.kept, b.row0 + b.rows);
  }
}

// din = d/din of experts_forward's blocks, from dout; their weight gradients added.
template <class T>
void FeedForward<T>::experts_backward(Mat<T> din, Mat<const T> dout, KeptActivation<T>& in, KeptActivation<T>& h,
                                      KeptActivation<T>& a) {
  const int64_t Fm = m_.moe.ffn, rows = int64_t(din.extent(0));
  auto da = ws_.mat("moe_dae", rows, Fm), dh = ws_.mat("moe_dhe", rows, 2 * Fm);
  for (const auto& b : blocks_) {
    if (b.kept > 0)
      k::linear_backward<T>(Mat<T>(da.data() + b.row0 * Fm, b.kept, Fm), ew2_[b.expert].dmat(C_, Fm),
                            Mat<const T>(dout.data() + b.row0 * C_, b.kept, C_),
                            a.in().rows_from(b.row0, b.kept).varying_rows(), ew2_[b.expert].in(C_, Fm));
    if (b.kept < b.rows) zero_rows(da, b.row0 + b.kept, b.row0 + b.rows);
  }
  k::swiglu_backward<T>(dh, da, h.values());
  for (const auto& b : blocks_) {
    if (b.kept > 0)
      k::linear_backward<T>(Mat<T>(din.data() + b.row0 * C_, b.kept, C_), ew1_[b.expert].dmat(2 * Fm, C_),
                            Mat<const T>(dh.data() + b.row0 * 2 * Fm, b.kept, 2 * Fm),
                            in.in().rows_from(b.row0, b.kept).varying_rows(), ew1_[b.expert].in(2 * Fm, C_));
    if (b.kept < b.rows) zero_rows(din, b.row0 + b.kept, b.row0 + b.rows);
  }
}

// ---------------------------------------------------------------------------
// Expert parallelism: the rows sorted by expert go to the ranks holding their
// experts (rank q holds experts [q * E/N, (q + 1) * E/N), so each rank's share
// of the sorted rows is one contiguous run); they arrive in source-rank order,
// each source's rows still sorted by expert. The owner runs each expert over
// each source's rows as that source would have run them itself (the same
// GEMMs, so the same bits; a weight gradient adds the sources in rank order)
// and sends the outputs back in the order they came. The backward sends the
// output gradients the same way and brings the input gradients home.

// Each rank tells every other how many of its rows go to each of that rank's
// experts (and, in MTP blocks, how many of those carry a label).
template <class T>
void FeedForward<T>::exchange_counts() {
  auto& X = *exchange_;
  const int P = X.ranks();
  const int64_t H = held();
  std::vector<int32_t> labelled(E_, 0), send(2 * E_), recv(2 * E_);
  if (labels_.extent(0) > 0) labelled = labelled_expert_counts(labels_);
  for (int q = 0; q < P; ++q)
    for (int64_t x = 0; x < H; ++x)
      send[(q * 2) * H + x] = counts_host_[q * H + x], send[(q * 2 + 1) * H + x] = labelled[q * H + x];
  X.counts(send.data(), recv.data(), int(2 * H));
  send_rows_.assign(P, 0), recv_rows_.assign(P, 0);
  held_counts_.assign(H, 0), held_labelled_.assign(H, 0);
  blocks_.clear();
  // capacity: each expert runs its rows in arrival order (source rank, then
  // the source's token order) until the budget is spent
  std::vector<int64_t> budget(H, capacity(P));
  dropped_ = 0;
  int64_t row = 0;
  for (int q = 0; q < P; ++q) {
    send_rows_[q] = offsets_host_[(q + 1) * H] - offsets_host_[q * H];
    for (int64_t x = 0; x < H; ++x) {
      const int32_t n = recv[(q * 2) * H + x];
      const int64_t kept = std::min<int64_t>(n, budget[x]);
      budget[x] -= kept, dropped_ += n - kept;
      blocks_.push_back({row, n, x, kept});
      recv_rows_[q] += n, row += n;
      held_counts_[x] += n, held_labelled_[x] += recv[(q * 2 + 1) * H + x];
    }
  }
  ox_.use_rows(row), oh_.use_rows(row), oa_.use_rows(row);
}

template <class T>
void FeedForward<T>::parallel_forward(Mat<T> out, In xn) {
  auto& X = *exchange_;
  exchange_counts();
  // 16-bit inputs travel as they are kept: half the bytes, the same bits
  const bool half = xe_.is_half();
  const void* rows = half ? static_cast<const void*>(xe_.half()) : static_cast<const void*>(xe_.target().data());
  void* in = half ? static_cast<void*>(ox_.half()) : static_cast<void*>(ox_.target().data());
  X.start(rows, send_rows_, in, recv_rows_, C_ * int64_t(half ? sizeof(uint16_t) : sizeof(T)));
  if (F_ > 0) swiglu_forward(out, xn, w1_, w2_, F_, h_, a_);  // DeepSeek's overlap: the shared experts meanwhile
  X.wait();
  // the outputs wait for their trip home in scratch that every layer shares
  auto out_rows = ws_.mat("moe_held_out", held_counts_total(), C_);
  experts_forward(out_rows, ox_, oh_, oa_);
  X.start(out_rows.data(), recv_rows_, ye_.data(), send_rows_, C_ * int64_t(sizeof(T)));  // home
  X.wait();
}

template <class T>
void FeedForward<T>::parallel_backward(Mat<T> dxn, Mat<const T> dout, In xn, Mat<T> dye, Mat<T> dxe) {
  auto& X = *exchange_;
  const int64_t R = held_counts_total();
  auto dy = ws_.mat("moe_held_dy", R, C_);  // the output gradients as they arrive
  X.start(dye.data(), send_rows_, dy.data(), recv_rows_, C_ * int64_t(sizeof(T)));
  if (F_ > 0) swiglu_backward(dxn, dout, xn, w1_, w2_, F_, h_, a_, T(0));  // the shared experts meanwhile
  X.wait();
  auto dx = ws_.mat("moe_held_dx", R, C_);
  (this->*remake_experts_)(ox_, oh_, oa_);
  experts_backward(dx, dy, ox_, oh_, oa_);
  X.start(dx.data(), recv_rows_, dxe.data(), send_rows_, C_ * int64_t(sizeof(T)));  // home
  X.wait();
}

template <class T>
void FeedForward<T>::update_bias(const std::vector<double>& load, double gamma) {
  double mean = 0;
  for (double l : load) mean += l / double(load.size());
  auto h = host_copy(bias_);
  for (int64_t x = 0; x < E_; ++x) h(x) += float(gamma * (load[x] < mean ? 1.0 : load[x] > mean ? -1.0 : 0.0));
  Kokkos::deep_copy(bias_, h);
}

template class FeedForward<float>;
template class FeedForward<double>;

}  // namespace xx

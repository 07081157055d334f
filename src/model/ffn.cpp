#include "model/ffn.h"
#include <cmath>
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
    for (int x = 0; x < e.routed; ++x) {
      ew1_.push_back(store(p + "ffn.experts." + std::to_string(x) + ".w1"));
      ew2_.push_back(store(p + "ffn.experts." + std::to_string(x) + ".w2"));
    }
    gate_kind_ = {e.gate == "sigmoid", e.gate == "sigmoid", e.route_scale};
    logits_ = activation<T>("router_logits", N_, E_);
    scores_ = activation<T>("router_scores", N_, E_);
    weights_ = activation<T>("router_weights", N_, K_);
    score_grad_ = activation<T>("router_score_grad", E_);
    idx_ = k::Index2("Moe::idx", N_, K_);
    pos_ = k::Index2("Moe::pos", N_, K_);
    counts_ = k::Index1("Moe::counts", E_);
    offsets_ = k::Index1("Moe::offsets", E_ + 1);
    token_of_ = k::Index1("Moe::token_of", N_ * K_);
    xe_ = KeptActivation<T>("expert_in", N_ * K_, C_, store.type, ws);
    he_ = KeptActivation<T>("expert_h", N_ * K_, 2 * e.ffn, store.type, ws, 1);  // read with ae_ written: slot 1
    ae_ = KeptActivation<T>("expert_a", N_ * K_, e.ffn, store.type, ws);
    ye_ = activation<T>("expert_out", N_ * K_, C_);
    bias_ = Buffer<float>("Moe::bias", E_);
    counts_host_.assign(E_, 0);
    offsets_host_.assign(E_ + 1, 0);
  }
  if (F_ > 0)
    h_ = KeptActivation<T>("ffn_h", N_, 2 * F_, store.type, ws, 1), a_ = KeptActivation<T>("ffn_a", N_, F_, store.type, ws);
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
  auto da = ws_.mat("ffn_da", rows, width), dh = ws_.mat("ffn_dh", rows, 2 * width);
  k::linear_backward<T>(da, w2.dmat(C_, width), dout, a.in(), w2.in(C_, width));
  k::swiglu_backward<T>(dh, da, h.values());
  k::linear_backward<T>(dx, w13.dmat(2 * width, C_), dh, x, w13.in(2 * width, C_), dx_beta);
}

template <class T>
std::vector<int32_t> FeedForward<T>::labelled_expert_counts(Tokens labels) const {
  std::vector<int32_t> out(E_, 0);
  if (!moe_) return out;
  auto token_of = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), token_of_);
  auto label = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), labels);
  for (int64_t x = 0; x < E_; ++x)
    for (int64_t r = offsets_host_[x]; r < offsets_host_[x] + counts_host_[x]; ++r) out[x] += label(token_of(r)) >= 0;
  return out;
}

template <class T>
void FeedForward<T>::forward(Mat<T> out, In xn) {
  if (F_ > 0) swiglu_forward(out, xn, w1_, w2_, F_, h_, a_);
  if (!moe_) return;
  const auto& e = m_.moe;
  const int64_t Fm = e.ffn;
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
  // (16-bit inputs are gathered as they are: a copy, no rounding twice)
  if (xn.is_half()) k::dispatch_forward<uint16_t>(Mat<uint16_t>(xe_.half(), N_ * K_, C_), Mat<const uint16_t>(xn.half, N_, C_), token_of_);
  else k::dispatch_forward<T>(xe_.target(), Mat<const T>(xn.values, N_, C_), token_of_);
  for (int64_t x = 0; x < E_; ++x) {
    const int64_t r0 = offsets_host_[x], n = counts_host_[x];
    if (n == 0) continue;
    k::linear_forward<T>(Mat<T>(he_.target().data() + r0 * 2 * Fm, n, 2 * Fm), xe_.in().rows_from(r0, n).varying_rows(),
                         ew1_[x].in(2 * Fm, C_));
  }
  k::swiglu_forward<T>(ae_.target(), he_.target());
  he_.keep(), ae_.keep();
  for (int64_t x = 0; x < E_; ++x) {
    const int64_t r0 = offsets_host_[x], n = counts_host_[x];
    if (n == 0) continue;
    k::linear_forward<T>(Mat<T>(ye_.data() + r0 * C_, n, C_), ae_.in().rows_from(r0, n).varying_rows(),
                         ew2_[x].in(C_, Fm));
  }
  k::combine_forward<T>(out, mat(ye_, N_ * K_, C_), mat(weights_, N_, K_), pos_);
  // V2 expert-level balance loss: alpha * sum_i f_i P_i, f_i = E/(K N) * count_i,
  // P_i = mean score; its gradient alpha f_i / N reaches every token's score i.
  aux_loss_ = 0;
  auto grad = Kokkos::create_mirror_view(score_grad_);
  for (int64_t x = 0; x < E_; ++x) grad(x) = T(0);
  if (e.balance == "aux" && e.balance_coef > 0) {
    auto mean = ws_.vec("moe_mean", E_);
    k::score_means<T>(mean, mat(scores_, N_, E_));
    auto hmean = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), mean);
    for (int64_t x = 0; x < E_; ++x) {
      const double f = double(E_) / double(K_ * N_) * counts_host_[x];
      aux_loss_ += e.balance_coef * f * double(hmean(x));
      grad(x) = T(loss_scale_ * e.balance_coef * f / double(N_));
    }
  }
  Kokkos::deep_copy(score_grad_, grad);
}

template <class T>
void FeedForward<T>::scale_balance_gradient(double factor) {
  if (moe_) k::scale_inplace<T>(Vec<T>(score_grad_.data(), E_), T(factor));
}

template <class T>
void FeedForward<T>::backward(Mat<T> dxn, Mat<const T> dout, In xn) {
  if (!moe_) {
    swiglu_backward(dxn, dout, xn, w1_, w2_, F_, h_, a_, T(0));
    return;
  }
  const int64_t Fm = m_.moe.ffn;
  if (F_ > 0) swiglu_backward(dxn, dout, xn, w1_, w2_, F_, h_, a_, T(0));
  // combine, then each expert's SwiGLU in reverse, then back to the tokens
  auto dye = ws_.mat("moe_dye", N_ * K_, C_), dw = ws_.mat("moe_dw", N_, K_);
  k::combine_backward<T>(dye, dw, dout, mat(ye_, N_ * K_, C_), mat(weights_, N_, K_), pos_);
  auto dae = ws_.mat("moe_dae", N_ * K_, Fm), dhe = ws_.mat("moe_dhe", N_ * K_, 2 * Fm);
  auto dxe = ws_.mat("moe_dxe", N_ * K_, C_);
  for (int64_t x = 0; x < E_; ++x) {
    const int64_t r0 = offsets_host_[x], n = counts_host_[x];
    if (n == 0) continue;
    k::linear_backward<T>(Mat<T>(dae.data() + r0 * Fm, n, Fm), ew2_[x].dmat(C_, Fm),
                          Mat<const T>(dye.data() + r0 * C_, n, C_), ae_.in().rows_from(r0, n).varying_rows(),
                          ew2_[x].in(C_, Fm));
  }
  k::swiglu_backward<T>(dhe, dae, he_.values());
  for (int64_t x = 0; x < E_; ++x) {
    const int64_t r0 = offsets_host_[x], n = counts_host_[x];
    if (n == 0) continue;
    k::linear_backward<T>(Mat<T>(dxe.data() + r0 * C_, n, C_), ew1_[x].dmat(2 * Fm, C_),
                          Mat<const T>(dhe.data() + r0 * 2 * Fm, n, 2 * Fm), xe_.in().rows_from(r0, n).varying_rows(),
                          ew1_[x].in(2 * Fm, C_));
  }
  auto dx_routed = ws_.mat("moe_dx", N_, C_);
  k::dispatch_backward<T>(dx_routed, dxe, pos_);
  if (F_ > 0) k::add_inplace<T>(Vec<T>(dxn.data(), N_ * C_), Vec<const T>(dx_routed.data(), N_ * C_));
  else Kokkos::deep_copy(dxn, dx_routed);
  // the router: combine weights and balance loss back to the gate logits
  auto dlogits = ws_.mat("moe_dlogits", N_, E_);
  k::router_backward<T>(dlogits, dw, mat(scores_, N_, E_), idx_, Vec<const T>(score_grad_.data(), E_), gate_kind_);
  k::linear_backward<T>(dxn, gate_.dmat(E_, C_), dlogits, xn, gate_.mat(E_, C_), T(1));
}

template <class T>
void FeedForward<T>::update_bias(const std::vector<double>& load, double gamma) {
  double mean = 0;
  for (double l : load) mean += l / double(load.size());
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), bias_);
  for (int64_t x = 0; x < E_; ++x) h(x) += float(gamma * (load[x] < mean ? 1.0 : load[x] > mean ? -1.0 : 0.0));
  Kokkos::deep_copy(bias_, h);
}

template class FeedForward<float>;
template class FeedForward<double>;

}  // namespace xx

#include "model/attention.h"
#include "core/device_memory.h"
#include "kernels/elementwise.h"
#include "kernels/flash_attention.h"
#include "kernels/linear.h"
#include "kernels/mla.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include <algorithm>
#include <cmath>
#include <numbers>
#include <fmt/format.h>

namespace xx {
namespace k = kernels;

k::RopeFrequencies rope_frequencies(const ModelConfig& m) {
  const int64_t D = m.rope_width();
  k::RopeFrequencies f{k::rope_inverse_frequencies(m.rope_theta, D), 1.0};
  const RopeScalingConfig& y = m.rope_scaling;
  if (!y.yarn()) return f;
  // the pair index whose frequency turns r times over original_seq positions
  auto pair_turning = [&](double r) {
    return double(D) * std::log(double(y.original_seq) / (r * 2 * std::numbers::pi)) / (2 * std::log(m.rope_theta));
  };
  const double low = std::max(std::floor(pair_turning(y.beta_fast)), 0.0);
  double high = std::min(std::ceil(pair_turning(y.beta_slow)), double(D - 1));
  if (low == high) high += 0.001;  // DeepSeek's guard: a ramp of no width
  for (size_t i = 0; i < f.inv_freq.size(); ++i) {
    const double extra = f.inv_freq[i], inter = extra / y.factor;
    const double keep = 1 - std::clamp((double(i) - low) / (high - low), 0.0, 1.0);  // the extrapolation weight
    f.inv_freq[i] = inter * (1 - keep) + extra * keep;
  }
  f.table_scale = yarn_mscale(y.factor, y.mscale) / yarn_mscale(y.factor, y.mscale_all_dim);
  return f;
}

template <class T>
T attention_score_scale(const ModelConfig& m) {
  const RopeScalingConfig& y = m.rope_scaling;
  const double gain = y.yarn() ? std::pow(yarn_mscale(y.factor, y.mscale_all_dim), 2) : 1.0;
  return T(1) / T(std::sqrt(double(m.qk_dim()))) * T(gain);
}
template float attention_score_scale<float>(const ModelConfig&);
template double attention_score_scale<double>(const ModelConfig&);

bool uses_flash_attention(const AttentionConfig& a) {
  if (a.kernel != AttentionKernel::automatic) return a.kernel == AttentionKernel::flash;
  return !kernel_memory_on_host();
}

std::string attention_kernel_report(const AttentionConfig& a) {
  const std::string chose = uses_flash_attention(a)
                                ? "flash: tiled online softmax, a log-sum-exp per row kept, probabilities recomputed"
                                : "packed: the lower block triangle of probabilities kept for the backward";
  const std::string why = a.kernel != AttentionKernel::automatic ? "as the deck asks"
                          : uses_flash_attention(a) ? "auto: the kernels run on a device"
                                                    : "auto: the kernels' memory is the host's";
  return chose + fmt::format(", blocks of {} ({})", kAttentionBlock, why);
}

template <class T>
Attention<T>::Attention(const ModelConfig& m, const ParamStore<T>& store, const std::string& p, int64_t batch,
                        Workspace<T>& ws)
    : forward_(m.attention.mla() ? &Attention::forward_mla : &Attention::forward_mha),
      backward_(!m.attention.mla()                  ? &Attention::backward_mha
                : m.recompute == Recompute::selective ? &Attention::backward_mla_remade
                                                      : &Attention::backward_mla),
      m_(m), B_(batch), T_(m.seq), N_(batch * m.seq), H_(m.heads), C_(m.dim), qk_(m.qk_dim()), vd_(m.v_dim()),
      blocks_(m.seq, kAttentionBlock), ws_(ws), flash_(uses_flash_attention(m.attention)),
      score_scale_(attention_score_scale<T>(m)) {
  const auto& a = m.attention;
  wo_ = store(p + "attn.wo");
  if (!a.mla()) {
    wq_ = store(p + "attn.wq");  // wq|wk|wv: the fused (3C, C) weight
  } else {
    if (a.q_lora_rank == 0) {
      wq_ = store(p + "attn.wq");
    } else {
      wq_a_ = store(p + "attn.wq_a");
      q_norm_ = store(p + "attn.q_norm");
      wq_b_ = store(p + "attn.wq_b");
      qa_ = ws.activation("qa", N_, a.q_lora_rank);
      qan_ = KeptActivation<T>("qan", N_, a.q_lora_rank, store.type, ws);
      rstd_q_ = ws.activation("rstd_q", N_);
    }
    wkv_a_ = store(p + "attn.wkv_a");
    kv_norm_ = store(p + "attn.kv_norm");
    wkv_b_ = store(p + "attn.wkv_b");
    c_ = ws.activation("c", N_, a.kv_lora_rank);
    cn_ = KeptActivation<T>("cn", N_, a.kv_lora_rank, store.type, ws);
    rstd_c_ = ws.activation("rstd_c", N_);
    krope_ = ws.activation("krope", N_, a.rope_dim);
  }
  const int64_t rope = m.rope_width();
  rope_cos_ = ws.activation("rope_cos", T_, rope / 2);
  rope_sin_ = ws.activation("rope_sin", T_, rope / 2);
  k::rope_tables<T>(mat(rope_cos_, T_, rope / 2), mat(rope_sin_, T_, rope / 2), rope_frequencies(m));
  q_ = KeptActivation<T>("q", B_ * H_ * T_, qk_, store.type, ws, 0);  // written together: three slots
  k_ = KeptActivation<T>("k", B_ * H_ * T_, qk_, store.type, ws, 1);
  v_ = KeptActivation<T>("v", B_ * H_ * T_, vd_, store.type, ws, 2);
  if (flash_) lse_ = ws.activation("lse", B_ * H_ * T_);
  else if (store.type == kernels::Precision::fp32) att_ = ws.activation("att", B_ * H_ * blocks_.per_head());
  else att_half_ = ws.half_activation("att", B_ * H_ * blocks_.per_head());
  o_ = KeptActivation<T>("o", N_, H_ * vd_, store.type, ws);
}

template <class T>
kernels::KeptProbabilities<T> Attention<T>::probabilities() {
  return {att_.data(), att_half_.data(), q_.in().type};
}

template <class T>
void Attention<T>::forward(Mat<T> out, In xn) {
  (this->*forward_)(out, xn);
}
template <class T>
void Attention<T>::backward(Mat<T> dxn, Mat<const T> dout, In xn) {
  (this->*backward_)(dxn, dout, xn);
}

// softmax(q k^T / sqrt(qk)) v over the heads, merged, then out += o . Wo^T
template <class T>
void Attention<T>::attend_forward(Mat<T> out) {
  const int64_t BHT = B_ * H_ * T_;
  auto heads = ws_.mat("attn_heads", BHT, vd_);
  if (flash_)
    k::flash_attention_forward<T>(heads, Vec<T>(lse_.data(), BHT), q_.in(), k_.in(), v_.in(),
                                  ws_.vec("attn_flash", k::flash_scratch_size(B_ * H_, T_, kAttentionBlock)), blocks_,
                                  B_ * H_, score_scale_);
  else
    k::attention_forward<T>(heads, probabilities(), q_.in(), k_.in(), v_.in(),
                            ws_.vec("attn_p", kAttentionBlock * T_), blocks_, B_ * H_, score_scale_);
  k::merge_heads_forward<T>(o_.target(), heads, B_, T_, H_);
  o_.keep();
  k::linear_forward<T>(out, o_.in(), wo_.in(C_, H_ * vd_), T(1));
}

// From dout to the per-head gradients, left in the workspace as dq, dk, dv.
template <class T>
void Attention<T>::attend_backward(Mat<const T> dout) {
  const int64_t BHT = B_ * H_ * T_;
  auto dO = ws_.mat("attn_do", N_, H_ * vd_);
  k::linear_backward<T>(dO, wo_.dmat(C_, H_ * vd_), dout, o_.in(), wo_.in(C_, H_ * vd_));
  auto dheads = ws_.mat("attn_heads", BHT, vd_);
  k::merge_heads_backward<T>(dheads, dO, B_, T_, H_);
  if (flash_) {
    auto delta = ws_.vec("attn_delta", BHT);  // rowsum(dO o O), from the merged output kept
    k::flash_attention_delta<T>(delta, dO, o_.in(), B_, T_, H_);
    k::flash_attention_backward<T>(ws_.mat("attn_dq", BHT, qk_), ws_.mat("attn_dk", BHT, qk_),
                                   ws_.mat("attn_dv", BHT, vd_),
                                   ws_.vec("attn_flash", k::flash_scratch_size(B_ * H_, T_, kAttentionBlock)), dheads,
                                   delta, Vec<const T>(lse_.data(), BHT), q_.in(), k_.in(), v_.in(), blocks_, B_ * H_,
                                   score_scale_);
    return;
  }
  k::attention_backward<T>(ws_.mat("attn_dq", BHT, qk_), ws_.mat("attn_dk", BHT, qk_), ws_.mat("attn_dv", BHT, vd_),
                           ws_.vec("attn_dp", kAttentionBlock * T_), dheads, probabilities(), q_.in(), k_.in(),
                           v_.in(), blocks_, B_ * H_, score_scale_);
}

// ---------------------------------------------------------------------------
// MHA: qkv = xn . [Wq|Wk|Wv]^T, rotate q and k, attend.

template <class T>
void Attention<T>::forward_mha(Mat<T> out, In xn) {
  const int64_t D = qk_;
  auto qkv = ws_.mat("mha_qkv", N_, 3 * C_);
  k::linear_forward<T>(qkv, xn, wq_.in(3 * C_, C_));
  k::split_heads_rope_forward<T>(q_.target(), k_.target(), v_.target(), qkv, mat(rope_cos_, T_, D / 2),
                                 mat(rope_sin_, T_, D / 2), B_, T_, H_);
  q_.keep(), k_.keep(), v_.keep();
  attend_forward(out);
}

template <class T>
void Attention<T>::backward_mha(Mat<T> dxn, Mat<const T> dout, In xn) {
  const int64_t BHT = B_ * H_ * T_, D = qk_;
  attend_backward(dout);
  auto dqkv = ws_.mat("mha_qkv", N_, 3 * C_);
  k::split_heads_rope_backward<T>(dqkv, ws_.mat("attn_dq", BHT, D), ws_.mat("attn_dk", BHT, D),
                                  ws_.mat("attn_dv", BHT, D), mat(rope_cos_, T_, D / 2), mat(rope_sin_, T_, D / 2), B_,
                                  T_, H_);
  k::linear_backward<T>(dxn, wq_.dmat(3 * C_, C_), dqkv, xn, wq_.in(3 * C_, C_));
}

// ---------------------------------------------------------------------------
// MLA: queries directly (or through their own normed latent), keys and values
// from a normed latent c, the rope key from its own rows of wkv_a.

template <class T>
void Attention<T>::forward_mla(Mat<T> out, In xn) {
  const auto& a = m_.attention;
  const int64_t R = a.kv_lora_rank, Q = a.q_lora_rank, rope = a.rope_dim;
  if (Q > 0) k::linear_forward<T>(mat(qa_, N_, Q), xn, wq_a_.in(Q, C_));
  // wkv_a rows [0, R) give the latent, rows [R, R + rope) the shared rope key.
  k::linear_forward<T>(mat(c_, N_, R), xn, wkv_a_.in(R, C_));
  k::linear_forward<T>(mat(krope_, N_, rope), xn, wkv_a_.in(rope, C_, R));
  mla_heads(xn);
  attend_forward(out);
}

// From the latents (kept) to the heads: the latents' norms, the up-projections
// (wq_b, wkv_b; wq from xn without a query latent), the split with RoPE.
template <class T>
void Attention<T>::mla_heads(In xn) {
  const auto& a = m_.attention;
  const int64_t R = a.kv_lora_rank, Q = a.q_lora_rank, rope = a.rope_dim;
  auto q = ws_.mat("mla_q", N_, H_ * qk_);
  if (Q == 0) {
    k::linear_forward<T>(q, xn, wq_.in(H_ * qk_, C_));
  } else {
    k::rmsnorm_forward<T>(qan_.target(), Vec<T>(rstd_q_.data(), N_), mat(qa_, N_, Q), q_norm_.vec(Q),
                          m_.latent_eps());
    qan_.keep();
    k::linear_forward<T>(q, qan_.in(), wq_b_.in(H_ * qk_, Q));
  }
  k::rmsnorm_forward<T>(cn_.target(), Vec<T>(rstd_c_.data(), N_), mat(c_, N_, R), kv_norm_.vec(R), m_.latent_eps());
  cn_.keep();
  auto kv = ws_.mat("mla_kv", N_, H_ * (a.qk_nope_dim + vd_));
  k::linear_forward<T>(kv, cn_.in(), wkv_b_.in(H_ * (a.qk_nope_dim + vd_), R));
  k::mla_split_heads_forward<T>(q_.target(), k_.target(), v_.target(), q, kv, mat(krope_, N_, rope),
                                mat(rope_cos_, T_, rope / 2), mat(rope_sin_, T_, rope / 2), B_, T_,
                                {H_, a.qk_nope_dim, rope, vd_});
  q_.keep(), k_.keep(), v_.keep();
}

// recompute selective: the heads and normed latents were not kept (one set
// shared by all blocks): made again from the latents, then the backward.
template <class T>
void Attention<T>::backward_mla_remade(Mat<T> dxn, Mat<const T> dout, In xn) {
  mla_heads(xn);
  backward_mla(dxn, dout, xn);
}

template <class T>
void Attention<T>::backward_mla(Mat<T> dxn, Mat<const T> dout, In xn) {
  const auto& a = m_.attention;
  const int64_t R = a.kv_lora_rank, Q = a.q_lora_rank, rope = a.rope_dim, BHT = B_ * H_ * T_;
  const int64_t kvw = H_ * (a.qk_nope_dim + vd_);
  attend_backward(dout);
  auto dq = ws_.mat("mla_q", N_, H_ * qk_);
  auto dkv = ws_.mat("mla_kv", N_, kvw);
  auto dkrope = ws_.mat("mla_dkrope", N_, rope);
  k::mla_split_heads_backward<T>(dq, dkv, dkrope, ws_.mat("attn_dq", BHT, qk_), ws_.mat("attn_dk", BHT, qk_),
                                 ws_.mat("attn_dv", BHT, vd_), mat(rope_cos_, T_, rope / 2),
                                 mat(rope_sin_, T_, rope / 2), B_, T_, {H_, a.qk_nope_dim, rope, vd_});
  auto dcn = ws_.mat("mla_dcn", N_, R);
  k::linear_backward<T>(dcn, wkv_b_.dmat(kvw, R), dkv, cn_.in(), wkv_b_.in(kvw, R));
  auto dc = ws_.mat("mla_dc", N_, R);
  k::rmsnorm_backward<T>(dc, kv_norm_.dvec(R), dcn, mat(c_, N_, R), kv_norm_.vec(R), Vec<const T>(rstd_c_.data(), N_));
  k::linear_backward<T>(dxn, wkv_a_.dmat(R, C_), dc, xn, wkv_a_.in(R, C_));
  k::linear_backward<T>(dxn, Mat<T>(wkv_a_.g + R * C_, rope, C_), dkrope, xn, wkv_a_.in(rope, C_, R), T(1));
  if (Q == 0) {
    k::linear_backward<T>(dxn, wq_.dmat(H_ * qk_, C_), dq, xn, wq_.in(H_ * qk_, C_), T(1));
  } else {
    auto dqan = ws_.mat("mla_dqan", N_, Q), dqa = ws_.mat("mla_dqa", N_, Q);
    k::linear_backward<T>(dqan, wq_b_.dmat(H_ * qk_, Q), dq, qan_.in(), wq_b_.in(H_ * qk_, Q));
    k::rmsnorm_backward<T>(dqa, q_norm_.dvec(Q), dqan, mat(qa_, N_, Q), q_norm_.vec(Q), Vec<const T>(rstd_q_.data(), N_));
    k::linear_backward<T>(dxn, wq_a_.dmat(Q, C_), dqa, xn, wq_a_.in(Q, C_), T(1));
  }
}

template class Attention<float>;
template class Attention<double>;

}  // namespace xx

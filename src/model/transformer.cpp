#include "model/transformer.h"
#include "core/rng.h"
#include "kernels/cross_entropy.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/linear.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"

namespace xx {
namespace k = kernels;

// Query/key block of the causal attention: big enough for BLAS to run near its
// peak, small enough that the diagonal blocks waste little.
constexpr int64_t kAttentionBlock = 64;

template <class T>
static Buffer<T> alloc(const std::string& what, int64_t n) {
  return Buffer<T>("Transformer::" + what, n);
}

template <class T>
Transformer<T>::Transformer(const ModelConfig& config, int batch)
    : cfg_(config), layout_(config), B_(batch), T_(config.seq), N_(int64_t(batch) * config.seq),
      blocks_(config.seq, kAttentionBlock) {
  const int64_t C = cfg_.dim, F = cfg_.ffn, V = cfg_.vocab, D = cfg_.head_dim(), H = cfg_.heads;
  params_ = alloc<T>("params", layout_.total());
  grads_ = alloc<T>("grads", layout_.total());
  rope_cos_ = alloc<T>("rope_cos", T_ * D / 2);
  rope_sin_ = alloc<T>("rope_sin", T_ * D / 2);
  k::rope_tables<T>(mat(rope_cos_, T_, D / 2), mat(rope_sin_, T_, D / 2), cfg_.rope_theta);
  for (int l = 0; l <= cfg_.layers; ++l) resid_.push_back(alloc<T>("resid" + std::to_string(l), N_ * C));
  for (int l = 0; l < cfg_.layers; ++l) {
    LayerActivations a;
    a.xn = alloc<T>("xn", N_ * C);
    a.rstd1 = alloc<T>("rstd1", N_);
    a.q = alloc<T>("q", N_ * C);
    a.k = alloc<T>("k", N_ * C);
    a.v = alloc<T>("v", N_ * C);
    a.att = alloc<T>("att", B_ * H * blocks_.per_head());
    a.o = alloc<T>("o", N_ * C);
    a.xmid = alloc<T>("xmid", N_ * C);
    a.xn2 = alloc<T>("xn2", N_ * C);
    a.rstd2 = alloc<T>("rstd2", N_);
    a.h = alloc<T>("h", N_ * 2 * F);
    a.a = alloc<T>("a", N_ * F);
    acts_.push_back(a);
  }
  qkv_ = alloc<T>("qkv", N_ * 3 * C);
  heads_out_ = alloc<T>("heads_out", N_ * C);
  xf_ = alloc<T>("xf", N_ * C);
  rstdf_ = alloc<T>("rstdf", N_);
  logits_ = alloc<T>("logits", N_ * V);
  losses_ = alloc<T>("losses", N_);
  dresid_ = alloc<T>("dresid", N_ * C);
  dtmp_ = alloc<T>("dtmp", N_ * C);
  dnorm_ = alloc<T>("dnorm", N_ * C);
  dheads_ = alloc<T>("dheads", N_ * C);
  dq_ = alloc<T>("dq", N_ * C);
  dk_ = alloc<T>("dk", N_ * C);
  dv_ = alloc<T>("dv", N_ * C);
  dqkv_ = alloc<T>("dqkv", N_ * 3 * C);
  dh_ = alloc<T>("dh", N_ * 2 * F);
  da_ = alloc<T>("da", N_ * F);
  datt_ = alloc<T>("datt", kAttentionBlock * T_);
}

template <class T>
Vec<T> Transformer<T>::window(Buffer<T>& b, const std::string& name) {
  const auto& t = layout_.at(name);
  return Vec<T>(b.data() + t.offset, t.size);
}

// (rows, cols) view starting at tensor `name`; rows may span adjacent tensors
// (wq|wk|wv is the fused QKV weight, w1|w3 the fused gate/up weight).
template <class T>
Mat<const T> Transformer<T>::weight(const std::string& name, int64_t rows, int64_t cols) const {
  return Mat<const T>(params_.data() + layout_.at(name).offset, rows, cols);
}
template <class T>
Mat<T> Transformer<T>::dweight(const std::string& name, int64_t rows, int64_t cols) {
  return Mat<T>(grads_.data() + layout_.at(name).offset, rows, cols);
}

template <class T>
void Transformer<T>::init(uint64_t seed) {
  auto host = Kokkos::create_mirror_view(params_);
  for (const auto& t : layout_.tensors()) {
    const uint64_t stream = mix_seed(seed, 0x1217, uint64_t(t.offset));
    for (int64_t i = 0; i < t.size; ++i)
      host(t.offset + i) = t.is_norm ? T(1) : T(t.init_std * normal(stream, uint64_t(i)));
  }
  Kokkos::deep_copy(params_, host);
  zero_grads();
}

template <class T>
void Transformer<T>::zero_grads() {
  Kokkos::deep_copy(grads_, T(0));
}

template <class T>
double Transformer<T>::forward(Tokens inputs, Tokens targets) {
  const int64_t C = cfg_.dim, F = cfg_.ffn, V = cfg_.vocab, H = cfg_.heads, D = cfg_.head_dim();
  const int64_t BHT = B_ * H * T_;
  k::embedding_forward<T>(mat(resid_[0], N_, C), inputs, weight("embed", V, C));
  for (int l = 0; l < cfg_.layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    auto& a = acts_[l];
    // attention branch
    k::rmsnorm_forward<T>(mat(a.xn, N_, C), Vec<T>(a.rstd1.data(), N_), mat(resid_[l], N_, C),
                          param(p + "attn_norm"), cfg_.norm_eps);
    k::linear_forward<T>(mat(qkv_, N_, 3 * C), mat(a.xn, N_, C), weight(p + "attn.wq", 3 * C, C));
    k::split_heads_rope_forward<T>(mat(a.q, BHT, D), mat(a.k, BHT, D), mat(a.v, BHT, D), mat(qkv_, N_, 3 * C),
                                   mat(rope_cos_, T_, D / 2), mat(rope_sin_, T_, D / 2), B_, T_, H);
    k::attention_forward<T>(mat(heads_out_, BHT, D), Vec<T>(a.att.data(), a.att.extent(0)), mat(a.q, BHT, D),
                            mat(a.k, BHT, D), mat(a.v, BHT, D), blocks_, B_ * H);
    k::merge_heads_forward<T>(mat(a.o, N_, C), mat(heads_out_, BHT, D), B_, T_, H);
    Kokkos::deep_copy(a.xmid, resid_[l]);  // residual: the GEMM adds into a copy of x
    k::linear_forward<T>(mat(a.xmid, N_, C), mat(a.o, N_, C), weight(p + "attn.wo", C, C), T(1));
    // feed-forward branch
    k::rmsnorm_forward<T>(mat(a.xn2, N_, C), Vec<T>(a.rstd2.data(), N_), mat(a.xmid, N_, C),
                          param(p + "ffn_norm"), cfg_.norm_eps);
    k::linear_forward<T>(mat(a.h, N_, 2 * F), mat(a.xn2, N_, C), weight(p + "ffn.w1", 2 * F, C));
    k::swiglu_forward<T>(mat(a.a, N_, F), mat(a.h, N_, 2 * F));
    Kokkos::deep_copy(resid_[l + 1], a.xmid);
    k::linear_forward<T>(mat(resid_[l + 1], N_, C), mat(a.a, N_, F), weight(p + "ffn.w2", C, F), T(1));
  }
  k::rmsnorm_forward<T>(mat(xf_, N_, C), Vec<T>(rstdf_.data(), N_), mat(resid_[cfg_.layers], N_, C), param("norm"),
                        cfg_.norm_eps);
  k::linear_forward<T>(mat(logits_, N_, V), mat(xf_, N_, C), weight("head", V, C));
  k::cross_entropy_forward<T>(Vec<T>(losses_.data(), N_), mat(logits_, N_, V), targets);
  return k::sum<T>(Vec<const T>(losses_.data(), N_)) / double(N_);
}

template <class T>
void Transformer<T>::backward(Tokens inputs, Tokens targets, const std::function<void(int64_t)>& ready) {
  const int64_t C = cfg_.dim, F = cfg_.ffn, V = cfg_.vocab, H = cfg_.heads, D = cfg_.head_dim();
  const int64_t BHT = B_ * H * T_;
  auto notify = [&](int64_t offset) {
    if (ready) ready(offset);
  };
  // head and final norm; dlogits overwrite the logits in place
  k::cross_entropy_backward<T>(mat(logits_, N_, V), mat(logits_, N_, V), targets, T(1.0 / double(N_)));
  k::linear_backward<T>(mat(dnorm_, N_, C), dweight("head", V, C), mat(logits_, N_, V), mat(xf_, N_, C),
                        weight("head", V, C));
  k::rmsnorm_backward<T>(mat(dresid_, N_, C), grad("norm"), mat(dnorm_, N_, C), mat(resid_[cfg_.layers], N_, C),
                         param("norm"), Vec<const T>(rstdf_.data(), N_));
  notify(layout_.layer_begin(cfg_.layers));
  Vec<T> dresid(dresid_.data(), N_ * C);
  Vec<const T> dtmp(dtmp_.data(), N_ * C);
  for (int l = cfg_.layers - 1; l >= 0; --l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    auto& a = acts_[l];
    // feed-forward branch: resid[l+1] = xmid + W2 . swiglu(W13 . xn2)
    k::linear_backward<T>(mat(da_, N_, F), dweight(p + "ffn.w2", C, F), mat(dresid_, N_, C), mat(a.a, N_, F),
                          weight(p + "ffn.w2", C, F));
    k::swiglu_backward<T>(mat(dh_, N_, 2 * F), mat(da_, N_, F), mat(a.h, N_, 2 * F));
    k::linear_backward<T>(mat(dnorm_, N_, C), dweight(p + "ffn.w1", 2 * F, C), mat(dh_, N_, 2 * F),
                          mat(a.xn2, N_, C), weight(p + "ffn.w1", 2 * F, C));
    k::rmsnorm_backward<T>(mat(dtmp_, N_, C), grad(p + "ffn_norm"), mat(dnorm_, N_, C), mat(a.xmid, N_, C),
                           param(p + "ffn_norm"), Vec<const T>(a.rstd2.data(), N_));
    k::add_inplace<T>(dresid, dtmp);
    // attention branch: xmid = x + Wo . attention(...)
    k::linear_backward<T>(mat(dnorm_, N_, C), dweight(p + "attn.wo", C, C), mat(dresid_, N_, C), mat(a.o, N_, C),
                          weight(p + "attn.wo", C, C));
    k::merge_heads_backward<T>(mat(dheads_, BHT, D), mat(dnorm_, N_, C), B_, T_, H);
    k::attention_backward<T>(mat(dq_, BHT, D), mat(dk_, BHT, D), mat(dv_, BHT, D),
                             Vec<T>(datt_.data(), datt_.extent(0)), mat(dheads_, BHT, D),
                             Vec<const T>(a.att.data(), a.att.extent(0)), mat(a.q, BHT, D), mat(a.k, BHT, D),
                             mat(a.v, BHT, D), blocks_, B_ * H);
    k::split_heads_rope_backward<T>(mat(dqkv_, N_, 3 * C), mat(dq_, BHT, D), mat(dk_, BHT, D), mat(dv_, BHT, D),
                                    mat(rope_cos_, T_, D / 2), mat(rope_sin_, T_, D / 2), B_, T_, H);
    k::linear_backward<T>(mat(dnorm_, N_, C), dweight(p + "attn.wq", 3 * C, C), mat(dqkv_, N_, 3 * C),
                          mat(a.xn, N_, C), weight(p + "attn.wq", 3 * C, C));
    k::rmsnorm_backward<T>(mat(dtmp_, N_, C), grad(p + "attn_norm"), mat(dnorm_, N_, C), mat(resid_[l], N_, C),
                           param(p + "attn_norm"), Vec<const T>(a.rstd1.data(), N_));
    k::add_inplace<T>(dresid, dtmp);
    notify(layout_.layer_begin(l));
  }
  k::embedding_backward<T>(dweight("embed", V, C), mat(dresid_, N_, C), inputs);
  notify(0);
}

template class Transformer<float>;
template class Transformer<double>;

}  // namespace xx

// The dense DeepSeek-style decoder: token embedding; L blocks of
//   x += Wo . attention(rope(Wqkv . rmsnorm(x)))
//   x += W2 . swiglu(W13 . rmsnorm(x))
// then a final RMSNorm and the LM head (not tied to the embedding).
// Parameters and gradients each live in one flat buffer (model/params.h).
// Templated on the scalar type: float for training, double for gradient checks.
#pragma once
#include <functional>
#include <vector>
#include "config.h"
#include "core/views.h"
#include "kernels/attention.h"
#include "model/params.h"

namespace xx {

template <class T>
class Transformer {
 public:
  // Allocates parameters, gradients and the activations of a batch of B sequences.
  Transformer(const ModelConfig& config, int batch);

  const ModelConfig& config() const { return cfg_; }
  const ParamLayout& layout() const { return layout_; }
  Buffer<T>& params() { return params_; }
  Buffer<T>& grads() { return grads_; }
  Vec<T> param(const std::string& name) { return window(params_, name); }
  Vec<T> grad(const std::string& name) { return window(grads_, name); }

  // normal(0, std) weights and unit norms, from a counter-based stream: the
  // same seed gives the same bits on every rank and thread count.
  void init(uint64_t seed);
  void zero_grads();

  // Mean cross-entropy over the B*T tokens; keeps what backward needs.
  double forward(Tokens inputs, Tokens targets);

  // grads += d(mean loss)/d(params) for the last forward. `ready(offset)` is
  // called whenever every gradient from `offset` to the end of the buffer is
  // final, so the caller can start reducing those buckets.
  void backward(Tokens inputs, Tokens targets, const std::function<void(int64_t)>& ready = {});

 private:
  struct LayerActivations {
    Buffer<T> xn, rstd1, q, k, v, att, o, xmid, xn2, rstd2, h, a;
  };
  Vec<T> window(Buffer<T>& b, const std::string& name);
  Mat<const T> weight(const std::string& name, int64_t rows, int64_t cols) const;
  Mat<T> dweight(const std::string& name, int64_t rows, int64_t cols);

  ModelConfig cfg_;
  ParamLayout layout_;
  int64_t B_, T_, N_;  // N = B*T tokens
  kernels::CausalBlocks blocks_;
  Buffer<T> params_, grads_;
  Buffer<T> rope_cos_, rope_sin_;            // (T, D/2)
  std::vector<Buffer<T>> resid_;             // L+1 residual streams, each (N, C)
  std::vector<LayerActivations> acts_;
  Buffer<T> qkv_, heads_out_, xf_, rstdf_, logits_, losses_;
  Buffer<T> dresid_, dtmp_, dnorm_, dheads_, dq_, dk_, dv_, dqkv_, dh_, da_, datt_;
};

}  // namespace xx

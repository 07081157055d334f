// The attention branch of a block: out += Wo . attention(xn), either dense
// multi-head attention with RoPE (MHA) or DeepSeek's multi-head latent
// attention (MLA). Forward and backward side by side in attention.cpp.
#pragma once
#include <string>
#include "deck/config.h"
#include "kernels/attention_packed.h"
#include "kernels/rope.h"
#include "model/store.h"

namespace xx {

// The causal-attention kernel a deck's `attention_kernel` runs here: packed
// (kernels/attention_packed.h: keeps the probabilities, BH T^2/2 values) or flash
// (kernels/flash_attention.h: keeps a log-sum-exp per row, recomputes the
// rest). auto: packed where the kernels' memory is the host's, so every CPU
// curve stays what it was; flash on a device, whose memory is the scarcer.
bool uses_flash_attention(const AttentionConfig& a);
// The backends table's line: which runs and why.
std::string attention_kernel_report(const AttentionConfig& a);
// Query and key block of both kernels: big enough for the GEMMs to run near
// their peak, small enough that the diagonal blocks waste little.
constexpr int64_t kAttentionBlock = 64;

// The rotary embedding of model m, the one owner of its frequencies and table
// multiplier for training (Attention) and decoding (Decoder): over the rotary
// width D (m.rope_width()), the plain theta^(-2i/D); under rope_scaling yarn,
// DeepSeek-V2's YaRN (deck/config.h RopeScalingConfig), with base = theta:
//   extra_i = theta^(-2i/D), inter_i = extra_i / factor, i < D/2;
//   dim(r) = D ln(original_seq / (2 pi r)) / (2 ln theta): the pair turning r times over original_seq;
//   low = max(floor(dim(beta_fast)), 0), high = min(ceil(dim(beta_slow)), D - 1) (+0.001 if equal);
//   keep_i = 1 - clamp((i - low) / (high - low), 0, 1); inv_freq_i = inter_i (1 - keep_i) + extra_i keep_i;
//   table_scale = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim) (deck/config.h).
kernels::RopeFrequencies rope_frequencies(const ModelConfig& m);
// The attention scores' scale, the one owner for the packed and flash kernels
// and the decoder's: 1/sqrt(qk_dim), times yarn_mscale(factor, mscale_all_dim)^2
// under rope_scaling yarn (DeepSeek's attention does this; 1 where mscale_all_dim is 0).
template <class T>
T attention_score_scale(const ModelConfig& m);

template <class T>
class Attention {
 public:
  Attention(const ModelConfig& m, const ParamStore<T>& store, const std::string& prefix, int64_t batch,
            Workspace<T>& ws);
  using In = kernels::GemmIn<T>;
  void forward(Mat<T> out, In xn);                     // out += attention(xn)
  void backward(Mat<T> dxn, Mat<const T> dout, In xn);  // dxn = d/dxn

 private:
  void forward_mha(Mat<T> out, In xn);
  void backward_mha(Mat<T> dxn, Mat<const T> dout, In xn);
  void forward_mla(Mat<T> out, In xn);
  void backward_mla(Mat<T> dxn, Mat<const T> dout, In xn);
  void mla_heads(In xn);                                        // latents -> q, k, v
  void backward_mla_remade(Mat<T> dxn, Mat<const T> dout, In xn);  // recompute selective
  // MHA or MLA (and under recompute selective, MLA remaking its heads), chosen once at construction
  using Forward = void (Attention::*)(Mat<T>, In);
  using Backward = void (Attention::*)(Mat<T>, Mat<const T>, In);
  Forward forward_;
  Backward backward_;
  kernels::KeptProbabilities<T> probabilities();
  void attend_forward(Mat<T> out);
  void attend_backward(Mat<const T> dout);

  const ModelConfig m_;
  int64_t B_, T_, N_, H_, C_, qk_, vd_;
  kernels::CausalBlocks blocks_;
  Workspace<T>& ws_;
  Param<T> wq_, wq_a_, q_norm_, wq_b_, wkv_a_, kv_norm_, wkv_b_, wo_;  // MHA uses wq (fused qkv) and wo
  Buffer<T> rope_cos_, rope_sin_;                                      // (T, rope width / 2)
  // kept for backward
  KeptActivation<T> q_, k_, v_, o_;    // heads (B*H*T, qk | v), merged output (N, H*v)
  bool flash_;                    // which kernel (uses_flash_attention)
  T score_scale_;                 // attention_score_scale
  Buffer<T> att_;                 // packed: probabilities, T values, or
  Buffer<uint16_t> att_half_;     //   their 16-bit copy under mixed precision
  Buffer<T> lse_;                 // flash: log-sum-exp of each row's scores (B*H*T)
  Buffer<T> qa_, rstd_q_;         // MLA query latent (q_lora_rank > 0) ...
  KeptActivation<T> qan_;              //   and its norm
  Buffer<T> c_, rstd_c_, krope_;  // MLA key/value latent and shared rope key ...
  KeptActivation<T> cn_;               //   and the latent's norm
};

}  // namespace xx

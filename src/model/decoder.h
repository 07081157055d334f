// Autoregressive decoding with a KV cache: one token in, the next token's
// logits out, each layer attending to what it cached of the earlier
// positions (kernels/decode.h). MHA caches keys and values; MLA only its
// normed latent and the shared rope key, which is what MLA is for at
// inference. The MoE layers route each token as in training (the same
// FeedForward code, with the model's balance biases). MTP modules are not
// used: they train the trunk, the main head predicts.
// Reads the model's fp32 parameters in place; a run in training may decode
// between steps (deck: sample every N).
#pragma once
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>
#include "model/transformer.h"

namespace xx {

class Decoder {
 public:
  // Room for `max_len` positions (at most the model's seq: its rope tables).
  Decoder(Transformer<float>& model, int64_t max_len);
  ~Decoder();

  void reset();                          // empty cache; takes the model's current MoE biases
  std::vector<float> step(int32_t token);  // appends token at position length(); returns the logits (V)
  int64_t length() const { return len_; }
  int64_t max_length() const { return max_len_; }

  // Bytes the cache holds per token (fp32, all layers), and what MHA of the
  // same width (H heads of qk_dim keys, v_dim values) would hold.
  static int64_t cache_bytes_per_token(const ModelConfig& m);
  static int64_t mha_bytes_per_token(const ModelConfig& m);

 private:
  struct Layer;
  Transformer<float>& model_;
  ModelConfig m_;  // the model's, with seq 1: the FFNs see one token
  int64_t max_len_, len_ = 0;
  Workspace<float> ws_;
  std::vector<std::unique_ptr<Layer>> layers_;
  Param<float> embed_, norm_, head_;
  Buffer<float> rope_cos_, rope_sin_;  // (seq, rope/2)
  float score_scale_ = 0;              // attention_score_scale (model/attention.h), as training uses
  Buffer<float> x_, xn_, rstd_, logits_;
};

// How the next token is drawn from the logits (xuanxue generate, sample every).
struct SamplingOptions {
  double temperature = 1.0;  // 0: greedy (argmax)
  int top_k = 0;             // 0: all tokens
  double top_p = 1.0;        // nucleus: the smallest set whose probability reaches top_p
  uint64_t seed = 0;
};

// Draws one token; pure function of (logits, options, draw), so a seed replays.
int32_t sample_token(const std::vector<float>& logits, const SamplingOptions& o, uint64_t draw);

// Feeds `prompt` (at least one token) and appends up to `count` tokens, not
// past the decoder's max length. Returns the new tokens only.
std::vector<int32_t> generate(Decoder& d, const std::vector<int32_t>& prompt, int64_t count, const SamplingOptions& o);

}  // namespace xx

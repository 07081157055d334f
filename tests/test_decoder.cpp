// Generation: the KV-cache decoder against the uncached full forward (dense
// MHA, MLA with and without the query latent, MLA with YaRN and a latent eps
// of its own, MoE with either balance, and a model with MTP), and the
// sampling of the next token.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include "core/device_memory.h"
#include "core/rng.h"
#include "model/decoder.h"
#include "model_fixture.h"

using namespace xx;

namespace {

int32_t argmax(const float* row, int64_t n) { return int32_t(std::max_element(row, row + n) - row); }

}  // namespace

TEST_CASE("decoder: greedy with the cache equals the argmax of the uncached forward at every position", "[decode]") {
  const std::string arch = GENERATE(as<std::string>{}, "dense", "mla", "mla-qlora", "mla-yarn", "moe-softmax-aux",
                                    "moe-sigmoid-bias", "deepseek-mtp");
  CAPTURE(arch);
  auto cfg = architecture(arch);
  cfg.init_std = 0.5;  // logits far enough apart that an argmax is not a coin toss
  const int64_t T = cfg.seq, V = cfg.vocab;
  Transformer<float> model(cfg, 1);
  model.init(11);
  // Balance biases that change the routing: the decoder must take them.
  for (auto& [prefix, ffn] : model.moe_layers()) {
    auto h = xx::host_staging(ffn->bias());
    for (int64_t e = 0; e < int64_t(h.extent(0)); ++e) h(e) = float(0.3 * normal(17, uint64_t(e)));
    Kokkos::deep_copy(ffn->bias(), h);
  }
  Decoder decoder(model, T);
  const std::vector<int32_t> prompt = {3, 1, 4};
  SamplingOptions greedy;
  greedy.temperature = 0;
  const auto out = generate(decoder, prompt, T, greedy);
  REQUIRE(int64_t(out.size()) == T - int64_t(prompt.size()) + 1);  // the last one needs no cache row
  std::vector<int32_t> seq = prompt;
  seq.insert(seq.end(), out.begin(), out.end() - 1);
  REQUIRE(int64_t(seq.size()) == T);

  // The uncached forward of the whole sequence.
  Kokkos::View<int32_t*, MemSpace> in("in", T), tgt("tgt", T);
  auto hin = xx::host_staging(in);
  for (int64_t i = 0; i < T; ++i) hin(i) = seq[size_t(i)];
  Kokkos::deep_copy(in, hin);
  Kokkos::deep_copy(tgt, 0);
  model.forward(Tokens(in.data(), T), Tokens(tgt.data(), T));
  auto full = xx::host_copy(model.logits());
  for (int64_t i = int64_t(prompt.size()) - 1; i < T; ++i) {
    INFO("position " << i);
    CHECK(argmax(&full(i, 0), V) == out[size_t(i - int64_t(prompt.size()) + 1)]);
  }
  // And the cached logits themselves, at every position.
  decoder.reset();
  double worst = 0;
  for (int64_t i = 0; i < T; ++i) {
    const auto logits = decoder.step(seq[size_t(i)]);
    for (int64_t v = 0; v < V; ++v) worst = std::max(worst, double(std::abs(logits[size_t(v)] - full(i, v))));
  }
  CHECK(worst < 1e-4);
  CHECK_THROWS_AS(decoder.step(0), std::out_of_range);  // the cache is full at seq
}

TEST_CASE("decoder: MLA caches the latent and the rope key, not keys and values", "[decode]") {
  const auto mla = architecture("mla");
  // kv_lora_rank 6 + rope 2 per layer, against H * (qk 6 + v 3) for MHA of the same width.
  CHECK(Decoder::cache_bytes_per_token(mla) == int64_t(mla.layers) * (6 + 2) * 4);
  CHECK(Decoder::mha_bytes_per_token(mla) == int64_t(mla.layers) * mla.heads * (6 + 3) * 4);
  const auto dense = architecture("dense");
  CHECK(Decoder::cache_bytes_per_token(dense) == Decoder::mha_bytes_per_token(dense));
}

TEST_CASE("sampling: greedy, top-k, top-p, temperature and the seed", "[decode]") {
  const std::vector<float> logits = {0.1f, 2.0f, 1.0f, -1.0f, 1.9f};
  SamplingOptions o;
  o.temperature = 0;
  CHECK(sample_token(logits, o, 0) == 1);
  o.temperature = 1, o.top_k = 1;
  for (uint64_t d = 0; d < 50; ++d) CHECK(sample_token(logits, o, d) == 1);
  o.top_k = 2;  // only 1 and 4 remain
  for (uint64_t d = 0; d < 200; ++d) {
    const int32_t t = sample_token(logits, o, d);
    CHECK((t == 1 || t == 4));
  }
  o.top_k = 0, o.top_p = 1e-6;  // the nucleus is the top token alone
  for (uint64_t d = 0; d < 50; ++d) CHECK(sample_token(logits, o, d) == 1);
  // Plain sampling follows softmax(logits / T); a seed replays, another differs.
  o.top_p = 1, o.temperature = 0.7, o.seed = 5;
  std::vector<int> counts(logits.size(), 0);
  const int n = 20000;
  std::vector<int32_t> first, again, other;
  for (int d = 0; d < n; ++d) ++counts[size_t(sample_token(logits, o, uint64_t(d)))];
  double z = 0;
  for (float l : logits) z += std::exp(l / 0.7);
  for (size_t v = 0; v < logits.size(); ++v) CHECK(std::abs(counts[v] / double(n) - std::exp(logits[v] / 0.7) / z) < 0.015);
  for (int d = 0; d < 64; ++d) first.push_back(sample_token(logits, o, uint64_t(d)));
  for (int d = 0; d < 64; ++d) again.push_back(sample_token(logits, o, uint64_t(d)));
  o.seed = 6;
  for (int d = 0; d < 64; ++d) other.push_back(sample_token(logits, o, uint64_t(d)));
  CHECK(first == again);
  CHECK(first != other);
}

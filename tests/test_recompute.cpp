// recompute off | selective | full (model/transformer.h): the backward remakes
// what the forward did not keep, so the losses and every gradient are the same
// bits as with everything kept, in fp32 and in 16 bits; and what the model
// allocates for the backward falls by what the shapes say.
#include <catch2/catch.hpp>
#include <cstring>
#include <map>
#include <string>
#include <vector>
#include "core/host_memory.h"
#include "model_fixture.h"
#include "model/transformer.h"

using namespace xx;
using namespace xx::test;

namespace {


struct Run {
  LossParts loss;
  std::vector<float> grads;
  std::vector<std::vector<int32_t>> counts;  // each MoE layer's expert counts after the backward
};

// Two steps' forward and backward (the gradients summed), the loss of each compared.
Run run(ModelConfig cfg, Recompute mode, kernels::Precision type) {
  cfg.recompute = mode;
  const int B = 2;
  Transformer<float> model(cfg, B, type);
  model.init(42);
  model.set_loss_scale(type == kernels::Precision::fp32 ? 1.0 : 1024.0);
  auto in = seeded_tokens(B * cfg.seq, cfg.vocab, 1), tgt = seeded_tokens(B * cfg.seq, cfg.vocab, 2);
  Tokens tin(in.data(), in.extent(0)), ttgt(tgt.data(), tgt.extent(0));
  Run r;
  for (int step = 0; step < 2; ++step) {
    r.loss = model.forward(tin, ttgt);
    model.backward(tin, ttgt);
  }
  auto g = host_copy(model.grads());
  r.grads.assign(g.data(), g.data() + g.extent(0));
  for (auto& [name, f] : model.moe_layers()) r.counts.push_back(f->expert_counts());
  return r;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

int64_t kept_bytes = 0;
decltype(Kokkos::Tools::Experimental::get_callbacks().allocate_data) previous_hook = nullptr;
void count_kept(Kokkos::Profiling::SpaceHandle space, const char* label, const void* ptr, uint64_t size) {
  if (previous_hook) previous_hook(space, label, ptr, size);
  if (std::string(label).rfind("Activation::", 0) == 0) kept_bytes += int64_t(size);
}

// The bytes of "Activation::" buffers building the model allocates.
int64_t activation_bytes(ModelConfig cfg, Recompute mode, int B, kernels::Precision type) {
  cfg.recompute = mode;
  kept_bytes = 0;
  previous_hook = Kokkos::Tools::Experimental::get_callbacks().allocate_data;
  Kokkos::Tools::Experimental::set_allocate_data_callback(count_kept);
  {
    Transformer<float> model(cfg, B, type);
  }
  Kokkos::Tools::Experimental::set_allocate_data_callback(previous_hook);
  return kept_bytes;
}

}  // namespace

TEST_CASE("recompute selective and full give the losses and gradients of off, bit for bit", "[model][recompute]") {
  const std::string name = GENERATE(as<std::string>{}, "dense", "mla", "mla-qlora", "moe-softmax-aux",
                                    "moe-softmax-seq-aux", "moe-sigmoid-bias", "deepseek-mtp", "deepseek-mtp-seq-aux",
                                    "moe-capacity", "deepseek-mtp-tied");
  const auto type = GENERATE(kernels::Precision::fp32, kernels::Precision::bf16);
  CAPTURE(name, int(type));
  auto cfg = architecture(name);
  if (name.starts_with("deepseek")) cfg.moe.groups = 2, cfg.moe.topk_groups = 1;  // group-limited routing too
  const Run off = run(cfg, Recompute::off, type);
  REQUIRE(std::isfinite(off.loss.total));
  for (auto mode : {Recompute::selective, Recompute::full}) {
    CAPTURE(int(mode));
    const Run r = run(cfg, mode, type);
    CHECK(r.loss.total == off.loss.total);
    CHECK(r.loss.main == off.loss.main);
    CHECK(r.loss.mtp == off.loss.mtp);
    CHECK(r.loss.aux == off.loss.aux);
    CHECK(same_bits(r.grads, off.grads));
    CHECK(r.counts == off.counts);  // the replay counts nothing twice
  }
}

// Per block, in elements (N = B*T tokens): selective shares xn, xn2 (N C
// each), MLA's cn (N R), qan (N Q), q, k (N H qk), v (N H v), and SwiGLU's
// output (N F dense or shared; N K Fe routed) and the routed rows' inputs
// and outputs (N K C each) among all blocks; full shares
// every activation a block allocates. The shared set is one block's.
TEST_CASE("recompute selective keeps fewer activation bytes, full fewer still, by the shapes", "[model][recompute]") {
  const std::string name = GENERATE(as<std::string>{}, "dense", "mla-qlora", "deepseek-mtp");
  const auto type = GENERATE(kernels::Precision::fp32, kernels::Precision::bf16);
  CAPTURE(name, int(type));
  const auto cfg = architecture(name);
  const int B = 2;
  const int64_t off = activation_bytes(cfg, Recompute::off, B, type);
  const int64_t sel = activation_bytes(cfg, Recompute::selective, B, type);
  const int64_t full = activation_bytes(cfg, Recompute::full, B, type);
  CHECK(sel < off);
  CHECK(full < sel);
  // selective: of each (name, size), all blocks but the first give theirs back
  const int64_t N = int64_t(B) * cfg.seq, C = cfg.dim, H = cfg.heads, g = type == kernels::Precision::fp32 ? 4 : 2;
  const auto& a = cfg.attention;
  std::map<std::pair<std::string, int64_t>, int> count;
  for (int l = 0; l < cfg.layers + cfg.mtp.depth; ++l) {
    ++count[{"xn", N * C}], ++count[{"xn2", N * C}];
    if (a.mla()) {
      ++count[{"cn", N * a.kv_lora_rank}], ++count[{"q", N * H * cfg.qk_dim()}], ++count[{"k", N * H * cfg.qk_dim()}];
      ++count[{"v", N * H * cfg.v_dim()}];
      if (a.q_lora_rank > 0) ++count[{"qan", N * a.q_lora_rank}];
    }
    if (!cfg.moe.is_moe_layer(l)) ++count[{"ffn_a", N * cfg.ffn}];
    else
      ++count[{"ffn_a", N * cfg.moe.shared * cfg.moe.ffn}], ++count[{"expert_a", N * cfg.moe.topk * cfg.moe.ffn}],
          ++count[{"expert_in", N * cfg.moe.topk * C}], ++count[{"expert_out", N * cfg.moe.topk * C}];
  }
  int64_t saved = 0;  // (the routed rows' outputs are fp32 at any precision)
  for (const auto& [what, n] : count) saved += (what.first == "expert_out" ? 4 : g) * (n - 1) * what.second;
  CHECK(off - sel == saved);
  // full: where all blocks are alike (no MoE, no MTP), one block's whole set
  // for all of them: off less (blocks - 1) x what one more block keeps under off
  if (!cfg.moe.enabled() && cfg.mtp.depth == 0) {
    auto one = cfg;
    one.layers = 1;
    // (one more layer also adds a residual stream, N C floats, which every mode keeps)
    const int64_t per_block = off - activation_bytes(one, Recompute::off, B, type) - 4 * N * C;
    CHECK(per_block > 0);
    CHECK(full == off - (cfg.layers - 1) * per_block);
  }
}

// The figures docs/SCALING.md gives: input/deepseek-tiny.deck's shape (batch 8,
// seq 128), the bytes of "Activation::" buffers per mode (hidden: run by name).
TEST_CASE("recompute: activation bytes at deepseek-tiny's shape", "[.][recompute-figures]") {
  ModelConfig m;
  m.kind = ModelKind::deepseek;
  m.vocab = 256, m.dim = 128, m.layers = 4, m.heads = 4, m.ffn = 384, m.seq = 128;
  m.attention = {AttentionKind::mla, /*kv_lora_rank*/ 64, /*q_lora_rank*/ 0, /*nope*/ 32, /*rope*/ 16, /*v*/ 32};
  m.moe.mode = MoeMode::on;
  m.moe.dense_layers = 1, m.moe.shared = 2, m.moe.routed = 8, m.moe.topk = 2, m.moe.ffn = 96;
  m.moe.gate = Gate::sigmoid, m.moe.balance = Balance::bias, m.moe.seq_aux = 1e-4, m.moe.groups = 4,
  m.moe.topk_groups = 2;
  m.mtp.depth = 1, m.mtp.weight = 0.3;
  for (auto kernel : {AttentionKernel::packed, AttentionKernel::flash})
  for (auto type : {kernels::Precision::fp32, kernels::Precision::bf16}) {
    m.attention.kernel = kernel;
    const int64_t off = activation_bytes(m, Recompute::off, 8, type);
    for (auto mode : {Recompute::off, Recompute::selective, Recompute::full}) {
      const int64_t b = activation_bytes(m, mode, 8, type);
      WARN((kernel == AttentionKernel::flash ? "flash " : "packed ") << (type == kernels::Precision::fp32 ? "fp32" : "bf16")
           << " recompute " << int(mode) << ": " << b << " bytes (" << double(b) / (1 << 20) << " MiB), "
           << 100.0 * double(off - b) / double(off) << "% below off");
    }
  }
}

// The whole model's gradient against central finite differences, in double,
// on a tiny configuration; and the properties the trainer relies on.
#include "mode_words.h"
#include "core/device_memory.h"
#include "source_dir.h"
#include "fd.h"
#include "model_fixture.h"
#include "model/attention.h"
#include "model/transformer.h"
#include "deck/deck.h"
#include "model/estimate.h"
#include "train/trainer.h"

using namespace xx;
using namespace xx::test;

namespace {

ModelConfig tiny_model() {
  ModelConfig m;
  m.vocab = 13;
  m.dim = 8;
  m.layers = 2;
  m.heads = 2;
  m.ffn = 12;
  m.seq = 6;
  m.init_std = 0.3;  // large enough that every path carries a visible gradient
  return m;
}

}  // namespace

// The architectures the FD check covers: dense MHA, and DeepSeek's pieces.
ModelConfig architecture(const std::string& name) {
  if (name.ends_with("-tied")) {  // the embedding is the head too
    ModelConfig m = architecture(name.substr(0, name.size() - 5));
    return m.tie_embeddings = true, m;
  }
  auto m = tiny_model();
  if (name == "dense") return m;
  m.kind = ModelKind::deepseek;
  m.attention = {AttentionKind::mla, /*kv_lora_rank*/ 6, /*q_lora_rank*/ 0, /*nope*/ 4, /*rope*/ 2, /*v*/ 3};
  if (name == "mla") return m;
  if (name == "mla-qlora") return m.attention.q_lora_rank = 5, m;
  if (name == "mla-yarn") {  // YaRN over rope 4 (pair 0 kept, pair 1 divided), both mscales, a latent eps of its own
    m.attention.q_lora_rank = 5, m.attention.rope_dim = 4, m.attention.latent_eps = 1e-2;
    m.rope_scaling = {RopeScalingKind::yarn, /*factor*/ 4, /*original_seq*/ 8, /*beta_fast*/ 2, /*beta_slow*/ 0.1,
                      /*mscale*/ 1, /*mscale_all_dim*/ 0.5};
    return m;
  }
  m.moe.mode = MoeMode::on;
  m.moe.dense_layers = 1, m.moe.shared = 1, m.moe.routed = 4, m.moe.topk = 2, m.moe.ffn = 6;
  m.moe.balance_coef = 0.01;  // large enough to show in the gradient
  if (name == "moe-softmax-aux") return m;
  if (name == "moe-softmax-seq-aux") return m.moe.aux_scope = AuxScope::sequence, m;  // V2's seq_aux: per sequence
  m.moe.gate = Gate::sigmoid, m.moe.balance = Balance::bias, m.moe.route_scale = 1.5;
  if (name == "moe-sigmoid-bias") return m;
  m.mtp.depth = 2, m.mtp.weight = 0.5;
  if (name == "deepseek-mtp") return m;  // MLA + MoE + MTP
  if (name == "deepseek-mtp-seq-aux") return m.moe.seq_aux = 0.05, m;  // V3's sequence-wise loss, MTP's blocks too
  m.moe.capacity_factor = 0.75;  // "moe-capacity": 12 rows x top-2 over 4 experts, at most 5 each: some dropped
  return m;
}

TEST_CASE("whole-model gradient matches finite differences", "[model]") {
  const std::string arch =
      GENERATE(as<std::string>{}, "dense", "mla", "mla-qlora", "mla-yarn", "moe-softmax-aux", "moe-sigmoid-bias",
               "deepseek-mtp", "moe-capacity", "moe-softmax-seq-aux", "deepseek-mtp-seq-aux", "dense-tied",
               "deepseek-mtp-tied");
  CAPTURE(arch);
  const auto cfg = architecture(arch);
  const int B = 2;
  Transformer<double> model(cfg, B);
  model.init(42);
  auto in = seeded_tokens(B * cfg.seq, cfg.vocab, 1), tgt = seeded_tokens(B * cfg.seq, cfg.vocab, 2);
  Tokens tin(in.data(), in.extent(0)), ttgt(tgt.data(), tgt.extent(0));
  const auto loss0 = model.forward(tin, ttgt);
  REQUIRE(std::isfinite(loss0.total));
  if (cfg.mtp.depth > 0) REQUIRE(loss0.mtp > 0);
  if (cfg.moe.enabled() && (cfg.moe.batch_loss_coef() > 0 || cfg.moe.sequence_loss_coef() > 0)) REQUIRE(loss0.aux > 0);
  int64_t dropped = 0;  // capacity_factor: dropped rows reach neither the output nor the expert's gradient
  for (auto& [prefix, ffn] : model.moe_layers()) dropped += ffn->dropped_rows();
  REQUIRE((dropped > 0) == (cfg.moe.capacity_factor > 0));
  model.zero_grads();
  std::vector<int64_t> ready;
  model.backward(tin, ttgt, [&](int64_t offset) { ready.push_back(offset); });

  // ready() reports ever earlier offsets, ending with the whole buffer.
  REQUIRE(ready.size() == size_t(cfg.layers + 2));
  for (size_t i = 1; i < ready.size(); ++i) REQUIRE(ready[i] < ready[i - 1]);
  REQUIRE(ready.back() == 0);

  Buffer<double> analytic("analytic", model.layout().total());
  Kokkos::deep_copy(analytic, model.grads());
  auto loss = [&] { return model.forward(tin, ttgt).total; };
  for (const auto& t : model.layout().tensors()) {
    // Check a handful of entries of every tensor.
    auto g = Kokkos::subview(analytic, Kokkos::make_pair(t.offset, t.offset + t.size));
    Buffer<double> gb("g", t.size);
    Kokkos::deep_copy(gb, g);
    // Perturb the real parameters through a window that aliases them.
    Buffer<double> window(model.params().data() + t.offset, t.size);
    check_gradient(t.name.c_str(), window, gb, loss, 6, 1e-5, 1e-5, 1e-10);
  }
}

TEST_CASE("initialisation is deterministic and seed dependent", "[model]") {
  const auto cfg = tiny_model();
  Transformer<float> a(cfg, 1), b(cfg, 1), c(cfg, 1);
  a.init(7);
  b.init(7);
  c.init(8);
  auto ha = xx::host_copy(a.params());
  auto hb = xx::host_copy(b.params());
  auto hc = xx::host_copy(c.params());
  REQUIRE(std::equal(ha.data(), ha.data() + ha.extent(0), hb.data()));
  REQUIRE_FALSE(std::equal(ha.data(), ha.data() + ha.extent(0), hc.data()));
  // Norm weights start at one, and are not decayed.
  const auto& norm = a.layout().at("layers.1.ffn_norm");
  REQUIRE(ha(norm.offset) == 1.0f);
  REQUIRE_FALSE(norm.decay);
  REQUIRE(a.layout().at("layers.1.attn.wq").decay);
}

TEST_CASE("parameter layout names every tensor with its real shape", "[model]") {
  ModelConfig m;
  m.vocab = 256, m.dim = 128, m.layers = 4, m.heads = 4, m.ffn = 384, m.seq = 128;
  ParamLayout layout(m);
  REQUIRE(layout.tensors().size() == size_t(2 + 9 * 4 + 1));
  REQUIRE(layout.at("layers.3.attn.wq").shape == std::vector<int64_t>{128, 128});
  REQUIRE(layout.at("layers.0.ffn.w2").shape == std::vector<int64_t>{128, 384});
  REQUIRE(layout.at("head").shape == std::vector<int64_t>{256, 128});
  // The fused weights rely on adjacency.
  REQUIRE(layout.at("layers.2.attn.wk").offset == layout.at("layers.2.attn.wq").offset + 128 * 128);
  REQUIRE(layout.at("layers.2.ffn.w3").offset == layout.at("layers.2.ffn.w1").offset + 384 * 128);
  int64_t sum = 0;
  for (const auto& t : layout.tensors()) sum += t.size;
  REQUIRE(sum == layout.total());
  // 12 C^2 + 3 C F per block... here: 4 C^2 attention + 3 C F feed-forward, plus the head.
  REQUIRE(layout.matmul_per_token() == 4 * (4 * 128 * 128 + 3 * 128 * 384) + 256 * 128);
  REQUIRE(layout.active_per_token() == layout.total() - 256 * 128);
}

TEST_CASE("tied embeddings: one tensor, no head, the plan's counts and units", "[model][tied]") {
  ModelConfig m;
  m.vocab = 256, m.dim = 128, m.layers = 4, m.heads = 4, m.ffn = 384, m.seq = 128;
  const ParamLayout untied(m);
  m.tie_embeddings = true;
  const ParamLayout tied(m);
  CHECK((untied.head_name() == "head" && !untied.tied()));
  CHECK((tied.head_name() == "embed" && tied.tied() && !tied.has("head")));
  CHECK(tied.total() == untied.total() - 256 * 128);
  CHECK(tied.tensors().size() == untied.tensors().size() - 1);
  // The same FLOPs (the head still multiplies), and the table counts as active: every token's logits read it.
  CHECK(tied.matmul_per_token() == untied.matmul_per_token());
  CHECK(tied.active_per_token() == tied.total());
  CHECK(tied.at("embed").matmul);
  const auto units = tied.weight_units();
  REQUIRE(units.size() == size_t(m.layers + 2));
  CHECK((units.front().name == "embed" && units.back().name == "norm" && units.back().end == tied.total()));
  CHECK(untied.weight_units().back().name == "norm + head");
  CHECK(estimate_memory(m, 8).params == tied.full_total());
  m.mtp.depth = 2;  // MTP's depths share the one head: the same FLOPs, V*C fewer parameters
  const ParamLayout tied_mtp(m);
  m.tie_embeddings = false;
  CHECK(tied_mtp.matmul_per_token() == ParamLayout(m).matmul_per_token());
  CHECK(ParamLayout(m).total() - tied_mtp.total() == 256 * 128);
}

TEST_CASE("tied embeddings: an untied model whose head equals its embedding computes the same; the gradients sum",
          "[model][tied]") {
  for (const std::string arch : {"dense", "deepseek-mtp"}) {
    CAPTURE(arch);
    ModelConfig m = architecture(arch);
    const int B = 2;
    Transformer<double> untied(m, B);
    m.tie_embeddings = true;
    Transformer<double> tied(m, B);
    untied.init(7);
    // The tied model's tensors, each from the untied one's (the head is gone, the MTP modules moved up).
    auto from = xx::host_copy(untied.params());
    auto to = xx::host_staging(tied.params());
    for (const auto& t : tied.layout().tensors())
      std::copy_n(from.data() + untied.layout().at(t.name).offset, t.size, to.data() + t.offset);
    Kokkos::deep_copy(tied.params(), to);
    Kokkos::deep_copy(untied.param("head"), untied.param("embed"));
    auto in = seeded_tokens(B * m.seq, m.vocab, 3), tgt = seeded_tokens(B * m.seq, m.vocab, 4);
    Tokens tin(in.data(), in.extent(0)), ttgt(tgt.data(), tgt.extent(0));
    const double a = untied.forward(tin, ttgt).total, b = tied.forward(tin, ttgt).total;
    CHECK(a == b);
    untied.zero_grads(), tied.zero_grads();
    untied.backward(tin, ttgt), tied.backward(tin, ttgt);
    auto gu = xx::host_copy(untied.grads()), gt = xx::host_copy(tied.grads());
    const auto& e = tied.layout().at("embed");
    const int64_t ue = untied.layout().at("embed").offset, uh = untied.layout().at("head").offset;
    double worst = 0, norm = 0;
    for (int64_t i = 0; i < e.size; ++i) {
      const double want = gu(ue + i) + gu(uh + i);
      worst = std::max(worst, std::abs(gt(e.offset + i) - want)), norm = std::max(norm, std::abs(want));
    }
    CHECK(worst <= 1e-12 * norm);
    for (const auto& t : tied.layout().tensors()) {
      if (t.name == "embed") continue;
      CAPTURE(t.name);
      CHECK(std::equal(gt.data() + t.offset, gt.data() + t.offset + t.size,
                       gu.data() + untied.layout().at(t.name).offset));
    }
  }
}

TEST_CASE("the missing-gradient check names tensors that got no gradient", "[model]") {
  auto cfg = tiny_model();
  const int B = 1;
  Transformer<float> model(cfg, B);
  model.init(3);
  auto in = seeded_tokens(B * cfg.seq, cfg.vocab, 1), tgt = seeded_tokens(B * cfg.seq, cfg.vocab, 2);
  Tokens tin(in.data(), in.extent(0)), ttgt(tgt.data(), tgt.extent(0));
  model.zero_grads();
  const auto& layout = model.layout();
  REQUIRE(tensors_without_gradient(layout, model.grads(), 0, layout.total()).size() == layout.tensors().size());
  model.forward(tin, ttgt);
  model.backward(tin, ttgt);
  REQUIRE(tensors_without_gradient(layout, model.grads(), 0, layout.total()).empty());
  // Wipe one tensor's gradient, as a forgotten backward would leave it.
  Kokkos::deep_copy(model.grad("layers.1.ffn.w3"), 0.0f);
  const auto missing = tensors_without_gradient(layout, model.grads(), 0, layout.total());
  REQUIRE(missing == std::vector<std::string>{"layers.1.ffn.w3"});
  // Only tensors that start inside the range are checked.
  REQUIRE(tensors_without_gradient(layout, model.grads(), layout.layer_begin(cfg.layers), layout.total()).empty());
}

TEST_CASE("DeepSeek-V2-Lite's deck gives the published parameter counts", "[model]") {
  // Published: 15.7B parameters in total, 2.4B activated per token.
  const auto program = build_program(read_deck(test::input_path("deepseek-v2-lite.deck"), {}), false);
  const auto& m = program.phases.front().config.model;
  const ParamLayout layout(m);
  CHECK(layout.total() == Approx(15.7e9).epsilon(0.01));
  CHECK(layout.active_per_token() == Approx(2.4e9).epsilon(0.03));
  // By hand: embed and head 2 * 102400 * 2048; per layer MLA 13.76M; the
  // dense first FFN 3 * 2048 * 10944; 26 MoE layers of 66 experts of
  // 3 * 2048 * 1408 plus the gate.
  const int64_t mla = 2048LL * 3072 + 2048 * 576 + 512 + 512LL * 4096 + 2048LL * 2048 + 2 * 2048;
  const int64_t expert = 3LL * 2048 * 1408;
  const int64_t expected = 2LL * 102400 * 2048 + 2048 + 27 * mla + 3LL * 2048 * 10944 + 26 * (66 * expert + 64LL * 2048);
  CHECK(layout.total() == expected);
  CHECK(layout.active_per_token() == expected - 102400LL * 2048 - 26 * 58 * expert);
  // The dry run's estimate is built from the same layout, without allocating.
  const auto est = estimate_memory(m, 1);
  CHECK(est.params == layout.total());
  CHECK(est.activation_elements() > 0);
}

TEST_CASE("idle experts are excused from the missing-gradient check, real misses are not", "[model]") {
  auto cfg = architecture("moe-sigmoid-bias");
  const int B = 1;
  Transformer<float> model(cfg, B);
  model.init(5);
  // A large negative selection bias keeps expert 0 of every MoE layer idle.
  for (auto& [prefix, ffn] : model.moe_layers()) {
    auto h = xx::host_staging(ffn->bias());
    for (size_t e = 0; e < h.extent(0); ++e) h(e) = e == 0 ? -100.0f : 0.0f;
    Kokkos::deep_copy(ffn->bias(), h);
  }
  auto in = seeded_tokens(B * cfg.seq, cfg.vocab, 1), tgt = seeded_tokens(B * cfg.seq, cfg.vocab, 2);
  Tokens tin(in.data(), in.extent(0)), ttgt(tgt.data(), tgt.extent(0));
  model.zero_grads();
  model.forward(tin, ttgt);
  model.backward(tin, ttgt);
  const auto& layout = model.layout();
  auto excused = [&](const TensorInfo& t) { return model.idle_expert(t); };
  // Without the excuse, expert 0's three tensors are reported; with it, nothing.
  const auto strict = tensors_without_gradient(layout, model.grads(), 0, layout.total());
  REQUIRE(strict == std::vector<std::string>{"layers.1.ffn.experts.0.w1", "layers.1.ffn.experts.0.w3",
                                              "layers.1.ffn.experts.0.w2"});
  REQUIRE(tensors_without_gradient(layout, model.grads(), 0, layout.total(), excused).empty());
  // An expert that did get tokens but lost its gradient is still caught, as is any other tensor.
  Kokkos::deep_copy(model.grad("layers.1.ffn.experts.2.w2"), 0.0f);
  Kokkos::deep_copy(model.grad("layers.1.ffn.gate"), 0.0f);
  REQUIRE(tensors_without_gradient(layout, model.grads(), 0, layout.total(), excused) ==
          std::vector<std::string>{"layers.1.ffn.gate", "layers.1.ffn.experts.2.w2"});
}

TEST_CASE("an MTP expert that got only unlabelled positions is excused, as it has no gradient", "[model]") {
  // MTP module d labels positions t < T-d-1 only; an expert whose tokens all
  // sit past that has an all-zero gradient. Over many batches: every expert
  // tensor has a zero gradient exactly when idle_expert says so.
  auto cfg = architecture("deepseek-mtp");
  Transformer<float> model(cfg, 1);
  model.init(3);
  const auto& layout = model.layout();
  int only_unlabelled = 0;
  for (uint64_t seed = 0; seed < 60; ++seed) {
    auto in = seeded_tokens(cfg.seq, cfg.vocab, seed), tgt = seeded_tokens(cfg.seq, cfg.vocab, seed * 5 + 1);
    Tokens tin(in.data(), in.extent(0)), ttgt(tgt.data(), tgt.extent(0));
    model.zero_grads();
    model.forward(tin, ttgt);
    model.backward(tin, ttgt);
    for (const auto& t : layout.tensors()) {
      if (t.expert < 0) continue;
      const bool zero = tensors_without_gradient(layout, model.grads(), t.offset, t.offset + 1).size() == 1;
      INFO(t.name << " seed " << seed);
      REQUIRE(zero == model.idle_expert(t));
      if (zero && t.layer >= cfg.layers) {
        const std::string prefix = "mtp." + std::to_string(t.layer - cfg.layers) + ".";
        for (auto& [p, ffn] : model.moe_layers())
          if (p == prefix) only_unlabelled += ffn->expert_counts()[t.expert] > 0;
      }
    }
  }
  REQUIRE(only_unlabelled > 0);  // the case this test is about did occur
}

namespace {
// Bytes the model allocates for what it keeps between forward and backward,
// counted through Kokkos's allocation hook while it is set.
int64_t kept_bytes = 0;
decltype(Kokkos::Tools::Experimental::get_callbacks().allocate_data) previous_hook = nullptr;  // the device emulation's, if on
void count_kept(Kokkos::Profiling::SpaceHandle space, const char* label, const void* ptr, uint64_t size) {
  if (previous_hook) previous_hook(space, label, ptr, size);
  const std::string l = label;
  const bool kept = l.rfind("Activation::", 0) == 0 || l == "Moe::idx" || l == "Moe::pos" || l == "Moe::token_of" ||
                    l == "mtp_in" || l == "mtp_target";
  if (kept) kept_bytes += int64_t(size);
}


// What building the model allocates that it keeps for the backward.
int64_t kept_by(const ModelConfig& cfg, int B, kernels::Precision type, int ep_rank = 0) {
  kept_bytes = 0;
  previous_hook = Kokkos::Tools::Experimental::get_callbacks().allocate_data;
  Kokkos::Tools::Experimental::set_allocate_data_callback(count_kept);
  {
    Transformer<float> model(cfg, B, type, ep_rank);
  }
  Kokkos::Tools::Experimental::set_allocate_data_callback(previous_hook);
  return kept_bytes;
}
}  // namespace

TEST_CASE("the dry run's activation estimate is what the model allocates, in fp32 and in 16 bits", "[model]") {
  const std::string name = GENERATE("dense", "mla", "mla-qlora", "moe-softmax-aux", "deepseek-mtp");
  const auto type = GENERATE(kernels::Precision::fp32, kernels::Precision::bf16);
  CAPTURE(name, int(type));
  const auto cfg = architecture(name);
  const int B = 2;
  const auto est = estimate_memory(cfg, B);
  const int64_t gemm_bytes = (type == kernels::Precision::fp32 ? 4 : 2) * est.halvable_elements;
  CHECK(kept_by(cfg, B, type) == gemm_bytes + 4 * est.other_elements);
  CHECK(est.halvable_elements > est.other_elements);  // most of them move to 16 bits
}

// recompute selective and full: the plan counts what the model then allocates
// (each block's own buffers less what one shared set holds for all).
TEST_CASE("under recompute the activation estimate is what the model allocates", "[model][recompute]") {
  const std::string name = GENERATE("dense", "mla", "mla-qlora", "moe-softmax-aux", "deepseek-mtp");
  const auto type = GENERATE(kernels::Precision::fp32, kernels::Precision::bf16);
  const auto mode = GENERATE(Recompute::selective, Recompute::full);
  CAPTURE(name, int(type), int(mode));
  auto cfg = architecture(name);
  cfg.recompute = mode;
  const int B = 2;
  const auto est = estimate_memory(cfg, B);
  const int64_t gemm_bytes = (type == kernels::Precision::fp32 ? 4 : 2) * est.halvable_elements;
  CHECK(kept_by(cfg, B, type) == gemm_bytes + 4 * est.other_elements);
}

// Under ep a rank keeps the rows it sends and, for its experts, the rows it
// runs: sized at first for an even load (expert_load 1), the same at every
// rank of the group.
TEST_CASE("under ep the activation estimate is what a rank allocates at first", "[model][plan]") {
  const std::string name = GENERATE("moe-softmax-aux", "deepseek-mtp");
  const auto type = GENERATE(kernels::Precision::fp32, kernels::Precision::bf16);
  const int ep = GENERATE(2, 4);
  CAPTURE(name, int(type), ep);
  auto cfg = architecture(name);
  cfg.moe.ep = ep;
  const int B = 2;
  const auto est = estimate_memory(cfg, B);
  const int64_t NK = int64_t(B) * cfg.seq * cfg.moe.topk;
  CHECK(est.expert_rows == NK);
  CHECK(est.exchange_elements == 2 * NK * cfg.dim);
  const int64_t gemm_bytes = (type == kernels::Precision::fp32 ? 4 : 2) * est.halvable_elements;
  for (int ep_rank : {0, ep - 1}) CHECK(kept_by(cfg, B, type, ep_rank) == gemm_bytes + 4 * est.other_elements);
}

// The flash kernel keeps a log-sum-exp per (batch, head, row) in fp32 instead
// of the probabilities' packed triangle: the estimate follows, and still
// equals what the model allocates.
TEST_CASE("with attention_kernel flash the activation estimate is what the model allocates, the probabilities gone",
          "[model][flash]") {
  const std::string name = GENERATE("dense", "mla", "deepseek-mtp");
  const auto type = GENERATE(kernels::Precision::fp32, kernels::Precision::bf16);
  CAPTURE(name, int(type));
  auto cfg = architecture(name);
  cfg.attention.kernel = AttentionKernel::flash;
  const int B = 2;
  const auto est = estimate_memory(cfg, B);
  const int64_t gemm_bytes = (type == kernels::Precision::fp32 ? 4 : 2) * est.halvable_elements;
  CHECK(kept_by(cfg, B, type) == gemm_bytes + 4 * est.other_elements);
  cfg.attention.kernel = AttentionKernel::packed;
  const auto packed = estimate_memory(cfg, B);
  const int64_t blocks = cfg.layers + cfg.mtp.depth, BH = int64_t(B) * cfg.heads;
  CHECK(packed.halvable_elements - est.halvable_elements ==
        blocks * BH * kernels::CausalBlocks(cfg.seq, kAttentionBlock).per_head());
  CHECK(est.other_elements - packed.other_elements == blocks * BH * cfg.seq);
}

// ---------------------------------------------------------------------------
// The rotary frequencies and the scores' scale (model/attention.h), against
// values worked out by hand from DeepSeek-V2's YaRN.

TEST_CASE("rope: without rope_scaling the tables and the score scale are the plain ones, bit for bit", "[rope]") {
  ModelConfig m;  // MHA, head_dim 32
  const auto f = rope_frequencies(m);
  REQUIRE(f.inv_freq.size() == 16);
  CHECK(f.table_scale == 1);
  const int64_t T = 7, half = 16;
  Buffer<float> cs("cos", T * half), sn("sin", T * half);
  kernels::rope_tables<float>(mat(cs, T, half), mat(sn, T, half), f);
  auto hc = xx::host_copy(cs), hs = xx::host_copy(sn);
  int differ = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < half; ++i) {  // the formula rope_tables had before YaRN
      const double angle = double(t) * std::pow(m.rope_theta, -double(2 * i) / double(2 * half));
      differ += hc(t * half + i) != float(std::cos(angle)) || hs(t * half + i) != float(std::sin(angle));
    }
  CHECK(differ == 0);
  CHECK(attention_score_scale<float>(m) == 1.0f / float(std::sqrt(32.0)));
  m.kind = ModelKind::deepseek;
  m.attention = {AttentionKind::mla, 16, 0, /*nope*/ 8, /*rope*/ 6, 8};
  CHECK(rope_frequencies(m).inv_freq.size() == 3);
  CHECK(attention_score_scale<double>(m) == 1.0 / std::sqrt(14.0));
}

TEST_CASE("rope: YaRN's ramp, tables and score scale, as DeepSeek-V2's code computes them", "[rope]") {
  // DeepSeek-V2-Lite: rope_dim 64, theta 10000, factor 40 over 4096 positions, beta 32 and 1, mscale 0.707 both.
  // The pair turning r times: 64 ln(4096 / (2 pi r)) / (2 ln 10000) = 10.47 (r = 32), 22.50 (r = 1): the ramp
  // runs from pair 10 (kept) to pair 23 (divided).
  ModelConfig m;
  m.kind = ModelKind::deepseek;
  m.attention = {AttentionKind::mla, 512, 0, /*nope*/ 128, /*rope*/ 64, 128};
  m.rope_scaling = {RopeScalingKind::yarn, 40, 4096, 32, 1, 0.707, 0.707};
  const auto f = rope_frequencies(m);
  REQUIRE(f.inv_freq.size() == 32);
  for (size_t i = 0; i < 32; ++i) {
    CAPTURE(i);
    const double extra = std::pow(10000.0, -double(2 * i) / 64.0);
    const double keep = std::clamp(1 - (double(i) - 10) / 13, 0.0, 1.0);
    if (i <= 10) CHECK(f.inv_freq[i] == extra);
    else if (i >= 23) CHECK(f.inv_freq[i] == extra / 40);
    else CHECK(f.inv_freq[i] == Approx(extra / 40 * (1 - keep) + extra * keep).epsilon(1e-14));
  }
  CHECK(f.table_scale == 1);  // mscale == mscale_all_dim
  const double mscale = 0.1 * 0.707 * std::log(40.0) + 1;
  CHECK(attention_score_scale<double>(m) == Approx(mscale * mscale / std::sqrt(192.0)).epsilon(1e-15));

  // the tables' factor: mscale(4, 1) / mscale(4, 0.8), the scores' mscale(4, 0.8)^2; mscale_all_dim 0: none
  m.rope_scaling = {RopeScalingKind::yarn, 4, 4096, 32, 1, 1.0, 0.8};
  CHECK(rope_frequencies(m).table_scale == Approx((0.1 * std::log(4.0) + 1) / (0.08 * std::log(4.0) + 1)));
  CHECK(attention_score_scale<double>(m) == Approx(std::pow(0.08 * std::log(4.0) + 1, 2) / std::sqrt(192.0)));
  m.rope_scaling.mscale_all_dim = 0;
  CHECK(rope_frequencies(m).table_scale == Approx(0.1 * std::log(4.0) + 1));
  CHECK(attention_score_scale<double>(m) == 1 / std::sqrt(192.0));
  const int64_t T = 5;
  Buffer<double> cs("cos", T * 32), sn("sin", T * 32);
  const auto g = rope_frequencies(m);
  kernels::rope_tables<double>(mat(cs, T, 32), mat(sn, T, 32), g);
  auto hc = xx::host_copy(cs), hs = xx::host_copy(sn);
  for (int64_t t = 0; t < T; ++t)  // index i of the tables is frequency i, times the factor
    for (int64_t i = 0; i < 32; ++i) {
      CHECK(hc(t * 32 + i) == Approx(std::cos(double(t) * g.inv_freq[size_t(i)]) * g.table_scale).epsilon(1e-15));
      CHECK(hs(t * 32 + i) == Approx(std::sin(double(t) * g.inv_freq[size_t(i)]) * g.table_scale).epsilon(1e-15));
    }

  // a ramp of no width: rope 8 over 4 positions puts both bounds at pair 0 (then 0.001 apart): pair 0 kept
  m.attention.rope_dim = 8;
  m.rope_scaling = {RopeScalingKind::yarn, 4, 4, 32, 1, 1, 0};
  const auto n = rope_frequencies(m);
  CHECK(n.inv_freq[0] == 1);
  for (size_t i = 1; i < 4; ++i) CHECK(n.inv_freq[i] == std::pow(10000.0, -double(2 * i) / 8.0) / 4);
  // factor <= 1: the frequencies divided by it all the same (at 1 unchanged), no mscale anywhere
  m.rope_scaling = {RopeScalingKind::yarn, 1, 4, 32, 1, 0.5, 0.9};
  const auto one = rope_frequencies(m);
  for (size_t i = 0; i < 4; ++i)
    CHECK(one.inv_freq[i] == Approx(std::pow(10000.0, -double(2 * i) / 8.0)).epsilon(1e-15));
  CHECK(one.table_scale == 1);
  CHECK(attention_score_scale<double>(m) == 1 / std::sqrt(136.0));
}

// Pipeline stages (Transformer::forward_stage, backward_stage): the model cut
// after each block, its stages run in order with the activation and its
// gradient handed on, give forward's and backward's losses and gradients bit
// for bit (MLA, MoE, MTP; tied too), and so does the forward run again
// before each backward.
TEST_CASE("pipeline stages: the Transformer's stage passes give forward and backward bit for bit",
          "[model][pipeline]") {
  for (const std::string arch : {"deepseek-mtp", "deepseek-mtp-tied", "dense"}) {
    CAPTURE(arch);
    const auto cfg = architecture(arch);
    const int B = 2;
    const int64_t NC = int64_t(B) * cfg.seq * cfg.dim;
    auto in = seeded_tokens(B * cfg.seq, cfg.vocab, 1), tgt = seeded_tokens(B * cfg.seq, cfg.vocab, 2);
    Tokens tin(in.data(), in.extent(0)), ttgt(tgt.data(), tgt.extent(0));
    Transformer<float> whole(cfg, B), staged(cfg, B);
    whole.init(42), staged.init(42);
    const LossParts want = whole.forward(tin, ttgt);
    whole.zero_grads();
    whole.backward(tin, ttgt);
    const auto want_grads = host_copy(whole.grads());
    for (const int P : {1, 2}) {
      CAPTURE(P);
      const int per = cfg.layers / P;
      std::vector<Buffer<float>> act;  // act[s]: stage s's input (s > 0)
      for (int s = 0; s <= P; ++s) act.emplace_back("act", NC);
      staged.zero_grads();
      LossParts got;
      for (int s = 0; s < P; ++s) {
        const LossParts part =
            staged.forward_stage(s * per, (s + 1) * per, tin, ttgt, act[size_t(s)].data(), act[size_t(s + 1)].data());
        got.main += part.main, got.mtp += part.mtp, got.aux += part.aux;
      }
      CHECK(got.main == want.main);
      CHECK(got.mtp == want.mtp);
      CHECK(got.aux == Approx(want.aux).epsilon(1e-12));  // the stages' sums of their own layers, then added
      std::vector<Buffer<float>> grad;
      for (int s = 0; s <= P; ++s) grad.emplace_back("grad", NC);
      for (int s = P - 1; s >= 0; --s) {
        if (s + 1 < P)  // the forward again: its activations are the same bits
          staged.forward_stage(s * per, (s + 1) * per, tin, ttgt, act[size_t(s)].data(), act[size_t(s + 1)].data());
        staged.backward_stage(s * per, (s + 1) * per, tin, ttgt, grad[size_t(s + 1)].data(), grad[size_t(s)].data());
      }
      const auto got_grads = host_copy(staged.grads());
      int64_t differ = 0;
      for (int64_t i = 0; i < int64_t(got_grads.extent(0)); ++i) differ += got_grads(i) != want_grads(i);
      CHECK(differ == 0);
    }
    CHECK_THROWS_AS(staged.forward_stage(1, 1, tin, ttgt, nullptr, nullptr), std::invalid_argument);
  }
}

// A stage with several micro-batches in flight keeps each in a set of
// activations of its own: micro-batches a and b forwarded into sets 0 and 1,
// then backwarded in turn, give the losses and gradients of a model that
// runs a then b with one set; a MoE layer's sets share its selection bias.
TEST_CASE("pipeline stages: sets of activations keep micro-batches in flight apart", "[model][pipeline]") {
  const auto cfg = architecture("deepseek-mtp");
  const int B = 2;
  const int64_t N = int64_t(B) * cfg.seq;
  auto in = seeded_tokens(2 * N, cfg.vocab, 3), tgt = seeded_tokens(2 * N, cfg.vocab, 4);
  auto tokens = [&](const auto& all, int m) { return Tokens(all.data() + m * N, N); };
  Transformer<float> one(cfg, B), two(cfg, B, kernels::Precision::fp32, 0, StageCut{}, {2});
  one.init(7), two.init(7);
  one.zero_grads(), two.zero_grads();
  const int L = cfg.layers;
  std::vector<LossParts> want;
  for (int m = 0; m < 2; ++m) {
    want.push_back(one.forward_stage(0, L, tokens(in, m), tokens(tgt, m), nullptr, nullptr));
    one.backward_stage(0, L, tokens(in, m), tokens(tgt, m), nullptr, nullptr);
  }
  for (int m = 0; m < 2; ++m) {
    two.use_activations(0, m);
    const LossParts got = two.forward_stage(0, L, tokens(in, m), tokens(tgt, m), nullptr, nullptr);
    CHECK(got.main == want[size_t(m)].main);
    CHECK(got.mtp == want[size_t(m)].mtp);
  }
  for (int m = 0; m < 2; ++m) {
    two.use_activations(0, m);
    two.backward_stage(0, L, tokens(in, m), tokens(tgt, m), nullptr, nullptr);
  }
  const auto g1 = host_copy(one.grads()), g2 = host_copy(two.grads());
  int64_t differ = 0;
  for (int64_t i = 0; i < int64_t(g1.extent(0)); ++i) differ += g1(i) != g2(i);
  CHECK(differ == 0);
  // one selection bias per MoE layer, whichever set runs it
  two.use_activations(0, 0);
  const auto first = two.moe_layers();
  REQUIRE(!first.empty());
  two.use_activations(0, 1);
  const auto second = two.moe_layers();
  REQUIRE(second.size() == first.size());
  for (size_t l = 0; l < first.size(); ++l) {
    CHECK(first[l].second != second[l].second);
    CHECK(first[l].second->bias().data() == second[l].second->bias().data());
  }
  CHECK_THROWS_AS(two.use_activations(0, 2), std::invalid_argument);
  CHECK_THROWS_AS(two.use_activations(1, 0), std::invalid_argument);
  CHECK_THROWS_AS(Transformer<float>(cfg, B, kernels::Precision::fp32, 0, StageCut{}, {0}), std::invalid_argument);
  CHECK_THROWS_AS(Transformer<float>(cfg, B, kernels::Precision::fp32, 0, StageCut{}, {1, 1}), std::invalid_argument);
}

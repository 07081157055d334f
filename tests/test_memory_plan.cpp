// The memory plan behind -dry-run and the refusal of decks that cannot fit
// (model/estimate.h): each sharding level follows its definition, and sizes
// print in the unit that fits (core/units.h).
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <fmt/format.h>
#include "core/device_memory.h"
#include "core/error.h"
#include "core/pipeline_schedule.h"
#include "core/units.h"
#include "core/views.h"
#include "deck/deck.h"
#include "hf/config.h"
#include "kernels/attention_packed.h"
#include "model/estimate.h"
#include "model/params.h"
#include "temp_dir.h"

using namespace xx;
using xx::test::TempDir;

TEST_CASE("sizes print in the unit that fits each value", "[units]") {
  CHECK(format_count(0) == "0");
  CHECK(format_count(950) == "950");
  CHECK(format_count(3295488) == "3.30 M");
  CHECK(format_count(15.706e9) == "15.71 B");
  CHECK(format_count(2.5e12) == "2.50 T");
  CHECK(format_count(999999) == "1.00 M");  // rounds up into the next unit, not "1000.00 K"
  CHECK(format_bytes(512) == "512 B");
  CHECK(format_bytes(1536) == "1.50 KiB");
  CHECK(format_bytes(3.5 * 1024 * 1024) == "3.50 MiB");
  CHECK(format_bytes(8.0 * 1024 * 1024 * 1024) == "8.00 GiB");
  CHECK(format_bytes(16.0 * 1024 * 1024 * 1024 * 1024) == "16.00 TiB");
  CHECK(format_bytes(20000.0 * 1024 * 1024 * 1024 * 1024) == "20000.00 TiB");  // TiB is the largest unit
  CHECK(format_bytes(1024.0 * 1024 - 1) == "1.00 MiB");
}

namespace {

// A small MoE model with MTP: four blocks and one MTP module, so no layer is
// a large share of the model; bucket_mb small, so buckets are below a layer.
Program small_program(const TempDir& t, const std::string& precision, const std::string& extra = "", int ep = 1) {
  const std::string deck =
      "model deepseek vocab 256 dim 64 layers 4 heads 4 ffn 128 seq 16\n"
      "attention mla kv_lora_rank 32 q_lora_rank 0 qk_nope_dim 16 rope_dim 8 v_dim 16\n"
      "moe on dense_layers 1 shared 1 routed 4 topk 2 ffn 32 ep " + std::to_string(ep) + "\n"
      "mtp depth 1\n"
      "data bytes /dev/null batch 2\n"
      "precision " + precision + "\n"
      "sync dense bucket_mb 0.01\n" + extra + "run 1\n";
  return build_program(read_deck(t.write("plan.deck", deck), {}), false);
}

}  // namespace

TEST_CASE("each sharding level holds what its definition says", "[model][plan]") {
  TempDir t;
  const std::string precision = GENERATE("fp32", "bf16");
  const int W = GENERATE(1, 3, 8);
  CAPTURE(precision, W);
  const Program program = small_program(t, precision);
  const auto& m = program.phases.front().config.model;
  const ParamLayout layout(m);
  const PlanBasis b = plan_basis(program, W);
  const double P = double(layout.total()), S = double((layout.total() + W - 1) / W);
  REQUIRE(b.params == layout.total());
  REQUIRE(b.shard == (layout.total() + W - 1) / W);
  const bool half = precision != "fp32";
  const double c = half ? 2 : 0;
  const double held = m.mtp.depth > 0 ? 4 : 2;  // units gathered at once under params
  // The largest layer: the biggest run of one block's tensors, the embedding, or norm + head.
  int64_t largest = 0;
  for (int l = 0; l < m.layers + m.mtp.depth; ++l) {
    int64_t n = 0;
    for (const auto& ti : layout.tensors()) n += ti.layer == l ? ti.size : 0;
    largest = std::max(largest, n);
  }
  largest = std::max({largest, layout.at("embed").size, layout.at("norm").size + layout.at("head").size});
  REQUIRE(b.largest_layer == largest);
  const double L = double(largest), bucket = 0.01 * 1024 * 1024;
  REQUIRE(b.bucket_bytes == Approx(bucket));
  REQUIRE(4 * L > bucket);  // the case this model is for: a bucket is a part of a layer
  REQUIRE(b.sync_buffers == 0);  // dense over the full topology: in place

  // Under 16-bit precision at W > 1, optimizer and gradients keep the fp32
  // master of their pieces and of the M weights the model reads in fp32 (the
  // embedding, the norms, the router gates), all-gathered beside the whole 16-bit copy.
  double M = 0;
  for (const auto& ti : layout.tensors()) {
    const bool gate = ti.name.size() >= 8 && ti.name.compare(ti.name.size() - 8, 8, "ffn.gate") == 0;
    M += (ti.is_norm || ti.name == "embed" || gate) ? double(ti.size) : 0;
  }
  REQUIRE(b.fp32_read == int64_t(M));
  const bool pieces = half && W > 1;
  const double below_params = pieces ? c * P + 4 * S + 4 * M * (W - 1) / W : (4 + c) * P;
  const double gathered = pieces ? 4 * M : 0;
  const auto off = plan_level(b, ShardLevel::off), opt = plan_level(b, ShardLevel::optimizer),
             grad = plan_level(b, ShardLevel::gradients), par = plan_level(b, ShardLevel::params);
  // off: everything whole; the all-reduce works in place.
  CHECK(off.weights == (4 + c) * P);
  CHECK(off.gradients == 4 * P);
  CHECK(off.optimizer == 8 * P);
  CHECK(off.communication == 0);
  // optimizer: the moments owned 1/W; the weights whole (but the fp32 master of a 16-bit run).
  CHECK(opt.optimizer == 8 * S);
  CHECK(opt.weights == Approx(below_params));
  CHECK(opt.gradients == 4 * P);
  CHECK(opt.communication == gathered + (W > 1 ? 2 * bucket : 0));  // two buckets reducing, in MPI's temporary
  // gradients: also the gradients; in flight the unit written and two buckets reducing, each twice.
  CHECK(grad.gradients == 4 * S);
  CHECK(grad.weights == opt.weights);
  CHECK(grad.optimizer == 8 * S);
  CHECK(grad.communication == 4 * L + 2 * 2 * bucket + gathered);
  // params: also the weights; units gathered in fp32 with their 16-bit copy.
  CHECK(par.weights == (4 + c) * S);
  CHECK(par.gradients == 4 * S);
  CHECK(par.communication == 4 * L + 2 * 2 * bucket + held * (4 + c) * L);
  for (const auto& p : {off, opt, grad, par}) CHECK(p.activations == off.activations);

  if (W == 1) {
    // One rank: nothing to shard. The levels hold the same weights,
    // gradients, optimizer state and activations; the ones that shard
    // gradients or weights only add their buffers in flight.
    for (const auto& p : {opt, grad, par}) CHECK(p.total() - p.communication == off.total());
  } else {
    CHECK(off.total() >= opt.total());
    CHECK(opt.total() >= grad.total());
    // params trades the weights' copies below it (and the fp32-read runs
    // gathered) for units in flight and gathered: it pays when those outweigh
    // them (not always on a model this small).
    CHECK((grad.total() >= par.total()) == (below_params - (4 + c) * S + gathered >= held * (4 + c) * L));
  }
}

TEST_CASE("optimizer ... moments bf16: the moments take 4 bytes per parameter at every level, nothing else moves",
          "[model][plan]") {
  TempDir t;
  const std::string precision = GENERATE("fp32", "bf16");
  const int W = GENERATE(1, 3, 8);
  const int ep = GENERATE(1, 2);
  if (W % ep != 0) return;
  CAPTURE(precision, W, ep);
  const PlanBasis f = plan_basis(small_program(t, precision, "", ep), W);
  const PlanBasis b = plan_basis(small_program(t, precision, "optimizer adamw moments bf16\n", ep), W);
  CHECK((f.moment_bytes == 8 && b.moment_bytes == 4));
  const double P = double(b.params), S = double(b.shard);
  for (const ShardLevel level : kShardLevels) {
    INFO(mode_name(level));
    const MemoryPlan p = plan_level(b, level), p32 = plan_level(f, level);
    const double owned = level == ShardLevel::off ? P : S;
    CHECK(p.optimizer == 4 * owned);
    CHECK(p32.optimizer == 8 * owned);
    CHECK((p.weights == p32.weights && p.gradients == p32.gradients && p.activations == p32.activations &&
           p.communication == p32.communication));
  }
  // The dry run says so: the sharded moments' bytes, and a line naming the type.
  const std::string report = dry_run_report(small_program(t, precision, "optimizer adamw moments bf16\n", ep), W, {});
  CHECK_THAT(report, Catch::Contains("AdamW's moments sharded (4 S)"));
  CHECK_THAT(report, Catch::Contains("AdamW's moments m and v in bf16, 4 bytes per parameter"));
  CHECK_THAT(dry_run_report(small_program(t, precision, "", ep), W, {}), Catch::Contains("AdamW's moments sharded (8 S)"));
}

TEST_CASE("the plan counts the sync strategy's buffers, whole at every level", "[model][plan]") {
  TempDir t;
  const Program dense = small_program(t, "fp32");
  const Program compressed = small_program(t, "fp32", "compress topk 0.1 momentum 0.9\n");
  const Program local = small_program(t, "fp32", "sync local 4 outer nesterov lr 0.7 momentum 0.9\n");
  const double P = double(plan_basis(dense, 4).params);
  const PlanBasis c = plan_basis(compressed, 4), l = plan_basis(local, 4);
  CHECK(c.sync_buffers > 4 * 4 * P);  // packed, dense, residual, momentum, and a workspace
  CHECK(l.sync_buffers == 3 * 4 * P);  // anchor, outer momentum, group mean
  for (ShardLevel level : kShardLevels)
    CHECK(plan_level(l, level).communication - plan_level(plan_basis(dense, 4), level).communication ==
          l.sync_buffers);
}

TEST_CASE("a deck that cannot fit is refused with the smallest level that would", "[model][plan]") {
  TempDir t;
  const Program program = small_program(t, "bf16");
  const PlanBasis b = plan_basis(program, 8);
  const double off = plan_level(b, ShardLevel::off).total(), grad = plan_level(b, ShardLevel::gradients).total(),
               par = plan_level(b, ShardLevel::params).total();
  CHECK(memory_refusal(program, 8, {off, "test"}).empty());  // fits exactly
  CHECK(memory_refusal(program, 8, {0, "none known"}).empty());
  const std::string refusal = memory_refusal(program, 8, {grad, "-device-gb 1"});
  CHECK_THAT(refusal, Catch::Contains("memory: the plan for shard off needs " + format_bytes(off)));
  CHECK_THAT(refusal, Catch::Contains("over the limit of " + format_bytes(grad) + " (-device-gb 1)"));
  CHECK_THAT(refusal, Catch::Contains("the least sharded level that would fit is shard gradients"));
  CHECK_THAT(memory_refusal(program, 8, {par / 2, "x"}), Catch::Contains("no sharding level fits"));
  const std::string report = dry_run_report(program, 8, {grad, "-device-gb 1"});
  CHECK_THAT(report, Catch::Contains("smallest level that fits: gradients\n"));
  std::string fits;  // the levels at or below the limit, in order
  for (ShardLevel level : kShardLevels)
    if (plan_level(b, level).total() <= grad) fits += (fits.empty() ? "" : ", ") + std::string(mode_name(level));
  CHECK_THAT(report, Catch::Contains("fits: " + fits + "\n"));
  CHECK_THAT(report, Catch::Contains("  <- the deck's"));
  // The deck's own level is what a run is held to: sharded, it fits.
  const Program sharded = small_program(t, "bf16", "shard gradients\n");
  CHECK(memory_refusal(sharded, 8, {grad, "-device-gb 1"}).empty());
  CHECK_THAT(memory_refusal(sharded, 8, {0.99 * std::min(grad, par), "-device-gb 1"}),
             Catch::Contains("the plan for shard gradients needs " + format_bytes(grad)));
}

// moe ... ep N: a rank holds the replicated tensors and E/N of each MoE
// layer's experts; the sharded parts of the experts are shared by their D =
// W/N holders, of the replicated tensors by all W ranks.
TEST_CASE("under ep the experts divide by ep, and sharding divides them by their holders", "[model][plan]") {
  TempDir t;
  const std::string precision = GENERATE("fp32", "bf16");
  const int ep = GENERATE(2, 4);
  const int W = GENERATE(4, 8);
  CAPTURE(precision, ep, W);
  const Program whole = small_program(t, precision), program = small_program(t, precision, "", ep);
  const ParamLayout all(whole.phases.front().config.model);
  int64_t experts = 0;  // every routed expert of the model
  for (const auto& ti : all.tensors()) experts += ti.expert >= 0 ? ti.size : 0;
  REQUIRE(experts > 0);
  const int64_t R = all.total() - experts, X = experts / ep, D = W / ep;
  const PlanBasis b = plan_basis(program, W), b1 = plan_basis(whole, W);
  CHECK(b.ep == ep);
  CHECK(b.model_params == all.total());
  CHECK(b.experts == X);
  CHECK(b.params == R + X);
  CHECK(b.shard == (R + W - 1) / W + (X + D - 1) / D);
  CHECK(b1.experts == 0);  // without ep every tensor is replicated
  CHECK(b1.shard == (all.total() + W - 1) / W);

  const double c = precision != "fp32" ? 2 : 0, P = double(R + X), S = double(b.shard);
  const int64_t NK = 2 * 16 * 2, C = 64;  // batch x seq x topk rows, width
  const int64_t rows = int64_t(std::ceil(kExpertLoadPlanned * NK));
  CHECK(b.expert_rows == rows);
  CHECK(b.exchange == 4.0 * 2 * rows * C);  // outputs going home, output gradients arriving
  for (ShardLevel level : kShardLevels) {
    CAPTURE(mode_name(level));
    const MemoryPlan p = plan_level(b, level), p1 = plan_level(b1, level);
    // The formulas of every level, with P and S as above (and below params
    // in 16 bits the fp32 master of S and of the M fp32-read weights).
    const double M = double(b.fp32_read), master_pieces = c * P + 4 * S + 4 * M * (W - 1) / W;
    const bool pieces = c > 0 && (level == ShardLevel::optimizer || level == ShardLevel::gradients);
    CHECK(p.weights == Approx(pieces ? master_pieces : (4 + c) * (level == ShardLevel::params ? S : P)));
    CHECK(p.gradients == 4 * (level == ShardLevel::gradients || level == ShardLevel::params ? S : P));
    CHECK(p.optimizer == 8 * (level == ShardLevel::off ? P : S));
    CHECK(p.activations == b.activations);
    // Against ep 1: what the other ranks' experts cost is gone.
    if (level == ShardLevel::off) {
      CHECK(p1.weights - p.weights == (4 + c) * double(experts - X));
      CHECK(p1.optimizer - p.optimizer == 8.0 * double(experts - X));
      CHECK(p.communication == b.exchange);
    }
    PlanBasis without_exchange = b;
    without_exchange.exchange = 0;
    CHECK(p.communication - plan_level(without_exchange, level).communication == Approx(b.exchange));  // at every level (a fractional bucket of bytes rounds)
  }
  // The largest unit gathered under params is a MoE block with its own experts only.
  CHECK(b.largest_layer < b1.largest_layer);
  const std::string report = dry_run_report(program, W, {0, "none"});
  CHECK_THAT(report, Catch::Contains(fmt::format("{} rank(s), ep {}: experts sharded over their D = {} holder(s)",
                                                 W, ep, D)));
  CHECK_THAT(report, Catch::Contains(fmt::format("each rank holds {} of every", 4 / ep)));
  CHECK_THAT(report, Catch::Contains(fmt::format("MoE layer's 4 routed experts, each expert held by D = {} rank(s)", D)));
  CHECK_THAT(report, Catch::Contains(fmt::format("S = ceil(R/{}) + ceil(X/{})", W, D)));
  CHECK_THAT(report,
             Catch::Contains(fmt::format("planned at {}x an even load: {} per MoE layer", kExpertLoadPlanned, rows)));
  CHECK((D == 1) == (report.find("D = 1: each expert has one holder") != std::string::npos));
}

TEST_CASE("under ep the rows an expert owner runs grow with its load", "[model][plan]") {
  TempDir t;
  const Program program = small_program(t, "bf16", "", 2);
  const auto& m = program.phases.front().config.model;
  const auto even = estimate_memory(m, 2), busy = estimate_memory(m, 2, 2.0);
  const int64_t NK = 2 * 16 * 2, C = 64, Fm = 32;
  int64_t moe_blocks = 0;  // blocks, MTP's included, MoeConfig::is_moe_layer counts
  for (int l = 0; l < m.layers + m.mtp.depth; ++l) moe_blocks += m.moe.is_moe_layer(l);
  CHECK(even.expert_rows == NK);
  CHECK(busy.expert_rows == 2 * NK);
  // Per MoE block the rows run keep their input, gate/up and SwiGLU output.
  CHECK(busy.halvable_elements - even.halvable_elements == moe_blocks * NK * (C + 3 * Fm));
  CHECK(busy.other_elements == even.other_elements);
  CHECK(busy.exchange_elements == 2 * even.exchange_elements);
  // ep 1 runs the N K rows it routes: nothing travels.
  const auto local = estimate_memory(small_program(t, "bf16").phases.front().config.model, 2, 2.0);
  CHECK(local.expert_rows == NK);
  CHECK(local.exchange_elements == 0);
  // ep keeps the rows' input twice, sent and run: N K C more per MoE block at an even load.
  CHECK(even.halvable_elements - local.halvable_elements == moe_blocks * NK * C);
}

TEST_CASE("a plan under ep needs whole expert-parallel groups", "[model][plan]") {
  TempDir t;
  const Program program = small_program(t, "fp32", "", 4);
  const std::string moe_line = (t.dir / "plan.deck").string() + ":3";
  try {
    plan_basis(program, 6);
    FAIL("no error for ep 4 over 6 ranks");
  } catch (const InputError& e) {
    CHECK_THAT(e.what(), Catch::StartsWith(moe_line + ": moe ep 4 does not divide the 6 ranks planned (expected "
                                           "a world size that is a multiple of ep, or an ep that divides 6 and "
                                           "routed 4)"));
  }
  CHECK_THROWS_AS(dry_run_report(program, 2, {0, "none"}), InputError);
  // A run leaves that refusal to the trainer, which names a checkpoint's layout too.
  CHECK(memory_refusal(program, 6, {1, "-device-gb 1e-9"}).empty());
  CHECK_NOTHROW(plan_basis(program, 8));
  const PlanBasis b = plan_basis(program, 4);
  CHECK_THAT(memory_refusal(program, 4, {plan_level(b, ShardLevel::off).total() / 2, "-device-gb 1"}),
             Catch::Contains("per rank at 4 rank(s), ep 4 ("));
}

// At long contexts the packed kernel's probabilities (B H T^2/2 per layer)
// dominate the activations; the flash kernel keeps B H T values and a
// scratch of B H 64 (2*64 + 2), whatever T. The dry run says which it counts.
TEST_CASE("the plan with attention_kernel flash is smaller at long T and says which kernel it counts",
          "[model][plan][flash]") {
  TempDir t;
  const std::string precision = GENERATE("fp32", "bf16");
  CAPTURE(precision);
  auto program_with = [&](const std::string& kernel, int seq) {
    const std::string deck = fmt::format(
        "model deepseek vocab 256 dim 64 layers 4 heads 4 ffn 128 seq {}\n"
        "attention mla kv_lora_rank 32 q_lora_rank 0 qk_nope_dim 16 rope_dim 8 v_dim 16\n"
        "attention_kernel {}\n"
        "data bytes /dev/null batch 2\n"
        "precision {}\n"
        "run 1\n", seq, kernel, precision);
    return build_program(read_deck(t.write("plan.deck", deck), {}), false);
  };
  const Program packed = program_with("packed", 2048), flash = program_with("flash", 2048);
  const PlanBasis bp = plan_basis(packed, 1), bf = plan_basis(flash, 1);
  CAPTURE(bp.activations, bf.activations);
  // The triangle: 4 layers x B*H = 8 x 2048^2/2 values, less the flash kernel's scratch and log-sum-exps.
  const double triangle = (precision == std::string("fp32") ? 4.0 : 2.0) * 4 * 8 * xx::kernels::CausalBlocks(2048, 64).per_head();
  CHECK(bp.activations - bf.activations > 0.9 * triangle);
  CHECK(bf.activations < bp.activations / 2);
  CHECK(bf.params == bp.params);
  // At short T the flash scratch can outweigh what it saves: the plan says so too.
  const PlanBasis sp = plan_basis(program_with("packed", 16), 1), sf = plan_basis(program_with("flash", 16), 1);
  CHECK(sf.activations != sp.activations);
  const MemoryLimit none{0, "test"};
  CHECK_THAT(dry_run_report(flash, 1, none), Catch::Contains("attention: the flash kernel"));
  CHECK_THAT(dry_run_report(packed, 1, none), Catch::Contains("attention: the packed kernel"));
  // auto: packed where the kernels' memory is the host's, flash on a device.
  const bool host = kernel_memory_on_host();  // false under XX_EMULATE_DEVICE=1 too
  CHECK(plan_basis(program_with("auto", 2048), 1).activations == (host ? bp : bf).activations);
}

namespace {

// The small model of small_program with `layers` blocks (dense_layers 1: one
// dense block, the rest MoE; MTP's block is MoE too) and a recompute mode.
ModelConfig recompute_model(const TempDir& t, int layers, const std::string& recompute) {
  const std::string deck = fmt::format(
      "model deepseek vocab 256 dim 64 layers {} heads 4 ffn 128 seq 16\n"
      "attention mla kv_lora_rank 32 q_lora_rank 0 qk_nope_dim 16 rope_dim 8 v_dim 16\n"
      "attention_kernel packed\n"
      "moe on dense_layers 1 shared 1 routed 4 topk 2 ffn 32\n"
      "mtp depth 1\n"
      "recompute {}\n"
      "data bytes /dev/null batch 2\n"
      "run 1\n", layers, recompute);
  return build_program(read_deck(t.write("recompute.deck", deck), {}), false).phases.front().config.model;
}

}  // namespace

// recompute selective gives up per block the RMSNorm outputs (xn, xn2, MLA's
// cn), the up-projections q, k, v, the SwiGLU activations and the routed
// rows' inputs and outputs (N K C each, made again), and keeps one
// set of them as the model shares it: the norms' and attention's, alike in
// every block, and one feed-forward set per kind (dense, MoE); full keeps per
// block only its input and the router's indices and gradients.
TEST_CASE("recompute: what each mode keeps per block, against the shapes", "[model][plan][recompute]") {
  TempDir t;
  const int64_t B = 2, T = 16, N = B * T, C = 64, H = 4, qk = 16 + 8, vd = 16, kv = 32, F = 128, Fm = 32, K = 2;
  // What selective gives up: of the dense block, and of a MoE block (one shared expert, N K rows run).
  const int64_t norms_and_heads = 2 * N * C + B * H * T * (2 * qk + vd) + N * kv;
  const int64_t dense = norms_and_heads + N * F, moe = norms_and_heads + N * Fm + N * K * Fm + N * K * C;
  for (int layers : {4, 6}) {
    CAPTURE(layers);
    const auto off = estimate_memory(recompute_model(t, layers, "off"), 2);
    const auto sel = estimate_memory(recompute_model(t, layers, "selective"), 2);
    // Per block dense + (layers - 1 + 1 MTP) MoE blocks gone; one set kept: the attention part and each kind's FFN.
    const int64_t one_set = dense + moe - norms_and_heads;
    CHECK(off.halvable_elements - sel.halvable_elements == dense + layers * moe - one_set);
    CHECK(off.other_elements - sel.other_elements == layers * N * K * C - N * K * C);  // the rows' outputs (fp32)
    CHECK(sel.recomputed_elements == one_set + N * K * C);  // and one set of the rows' outputs (fp32)
    CHECK(sel.scratch_elements == off.scratch_elements);
    CHECK(sel.mixed_scratch_elements == off.mixed_scratch_elements);
    CHECK(off.recomputed_elements == 0);
  }
  // Two MoE blocks more: off keeps theirs and their streams; selective theirs
  // less the recomputed part; full only their streams (N C each, 32 bits) and
  // their routers' indices.
  const auto off4 = estimate_memory(recompute_model(t, 4, "off"), 2), off6 = estimate_memory(recompute_model(t, 6, "off"), 2);
  const auto sel4 = estimate_memory(recompute_model(t, 4, "selective"), 2),
             sel6 = estimate_memory(recompute_model(t, 6, "selective"), 2);
  const auto full4 = estimate_memory(recompute_model(t, 4, "full"), 2), full6 = estimate_memory(recompute_model(t, 6, "full"), 2);
  const int64_t moe_block = (off6.halvable_elements + off6.other_elements - off4.halvable_elements -
                             off4.other_elements) / 2 - N * C;  // one MoE block's own
  CHECK(moe_block > moe);
  CHECK(sel6.halvable_elements + sel6.other_elements - sel4.halvable_elements - sel4.other_elements ==
        2 * (moe_block - moe - N * K * C + N * C));
  CHECK(full6.halvable_elements - full4.halvable_elements == 0);
  const int64_t router_own = 4 + 3 * N * K;  // each MoE block's under full: its score gradient (E) and indices
  CHECK(full6.other_elements - full4.other_elements == 2 * (N * C + router_own));
  // full keeps the largest block's set once: off less every block's own, plus that set.
  CHECK(full4.recomputed_elements >= moe_block);
  CHECK(full4.activation_elements() < sel4.activation_elements());
  CHECK(sel4.activation_elements() < off4.activation_elements());
}

TEST_CASE("pipeline stages: the layers cut into P runs, every tensor in one stage, the last adds the embedding's copy",
          "[model][plan][pipeline]") {
  TempDir t;
  // 61 layers over 16 stages: 13 of 4, then 3 of 3.
  const auto v3 = stage_layers(61, 16);
  REQUIRE(v3.size() == 16);
  CHECK(v3.front() == std::pair<int, int>{0, 4});
  CHECK(v3[12] == std::pair<int, int>{48, 52});
  CHECK(v3[13] == std::pair<int, int>{52, 55});
  CHECK(v3.back() == std::pair<int, int>{58, 61});
  // the deck's cut wins: V3's layers with the short stages first
  std::vector<int> cut(16, 4);
  cut[0] = cut[1] = cut[2] = 3;
  const auto given = stage_layers(61, 16, cut);
  CHECK(given.front() == std::pair<int, int>{0, 3});
  CHECK(given[3] == std::pair<int, int>{9, 13});
  CHECK(given.back() == std::pair<int, int>{57, 61});
  const int ep = GENERATE(1, 2);
  const int P = GENERATE(1, 2, 4);
  CAPTURE(ep, P);
  const int W = 8;
  const Program program = small_program(t, "bf16", "", ep);
  const auto& m = program.phases.front().config.model;
  const ParamLayout layout(m);  // rank 0's experts under ep
  const int64_t copy = P > 1 ? layout.at("embed").size : 0;  // MTP reads the embedding on the last stage
  int64_t params = 0, experts = 0, fp32_read = 0;
  for (int s = 0; s < P; ++s) {
    const PipelinePlan pipe{P, PipelineSchedule::one_f_one_b, 2};
    const PlanBasis b = plan_basis(program, W, pipe, s);
    CAPTURE(s);
    CHECK(b.ranks == W / P);  // ZeRO over the stage's data-parallel ranks
    CHECK(b.embed_copy == (s == P - 1 ? copy : 0));
    params += b.params, experts += b.experts, fp32_read += b.fp32_read;
    CHECK(b.shard == (b.params - b.experts + W / P - 1) / (W / P) + (b.experts + W / P / ep - 1) / (W / P / ep));
    // Between stages: the activation and its gradient, fp32, of one micro-batch, per neighbour.
    CHECK(b.pipe_buffers == 4.0 * 2 * ((s > 0) + (s < P - 1)) * 1 * 16 * 64);
  }
  CHECK(params == layout.total() + copy);
  CHECK(experts == (ep > 1 ? plan_basis(program, W).experts : 0));
  CHECK(fp32_read == plan_basis(program, W).fp32_read + copy);
  // At P = 1 the plan is the one without a pipeline.
  const PlanBasis one = plan_basis(program, W, PipelinePlan{}, 0), whole = plan_basis(program, W);
  CHECK(one.params == whole.params);
  CHECK(one.activations == whole.activations);
  CHECK(plan_level(one, ShardLevel::optimizer).total() == plan_level(whole, ShardLevel::optimizer).total());
}

TEST_CASE("pipeline stages: 1F1B keeps min(P - s, M) micro-batches in flight, GPipe M", "[model][plan][pipeline]") {
  TempDir t;
  const Program program = small_program(t, "fp32", "", 1);
  const auto& m = program.phases.front().config.model;
  // Stage 0 of 2 (layers 0-1) with micro-batches of 1 sequence: its blocks' own per micro-batch in flight.
  const StageSpan one{0, 2, true, false, 1}, two{0, 2, true, false, 2};
  const auto e1 = estimate_stage(m, 1, {one}), e2 = estimate_stage(m, 1, {two});
  CHECK(e2.halvable_elements == 2 * e1.halvable_elements);
  CHECK(e2.other_elements == 2 * e1.other_elements);
  CHECK(e2.scratch_elements == e1.scratch_elements);  // scratch once
  // dualpipev under ep: each of the two runs its own scratch and recomputed set (train/pass_pair.h)
  const StageSpan down{0, 1, true, false, 2}, up{3, 4, false, true, 1};
  const auto v = estimate_stage(m, 1, {down, up}), paired = estimate_stage(m, 1, {down, up}, 1.0, true);
  CHECK(paired.scratch_elements == 2 * v.scratch_elements);
  CHECK(paired.mixed_scratch_elements == 2 * v.mixed_scratch_elements);
  CHECK(paired.recomputed_elements == 2 * v.recomputed_elements);
  CHECK(paired.activation_elements() > v.activation_elements());
  ModelConfig with_ep = m;
  with_ep.moe.mode = MoeMode::on, with_ep.moe.routed = 4, with_ep.moe.topk = 2, with_ep.moe.ffn = 16, with_ep.moe.ep = 2;
  const PipelinePlan dualpipev{2, PipelineSchedule::dualpipev, 4, {}, 2};
  CHECK(dualpipev.overlapped(with_ep));
  CHECK(!dualpipev.overlapped(m));
  CHECK(!PipelinePlan{2, PipelineSchedule::one_f_one_b, 4}.overlapped(with_ep));
  const PipelinePlan f{4, PipelineSchedule::one_f_one_b, 8}, g{4, PipelineSchedule::gpipe, 8}, few{4, PipelineSchedule::one_f_one_b, 2};
  CHECK((f.in_flight(0) == 4 && f.in_flight(3) == 1));
  CHECK((g.in_flight(0) == 8 && g.in_flight(3) == 8));
  CHECK((few.in_flight(0) == 2 && few.in_flight(3) == 1));
  CHECK(PipelinePlan{}.in_flight(0) == 1);
}

TEST_CASE("-plan: a grid's bad text is refused naming -plan and what was expected", "[model][plan][grid]") {
  const std::string expected = "(expected -plan \"KEY=V1,V2 ...\" with keys P, ep, shard, recompute, micro, schedule";
  auto refusal = [](const std::string& text) {
    try {
      parse_plan_grid(text);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(refusal("P=0"), Catch::StartsWith("command line: bad -plan 'P=0': P=0 is not an integer >= 1 " + expected));
  CHECK_THAT(refusal("P=2x"), Catch::Contains("P=2x is not an integer >= 1"));
  CHECK_THAT(refusal("shard=zero"), Catch::Contains("shard=zero is not one of off, optimizer, gradients, params"));
  CHECK_THAT(refusal("recompute=some"), Catch::Contains("recompute=some is not one of off, selective, full"));
  CHECK_THAT(refusal("schedule=dualpipe"), Catch::Contains("schedule=dualpipe is not one of gpipe, 1f1b, interleaved, dualpipev"));
  CHECK_THAT(refusal("P"), Catch::Contains("'P' has no '='"));
  CHECK_THAT(refusal("P=1,,2"), Catch::Contains("P has an empty value"));
  CHECK_THAT(refusal("P=1 P=2"), Catch::Contains("P given twice"));
  CHECK_THAT(refusal("stages=2"), Catch::Contains("unknown key 'stages'"));
  CHECK_THAT(refusal(""), Catch::Contains("no KEY=VALUES"));
  const PlanGrid g = parse_plan_grid("P=1,2,4  ep=1,8 shard=optimizer,params recompute=off,selective micro=8");
  CHECK(g.stages == std::vector<int>{1, 2, 4});
  CHECK(g.ep == std::vector<int>{1, 8});
  CHECK(g.shard == std::vector<ShardLevel>{ShardLevel::optimizer, ShardLevel::params});
  CHECK(g.recompute == std::vector<Recompute>{Recompute::off, Recompute::selective});
  CHECK(g.micro == std::vector<int>{8});
  CHECK(g.schedule.empty());  // the default, 1f1b
}

TEST_CASE("-plan: one row per combination, the invalid ones with their reason, and the smallest that fits",
          "[model][plan][grid]") {
  TempDir t;
  const Program program = small_program(t, "bf16", "", 1);  // 4 layers, routed 4, batch 2
  const PlanGrid grid = parse_plan_grid("P=1,2,3,8 ep=1,2,3 shard=off,optimizer,params recompute=off,selective micro=2,4");
  const auto rows = plan_rows(program, 8, grid);
  // P 1: one row per (ep, shard, recompute), M taken as 1; P 2, 3, 8: both M.
  CHECK(rows.size() == 3 * 3 * 2 * (1 + 2 + 2 + 2));
  auto find = [&](int P, int ep, ShardLevel s, Recompute r, int micro) -> const PlanRow& {
    for (const auto& row : rows)
      if (row.stages == P && row.ep == ep && row.shard == s && row.recompute == r && row.micro == micro) return row;
    FAIL("no row");
    return rows.front();
  };
  CHECK(find(3, 1, ShardLevel::off, Recompute::off, 2).invalid == "P 3 does not divide the 8 ranks");
  CHECK(find(8, 1, ShardLevel::off, Recompute::off, 2).invalid == "P 8 > 4 layers: a stage needs a layer");
  CHECK(find(1, 3, ShardLevel::off, Recompute::off, 1).invalid == "ep 3 does not divide routed 4");
  CHECK(find(2, 1, ShardLevel::off, Recompute::off, 4).invalid ==
        "micro 4 does not divide batch 2 (sequences per pipeline per step)");
  const PlanRow& valid = find(2, 2, ShardLevel::optimizer, Recompute::selective, 2);
  CHECK(valid.invalid.empty());
  // The row is its worst stage: no stage needs more.
  {
    Program variant = small_program(t, "bf16", "recompute selective\nshard optimizer\n", 2);
    double worst = 0;
    for (int s = 0; s < 2; ++s)
      worst = std::max(worst, plan_level(plan_basis(variant, 8, {2, PipelineSchedule::one_f_one_b, 2}, s),
                                         ShardLevel::optimizer).total());
    CHECK(valid.plan.total() == worst);
  }
  // No limit: the deck's own (P 1, recompute off, shard off, ep 1) comes first.
  const PlanRow* any = smallest_fitting_row(rows, 1e30);
  REQUIRE(any);
  CHECK((any->stages == 1 && any->recompute == Recompute::off && any->shard == ShardLevel::off && any->ep == 1));
  CHECK(smallest_fitting_row(rows, 1) == nullptr);
  // At a limit only the P 1 rows that shard params (or recompute) fit: the rule picks the fewest stages
  // first, then the least recompute, then the least sharding.
  const double limit = find(1, 2, ShardLevel::params, Recompute::off, 1).plan.total();
  const PlanRow* pick = smallest_fitting_row(rows, limit);
  REQUIRE(pick);
  CHECK(pick->plan.total() <= limit);
  for (const auto& r : rows) {
    if (!r.invalid.empty() || r.plan.total() > limit) continue;
    CHECK(r.stages >= pick->stages);
    if (r.stages == pick->stages) CHECK(int(r.recompute) >= int(pick->recompute));
    if (r.stages == pick->stages && r.recompute == pick->recompute) CHECK(int(r.shard) >= int(pick->shard));
    if (r.stages == pick->stages && r.recompute == pick->recompute && r.shard == pick->shard) CHECK(r.ep >= pick->ep);
  }
  CHECK(pick->stages == 1);
  const std::string report = plan_grid_report(program, 8, grid, {limit, "-device-gb x"});
  CHECK_THAT(report, Catch::Contains("invalid: P 3 does not divide the 8 ranks"));
  CHECK_THAT(report, Catch::Contains(fmt::format("smallest that fits (the fewest stages, then the least recompute, "
                                                 "sharding, ep, micro-batches, bytes): P 1 ep {} shard {} recompute {}: {}",
                                                 pick->ep, pick->shard, pick->recompute, format_bytes(pick->plan.total()))));
  CHECK_THAT(plan_grid_report(program, 8, grid, {1, "-device-gb x"}), Catch::Contains("no combination fits: the least needs"));
}

// docs/SCALING.md: DeepSeek-V3 at DeepSeek's layout, 2048 ranks as PP16 x EP64
// x ZeRO-1, bf16 with bf16 moments, one 4096-token sequence per micro-batch.
// Under selective recompute with 16 micro-batches (1F1B) stage 1 keeps 15 in
// flight and needs 155 GiB: the documented gap (the MoE rows received, and
// their outputs home in fp32); full recompute fits, and so does selective
// with at most 6 in flight.
TEST_CASE("DeepSeek-V3 at PP16 x EP64 x ZeRO-1 against 80 GiB: the documented plan", "[model][plan][pipeline][v3]") {
  TempDir t;
  auto v3 = [&](int batch) {
    const std::string deck = fmt::format(
        "init hf {}/tests/data/hf_configs/deepseek-v3 seq 4096\n"
        "moe on ep 64\nattention_kernel flash\nprecision bf16\noptimizer adamw moments bf16\n"
        "recompute selective\nshard optimizer\ndata bytes /dev/null batch {}\nrun 1\n", XX_SOURCE_DIR, batch);
    return build_program(expand_hf_init(read_deck(t.write("v3.deck", deck), {})), false);
  };
  const double GiB = 1024.0 * 1024 * 1024, limit = 80 * GiB;
  const Program program = v3(16);
  const auto rows = plan_rows(program, 2048, parse_plan_grid("P=16 ep=64 shard=optimizer recompute=selective,full micro=16"));
  REQUIRE(rows.size() == 2);
  const PlanRow &selective = rows[0], &full = rows[1];
  REQUIRE((selective.invalid.empty() && full.invalid.empty()));
  CHECK(selective.worst_stage == 1);
  CHECK(selective.plan.total() / GiB == Approx(155.31).margin(0.01));
  CHECK(selective.plan.total() > limit);  // the gap SCALING.md explains: 75 GiB
  CHECK(full.plan.total() / GiB == Approx(49.40).margin(0.01));
  CHECK(full.worst_stage == 15);
  const PlanRow* smallest = smallest_fitting_row(rows, limit);
  REQUIRE(smallest);
  CHECK(smallest->recompute == Recompute::full);
  // The model state alone fits on every stage; 61 layers over 16: 13 stages of 4, then 3 of 3.
  const PipelinePlan pipe{16, PipelineSchedule::one_f_one_b, 16};
  const ParamLayout layout(program.phases.front().config.model);
  int64_t params = 0;
  for (int s = 0; s < 16; ++s) {
    const PlanBasis b = plan_basis(program, 2048, pipe, s);
    REQUIRE(b.runs.size() == 1);
    CHECK(b.runs[0].end - b.runs[0].begin == (s < 13 ? 4 : 3));
    const MemoryPlan p = plan_level(b, ShardLevel::optimizer);
    CHECK(p.weights + p.gradients + p.optimizer < 30 * GiB);
    params += b.params;
  }
  CHECK(params == layout.total() + layout.at("embed").size);  // the last stage's copy for MTP
  // Selective fits with 6 micro-batches of one sequence in flight, not 7.
  CHECK(plan_rows(v3(6), 2048, parse_plan_grid("P=16 ep=64 micro=6")).front().plan.total() <= limit);
  CHECK(plan_rows(v3(7), 2048, parse_plan_grid("P=16 ep=64 micro=7")).front().plan.total() > limit);
}

TEST_CASE("-dry-run plans the deck's pipeline line: its worst stage, and -plan's default", "[model][plan][grid]") {
  TempDir t;
  const Program program = small_program(t, "bf16", "pipeline stages 2 schedule 1f1b micro 2\ncheckpoint at_end no\n");
  const PipelinePlan pipe = deck_pipeline(program.phases.front().config);
  CHECK((pipe.stages == 2 && pipe.schedule == PipelineSchedule::one_f_one_b && pipe.micro == 2));
  double worst = 0;
  for (int s = 0; s < 2; ++s) worst = std::max(worst, plan_level(plan_basis(program, 8, pipe, s), ShardLevel::off).total());
  CHECK(plan_level(plan_basis(program, 8), ShardLevel::off).total() == worst);
  // Without the line: P 1, the plan as before.
  const Program plain = small_program(t, "bf16");
  CHECK(plan_level(plan_basis(plain, 8), ShardLevel::off).total() ==
        plan_level(plan_basis(plain, 8, PipelinePlan{}, 0), ShardLevel::off).total());
  CHECK(plan_level(plan_basis(plain, 8), ShardLevel::off).total() != worst);
  // -plan with no P, micro or schedule takes the deck's.
  const auto rows = plan_rows(program, 8, parse_plan_grid("shard=off"));
  REQUIRE(rows.size() == 1);
  CHECK((rows[0].stages == 2 && rows[0].micro == 2 && rows[0].schedule == PipelineSchedule::one_f_one_b));
  CHECK(rows[0].plan.total() == worst);
  // The report's header is that stage's too: its parameters, and the precision
  // table's deck row (bf16) is the level table's off row.
  const PlanBasis b = plan_basis(program, 8);
  const std::string report = dry_run_report(program, 8, MemoryLimit{});
  CHECK(report.find(fmt::format("planned here: stage {} ", b.stage)) != std::string::npos);
  CHECK(report.find(fmt::format("its rank holding {} parameters", b.params)) != std::string::npos);
  const std::string off_total = format_bytes(worst);
  size_t seen = 0;
  for (size_t at = report.find(off_total); at != std::string::npos; at = report.find(off_total, at + 1)) ++seen;
  CHECK(seen >= 2);
  // dualpipev needs micro >= 2P: a row saying so (batch 2 allows micro 2 at most)
  const auto chunked = plan_rows(program, 8, parse_plan_grid("schedule=dualpipev"));
  REQUIRE(chunked.size() == 1);
  CHECK(chunked[0].invalid == "micro 2 < 2 P: dualpipev fills both arms of its V");
}

// Virtual stages, planned from the trainer's own tables: each stage holds its
// chunks' tensors (dualpipev: stage 0 both ends of the model, so no copy of
// the embedding), and keeps in flight what its table holds in each run.
TEST_CASE("the plan of chunked schedules: each stage's runs of layers and what their tables keep in flight",
          "[model][plan][pipeline]") {
  TempDir t;
  const std::string deck =
      "model deepseek vocab 256 dim 64 layers 8 heads 4 ffn 128 seq 16\n"
      "attention mla kv_lora_rank 32 q_lora_rank 0 qk_nope_dim 16 rope_dim 8 v_dim 16\n"
      "moe on dense_layers 1 shared 1 routed 4 topk 2 ffn 32\nmtp depth 1\n"
      "data bytes /dev/null batch 8\nprecision bf16\nsync dense bucket_mb 0.01\n"
      "pipeline stages 2 schedule dualpipev virtual 2 micro 8\nrun 1\n";
  const Program program = build_program(read_deck(t.write("v.deck", deck), {}), false);
  const ParamLayout layout(program.phases.front().config.model);
  const PipelinePlan v = deck_pipeline(program.phases.front().config);
  CHECK((v.virtual_stages == 2 && v.chunks() == 4));
  const PlanBasis s0 = plan_basis(program, 2, v, 0), s1 = plan_basis(program, 2, v, 1);
  CHECK(s0.layers_text() == "0-1,6-7");
  CHECK(s1.layers_text() == "2-3,4-5");
  CHECK((s0.runs.front().first && s0.runs.back().last && !s1.runs.front().first && !s1.runs.back().last));
  CHECK(s0.embed_copy == 0);
  CHECK(s0.params + s1.params == layout.total());  // every tensor once
  for (int s = 0; s < 2; ++s) {
    const auto order = stage_order(PipelineSchedule::dualpipev, 2, 8, s, 2);
    CHECK(v.in_flight(s) == most_in_flight(order, 0) + most_in_flight(order, 1));
  }
  // The stage keeps its runs' activations: more micro-batches in flight, more kept
  const PipelinePlan fewer{2, PipelineSchedule::interleaved, 2, {}, 2};
  CHECK(fewer.in_flight(0) < v.in_flight(0));
  // -plan rows: interleaved and dualpipev planned at P 2, refused where P x V passes the layers
  const auto rows = plan_rows(program, 8, parse_plan_grid("P=2,8 schedule=interleaved,dualpipev micro=8"));
  REQUIRE(rows.size() == 4);
  CHECK((rows[0].invalid.empty() && rows[1].invalid.empty()));
  CHECK(rows[2].invalid == "P 8 x V 2 > 8 layers: a chunk needs a layer");
  // the dry run names the chunks
  const std::string report = dry_run_report(program, 2, MemoryLimit{});
  CHECK(report.find("2 chunks each") != std::string::npos);
}

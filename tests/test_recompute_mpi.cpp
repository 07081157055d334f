// recompute selective | full in the trainer at 2 ranks: under moe ... ep 2
// (the replayed MoE forward runs its all-to-alls again on both ranks, in the
// same block order), shard optimizer and shard params (each block's unit held
// through its recompute), fp32 and bf16, the losses and the weights after a
// few steps are those of recompute off, bit for bit; the backends table says
// which recompute runs.
#include <catch2/catch.hpp>
#include "mpi_fixture.h"

using namespace xx;
using namespace xx::test;

namespace {

// deepseek-tiny's features, small: MLA with a query latent, a dense block and
// a MoE block (sigmoid gate, selection bias, sequence-wise loss, 2 groups),
// MTP depth 1, tied embeddings.
std::string deck(const std::string& corpus, const std::string& out, const std::string& extra, int ep) {
  return "seed 1234\n"
         "model deepseek vocab 256 dim 32 layers 2 heads 2 ffn 64 seq 16 tie_embeddings yes\n"
         "attention mla kv_lora_rank 16 q_lora_rank 12 qk_nope_dim 8 rope_dim 8 v_dim 8\n"
         "moe on dense_layers 1 shared 1 routed 4 topk 2 ffn 16 gate sigmoid balance bias balance_coef 0.001 "
         "seq_aux 0.01 groups 2 topk_groups 1 ep " + std::to_string(ep) + "\n"
         "mtp depth 1 weight 0.3\n"
         "data bytes " + corpus + " valid 0.1 batch 2 workers 1\n"
         "optimizer adamw lr 3e-4 beta1 0.9 beta2 0.95 weight_decay 0.1 clip 1.0\n"
         "schedule cosine warmup 2 min_lr 3e-5\n"
         "sync dense bucket_mb 0.01\n"
         "output dir " + out + " log_every 1\n"
         "eval every 0 batches 2\n"
         "grad_check missing error\n"
         "checkpoint every 0 at_end no\n" + extra +
         "run 3\n";
}

struct Outcome {
  std::vector<double> losses;
  std::vector<float> whole;
  std::string backends;
};

Outcome run(const Program& program) {
  return run_trainer(program, "", [](Trainer& t) { return Outcome{t.losses(), t.whole_params(), t.backends()}; });
}

}  // namespace

TEST_CASE("recompute selective and full train as off, bit for bit, under ep 2 and shard optimizer | params",
          "[mpi][recompute]") {
  const auto dir = shared_scratch("recompute");
  const auto corpus = make_corpus(dir);
  const int ep = mpi_size() % 2 == 0 ? 2 : 1;
  for (const std::string setting : {"precision fp32\nshard optimizer\n", "precision bf16\nshard params\n"}) {
    INFO(setting);
    const std::string tag = setting.find("bf16") != std::string::npos ? "bf16" : "fp32";
    const auto off = run(make_program(dir, tag + "_off", deck(corpus, dir + "/" + tag + "_off", setting, ep)));
    REQUIRE(off.losses.size() == 3);
    REQUIRE_THAT(off.backends, Catch::Contains("off: every activation kept"));
    for (const std::string mode : {"selective", "full"}) {
      INFO(mode);
      const std::string name = tag + "_" + mode;
      const auto r = run(make_program(dir, name, deck(corpus, dir + "/" + name, setting + "recompute " + mode + "\n", ep)));
      REQUIRE_THAT(r.backends, Catch::Contains(mode + ": "));
      REQUIRE(r.losses == off.losses);
      REQUIRE(r.whole == off.whole);
    }
  }
}

// Tied embeddings (model ... tie_embeddings yes): one (V, C) tensor is the
// embedding and the head of the main model and of every MTP depth. It trains
// under every shard level as shard off does (the one tensor's pieces, its
// 16-bit copy gathered under bf16, its unit held through the forward under
// params), under moe ... ep as ep 1 does, resumes bit for bit, and its
// checkpoint refuses an untied deck (and an untied one a tied deck).
#include <catch2/catch.hpp>
#include <hdf5.h>
#include <cmath>
#include "core/error.h"
#include "mpi_fixture.h"

using namespace xx;
using namespace xx::test;

namespace {

// deepseek-tiny's features at dim 32 (MLA, 2 shared + 4 routed experts after
// one dense block, MTP depth 1 sharing the tied head), lr 3e-4 as the ep tests
// (a last-bit difference stays small over the run).
std::string deck(const std::string& corpus, const std::string& out, int steps, const std::string& extra = "",
                 const std::string& tie = "yes", int ep = 1) {
  return "seed 1234\n"
         "model deepseek vocab 256 dim 32 layers 2 heads 2 ffn 96 seq 32 tie_embeddings " + tie + "\n"
         "attention mla kv_lora_rank 16 q_lora_rank 0 qk_nope_dim 8 rope_dim 8 v_dim 8\n"
         "moe on dense_layers 1 shared 2 routed 4 topk 2 ffn 24 gate softmax balance aux balance_coef 0.001 ep " +
         std::to_string(ep) + "\n"
         "mtp depth 1 weight 0.3\n"
         "data bytes " + corpus + " valid 0.1 batch 4 workers 2\n"
         "optimizer adamw lr 3e-4 beta1 0.9 beta2 0.95 weight_decay 0.1 clip 1.0\n"
         "schedule cosine warmup 10 min_lr 3e-5\n"
         "sync dense bucket_mb 0.01\n"
         "output dir " + out + " log_every 1\n"
         "eval every 0 batches 2\n"
         "grad_check missing error\n"
         "checkpoint every 10 at_end no\n" + extra +
         "run " + std::to_string(steps) + "\n";
}

struct Outcome {
  std::vector<double> losses;
  std::vector<float> whole;  // the whole model's weights at the end
  std::string backends;
  int64_t params = 0;
};

Outcome run(const Program& program, const std::string& resume = "") {
  return run_trainer(program, resume, [](Trainer& t) {
    return Outcome{t.losses(), t.whole_params(), t.backends(), t.model().layout().full_total()};
  });
}

double relative(double a, double b) { return std::fabs(a - b) / std::max(std::fabs(b), 1e-30); }

double relative(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, ref = 0;
  for (size_t i = 0; i < a.size(); ++i) diff += double(a[i] - b[i]) * (a[i] - b[i]), ref += double(b[i]) * b[i];
  return std::sqrt(diff / std::max(ref, 1e-300));
}

}  // namespace

// 1. shard optimizer, gradients and params follow shard off bit for bit, in
// fp32 and bf16 (the tied tensor is read in fp32 by the lookup and as its
// 16-bit copy by the head); ep 2 follows ep 1 as the ep tests bound it.
TEST_CASE("a tied model trains as shard off under every shard level, and as ep 1 under ep 2", "[mpi][tied]") {
  constexpr int kSteps = 20;
  const auto dir = shared_scratch("tied");
  const auto corpus = make_corpus(dir);
  // Under the device emulation (ctest mpi_np2_emulated_device, the slowest suite) bf16 alone: the
  // tied tensor's 16-bit copy as the head and its fp32 master as the table, the case a device adds.
  // At 4 ranks fp32 alone: what 4 adds to 2 is ep 2 with two holders of each expert, compared in fp32.
  const std::vector<std::string> precisions = device_emulated() ? std::vector<std::string>{"bf16"}
                                              : mpi_size() > 2  ? std::vector<std::string>{"fp32"}
                                                                : std::vector<std::string>{"fp32", "bf16"};
  for (const std::string& precision : precisions) {
    INFO(precision);
    const std::string with = "precision " + precision + "\n";
    const auto off = run(make_program(dir, precision + "_off", deck(corpus, dir + "/" + precision + "_off", kSteps, with)));
    REQUIRE(off.losses.size() == size_t(kSteps));
    REQUIRE(off.losses.back() < off.losses.front());
    const auto untied =
        run(make_program(dir, precision + "_untied", deck(corpus, dir + "/" + precision + "_untied", 1, with, "no")));
    REQUIRE(untied.params - off.params == 256 * 32);  // no second copy of the table
    REQUIRE(untied.losses.front() != off.losses.front());  // another model (its head drawn apart)
    for (const std::string level : {"optimizer", "gradients", "params"}) {
      INFO("shard " << level);
      const std::string name = precision + "_" + level;
      const auto sharded = run(make_program(dir, name, deck(corpus, dir + "/" + name, kSteps, with + "shard " + level + "\n")));
      REQUIRE_THAT(sharded.backends, Catch::Contains("ZeRO"));
      REQUIRE(sharded.losses.size() == off.losses.size());
      for (size_t i = 0; i < off.losses.size(); ++i) {
        INFO("step " << i + 1);
        REQUIRE(sharded.losses[i] == off.losses[i]);
      }
      REQUIRE(sharded.whole == off.whole);
      // Its checkpoint at step 10 resumes under the same level bit for bit.
      const auto resumed = run(make_program(dir, name + "_resumed", deck(corpus, dir + "/" + name + "_resumed", kSteps,
                                                                         with + "shard " + level + "\n")),
                               dir + "/" + name + "/ckpt/step_00000010.h5");
      REQUIRE(resumed.losses.size() == size_t(kSteps - 10));
      for (size_t i = 0; i < resumed.losses.size(); ++i) REQUIRE(resumed.losses[i] == off.losses[10 + i]);
      REQUIRE(resumed.whole == off.whole);
    }
    if (mpi_size() % 2 != 0 || precision != "fp32") continue;  // (ep 2 against ep 1 as the ep tests bound it: fp32)
    const auto ep = run(make_program(dir, precision + "_ep2", deck(corpus, dir + "/" + precision + "_ep2", kSteps, with, "yes", 2)));
    REQUIRE(ep.losses.size() == off.losses.size());
    double worst = 0;
    for (size_t i = 0; i < off.losses.size(); ++i) {
      INFO("step " << i + 1);
      worst = std::max(worst, relative(ep.losses[i], off.losses[i]));
      REQUIRE(relative(ep.losses[i], off.losses[i]) < 1e-6);
    }
    REQUIRE(relative(ep.whole, off.whole) < 1e-6);
    if (mpi_rank() == 0)
      fmt::print(stderr, "[tied] {} ranks, {}, ep 2: losses within {:.2g} of ep 1, weights within {:.2g}\n",
                 mpi_size(), precision, worst, relative(ep.whole, off.whole));
  }
}

// 2. The file stores the one tensor and says it is tied; a deck that does
// not tie refuses it, and a tied deck refuses an untied file: exit 2 (InputError), naming both.
TEST_CASE("a tied checkpoint holds 'embed' alone, says so, and refuses an untied deck, and the reverse", "[mpi][tied]") {
  const auto dir = shared_scratch("tied_ckpt");
  const auto corpus = make_corpus(dir);
  run(make_program(dir, "tied", deck(corpus, dir + "/tied", 10)));
  run(make_program(dir, "untied", deck(corpus, dir + "/untied", 10, "", "no")));
  const std::string tied_file = dir + "/tied/ckpt/step_00000010.h5", untied_file = dir + "/untied/ckpt/step_00000010.h5";
  if (mpi_rank() == 0) {
    for (const auto& [path, tied] : {std::pair{tied_file, 1}, std::pair{untied_file, 0}}) {
      INFO(path);
      const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
      REQUIRE(f >= 0);
      int value = -1;
      const hid_t a = H5Aopen(f, "tied_embeddings", H5P_DEFAULT);
      H5Aread(a, H5T_NATIVE_INT, &value);
      H5Aclose(a);
      CHECK(value == tied);
      CHECK((H5Lexists(f, "/model/head", H5P_DEFAULT) > 0) == !tied);
      CHECK(H5Lexists(f, "/model/embed", H5P_DEFAULT) > 0);
      H5Fclose(f);
    }
  }
  const auto refused = [&](const std::string& name, const std::string& tie, const std::string& from) {
    try {
      run(make_program(dir, name, deck(corpus, dir + "/" + name, 20, "", tie)), from);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK_THAT(refused("untied_from_tied", "no", tied_file),
             Catch::StartsWith(tied_file + ": its model ties its embeddings: 'embed' is also the head (attribute "
                                           "tied_embeddings 1), the deck's has its own head (expected the deck's "
                                           "model line with tie_embeddings yes"));
  CHECK_THAT(refused("tied_from_untied", "yes", untied_file),
             Catch::StartsWith(untied_file + ": its model has its own head tensor 'head' (attribute tied_embeddings "
                                             "0), the deck's ties its embeddings (expected the deck's model line with "
                                             "tie_embeddings no"));
}

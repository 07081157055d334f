// Multi-view loss aggregation across ranks (deck: lossagg): mean is plain
// data-parallel training, robust sidelines a rank fed garbage, and every
// kind keeps the ranks' parameters bit-identical.
#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include "core/error.h"
#include "mpi_fixture.h"

using namespace xx;
using namespace xx::test;

namespace {

// small_deck's dense model turned into a DeepSeek one with MTP and the MoE
// balance loss, so every kind of loss (main, mtp, aux) gets a seed.
std::string deepseek_deck(const std::string& corpus, const std::string& out_dir, int steps, const std::string& extra) {
  std::string deck = small_deck(corpus, out_dir, steps,
                                "moe on dense_layers 1 shared 1 routed 4 topk 2 ffn 32 gate softmax balance aux "
                                "balance_coef 0.01\nmtp depth 1 weight 0.3\n" + extra);
  deck.replace(deck.find("model dense"), 11, "model deepseek");
  return deck;
}

struct Outcome {
  std::vector<double> losses;
  std::vector<uint64_t> fingerprints;
  std::vector<double> log_var;  // uncertainty, else empty
  double val_loss = 0;          // the last validation loss (clean data on every rank)
};

Outcome train(const Program& program, int poisoned_rank = -1, const std::string& resume = "") {
  RunOptions options;
  options.quiet = true;
  options.resume = resume;
  Program noisy = program;  // deck: data ... noise_rank R
  for (auto& phase : noisy.phases) phase.config.data.noise_rank = poisoned_rank;
  Trainer trainer(MPI_COMM_WORLD, noisy, options);
  trainer.run();
  Outcome out{trainer.losses(), all_fingerprints(trainer.model().params()), {}, 0};
  if (trainer.lossagg()) out.log_var = trainer.lossagg()->log_var();
  return out;
}

// Rank 0 reads RUN_DIR/metrics.jsonl: one record per step (log_every 1).
std::vector<nlohmann::json> metrics(const std::string& run_dir) {
  std::vector<nlohmann::json> out;
  if (mpi_rank() != 0) return out;
  std::ifstream in(run_dir + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

double last_val_loss(const std::vector<nlohmann::json>& records) {
  double val = -1;
  for (const auto& r : records)
    if (r.contains("val_loss")) val = r["val_loss"].get<double>();
  return val;
}

}  // namespace

TEST_CASE("lossagg mean equals plain data-parallel training bit for bit", "[mpi][lossagg][host]") {
  const auto dir = shared_scratch("lossagg_mean");
  const auto corpus = make_corpus(dir);
  for (const std::string sync : {"dense", "accumulate 2"}) {
    INFO("sync " << sync);
    const std::string tag = sync.substr(0, 5), line = "sync " + sync + "\n";
    const auto plain = train(make_program(dir, "plain", deepseek_deck(corpus, dir + "/plain" + tag, 5, line)));
    const auto mean = train(
        make_program(dir, "mean", deepseek_deck(corpus, dir + "/mean" + tag, 5, line + "lossagg mean\n")));
    REQUIRE(plain.losses == mean.losses);
    REQUIRE(plain.fingerprints == mean.fingerprints);
    REQUIRE(all_equal(mean.fingerprints));
    // the weights were computed and logged: 1/W each
    for (const auto& r : metrics(dir + "/mean" + tag)) {
      REQUIRE(r.contains("lossagg_weight_min"));
      CHECK(r["lossagg_weight_min"].get<double>() == Approx(1.0 / mpi_size()));
      CHECK(r["lossagg_weight_max"].get<double>() == Approx(1.0 / mpi_size()));
    }
  }
}

TEST_CASE("lossagg robust gives a rank fed garbage less weight, and the clean ranks train better", "[mpi][lossagg][host]") {
  const int W = mpi_size();
  const auto dir = shared_scratch("lossagg_robust");
  const auto corpus = make_corpus(dir);
  const int bad = W - 1, steps = 12;
  const auto mean = train(make_program(dir, "mean", small_deck(corpus, dir + "/mean", steps, "lossagg mean\n")), bad);
  const auto robust =
      train(make_program(dir, "robust", small_deck(corpus, dir + "/robust", steps, "lossagg robust\n")), bad);
  REQUIRE(all_equal(robust.fingerprints));
  if (mpi_rank() != 0) return;
  const auto mean_log = metrics(dir + "/mean"), robust_log = metrics(dir + "/robust");
  REQUIRE(robust_log.size() >= size_t(steps));
  for (const auto& r : robust_log) {
    const auto w = r["lossagg_weights"].get<std::vector<double>>();
    double sum = 0;
    for (double x : w) sum += x;
    CHECK(sum == Approx(1.0));
  }
  // One rank in W is an outlier only when trimming floor(0.25 * W) >= 1 ranks
  // is allowed and there is a majority to compare against.
  if (W < 4) return;
  // Once the clean ranks have learned something the garbage rank stands out.
  double clean_robust = 0, clean_mean = 0;
  for (int step = 4; step <= steps; ++step) {
    const auto& r = robust_log[step - 1];
    REQUIRE(r["step"].get<int>() == step);
    const auto w = r["lossagg_weights"].get<std::vector<double>>();
    INFO("step " << step);
    for (int q = 0; q < W; ++q)
      if (q != bad) CHECK(w[bad] < w[q]);
  }
  for (int step = steps - 2; step <= steps; ++step) {
    const auto rm = robust_log[step - 1]["lossagg_rank_loss_main"].get<std::vector<double>>();
    const auto mm = mean_log[step - 1]["lossagg_rank_loss_main"].get<std::vector<double>>();
    for (int q = 0; q < W; ++q)
      if (q != bad) clean_robust += rm[q], clean_mean += mm[q];
  }
  CHECK(clean_robust < clean_mean);
  CHECK(last_val_loss(robust_log) < last_val_loss(mean_log));
}

TEST_CASE("lossagg softmax and uncertainty keep every rank's parameters identical", "[mpi][lossagg][host]") {
  const auto dir = shared_scratch("lossagg_kinds");
  const auto corpus = make_corpus(dir);
  const auto plain = train(make_program(dir, "plain", deepseek_deck(corpus, dir + "/plain", 6, "")));
  for (const std::string kind : {"softmax 0.5", "uncertainty"}) {
    INFO("lossagg " << kind);
    const std::string run_dir = dir + "/" + kind.substr(0, 7);
    const auto out = train(make_program(dir, "kind", deepseek_deck(corpus, run_dir, 6, "lossagg " + kind + "\n")));
    REQUIRE(all_equal(out.fingerprints));
    if (mpi_size() > 1 && kind != "uncertainty") CHECK(out.fingerprints != plain.fingerprints);
    if (kind == "uncertainty") {
      // the log-variances moved, identically everywhere (main, mtp, aux all active)
      REQUIRE(out.log_var.size() == 3);
      for (double s : out.log_var) CHECK(s != 0.0);
      std::vector<double> all(3 * mpi_size());
      MPI_Allgather(out.log_var.data(), 3, MPI_DOUBLE, all.data(), 3, MPI_DOUBLE, MPI_COMM_WORLD);
      for (int r = 1; r < mpi_size(); ++r)
        for (int i = 0; i < 3; ++i) CHECK(all[3 * r + i] == all[i]);
      CHECK(out.fingerprints != plain.fingerprints);
      for (const auto& r : metrics(run_dir)) REQUIRE(r.contains("lossagg_loss_weight_aux"));
    }
  }
}

TEST_CASE("lossagg softmax weighs the rank with the higher loss more", "[mpi][lossagg]") {
  if (mpi_size() < 2) return;
  const auto dir = shared_scratch("lossagg_softmax");
  const auto corpus = make_corpus(dir);
  train(make_program(dir, "s", small_deck(corpus, dir + "/s", 6, "lossagg softmax 0.5\n")), 0);
  for (const auto& r : metrics(dir + "/s")) {
    if (r["step"].get<int>() < 3) continue;
    const auto w = r["lossagg_weights"].get<std::vector<double>>();
    CHECK(w[0] == r["lossagg_weight_max"].get<double>());
  }
}

TEST_CASE("lossagg uncertainty: 2N steps equal N steps, checkpoint, resume, N steps", "[mpi][lossagg]") {
  const int N = 3;
  const auto dir = shared_scratch("lossagg_resume");
  const auto corpus = make_corpus(dir);
  const std::string agg = "lossagg uncertainty\n";
  const auto full = train(make_program(dir, "full", deepseek_deck(corpus, dir + "/full", 2 * N, agg)));
  train(make_program(dir, "first", deepseek_deck(corpus, dir + "/half", N, agg)));
  const auto second = train(make_program(dir, "second", deepseek_deck(corpus, dir + "/half", 2 * N, agg)), -1, "auto");
  REQUIRE(second.losses.size() == size_t(N));
  for (int i = 0; i < N; ++i) REQUIRE(second.losses[i] == full.losses[N + i]);
  REQUIRE(second.log_var == full.log_var);
  REQUIRE(second.fingerprints == full.fingerprints);
}

TEST_CASE("lossagg robust with sync local is refused, naming the run line", "[mpi][lossagg]") {
  const auto dir = shared_scratch("lossagg_refuse");
  const auto corpus = make_corpus(dir);
  // The deck refuses it, before a Trainer exists.
  REQUIRE_THROWS_WITH(make_program(dir, "bad", small_deck(corpus, dir + "/bad", 2, "sync local 2\nlossagg robust\n")),
                      Catch::Contains("bad.deck") && Catch::Contains("lossagg robust with sync local"));
}

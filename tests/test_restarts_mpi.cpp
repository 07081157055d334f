// sgdr warm restarts in the trainer: the record of every restart
// (lr_history.jsonl and the checkpoint), restart_from best going back to the
// cycle's best validation point, and exact resume across restarts.
#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include "mpi_fixture.h"
#include "train/schedule.h"

using namespace xx;
using namespace xx::test;

namespace {

std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

// val_loss by step from metrics.jsonl
std::map<int64_t, double> val_losses(const std::string& run_dir) {
  std::map<int64_t, double> out;
  for (const auto& r : read_jsonl(run_dir + "/metrics.jsonl"))
    if (r.contains("val_loss")) out[r["step"].get<int64_t>()] = r["val_loss"].get<double>();
  return out;
}

std::string ckpt(const std::string& run_dir, int64_t step) {
  return fmt::format("{}/ckpt/step_{:08d}.h5", run_dir, step);
}

}  // namespace

TEST_CASE("sgdr restarts are recorded in lr_history.jsonl and in the checkpoint", "[mpi][restart]") {
  const auto dir = shared_scratch("restarts");
  const auto corpus = make_corpus(dir);
  // warmup 2, period 3, mult 2: cycles start at steps 3, 6 and 12
  const std::string sgdr = "schedule sgdr period 3 mult 2 min_lr 3e-4 warmup 2 jitter 0.2\n";
  const auto program = make_program(dir, "deck", small_deck(corpus, dir + "/run", 12, sgdr));
  RunOptions options;
  options.quiet = true;
  Trainer trainer(MPI_COMM_WORLD, program, options);
  trainer.run();
  if (mpi_rank() != 0) return;
  const Schedule schedule(program.phases[0].config.optimizer, program.phases[0].config.schedule,
                          program.phases[0].config.seed);
  const auto history = read_jsonl(dir + "/run/lr_history.jsonl");
  REQUIRE(history.size() == 2);
  const int64_t steps[2] = {6, 12};
  for (int i = 0; i < 2; ++i) {
    INFO("restart " << i);
    REQUIRE(history[i]["step"] == steps[i]);
    REQUIRE(history[i]["cycle"] == i + 1);
    REQUIRE(history[i]["lr"].get<double>() == schedule.lr(steps[i]));
    REQUIRE(history[i]["val_loss"].get<double>() > 0);
    REQUIRE_FALSE(history[i].contains("restored_from"));  // restart_from last
  }
  // eval every 3 has no point at step 11: the restart before step 12 evaluated on its own.
  REQUIRE(val_losses(dir + "/run").count(11) == 0);
  const auto data = read_checkpoint(ckpt(dir + "/run", 12), whole_frame(trainer.model().layout()));
  const auto& series = data.series.at("lr_restarts");
  REQUIRE(series.size() == 10);
  REQUIRE(series[0] == 6);
  REQUIRE(series[1] == schedule.lr(6));
  REQUIRE(series[5] == 12);
  REQUIRE(series[7] == history[1]["val_loss"].get<double>());
}

TEST_CASE("restart_from best goes back to the cycle's best validation point", "[mpi][restart]") {
  const auto dir = shared_scratch("restart_best");
  const auto corpus = make_corpus(dir);
  // An lr far too high for this model, no warmup: the loss rises within the
  // first cycle, so the best point is not its last step.
  const std::string extra =
      "optimizer adamw lr 0.2 clip 0\n"
      "schedule sgdr period 5 min_lr 0.2 warmup 0 restart_from best\n"
      "eval every 1 batches 2\n"
      "checkpoint every 1\n";
  const auto program = make_program(dir, "deck", small_deck(corpus, dir + "/run", 12, extra));
  RunOptions options;
  options.quiet = true;
  Trainer trainer(MPI_COMM_WORLD, program, options);
  trainer.run();
  int64_t best = 0;
  if (mpi_rank() == 0) {
    const auto val = val_losses(dir + "/run");
    for (int64_t s = 1; s <= 5; ++s)
      if (best == 0 || val.at(s) < val.at(best)) best = s;
    INFO("val_loss per step of the first cycle: " << val.at(1) << " " << val.at(2) << " " << val.at(3) << " "
                                                   << val.at(4) << " " << val.at(5));
    REQUIRE(best < 5);  // the set-up works: the cycle ended worse than its best
    const auto history = read_jsonl(dir + "/run/lr_history.jsonl");
    REQUIRE(history.size() == 2);  // before steps 6 and 11
    REQUIRE(history[0]["step"] == 6);
    REQUIRE(history[0]["restored_from"] == best);
    REQUIRE(history[0]["restored_val_loss"].get<double>() == val.at(best));
    // The checkpoint after step 5 holds the state after the restart: step `best`'s, bit for bit.
    const Frame layout = whole_frame(trainer.model().layout());
    const auto at_best = read_checkpoint(ckpt(dir + "/run", best), layout);
    const auto restarted = read_checkpoint(ckpt(dir + "/run", 5), layout);
    REQUIRE(restarted.params == at_best.params);
    REQUIRE(restarted.adam_m == at_best.adam_m);
    REQUIRE(restarted.adam_v == at_best.adam_v);
  }
  MPI_Barrier(MPI_COMM_WORLD);

  // Resumed inside the second cycle, the restart before step 11 goes back to
  // a best state that partly came from the checkpoint: still bit for bit.
  const auto full = trainer.losses();
  const auto resumed = run_deck(program, ckpt(dir + "/run", 8));
  REQUIRE(resumed.size() == 4);
  for (int i = 0; i < 4; ++i) {
    INFO("step " << 9 + i);
    REQUIRE(resumed[i] == full[8 + i]);
  }
}

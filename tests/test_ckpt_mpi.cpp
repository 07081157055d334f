// Per-rank checkpoints (docs/CHECKPOINT.md, version 2): every rank's own
// state in /ranks/<r>, written collectively with parallel HDF5, so a run
// whose ranks disagree (sync local, clusters, compression residuals) resumes
// bit for bit from any step; diff codecs rebuild each rank within their bounds.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include "mpi_fixture.h"

using namespace xx;
using namespace xx::test;

namespace {

std::string ckpt(const std::string& run_dir, int64_t step) {
  return fmt::format("{}/ckpt/step_{:08d}.h5", run_dir, step);
}

struct Outcome {
  std::vector<double> losses;
  std::vector<uint64_t> fingerprints;  // every rank's parameters at the end
};

Outcome run(const Program& program, const std::string& resume = "") {
  RunOptions options;
  options.quiet = true;
  options.resume = resume;
  Trainer trainer(MPI_COMM_WORLD, program, options);
  trainer.run();
  return {trainer.losses(), all_fingerprints(trainer.model().params())};
}

}  // namespace

TEST_CASE("per-rank checkpoints resume bit for bit where ranks disagree", "[mpi][ckpt]") {
  const auto dir = shared_scratch("ckpt_ranks");
  const auto corpus = make_corpus(dir);
  // A checkpoint after step 4, between syncs (every 3) and cluster redraws;
  // the phase ends at step 8 with a global average.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"local", "sync local 3\ncheckpoint every 4 mode full\n"},
      {"local_outer_clusters",
       "sync local 3 outer nesterov lr 0.7 momentum 0.5\ntopology clusters 2 redraw 4\n"
       "checkpoint every 4 mode diff codec lossless\n"},
      {"compress_feedback", "compress topk 0.05 quant int8 feedback on momentum 0.5\ncheckpoint every 4 mode diff\n"},
  };
  for (const auto& [name, extra] : cases) {
    INFO(name);
    const auto full = run(make_program(dir, name + "_full", small_deck(corpus, dir + "/" + name + "_full", 8, extra)));
    const auto program = make_program(dir, name, small_deck(corpus, dir + "/" + name, 8, extra));
    const auto first = run(program);  // the same run, to have its checkpoint at step 4
    REQUIRE(first.losses == full.losses);
    const auto resumed = run(program, ckpt(dir + "/" + name, 4));
    REQUIRE(resumed.losses.size() == 4);
    for (int i = 0; i < 4; ++i) {
      INFO("step " << 5 + i);
      REQUIRE(resumed.losses[i] == full.losses[4 + i]);
    }
    REQUIRE(resumed.fingerprints == full.fingerprints);
  }
}

TEST_CASE("diff codecs: lossless is exact, int8 and topk stay within their bounds and take fewer bytes",
          "[mpi][ckpt]") {
  const auto dir = shared_scratch("ckpt_codecs");
  const auto corpus = make_corpus(dir);
  // sync local 4, checkpoint after step 2 of 3: the ranks hold different
  // weights (a phase's end would average them).
  const std::vector<std::pair<std::string, std::string>> modes = {
      {"full", "mode full"}, {"lossless", "mode diff codec lossless"}, {"int8", "mode diff codec int8 block 64"},
      {"topk", "mode diff codec topk ratio 0.1"}};
  std::map<std::string, std::string> files;
  std::unique_ptr<ParamLayout> layout_of_run;
  for (const auto& [name, line] : modes) {
    const auto extra = "sync local 4\ncheckpoint every 2 at_end no " + line + "\n";
    RunOptions options;
    options.quiet = true;
    Trainer trainer(MPI_COMM_WORLD, make_program(dir, name, small_deck(corpus, dir + "/" + name, 3, extra)), options);
    trainer.run();
    layout_of_run = std::make_unique<ParamLayout>(trainer.model().layout());
    files[name] = ckpt(dir + "/" + name, 2);
  }
  if (mpi_rank() != 0) return;
  const ParamLayout& layout = *layout_of_run;
  const auto base = read_checkpoint(files["full"], layout);
  const int64_t n = layout.total();
  for (int r = 0; r < mpi_size(); ++r) {
    INFO("rank " << r);
    const auto truth = read_rank_state(files["full"], layout, base, r);
    // Every mode's base is the same average, so every decode is against the same bits.
    REQUIRE(read_checkpoint(files["lossless"], layout).params == base.params);
    const auto lossless = read_rank_state(files["lossless"], layout, read_checkpoint(files["lossless"], layout), r);
    REQUIRE(lossless.params == truth.params);
    REQUIRE(lossless.adam_m == truth.adam_m);
    REQUIRE(lossless.adam_v == truth.adam_v);
    const auto int8 = read_rank_state(files["int8"], layout, read_checkpoint(files["int8"], layout), r);
    const auto topk = read_rank_state(files["topk"], layout, read_checkpoint(files["topk"], layout), r);
    // int8, per block of 64 (kernels/ckpt_codec.h): scale <= max |d| / 127 * (1 + 2^-15), and each
    // element is off by at most scale/2 plus the roundings of d and of the restoring add.
    for (int64_t b0 = 0; b0 < n; b0 += 64) {
      const int64_t b1 = std::min(n, b0 + 64);
      double max_d = 0;
      for (int64_t i = b0; i < b1; ++i) max_d = std::max(max_d, std::fabs(double(truth.params[i]) - double(base.params[i])));
      const double scale = max_d / 127 * (1 + std::ldexp(1.0, -15));
      for (int64_t i = b0; i < b1; ++i) {
        const double d = std::fabs(double(truth.params[i]) - double(base.params[i]));
        const double ulps = (d + std::fabs(double(int8.params[i]))) * std::ldexp(1.0, -23);
        INFO("entry " << i);
        REQUIRE(std::fabs(double(int8.params[i]) - double(truth.params[i])) <= scale / 2 + ulps);
      }
    }
    // topk 0.1: at least a tenth of the entries exact, the rest at the base,
    // and nothing dropped exceeds what was kept.
    int64_t exact = 0;
    double max_dropped = 0, min_kept = INFINITY;
    for (int64_t i = 0; i < n; ++i) {
      const double d = std::fabs(double(truth.params[i]) - double(base.params[i]));
      if (topk.params[i] == truth.params[i] && topk.params[i] != base.params[i]) {
        ++exact, min_kept = std::min(min_kept, d);
      } else if (topk.params[i] != truth.params[i]) {
        REQUIRE(topk.params[i] == base.params[i]);
        max_dropped = std::max(max_dropped, d);
      }
    }
    if (mpi_size() > 1) REQUIRE(exact > 0);  // one rank is its own average
    REQUIRE(max_dropped <= min_kept);
  }
  if (mpi_size() == 1) return;  // one rank is its own average: every difference is zero
  const auto size = [&](const std::string& m) { return std::filesystem::file_size(files[m]); };
  INFO("bytes: full " << size("full") << ", lossless " << size("lossless") << ", int8 " << size("int8") << ", topk "
                      << size("topk"));
  REQUIRE(size("lossless") < size("full"));
  REQUIRE(size("int8") < size("lossless"));
  REQUIRE(size("topk") < size("int8"));
}

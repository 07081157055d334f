// Training with compressed gradients (compress topk, src/comm/compressed_sync.h)
// over the real transports; ctest runs this binary at 2 and 4 ranks with UCX
// on TCP, so both the UCX and the MPI exchange can serve it.
#include <catch2/catch.hpp>
#include "core/error.h"
#include "kernels/compress.h"
#include "mpi_fixture.h"

using namespace xx;
using namespace xx::test;
namespace cx = xx::kernels::compress;

namespace {

struct Trace {
  std::vector<double> losses;
  std::vector<uint64_t> params;  // fingerprint after each step
  std::vector<CommStats> comm;
};

Trace train(const std::string& dir, const std::string& name, const std::string& extra, int steps) {
  const auto corpus = make_corpus(dir);
  RunOptions options;
  options.quiet = true;
  Trainer trainer(MPI_COMM_WORLD, make_program(dir, name, small_deck(corpus, dir + "/" + name, steps, extra)), options);
  Trace t;
  for (int s = 0; s < steps; ++s) {
    t.losses.push_back(trainer.train_step());
    const auto prints = all_fingerprints(trainer.model().params());
    REQUIRE(all_equal(prints));  // every rank decodes the same sum
    t.params.push_back(prints[0]);
    t.comm.push_back(trainer.last_comm());
  }
  return t;
}

}  // namespace

TEST_CASE("compress topk 1 without quantization is the dense all-reduce, bit for bit", "[compress][mpi]") {
  const auto sync = GENERATE(as<std::string>{}, "sync dense", "sync accumulate 2");
  const auto transport = GENERATE(as<std::string>{}, "ucx", "mpi");
  CAPTURE(sync, transport);
  const auto dir = shared_scratch("topk1");
  const Trace dense = train(dir, "dense", sync + "\n", 4);
  // min_size 100: the norm weights (32 values) take the dense part of the path.
  const Trace topk = train(dir, "topk", sync + "\ncompress topk 1 quant none min_size 100 transport " + transport + "\n", 4);
  if (mpi_size() == 2) {  // two addends: any reduction order gives the same bits
    REQUIRE(topk.losses == dense.losses);
    REQUIRE(topk.params == dense.params);
  } else {  // MPI may add four ranks' values in another order than rank order
    for (size_t s = 0; s < dense.losses.size(); ++s) REQUIRE(topk.losses[s] == Approx(dense.losses[s]).epsilon(1e-5));
  }
  for (const auto& c : topk.comm) REQUIRE(c.rounds == 2);  // one exchange, one all-reduce of the small tensors
}

TEST_CASE("compressed training over UCX and over MPI gives identical results", "[compress][mpi]") {
  const auto target = GENERATE(as<std::string>{}, "gradient", "update");
  CAPTURE(target);
  const auto dir = shared_scratch("transports_" + target);
  const std::string compress =
      "compress topk 0.05 quant int8 feedback on min_size 100 warmup 2 target " + target + " transport ";
  const Trace ucx = train(dir, "ucx", compress + "ucx\n", 5);
  const Trace mpi = train(dir, "mpi", compress + "mpi\n", 5);
  REQUIRE(ucx.losses == mpi.losses);
  REQUIRE(ucx.params == mpi.params);
  const Trace dense = train(dir, "dense", "", 5);
  REQUIRE(ucx.params.back() != dense.params.back());  // compression did change the update
  REQUIRE(ucx.losses.back() < ucx.losses.front() + 0.5);  // and training still works
}

TEST_CASE("bytes on the wire are the payload formula", "[compress][mpi]") {
  const auto quant = GENERATE(as<std::string>{}, "none", "int8", "int4");
  const auto transport = GENERATE(as<std::string>{}, "ucx", "mpi");
  CAPTURE(quant, transport);
  const auto dir = shared_scratch("bytes_" + quant + transport);
  const auto corpus = make_corpus(dir);
  const std::string extra = "compress topk 0.01 quant " + quant + " min_size 100 transport " + transport + "\n";
  RunOptions options;
  options.quiet = true;
  Trainer trainer(MPI_COMM_WORLD, make_program(dir, "deck", small_deck(corpus, dir + "/run", 3, extra)), options);
  // From the layout, independently of CompressedSync: each tensor of >= 100
  // values is one bucket (smaller than 1 MB) with its own payload; the rest
  // is all-reduced.
  const cx::Quant q = quant == "int8" ? cx::Quant::int8 : quant == "int4" ? cx::Quant::int4 : cx::Quant::none;
  int64_t sparse = 0, dense = 0, payload = 0;
  for (const auto& t : trainer.model().layout().tensors()) {
    REQUIRE(t.size < 262144);
    if (t.size < 100) {
      dense += t.size;
      continue;
    }
    sparse += t.size;
    payload += cx::payload_bytes(t.size, cx::topk_count(t.size, 0.01), q, 64);
  }
  REQUIRE(dense > 0);
  const int64_t peers = mpi_size() - 1;
  const int64_t expected = peers * (payload + (transport == "mpi" ? kMpiHeaderBytes : 0)) + dense * 4;
  for (int s = 0; s < 3; ++s) {
    trainer.train_step();
    REQUIRE(trainer.last_comm().bytes_sent == expected);
    REQUIRE(trainer.last_comm().rounds == 2);
  }
  // The dense all-reduce of the same model, for the record.
  INFO("dense bytes " << (sparse + dense) * 4 << ", compressed " << expected);
  REQUIRE(expected * 20 < (sparse + dense) * 4 * peers);
}

TEST_CASE("the ratio ramps from near dense to RATIO over the warmup", "[compress]") {
  const auto dir = shared_scratch("warmup");
  const auto corpus = make_corpus(dir);
  RunOptions options;
  options.quiet = true;
  Trainer trainer(MPI_COMM_WORLD,
                  make_program(dir, "deck", small_deck(corpus, dir + "/run", 1, "compress topk 0.001 warmup 100\n")),
                  options);
  const CompressedSync& c = *trainer.compressed();
  double previous = 1;
  for (int64_t s = 0; s < 100; ++s) {
    REQUIRE(c.ratio_at(s) < previous);
    REQUIRE(c.ratio_at(s) > 0.001);
    previous = c.ratio_at(s);
  }
  REQUIRE(c.ratio_at(0) == Approx(std::pow(0.001, 1.0 / 101)));
  REQUIRE(c.ratio_at(100) == 0.001);
  REQUIRE(c.ratio_at(1000) == 0.001);
  // At ratio 0.93 an index-value payload outweighs the dense bucket: the
  // first steps send it dense; by the end of the warmup it is compressed.
  REQUIRE(c.compressed_buckets(0, 2) == 0);
  REQUIRE(c.compressed_buckets(100, 2) == c.buckets());
  // Each rank sends R-1 payloads: in a larger group the ramp switches later.
  int switch_2 = 0, switch_8 = 0;
  while (c.compressed_buckets(switch_2, 2) < c.buckets()) ++switch_2;
  while (switch_8 < 100 && c.compressed_buckets(switch_8, 8) < c.buckets()) ++switch_8;
  REQUIRE(switch_8 > switch_2);
  for (int64_t step = 0; step <= 100; ++step) REQUIRE(c.compressed_buckets(step, 8) <= c.compressed_buckets(step, 2));
  REQUIRE(c.compressed_buckets(100, 8) > 0);  // the large tensors still pay 7 payloads
}

TEST_CASE("compress topk refuses sync local and topology ring", "[compress][deck]") {
  const auto dir = shared_scratch("refuse");
  const auto corpus = make_corpus(dir);
  for (const std::string extra : {"sync local 2\ncompress topk 0.1\n", "topology ring\ncompress topk 0.1\n"}) {
    CAPTURE(extra);
    // The deck refuses it (at the run line), before a Trainer exists.
    REQUIRE_THROWS_AS(make_program(dir, "deck", small_deck(corpus, dir + "/run", 1, extra)), InputError);
  }
}

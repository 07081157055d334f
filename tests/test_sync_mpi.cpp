// The sync strategies on their own (comm/sync_strategy.h), without a
// Trainer: small flat buffers with known values on every rank, each
// strategy's arithmetic against a host reference, its agreement answer, its
// state names, and the registry's choice and report. Runs at 1, 2 and 4 ranks.
#include <catch2/catch.hpp>
#include <cmath>
#include <numeric>
#include "mode_words.h"
#include "core/device_memory.h"
#include "comm/ops.h"
#include "comm/sync_strategy.h"
#include "core/error.h"
#include "mpi_fixture.h"

using namespace xx;
using namespace xx::test;

namespace {

// Rank r's value at i: distinct per rank and entry, exact in float.
float value(int rank, int64_t i) { return float((rank + 1) * 0.25 + double(i % 7) * 0.125); }

ModelConfig tiny_model() {
  ModelConfig m;
  m.dim = 4, m.layers = 1, m.heads = 2, m.ffn = 4, m.vocab = 2, m.seq = 4;
  return m;
}

// Flat buffers laid out like a tiny model's parameters (the compressor reads its tensor list).
struct Fixture {
  Communicator ops{MPI_COMM_WORLD, DenseTransport::automatic, SparseTransport::mpi};
  ParamLayout layout{tiny_model()};
  const int64_t P = layout.total();
  Buffer<float> params{"params", size_t(P)}, grads{"grads", size_t(P)};
  kernels::Moments m{"m", P, Precision::fp32}, v{"v", P, Precision::fp32};  // AdamW's, as the trainer hands them
  Fixture() {
    fill(params, 0), fill(grads, 0);
    m.in_fp32([&](Buffer<float>& b) { fill(b, 10); });
    v.in_fp32([&](Buffer<float>& b) { fill(b, 20); });
  }
  void fill(Buffer<float>& b, int offset) {
    auto h = xx::host_staging(b);
    for (int64_t i = 0; i < P; ++i) h(i) = value(mpi_rank() + offset, i);
    Kokkos::deep_copy(b, h);
  }
  SyncBuffers buffers() {
    return {MPI_COMM_WORLD, params, grads, {m, v}, &ops, 7,
            [this](Buffer<float> target, const CompressConfig& c, double mb) {
              return std::make_unique<CompressedSync>(layout.spans(), target, c, mb);
            },
            Ownership::whole(P), {}, {}};
  }
};

std::vector<float> host(const Buffer<float>& b) {
  std::vector<float> out(b.extent(0));
  Kokkos::deep_copy(Kokkos::View<float*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(out.data(), out.size()), b);
  return out;
}

// The mean over all ranks of value(r + offset, i), summed in rank order as a reference.
double mean_of(int64_t i, int offset) {
  double s = 0;
  for (int r = 0; r < mpi_size(); ++r) s += value(r + offset, i);
  return s / mpi_size();
}

SyncSettings settings(const std::string& sync_line, const std::string& topology = "full", int size = 2) {
  SyncSettings s;
  s.sync.kind = *mode_from_name<SyncKind>(sync_line);
  s.topology.kind = *mode_from_name<TopologyKind>(topology);
  s.topology.size = size;
  return s;
}

}  // namespace

TEST_CASE("sync dense: the gradients become their mean over every rank, the ranks agree", "[mpi][sync]") {
  Fixture f;
  SyncSettings s = settings("dense");
  const int64_t third = (f.P + 2) / 3;  // a third of the buffer a bucket: three buckets
  s.sync.bucket_mb = (double(third) + 0.5) * sizeof(float) / (1024.0 * 1024.0);
  std::string report;
  auto sync = choose_sync_strategy(f.buffers(), s, &report);
  CHECK(report.rfind("dense: 3 buckets", 0) == 0);
  CHECK(report.find("passed over: compressed-update (compress off), compressed-gradient (compress off), local "
                    "(sync dense), gossip (topology full)") != std::string::npos);
  REQUIRE(sync->micro_batches() == 1);
  sync->begin_step(0);
  sync->gradients_ready(f.P / 2);  // the backward finishes the end of the buffer first
  sync->gradients_ready(0);
  CommStats stats;
  sync->reduce_gradients(0, stats);
  const auto g = host(f.grads);
  for (int64_t i = 0; i < f.P; ++i) CHECK(g[i] == Approx(mean_of(i, 0)).epsilon(1e-6));
  CHECK(stats.rounds == (mpi_size() > 1 ? 3 : 0));
  CHECK(sync->agreement(1).all());
  StateRegistry state;
  sync->register_state(state);
  CHECK(state.entries().empty());  // nothing of its own to checkpoint
}

TEST_CASE("a dense all-reduce puts 2(g-1)/g of its bytes on the wire", "[mpi][sync]") {
  const int g = mpi_size();
  // The all-reduce op alone: 1000 floats, 4000 bytes handed to MPI.
  Communicator ops{MPI_COMM_WORLD, DenseTransport::automatic, SparseTransport::mpi};
  Buffer<float> buffer("buffer", 1000);
  Kokkos::deep_copy(buffer, 1.0f);
  CommStats op;
  ops.dense().execute(buffer.data(), 1000, MPI_COMM_WORLD, op);
  CHECK(op.bytes_sent == (g > 1 ? 4000 : 0));
  CHECK(op.wire_bytes == 2 * (g - 1) * 4000 / g);  // 4000 at 2 ranks, 6000 at 4
  if (g == 2) CHECK(op.wire_bytes == 4000);
  if (g == 4) CHECK(op.wire_bytes == 6000);
  CHECK(host(buffer)[999] == float(g));
  // sync dense's buckets: each bucket's all-reduce counted on its own.
  Fixture f;
  SyncSettings s = settings("dense");
  const int64_t third = (f.P + 2) / 3;
  s.sync.bucket_mb = (double(third) + 0.5) * sizeof(float) / (1024.0 * 1024.0);
  auto sync = choose_sync_strategy(f.buffers(), s);
  sync->begin_step(0);
  sync->gradients_ready(0);
  CommStats stats;
  sync->reduce_gradients(0, stats);
  int64_t wire = 0;
  for (int64_t end = f.P; end > 0; end -= third) wire += 2 * (g - 1) * (end - std::max<int64_t>(0, end - third)) * 4 / g;
  CHECK(stats.bytes_sent == (g > 1 ? f.P * 4 : 0));
  CHECK(stats.wire_bytes == wire);
  CommStats sum = op;
  sum += stats;
  CHECK(sum.wire_bytes == op.wire_bytes + stats.wire_bytes);
}

TEST_CASE("sync accumulate K: K micro-batches, one round, divided by W*K", "[mpi][sync]") {
  Fixture f;
  SyncSettings s = settings("accumulate");
  s.sync.every = 3;
  auto sync = choose_sync_strategy(f.buffers(), s);
  REQUIRE(sync->micro_batches() == 3);
  sync->begin_step(0);
  sync->gradients_ready(0);
  CommStats stats;
  sync->reduce_gradients(0, stats);
  const auto g = host(f.grads);
  for (int64_t i = 0; i < f.P; ++i) CHECK(g[i] == Approx(mean_of(i, 0) / 3).epsilon(1e-6));
}

TEST_CASE("sync local K: no gradient traffic; every K steps the parameters become the mean", "[mpi][sync]") {
  Fixture f;
  SyncSettings s = settings("local");
  s.sync.every = 2;
  auto sync = choose_sync_strategy(f.buffers(), s);
  sync->begin_step(0);
  CommStats stats;
  sync->reduce_gradients(0, stats);
  CHECK(stats.rounds == 0);
  CHECK(host(f.grads)[1] == value(mpi_rank(), 1));  // untouched: still this rank's own
  sync->after_step(1, stats);  // not a sync step
  CHECK(host(f.params)[1] == value(mpi_rank(), 1));
  CHECK_FALSE(sync->agreement(1).params);
  sync->after_step(2, stats);
  const auto p = host(f.params);
  for (int64_t i = 0; i < f.P; ++i) CHECK(p[i] == Approx(mean_of(i, 0)).epsilon(1e-6));
  CHECK(sync->agreement(2).params);
  CHECK_FALSE(sync->agreement(2).optimizer);  // each rank's AdamW moments are its own
  CHECK(sync->consensus_distance() >= 0);
  if (mpi_size() == 1) CHECK(sync->consensus_distance() == 0);
  // The phase ends in consensus: AdamW's moments too.
  sync->end_phase(2, stats);
  const auto m = f.m.to_host();
  for (int64_t i = 0; i < f.P; ++i) CHECK(m[i] == Approx(mean_of(i, 10)).epsilon(1e-6));
}

TEST_CASE("sync local nesterov: the outer step on anchor - mean, as the formula says", "[mpi][sync]") {
  Fixture f;
  SyncSettings s = settings("local");
  s.sync.every = 1, s.sync.outer = Outer::nesterov, s.sync.outer_lr = 0.5, s.sync.momentum = 0.9;
  // Every rank starts from the same anchor: the parameters at the phase start.
  Kokkos::deep_copy(f.params, 1.0f);
  auto sync = choose_sync_strategy(f.buffers(), s);
  StateRegistry state;
  sync->register_state(state);
  std::vector<std::string> names;
  for (const auto& e : state.entries()) names.push_back(e.name);
  CHECK(names == std::vector<std::string>{"outer.initial", "outer.anchor", "outer.momentum"});
  f.fill(f.params, 0);  // the ranks' local steps moved them apart
  CommStats stats;
  sync->after_step(1, stats);
  const auto p = host(f.params);
  for (int64_t i = 0; i < f.P; ++i) {
    const double delta = 1.0 - mean_of(i, 0), mom = delta;  // momentum 0 before
    CHECK(p[i] == Approx(1.0 - 0.5 * (delta + 0.9 * mom)).epsilon(1e-5));
  }
}

TEST_CASE("topology ring: the gradients become (left + self + right) / 3", "[mpi][sync]") {
  Fixture f;
  std::string report;
  auto sync = choose_sync_strategy(f.buffers(), settings("dense", "ring"), &report);
  CHECK(report.rfind("gossip: ", 0) == 0);
  sync->begin_step(0);
  CommStats stats;
  sync->reduce_gradients(0, stats);
  const int W = mpi_size(), r = mpi_rank();
  const auto g = host(f.grads);
  for (int64_t i = 0; i < f.P; ++i) {
    double expect = value(r, i);
    if (W == 2) expect = (value(0, i) + value(1, i)) / 2;
    if (W > 2) expect = (value((r + W - 1) % W, i) + value(r, i) + value((r + 1) % W, i)) / 3;
    CHECK(g[i] == Approx(expect).epsilon(1e-6));
  }
  CHECK_FALSE(sync->agreement(1).params);
}

TEST_CASE("topology clusters: groups agree among themselves; the phase end makes everyone agree", "[mpi][sync]") {
  Fixture f;
  auto sync = choose_sync_strategy(f.buffers(), settings("dense", "clusters", 2));
  sync->begin_step(0);
  sync->gradients_ready(0);
  CommStats stats;
  sync->reduce_gradients(0, stats);
  CHECK_FALSE(sync->agreement(1).all());  // clusters of 2 over 2 ranks is everyone, but no promise is made
  sync->end_phase(1, stats);
  const auto p = host(f.params);
  const auto m = f.m.to_host();
  for (int64_t i = 0; i < f.P; ++i) {
    CHECK(p[i] == Approx(mean_of(i, 0)).epsilon(1e-6));
    CHECK(m[i] == Approx(mean_of(i, 10)).epsilon(1e-6));
  }
}

TEST_CASE("compress topk 1: every entry through the sparse path is the mean; the residual is named state",
          "[mpi][sync]") {
  Fixture f;
  SyncSettings s = settings("dense");
  s.compress.kind = CompressKind::topk, s.compress.ratio = 1.0, s.compress.transport = SparseTransport::mpi;
  std::string report;
  auto sync = choose_sync_strategy(f.buffers(), s, &report);
  CHECK(report.rfind("compressed-gradient: ", 0) == 0);
  REQUIRE(sync->compressor() != nullptr);
  sync->begin_step(0);
  CommStats stats;
  sync->reduce_gradients(0, stats);
  const auto g = host(f.grads);
  for (int64_t i = 0; i < f.P; ++i) CHECK(g[i] == Approx(mean_of(i, 0)).epsilon(1e-6));
  CHECK(sync->agreement(1).all());
  StateRegistry state;
  sync->register_state(state);
  REQUIRE(state.entries().size() == 1);
  CHECK(state.entries()[0].name == "compress.residual");
  CHECK(state.entries()[0].place == StatePlace::rank_buffer);
}

TEST_CASE("compress exchange partitioned: the owner residual is named state and round-trips", "[mpi][sync]") {
  Fixture f;
  SyncSettings s = settings("dense");
  s.compress.kind = CompressKind::topk, s.compress.ratio = 1, s.compress.quant = Quant::int8, s.compress.transport = SparseTransport::mpi;
  s.compress.exchange = Exchange::partitioned;
  std::string report;
  auto sync = choose_sync_strategy(f.buffers(), s, &report);
  CHECK(report.find("exchange partitioned") != std::string::npos);
  sync->begin_step(0);
  CommStats stats;
  sync->reduce_gradients(0, stats);
  StateRegistry state;
  sync->register_state(state);
  REQUIRE(state.entries().size() == 2);
  const StateEntry& held = state.entries()[1];
  CHECK(held.name == "compress.owner_residual");
  CHECK(held.place == StatePlace::shared_buffer);  // one vector of the sparse part, re-split at any world size
  CHECK_FALSE(held.required);  // a checkpoint of an allgather run has none
  // the ranks' ranges put together: the sparse part (every tensor here), the same on every rank
  const CompressedSync& c = *sync->compressor();
  const std::vector<float> saved = held.save_floats();
  CHECK(int64_t(saved.size()) == c.sparse_size());
  int64_t total = 0;
  for (const auto& t : f.layout.spans()) total += t.size;
  CHECK(c.sparse_size() == total);
  CHECK(c.buckets() == int(f.layout.spans().size()));
  // The ranks agree on the vector, and the owners did hold something back.
  double kept = 0;
  for (float v : saved) kept += std::abs(v);
  double most = 0, least = 0;
  MPI_Allreduce(&kept, &most, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(&kept, &least, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  CHECK(most == least);
  if (mpi_size() > 1) CHECK(kept > 0);
  held.load_floats(std::vector<float>(saved.size(), 0.0f));
  CHECK(held.save_floats() == std::vector<float>(saved.size(), 0.0f));
  held.load_floats(saved);
  CHECK(held.save_floats() == saved);
}

TEST_CASE("compress target update: the parameters move by the group's mean change", "[mpi][sync]") {
  Fixture f;
  SyncSettings s = settings("dense");
  s.compress.kind = CompressKind::topk, s.compress.ratio = 1.0, s.compress.target = CompressTarget::update, s.compress.transport = SparseTransport::mpi;
  std::string report;
  auto sync = choose_sync_strategy(f.buffers(), s, &report);
  CHECK(report.rfind("compressed-update: ", 0) == 0);
  Kokkos::deep_copy(f.params, 2.0f);
  sync->before_update();
  f.fill(f.params, 0);  // "the optimizer step": params = value(rank, i)
  CommStats stats;
  sync->after_update(0, stats);
  const auto p = host(f.params);
  for (int64_t i = 0; i < f.P; ++i) CHECK(p[i] == Approx(mean_of(i, 0)).epsilon(1e-5));
  CHECK_FALSE(sync->agreement(1).optimizer);
}

TEST_CASE("a per-phase setting takes effect at its run: bucket size, evaluation, strategy", "[mpi][sync][deck]") {
  const auto dir = shared_scratch("phase_rule");
  const auto corpus = make_corpus(dir);
  // Phase 1: one bucket, eval only at the phase end; phase 2: tiny buckets, eval every step, local SGD after.
  const std::string deck = small_deck(corpus, dir + "/run", 2, "sync dense bucket_mb 8\n") +
                           "sync dense bucket_mb 0.001\neval every 1 batches 1\nrun 2\nsync local 2\nrun 2\n";
  RunOptions options;
  options.quiet = true;
  Trainer trainer(MPI_COMM_WORLD, make_program(dir, "deck", deck), options);
  CHECK_THAT(trainer.backends(), Catch::Contains("dense: 1 buckets of 8 MB"));
  trainer.run();
  if (mpi_rank() != 0) return;
  std::vector<nlohmann::json> log;
  std::ifstream in(dir + "/run/metrics.jsonl");
  for (std::string line; std::getline(in, line);) log.push_back(nlohmann::json::parse(line));
  REQUIRE(log.size() == 6);
  CHECK_FALSE(log[0].contains("val_loss"));  // eval every 3 in phase 1: only at its end
  CHECK(log[1].contains("val_loss"));
  CHECK(log[2].contains("val_loss"));        // eval every 1 from phase 2 on
  if (mpi_size() > 1) {
    CHECK(log[0]["comm_rounds"] == 1);      // one 8 MB bucket
    CHECK(log[2]["comm_rounds"].get<int64_t>() > 10);  // 1 KB buckets
    CHECK(log[4]["comm_bytes"].get<int64_t>() < 100);  // sync local: no gradient traffic between syncs
  }
  CHECK(log[5].contains("consensus_distance"));  // a local sync happened in phase 3
}

TEST_CASE("the dense transport: NCCL only with a GPU per rank of each node, every obstacle named", "[mpi][sync]") {
  NcclFacts gpu{true, true, false, 4, 4};
  CHECK(nccl_obstacles(gpu).empty());
  gpu.ranks_on_node = 8;
  CHECK(nccl_obstacles(gpu) == "8 ranks on a node share 4 visible GPUs (NCCL takes one GPU per rank)");
  gpu.gpus_on_node = 1, gpu.ranks_on_node = 2;
  CHECK(nccl_obstacles(gpu) == "2 ranks on a node share 1 visible GPU (NCCL takes one GPU per rank)");
  const NcclFacts host{false, false, false, 2, 0};  // a host build: no GPU question is asked
  CHECK(nccl_obstacles(host).find("not built") == 0);
  CHECK(nccl_obstacles(host).find("gradients live in host memory") != std::string::npos);
  CHECK(nccl_obstacles(host).find("GPU") == std::string::npos);
  const NcclFacts emulated{false, false, true, 2, 2};  // the emulation stands in for the build and the device
  CHECK(nccl_obstacles(emulated).empty());

  // This machine's facts: every rank of the world shares the one node.
  const NcclFacts here = gather_nccl_facts(MPI_COMM_WORLD);
  CHECK(here.ranks_on_node == mpi_size());
  CHECK(here.gpus_on_node == visible_gpus());
  // Asked for by name, MPI serves; NCCL refused with its reason where it cannot serve (a host build here).
  Communicator mpi(MPI_COMM_WORLD, DenseTransport::mpi, std::nullopt);
  CHECK(std::string(mpi.dense().name()) == "mpi");
  CHECK(mpi.report().find("(the deck's sync ... transport)") != std::string::npos);
  if (!nccl_obstacles(here).empty()) {
    try {
      Communicator nccl(MPI_COMM_WORLD, DenseTransport::nccl, std::nullopt);
      FAIL("transport nccl was accepted where NCCL cannot serve");
    } catch (const InputError& e) {
      CHECK(std::string(e.what()).find("NCCL cannot carry the dense sums here: " + nccl_obstacles(here)) !=
            std::string::npos);
    }
    Communicator automatic(MPI_COMM_WORLD, DenseTransport::automatic, std::nullopt);
    CHECK(std::string(automatic.dense().name()) == "mpi");
    CHECK(automatic.report().find("mpi (nccl: " + nccl_obstacles(here) + ")") != std::string::npos);
  }
}

TEST_CASE("the bucket reducer: each hook once, after its bucket's sum; never more than the bound in flight",
          "[mpi][sync]") {
  const int64_t n = 1000;
  const auto buckets = cut_from_end(n, 97, {{300, 450}});  // 97-element buckets, cut again at the run's edges
  // The cut: from the end, contiguous, and no bucket crosses 300 or 450.
  REQUIRE(buckets.front().end == n);
  REQUIRE(buckets.back().begin == 0);
  for (size_t b = 0; b + 1 < buckets.size(); ++b) REQUIRE(buckets[b + 1].end == buckets[b].begin);
  for (const auto& b : buckets) {
    CHECK(b.end - b.begin <= 97);
    CHECK(b.expert == (b.begin >= 300 && b.end <= 450));
    CHECK(!(b.begin < 300 && b.end > 300));
    CHECK(!(b.begin < 450 && b.end > 450));
  }
  Buffer<float> grads("grads", n);
  {
    auto h = xx::host_staging(grads);
    for (int64_t i = 0; i < n; ++i) h(i) = value(mpi_rank(), i);
    Kokkos::deep_copy(grads, h);
  }
  const int bound = 2;
  std::vector<int> hooked(buckets.size(), 0);
  bool sums_in_place = true;
  // The expert runs summed over this rank alone here (its own group): their values stay its own.
  BucketReducer reducer(grads, buckets, MPI_COMM_SELF, bound, [&](size_t b) {
    ++hooked[b];
    const auto h = host(grads);
    for (int64_t i = buckets[b].begin; i < buckets[b].end; ++i) {
      const double want = buckets[b].expert ? value(mpi_rank(), i) : mean_of(i, 0) * mpi_size();
      sums_in_place = sums_in_place && h[i] == float(want);
    }
  });
  reducer.begin(MPI_COMM_WORLD);
  REQUIRE(reducer.group_size() == mpi_size());
  for (int64_t offset = n - 50; offset > -50; offset -= 50) {
    reducer.ready(std::max<int64_t>(0, offset));
    size_t started = 0, done = 0;
    for (size_t b = 0; b < buckets.size(); ++b)
      if (buckets[b].begin >= std::max<int64_t>(0, offset)) ++started, done += hooked[b];
    CHECK(started - done <= size_t(bound));
  }
  reducer.finish();
  for (size_t b = 0; b < buckets.size(); ++b) CHECK(hooked[b] == 1);
  CHECK(sums_in_place);
  // On the wire: each shared bucket's all-reduce, 2 (g-1)/g of its bytes; the expert buckets' group is one rank.
  int64_t wire = 0;
  for (const auto& b : buckets)
    if (!b.expert) wire += allreduce_wire_bytes((b.end - b.begin) * int64_t(sizeof(float)), mpi_size());
  CHECK(reducer.stats().wire_bytes == wire);
  // A device all-reduce's sums land on its stream: no hook can follow them.
  CHECK_THROWS_AS(reducer.use_device_allreduce(Communicator(MPI_COMM_WORLD, DenseTransport::mpi,
                                                             SparseTransport::mpi).dense()),
                  std::logic_error);
}

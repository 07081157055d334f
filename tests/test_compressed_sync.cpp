// Training with compressed gradients (compress topk, src/comm/compressed_sync.h)
// over the real transports; ctest runs this binary at 2 and 4 ranks with UCX
// on TCP, so both the UCX and the MPI exchange can serve it.
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fmt/format.h>
#include "mode_words.h"
#include "comm/compressed_sync.h"
#include "comm/ops.h"
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

uint64_t mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Rank r's gradient at step s, entry i: magnitudes over four decades, some -0.
float gradient(int r, int s, int64_t i) {
  if (i % 97 == 0) return -0.0f;
  const uint64_t u = mix(uint64_t(r) << 48 ^ uint64_t(s) << 40 ^ uint64_t(i));
  return float(int64_t(u % 20001) - 10000) * 1e-4f * float(1 << (2 * ((u >> 32) % 4)));
}

std::vector<float> to_host(const Buffer<float>& b) {
  std::vector<float> out(b.extent(0));
  Kokkos::deep_copy(Kokkos::View<float*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(out.data(),
                                                                                                    out.size()),
                    b);
  return out;
}

void from_host(Buffer<float>& b, const std::vector<float>& v) {
  Kokkos::deep_copy(b, Kokkos::View<const float*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
                           v.data(), v.size()));
}

// One CompressedSync over a flat buffer of tensors of `sizes`, averaging
// over the world, without a Trainer.
struct Direct {
  std::vector<TensorSpan> spans;
  int64_t P = 0;
  Buffer<float> grads;
  Communicator ops;
  CompressedSync sync;
  Direct(const std::vector<int64_t>& sizes, CompressConfig cfg, double bucket_mb, const std::string& transport)
      : spans(make_spans(sizes)),
        P(spans.back().offset + spans.back().size),
        grads("grads", P),
        ops(MPI_COMM_WORLD, DenseTransport::mpi, *mode_from_name<SparseTransport>(transport)),
        sync(spans, grads, cfg, bucket_mb) {}
  static std::vector<TensorSpan> make_spans(const std::vector<int64_t>& sizes) {
    std::vector<TensorSpan> out;
    int64_t at = 0;
    for (size_t t = 0; t < sizes.size(); ++t) out.push_back({fmt::format("t{}", t), at, sizes[t]}), at += sizes[t];
    return out;
  }
  // The world's average of this rank's `g`; returns it, with the step's traffic in `stats`.
  std::vector<float> reduce(const std::vector<float>& g, int64_t step, CommStats& stats) {
    from_host(grads, g);
    std::vector<int> members(mpi_size());
    for (int r = 0; r < mpi_size(); ++r) members[r] = r;
    sync.reduce(members, MPI_COMM_WORLD, step, 1, ops, stats);
    return to_host(grads);
  }
};

// min_size 0: every tensor in the sparse part.
CompressConfig topk(double ratio, const std::string& quant, const std::string& exchange) {
  CompressConfig c;
  c.kind = CompressKind::topk, c.ratio = ratio, c.quant = *mode_from_name<Quant>(quant);
  c.exchange = *mode_from_name<Exchange>(exchange), c.min_size = 0;
  return c;
}

std::vector<float> world_gather(const std::vector<float>& mine) {  // every rank's, rank after rank
  std::vector<float> all(mine.size() * mpi_size());
  MPI_Allgather(mine.data(), int(mine.size()), MPI_FLOAT, all.data(), int(mine.size()), MPI_FLOAT, MPI_COMM_WORLD);
  return all;
}

// The buckets CompressedSync cuts (each tensor on its own, in pieces of bucket_mb), as (begin, end).
std::vector<std::pair<int64_t, int64_t>> buckets_of(const std::vector<int64_t>& sizes, double bucket_mb) {
  const int64_t per = int64_t(bucket_mb * 1024 * 1024 / sizeof(float));
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t at = 0;
  for (int64_t n : sizes) {
    for (int64_t b = 0; b < n; b += per) out.push_back({at + b, at + std::min(n, b + per)});
    at += n;
  }
  return out;
}

}  // namespace

TEST_CASE("compress topk 1 without quantization is the dense all-reduce, bit for bit", "[compress][mpi]") {
  const auto sync = GENERATE(as<std::string>{}, "sync dense", "sync accumulate 2");
  const auto transport = GENERATE(as<std::string>{}, "ucx", "mpi");
  const auto exchange = GENERATE(as<std::string>{}, "allgather", "partitioned");
  CAPTURE(sync, transport, exchange);
  const auto dir = shared_scratch("topk1");
  const Trace dense = train(dir, "dense", sync + "\n", 4);
  // min_size 100: the norm weights (32 values) take the dense part of the path.
  const Trace topk = train(dir, "topk", sync + "\ncompress topk 1 quant none min_size 100 transport " + transport +
                                            " exchange " + exchange + "\n", 4);
  if (mpi_size() == 2) {  // two addends: any reduction order gives the same bits
    REQUIRE(topk.losses == dense.losses);
    REQUIRE(topk.params == dense.params);
  } else {  // MPI may add four ranks' values in another order than rank order
    for (size_t s = 0; s < dense.losses.size(); ++s) REQUIRE(topk.losses[s] == Approx(dense.losses[s]).epsilon(1e-5));
  }
  // one exchange (partitioned: two), one all-reduce of the small tensors
  for (const auto& c : topk.comm) REQUIRE(c.rounds == (mpi_size() == 1 ? 0 : exchange == Exchange::partitioned ? 3 : 2));
}

TEST_CASE("compressed training over UCX and over MPI gives identical results", "[compress][mpi]") {
  const auto target = GENERATE(as<std::string>{}, "gradient", "update");
  const auto exchange = GENERATE(as<std::string>{}, "allgather", "partitioned");
  CAPTURE(target, exchange);
  const auto dir = shared_scratch("transports_" + target + exchange);
  const std::string compress = "compress topk 0.05 quant int8 feedback on min_size 100 warmup 2 target " + target +
                               " exchange " + exchange + " transport ";
  const Trace ucx = train(dir, "ucx", compress + "ucx\n", 5);
  const Trace mpi = train(dir, "mpi", compress + "mpi\n", 5);
  REQUIRE(ucx.losses == mpi.losses);
  REQUIRE(ucx.params == mpi.params);
  const Trace dense = train(dir, "dense", "", 5);
  REQUIRE(ucx.params.back() != dense.params.back());  // compression did change the update
  REQUIRE(ucx.losses.back() < ucx.losses.front() + 0.5);  // and training still works
}

TEST_CASE("bytes on the wire are the payload formula", "[compress][mpi]") {
  const auto quant = GENERATE(as<std::string>{}, "none", "int8", "int4", "bf16");
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
  const cx::Quant q = quant == Quant::int8   ? cx::Quant::int8
                      : quant == Quant::int4 ? cx::Quant::int4
                      : quant == Quant::bf16 ? cx::Quant::bf16
                                        : cx::Quant::none;
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

// exchange partitioned (src/comm/compressed_sync.h): the sparse
// reduce-scatter and all-gather, on CompressedSync directly.

TEST_CASE("exchange partitioned at ratio 1 without quantization is allgather's sum, bit for bit", "[compress][mpi]") {
  // Tensors smaller than the group (pieces of length 0), odd sizes, and one cut into two buckets.
  const std::vector<int64_t> sizes = {5, 37, 1000, 70001, 300000};
  const double mb = 1.0;
  Direct allgather(sizes, topk(1, "none", "allgather"), mb, "auto");
  Direct partitioned(sizes, topk(1, "none", "partitioned"), mb, "auto");
  REQUIRE(partitioned.sync.describe().find("exchange partitioned") != std::string::npos);
  REQUIRE(allgather.sync.describe().find("exchange allgather") != std::string::npos);
  const int R = mpi_size();
  for (int step = 0; step < 2; ++step) {
    std::vector<float> g(allgather.P);
    for (int64_t i = 0; i < allgather.P; ++i) g[i] = gradient(mpi_rank(), step, i);
    CommStats a, p;
    const auto ours = partitioned.reduce(g, step, p), theirs = allgather.reduce(g, step, a);
    REQUIRE(std::memcmp(ours.data(), theirs.data(), ours.size() * sizeof(float)) == 0);
    // Both are the rank-ordered sum, scaled by 1/R: ((g_0 + g_1) + g_2) + ..., -0 kept.
    int64_t differ = 0;
    for (int64_t i = 0; i < allgather.P; ++i) {
      float sum = gradient(0, step, i);
      for (int r = 1; r < R; ++r) sum += gradient(r, step, i);
      if (R > 1) sum *= 1.0f / float(R);
      differ += std::memcmp(&sum, &ours[i], sizeof(float)) != 0;
    }
    REQUIRE(differ == 0);
    REQUIRE(p.rounds == (R > 1 ? 2 : 0));  // no dense part here: the two exchanges
    REQUIRE(p.wire_bytes == p.bytes_sent);
  }
}

TEST_CASE("exchange partitioned conserves mass: what was put in is what was summed plus what is held back",
          "[compress][mpi]") {
  // top-k 0.01 with int8; the 37-value tensor is not worth compressing and
  // goes dense, with both residuals flushed into the all-reduce. Ratio 1
  // with bf16 (the bf16 all-reduce): every bucket sparse, the residuals hold
  // the rounding errors. Feedback off: nothing is held back (and what was not
  // sent is dropped).
  const std::vector<int64_t> sizes = {200000, 5000, 37};
  const double mb = 0.5;
  const auto feedback = GENERATE(true, false);
  const auto mode = GENERATE(table<double, std::string>({{0.01, "int8"}, {1.0, "bf16"}}));
  const double ratio = std::get<0>(mode);
  const std::string quant = std::get<1>(mode);
  CAPTURE(feedback, ratio, quant);
  CompressConfig cfg = topk(ratio, quant, "partitioned");
  cfg.feedback = feedback;
  Direct d(sizes, cfg, mb, "auto");
  const int R = mpi_size();
  d.sync.own_pieces(R, mpi_rank());  // as the sync strategy does (else the first reduce does it)
  const auto buckets = buckets_of(sizes, mb);
  REQUIRE(buckets.size() == 4);
  // The owners' residuals as one vector of the sparse part: here (min_size 0)
  // the packed order is the flat one.
  auto owner_flat = [&](const std::vector<float>& whole) {
    REQUIRE(int64_t(whole.size()) == d.P);
    return std::vector<double>(whole.begin(), whole.end());
  };
  auto column_sums = [&](const std::vector<float>& all) {
    std::vector<double> s(d.P, 0.0);
    for (int r = 0; r < R; ++r)
      for (int64_t i = 0; i < d.P; ++i) s[i] += all[r * d.P + i];
    return s;
  };
  double held_back = 0;
  for (int step = 0; step < 3; ++step) {
    std::vector<float> g(d.P);
    for (int64_t i = 0; i < d.P; ++i) g[i] = gradient(mpi_rank(), step, i);
    const auto res0 = world_gather(to_host(d.sync.residual())), own0 = d.sync.owner_residual_whole(MPI_COMM_WORLD);
    const auto grads = world_gather(g);
    CommStats stats;
    const auto avg = d.reduce(g, step, stats);
    const auto res1 = world_gather(to_host(d.sync.residual())), own1 = d.sync.owner_residual_whole(MPI_COMM_WORLD);
    // exactly this rank's range, no padding
    REQUIRE(int64_t(d.sync.owner_residual().extent(0)) == d.P * (mpi_rank() + 1) / R - d.P * mpi_rank() / R);
    const auto in_g = column_sums(grads), in_r = column_sums(res0), out_r = column_sums(res1);
    const auto in_o = owner_flat(own0), out_o = owner_flat(own1);
    CAPTURE(step);
    int64_t bad = 0;
    if (!feedback) {  // nothing is held back, so what was not sent is dropped
      for (int64_t i = 0; i < d.P; ++i) bad += in_r[i] != 0 || out_r[i] != 0 || in_o[i] != 0 || out_o[i] != 0;
      REQUIRE(bad == 0);
      continue;
    }
    for (int64_t i = 0; i < d.P; ++i) {
      const double put_in = in_g[i] + in_r[i] + in_o[i];
      const double out = double(R) * avg[i] + out_r[i] + out_o[i];
      double scale = 0;
      for (int r = 0; r < R; ++r) scale += std::abs(grads[r * d.P + i]) + std::abs(res0[r * d.P + i]);
      scale += std::abs(in_o[i]) + std::abs(out_o[i]) + 1e-30;
      if (!(std::abs(put_in - out) <= 1e-5 * scale)) ++bad;
      held_back += std::abs(out_r[i]) + std::abs(out_o[i]);
    }
    REQUIRE(bad == 0);
  }
  if (feedback) REQUIRE(held_back > 0);  // not trivially: the residuals did hold mass back
}

namespace {

// Bytes this rank sends in one partitioned step over a group of R, top-k
// `ratio` int8 (B = 64) of one bucket of n whose selected entries are the
// multiples of 100 (compressed_sync.h's formula; h = the per-message header).
int64_t partitioned_bytes(int64_t n, double ratio, int R, int me, int64_t h) {
  using cx::payload_bytes, cx::topk_count;
  int64_t bytes = 0;
  for (int j = 0; j < R; ++j) {  // round 1: the entries in range j, to its owner, as one payload
    if (j == me) continue;
    const int64_t begin = n * j / R, end = n * (j + 1) / R, e = (end + 99) / 100 - (begin + 99) / 100;
    bytes += h + (e ? payload_bytes(end - begin, e, cx::Quant::int8, 64) : 0);
  }
  const int64_t m = n * (me + 1) / R - n * me / R;  // round 2: this rank's piece of the sum, to everyone
  return bytes + (R - 1) * (h + payload_bytes(m, topk_count(m, ratio), cx::Quant::int8, 64));
}

}  // namespace

TEST_CASE("exchange partitioned: bytes per rank are the formula, bounded in the group size", "[compress][mpi]") {
  const auto transport = GENERATE(as<std::string>{}, "ucx", "mpi");
  CAPTURE(transport);
  const int64_t n = int64_t(1) << 20, k = cx::topk_count(n, 0.01);
  REQUIRE(k == 10486);  // the multiples of 100 below 2^20: exactly the entries top-k takes
  const int64_t h = transport == "mpi" ? kMpiHeaderBytes : 0;
  const int R = mpi_size(), me = mpi_rank();
  std::vector<float> g(n);
  for (int64_t i = 0; i < n; ++i)
    g[i] = i % 100 == 0 ? 1.0f + float((i / 100 + me) % 89) / 89.0f : float((i * 7 + me) % 13) * 1e-4f;
  Direct partitioned({n}, topk(0.01, "int8", "partitioned"), 4.0, transport);
  Direct allgather({n}, topk(0.01, "int8", "allgather"), 4.0, transport);
  REQUIRE(partitioned.sync.buckets() == 1);
  CommStats p, a;
  partitioned.reduce(g, 0, p);
  allgather.reduce(g, 0, a);
  const int64_t payload = cx::payload_bytes(n, k, cx::Quant::int8, 64);
  REQUIRE(a.bytes_sent == int64_t(R - 1) * (h + payload));
  REQUIRE(p.bytes_sent == (R > 1 ? partitioned_bytes(n, 0.01, R, me, h) : 0));
  REQUIRE(p.wire_bytes == p.bytes_sent);
  REQUIRE(p.rounds == (R > 1 ? 2 : 0));
  // What the ring all-reduce of the dense bucket would put on the wire, per rank.
  auto ring = [&](int g) { return allreduce_wire_bytes(4 * n, g); };
  auto most = [&](int g) {  // the formula's largest figure over the ranks of a group of g
    int64_t top = 0;
    for (int r = 0; r < g; ++r) top = std::max(top, partitioned_bytes(n, 0.01, g, r, h));
    return top;
  };
  if (R > 1) REQUIRE(p.bytes_sent * 50 < ring(R));
  for (int g : {2, 4, 8}) REQUIRE(most(g) * 50 < ring(g));
  // From 4 to 8 ranks: partitioned grows like the ring's 2 (g-1)/g (7/6), allgather like g - 1 (7/3).
  CHECK(double(most(8)) / double(most(4)) <= 1.02 * double(ring(8)) / double(ring(4)));
  CHECK(double(most(8)) / double(most(4)) < 1.2);
  if (std::getenv("XX_PRINT_BYTES") && me == 0)
    std::printf("bytes per rank, %d ranks, %s, n %lld top-k 0.01 int8: partitioned %lld (most %lld), allgather "
                "%lld, ring all-reduce of the dense bucket %lld\n",
                R, transport.c_str(), (long long)n, (long long)p.bytes_sent, (long long)most(R),
                (long long)a.bytes_sent, (long long)ring(R));
}

TEST_CASE("exchange partitioned: 2N steps equal N steps, checkpoint, resume, N steps", "[compress][mpi]") {
  const int N = 4;
  const auto dir = shared_scratch("partitioned_resume");
  const auto corpus = make_corpus(dir);
  // Feedback on, momentum correction, and a ratio that leaves the owners residuals to carry over.
  const std::string compress =
      "compress topk 0.05 quant int8 momentum 0.9 min_size 100 exchange partitioned transport mpi\n";
  const auto full = run_deck(make_program(dir, "full", small_deck(corpus, dir + "/full", 2 * N, compress)));
  const auto first = run_deck(make_program(dir, "first", small_deck(corpus, dir + "/half", N, compress)));
  const auto second =
      run_deck(make_program(dir, "second", small_deck(corpus, dir + "/half", 2 * N, compress)), "auto");
  REQUIRE(first.size() == size_t(N));
  REQUIRE(second.size() == size_t(N));
  for (int i = 0; i < N; ++i) REQUIRE(first[i] == full[i]);
  for (int i = 0; i < N; ++i) {
    INFO("step " << N + i + 1);
    REQUIRE(second[i] == full[N + i]);  // bit-identical after the restart: the owner residual came back
  }
}

TEST_CASE("exchange partitioned at ratio 1 with bf16 is a bf16 all-reduce: its sum, and 2 (R-1)/R x 2n bytes",
          "[compress][mpi]") {
  // Step 1 (nothing held back yet): each rank sends its values rounded to
  // bf16; the owner of a range sums them in rank order in fp32, rounds the sum
  // to bf16 and sends it to everyone; the average is that times 1/R. Bytes:
  // to every other owner one payload of its range, then this rank's range of
  // the sum to every other member; per value 2 bytes, so about 2 (R-1)/R x 2n,
  // half the fp32 ring all-reduce.
  const std::vector<int64_t> sizes = {5, 1000, 70001};
  Direct d(sizes, topk(1, "bf16", "partitioned"), 1.0, "mpi");
  REQUIRE(d.sync.describe().find("bf16 quant") != std::string::npos);
  const int R = mpi_size(), me = mpi_rank();
  std::vector<float> g(d.P);
  for (int64_t i = 0; i < d.P; ++i) g[i] = gradient(me, 0, i);
  CommStats stats;
  const auto avg = d.reduce(g, 0, stats);
  int64_t differ = 0;
  for (int64_t i = 0; i < d.P; ++i) {
    float sum = cx::from_bf16(cx::to_bf16(gradient(0, 0, i)));
    for (int r = 1; r < R; ++r) sum += cx::from_bf16(cx::to_bf16(gradient(r, 0, i)));
    float want = cx::from_bf16(cx::to_bf16(sum));
    if (R > 1) want *= 1.0f / float(R);
    differ += !(want == avg[i]);
  }
  REQUIRE(differ == 0);
  int64_t expect = 0;
  for (int j = 0; j < R && R > 1; ++j) {
    const int64_t m = d.P * (j + 1) / R - d.P * j / R;  // range j of the sparse part (all of it here)
    const int64_t range = m ? cx::payload_bytes(m, m, cx::Quant::bf16, 64) : 0;
    if (j != me) expect += kMpiHeaderBytes + range;  // round 1: to owner j
    else expect += (R - 1) * (kMpiHeaderBytes + range);  // round 2: this rank's range of the sum
  }
  REQUIRE(stats.bytes_sent == expect);
  REQUIRE(stats.wire_bytes == expect);
  if (R > 1) {  // headers and tables aside, 2 bytes a value: 2 (R-1)/R x 2n within 1%
    const int64_t headers = 2 * (R - 1) * (kMpiHeaderBytes + cx::kHeaderBytes + 4);
    const double bf16_ring = double(2 * (R - 1)) / R * double(2 * d.P);
    CHECK(std::abs(double(expect) - bf16_ring) <= 0.01 * bf16_ring + double(headers));
    CHECK(expect - headers <= allreduce_wire_bytes(4 * d.P, R) / 2);  // half the fp32 ring
  }
}

TEST_CASE("exchange partitioned with many buckets: one message per peer and round, under 1/50 of the ring",
          "[compress][mpi]") {
  // 64 tensors of 16384 values, buckets of 8192 (128 buckets); top-k 0.01
  // int8. In each bucket the selected entries are known: the positions
  // 100 t from the bucket's start (83 of them: k = topk_count(8192, 0.01)).
  const auto transport = GENERATE(as<std::string>{}, "mpi", "ucx");
  CAPTURE(transport);
  const int64_t T = 64, n = 16384, per = 8192;
  const double mb = double(per) * sizeof(float) / (1024.0 * 1024.0);
  const int64_t S = T * n, k = cx::topk_count(per, 0.01);
  REQUIRE(k == (per + 99) / 100);
  const int64_t h = transport == "mpi" ? kMpiHeaderBytes : 0;
  const int R = mpi_size(), me = mpi_rank();
  std::vector<float> g(S);
  for (int64_t i = 0; i < S; ++i) {
    const int64_t at = i % per;  // the position in its bucket
    g[i] = at % 100 == 0 ? 1.0f + float((at / 100 + me + i / per) % 89) / 89.0f : float((i * 7 + me) % 13) * 1e-4f;
  }
  Direct partitioned(std::vector<int64_t>(T, n), topk(0.01, "int8", "partitioned"), mb, transport);
  Direct allgather(std::vector<int64_t>(T, n), topk(0.01, "int8", "allgather"), mb, transport);
  REQUIRE(partitioned.sync.buckets() == int(S / per));
  CommStats p, a;
  const auto ours = partitioned.reduce(g, 0, p);
  allgather.reduce(g, 0, a);
  // The formula: round 1, this rank's entries in range j to owner j as one
  // payload; round 2, the owner's top-k per segment of its range to everyone.
  auto range = [&](int64_t j) { return std::pair<int64_t, int64_t>{S * j / R, S * (j + 1) / R}; };
  auto payload = [&](int64_t m, int64_t e) { return e ? cx::payload_bytes(m, e, cx::Quant::int8, 64) : int64_t(0); };
  int64_t payloads = 0;
  for (int j = 0; j < R; ++j) {
    const auto [lo, hi] = range(j);
    if (j != me) {
      int64_t e = 0;  // selected positions 100 t from each bucket start, inside [lo, hi)
      for (int64_t b = 0; b < S; b += per)
        for (int64_t i = b; i < b + per; i += 100) e += i >= lo && i < hi;
      payloads += payload(hi - lo, e);
    } else {
      int64_t kk = 0;  // k' = the sum over the range's segments (its intersections with the buckets)
      for (int64_t b = 0; b < S; b += per) {
        const int64_t len = std::min(hi, b + per) - std::max(lo, b);
        if (len > 0) kk += cx::topk_count(len, 0.01);
      }
      payloads += (R - 1) * payload(hi - lo, kk);
    }
  }
  if (R > 1) {
    REQUIRE(p.bytes_sent - payloads == 2 * (R - 1) * h);  // one message per peer and round, whatever the buckets
    REQUIRE(p.rounds == 2);
  } else {
    REQUIRE(p.bytes_sent == 0);
  }
  const int64_t ring = allreduce_wire_bytes(4 * S, R);
  if (R > 1) REQUIRE(p.bytes_sent * 50 < ring);
  if (R > 2) REQUIRE(p.bytes_sent < a.bytes_sent);
  // Every selected entry arrived: the sum holds each rank's value at the selected positions (int8, so within a scale).
  if (R > 1) {
    const auto all = world_gather(g);
    int64_t bad = 0;
    for (int64_t i = 0; i < S; ++i) {
      if ((i % per) % 100 != 0) continue;
      double want = 0;
      for (int r = 0; r < R; ++r) want += all[r * S + i];
      want /= R;
      bad += !(std::abs(ours[i] - want) <= 0.02 * std::abs(want));
    }
    REQUIRE(bad == 0);
  }
  if (std::getenv("XX_PRINT_BYTES") && me == 0)
    std::printf("many buckets (%lld of %lld), %d ranks, %s, top-k 0.01 int8: partitioned %lld, allgather %lld, "
                "ring all-reduce of the dense part %lld\n",
                (long long)(S / per), (long long)per, R, transport.c_str(), (long long)p.bytes_sent,
                (long long)a.bytes_sent, (long long)ring);
}

TEST_CASE("exchange partitioned: the owner residual is one vector of the sparse part, re-split at any world size",
          "[compress][mpi]") {
  // Three steps at this world size leave the owners something held back; the
  // whole vector (as checkpoints save it) is then loaded by CompressedSyncs
  // laid out for other group shapes, member by member: their ranges put
  // together are the vector bit for bit, so its sum is conserved.
  const std::vector<int64_t> sizes = {70001, 5000, 37, 1000};
  Direct d(sizes, topk(0.05, "int8", "partitioned"), 0.25, "auto");
  for (int step = 0; step < 3; ++step) {
    std::vector<float> g(d.P);
    for (int64_t i = 0; i < d.P; ++i) g[i] = gradient(mpi_rank(), step, i);
    CommStats stats;
    d.reduce(g, step, stats);
  }
  const std::vector<float> whole = d.sync.owner_residual_whole(MPI_COMM_WORLD);
  REQUIRE(int64_t(whole.size()) == d.sync.sparse_size());
  double held = 0;
  for (float v : whole) held += std::abs(v);
  if (mpi_size() > 1) REQUIRE(held > 0);
  for (int W : {1, 2, 3, 5, 8}) {
    CAPTURE(W);
    std::vector<float> joined;
    for (int me = 0; me < W; ++me) {  // no transport needed: only the layout and the load
      CompressedSync other(d.spans, Buffer<float>("test::grads", d.P), topk(0.05, "int8", "partitioned"), 0.25);
      other.own_pieces(W, me);
      REQUIRE(other.load_owner_residual_whole(whole));
      const auto mine = to_host(other.owner_residual());
      REQUIRE(int64_t(mine.size()) == other.range_begin(me + 1) - other.range_begin(me));
      joined.insert(joined.end(), mine.begin(), mine.end());
    }
    REQUIRE(std::memcmp(joined.data(), whole.data(), whole.size() * sizeof(float)) == 0);
  }
  CompressedSync other(d.spans, Buffer<float>("test::grads", d.P), topk(0.05, "int8", "partitioned"), 0.25);
  other.own_pieces(2, 1);
  REQUIRE_FALSE(other.load_owner_residual_whole(std::vector<float>(whole.size() + 1, 1.0f)));
  const auto zero = to_host(other.owner_residual());
  REQUIRE(std::all_of(zero.begin(), zero.end(), [](float x) { return x == 0.0f; }));
}

TEST_CASE("exchange partitioned: a resume on half the ranks takes the owners' residual back whole",
          "[compress][mpi]") {
  // N steps on every rank, a checkpoint; then the first half of the ranks
  // (a communicator of their own) resume from it: their owner residuals put
  // together are the saved vector bit for bit, so its sum is conserved.
  const int R = mpi_size();
  if (R < 2) return;
  const int N = 3;
  const auto dir = shared_scratch("partitioned_rescale");
  const auto corpus = make_corpus(dir);
  const std::string compress =
      "compress topk 0.05 quant int8 momentum 0.9 min_size 100 exchange partitioned transport mpi\n";
  std::vector<float> saved;
  {
    RunOptions options;
    options.quiet = true;
    Trainer trainer(MPI_COMM_WORLD, make_program(dir, "first", small_deck(corpus, dir + "/run", N, compress)),
                    options);
    trainer.run();
    saved = trainer.compressed()->owner_residual_whole(MPI_COMM_WORLD);
  }
  double held = 0;
  for (float v : saved) held += std::abs(v);
  REQUIRE(held > 0);
  // make_program is collective over the world: every rank makes the deck first
  const Program second = make_program(dir, "second", small_deck(corpus, dir + "/run", N, compress));
  MPI_Comm half = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, mpi_rank() < R / 2 ? 0 : MPI_UNDEFINED, mpi_rank(), &half);
  if (half != MPI_COMM_NULL) {
    {
      RunOptions options;
      options.quiet = true;
      options.resume = "auto";
      Trainer trainer(half, second, options);
      const auto back = trainer.compressed()->owner_residual_whole(half);
      REQUIRE(back.size() == saved.size());
      REQUIRE(std::memcmp(back.data(), saved.data(), saved.size() * sizeof(float)) == 0);
    }
    MPI_Comm_free(&half);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

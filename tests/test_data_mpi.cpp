// Multi-rank data tests: the common pool's shared-memory window (one copy per
// node, the same bytes on every rank), shards that stay disjoint beside the
// pool, and chaos runs that replay and resume bit for bit from their seed.
#include <catch2/catch.hpp>
#include <fstream>
#include <set>
#include <nlohmann/json.hpp>
#include "data/common_pool.h"
#include "data/sampler.h"
#include "mpi_fixture.h"

using namespace xx;
using namespace xx::test;

namespace {

uint64_t fnv1a(const void* data, size_t bytes) {
  uint64_t x = 1469598103934665603ULL;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) x = (x ^ p[i]) * 1099511628211ULL;
  return x;
}

// A deck whose data line replays ${chaos_seed} (0: draw one) from a -var.
Program chaos_program(const std::string& dir, const std::string& name, const std::string& corpus, int steps,
                      uint64_t chaos_seed) {
  std::string deck = "variable chaos_seed 0\n" + small_deck(corpus, dir + "/" + name, steps);
  const std::string plain = "workers 2\n";
  deck.replace(deck.find(plain), plain.size(),
               "workers 2 shuffle chaos chaos_seed ${chaos_seed} common 0.1 common_rate 0.25\n");
  const std::string path = dir + "/" + name + "_" + std::to_string(steps) + ".deck";
  if (mpi_rank() == 0) std::ofstream(path) << deck;
  MPI_Barrier(MPI_COMM_WORLD);
  std::map<std::string, std::string> vars;
  if (chaos_seed != 0) vars["chaos_seed"] = std::to_string(chaos_seed);
  return build_program(read_deck(path, vars), true);
}

// The chaos seed a run recorded in RUN_DIR/run.json, as rank 0 reads it.
uint64_t recorded_seed(const std::string& run_dir) {
  uint64_t seed = 0;
  if (mpi_rank() == 0) seed = nlohmann::json::parse(std::ifstream(run_dir + "/run.json"))["chaos_seed"].get<uint64_t>();
  MPI_Bcast(&seed, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  return seed;
}

}  // namespace

TEST_CASE("common pool: one shared copy per node, the same bytes everywhere, disjoint shards", "[data][mpi]") {
  const int world = mpi_size(), rank = mpi_rank();
  const auto dir = shared_scratch("pool");
  // One text file, or the same bytes cut into three memory-mapped shards.
  const bool many = GENERATE(false, true);
  CAPTURE(many);
  const std::string text = make_corpus(dir);
  if (many && rank == 0) {
    const Corpus whole = Corpus::load(text, DataFormat::bytes);
    const int64_t cut[] = {0, 9000, 25000, whole.size()};
    for (int s = 0; s < 3; ++s) {
      std::vector<int32_t> t;
      for (int64_t i = cut[s]; i < cut[s + 1]; ++i) t.push_back(whole.token(i));
      write_shard(dir + "/pool_" + std::to_string(s) + ".bin", t, 256, 2);
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const Corpus corpus = many ? Corpus::load(dir + "/pool_*.bin", DataFormat::shard) : Corpus::load(text, DataFormat::bytes);
  REQUIRE(corpus.files().size() == (many ? 3u : 1u));
  const int64_t seq = 32;
  const WindowSplit split = split_windows(corpus, seq, 0.1);
  SamplerOptions options;
  options.shuffle = Shuffle::chaos;
  options.seed = 0x5eed;
  options.common = 0.1;
  options.common_rate = 0.25;
  DistributedSampler sampler(split.train_windows, world, rank, options);
  REQUIRE(!sampler.pool_windows().empty());

  CommonPool pool(MPI_COMM_WORLD, corpus, sampler.pool_windows(), seq);
  const int64_t pool_bytes = int64_t(sampler.pool_windows().size()) * (seq + 1) * 4;
  REQUIRE(pool.bytes() == pool_bytes);
  // One copy per node: the leader's share of the window is the whole pool, the others' nothing.
  CHECK(pool.local_bytes() == (pool.node_rank() == 0 ? pool_bytes : 0));
  int64_t node_total = 0;
  const int64_t mine = pool.local_bytes();
  MPI_Allreduce(&mine, &node_total, 1, MPI_INT64_T, MPI_SUM, pool.node_comm());
  CHECK(node_total == pool_bytes);
  int leaders = 0, is_leader = pool.node_rank() == 0;
  MPI_Allreduce(&is_leader, &leaders, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  CHECK(leaders == pool.nodes());

  // Every rank reads the same bytes, and they are the corpus windows of the pool.
  const PoolTokens tokens = pool.tokens();
  const uint64_t hash = fnv1a(tokens.tokens, size_t(pool_bytes));
  std::vector<uint64_t> hashes(world);
  MPI_Allgather(&hash, 1, MPI_UINT64_T, hashes.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD);
  CHECK(all_equal(hashes));
  for (size_t i = 0; i < sampler.pool_windows().size(); ++i)
    for (int64_t t = 0; t <= seq; ++t)
      REQUIRE(tokens.window(int64_t(i))[t] == corpus.token(corpus.window_start(sampler.pool_windows()[i], seq) + t));

  // The shard samples of one epoch stay disjoint across ranks (but for the padding) and leave out the pool.
  std::vector<int64_t> shard;
  for (int64_t k = 0; int64_t(shard.size()) < sampler.per_rank_per_epoch(); ++k) {
    const Sample s = sampler.sample(k);
    if (s.pool_slot < 0) shard.push_back(s.window);
  }
  std::vector<int64_t> all(shard.size() * world);
  MPI_Allgather(shard.data(), int(shard.size()), MPI_INT64_T, all.data(), int(shard.size()), MPI_INT64_T,
                MPI_COMM_WORLD);
  const int64_t shard_windows = split.train_windows - int64_t(sampler.pool_windows().size());
  const std::set<int64_t> distinct(all.begin(), all.end());
  CHECK(int64_t(distinct.size()) == shard_windows);
  CHECK(int64_t(all.size()) - shard_windows < world);  // duplicates: the padding only
  for (int64_t w : sampler.pool_windows()) CHECK(distinct.count(w) == 0);
}

TEST_CASE("shuffle chaos: the recorded seed replays and resumes the run bit for bit", "[data][mpi]") {
  const auto dir = shared_scratch("chaos");
  const auto corpus = make_corpus(dir);
  const int N = 3;
  // A fresh chaos run draws its seed and records it; it stops after N steps with a checkpoint.
  const auto first = run_deck(chaos_program(dir, "half", corpus, N, 0));
  const uint64_t seed = recorded_seed(dir + "/half");
  REQUIRE(seed != 0);
  // Resuming it continues the checkpoint's seed: the deck's chaos_seed stays 0.
  const auto second = run_deck(chaos_program(dir, "half", corpus, 2 * N, 0), "auto");
  CHECK(recorded_seed(dir + "/half") == seed);
  // Replaying with -var chaos_seed gives the same losses, bit for bit, across the restart.
  const auto replay = run_deck(chaos_program(dir, "replay", corpus, 2 * N, seed));
  CHECK(recorded_seed(dir + "/replay") == seed);
  REQUIRE(first.size() == size_t(N));
  REQUIRE(second.size() == size_t(N));
  REQUIRE(replay.size() == size_t(2 * N));
  for (int i = 0; i < N; ++i) {
    INFO("step " << i + 1);
    CHECK(first[i] == replay[i]);
    CHECK(second[i] == replay[N + i]);
  }
  // Another seed is another run.
  const auto other = run_deck(chaos_program(dir, "other", corpus, N, seed + 1));
  CHECK(std::vector<double>(replay.begin(), replay.begin() + N) != other);
}

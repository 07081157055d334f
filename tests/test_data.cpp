// Data pipeline tests: corpus formats and their errors, the window split, the
// sampler's epoch partition across ranks, and the loader's determinism.
#include <catch2/catch.hpp>
#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>
#include "mode_words.h"
#include "core/error.h"
#include "core/permutation.h"
#include "data/corpus.h"
#include "data/loader.h"
#include "data/sampler.h"
#include "data/seeding.h"
#include "data/tokenizer.h"
#include "deck/deck.h"
#include "temp_dir.h"

namespace fs = std::filesystem;
using namespace xx;
using xx::test::TempDir;

namespace {

void write_bytes(const std::string& path, const std::vector<unsigned char>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

std::vector<unsigned char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void put_u32(std::vector<unsigned char>& b, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) b[at + i] = (unsigned char)(v >> (8 * i));
}

// The InputError message of loading `path`; fails the test when nothing is thrown.
std::string load_error(const std::string& path, DataFormat format) {
  try {
    Corpus::load(path, format);
  } catch (const InputError& e) {
    return e.what();
  }
  FAIL("no InputError loading " << path << " as " << mode_name(format));
  return "";
}

std::vector<unsigned char> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<unsigned char> b(n);
  for (auto& c : b) c = (unsigned char)(gen() & 0xff);
  return b;
}

}  // namespace

TEST_CASE("bytes corpus holds every byte of the file", "[data]") {
  TempDir tmp;
  std::vector<unsigned char> bytes = {'h', 'i', 0x00, 0xff, '\n', 0x80, 0x7f};
  write_bytes(tmp.file("a.txt"), bytes);
  const Corpus c = Corpus::load(tmp.file("a.txt"), DataFormat::bytes);
  REQUIRE(c.size() == int64_t(bytes.size()));
  CHECK(c.vocab() == 256);
  CHECK(c.path() == tmp.file("a.txt"));
  for (size_t i = 0; i < bytes.size(); ++i) CHECK(c.token(int64_t(i)) == int32_t(bytes[i]));
}

TEST_CASE("bytes corpus errors: empty, missing file", "[data]") {
  TempDir tmp;
  write_bytes(tmp.file("empty.txt"), {});
  std::string m = load_error(tmp.file("empty.txt"), DataFormat::bytes);
  CHECK_THAT(m, Catch::Contains(tmp.file("empty.txt")) && Catch::Contains("offset 0"));
  m = load_error(tmp.file("missing.txt"), DataFormat::bytes);
  CHECK_THAT(m, Catch::Contains(tmp.file("missing.txt")) && Catch::Contains("cannot open"));
}

TEST_CASE("shard round-trip with 2- and 4-byte tokens, versions 2 and 1", "[data]") {
  TempDir tmp;
  for (int version : {2, 1})
    for (int width : {2, 4}) {
      const int32_t vocab = width == 2 ? 65536 : 100000;
      const std::vector<int32_t> tokens = {0, 1, 255, 256, 4660, vocab - 1, 7};
      const std::string path = tmp.file(fmt::format("v{}w{}.bin", version, width));
      const ShardInfo info{0x0123456789abcdefull, 12345};
      write_shard(path, tokens, vocab, width, info, version);

      // The layout on disk, read independently of the loader.
      const size_t header = version == 2 ? 64 : 32;
      const auto raw = read_bytes(path);
      REQUIRE(raw.size() == header + tokens.size() * width);
      CHECK(std::string(raw.begin(), raw.begin() + 8) == "XXTOKENS");
      CHECK(raw[8] == version);
      CHECK(raw[12] == width);
      CHECK(raw[16] == tokens.size());
      CHECK(raw[24 + 2] == ((uint32_t(vocab) >> 16) & 0xff));
      CHECK((raw[header + 4 * width] | raw[header + 4 * width + 1] << 8) == 4660);  // little-endian 0x1234
      if (version == 2) {
        CHECK(raw[32] == 0xef);  // tokenizer hash, little-endian
        CHECK(raw[39] == 0x01);
        CHECK((raw[40] | raw[41] << 8) == 12345);  // text bytes
        CHECK(std::all_of(raw.begin() + 48, raw.begin() + 64, [](unsigned char b) { return b == 0; }));
      }
      CHECK(!fs::exists(path + ".tmp." + std::to_string(::getpid())));

      const Corpus c = Corpus::load(path, DataFormat::shard);
      CHECK(c.vocab() == vocab);
      REQUIRE(c.files().size() == 1);
      CHECK(c.files()[0].version() == version);
      CHECK(c.files()[0].info().tokenizer_hash == (version == 2 ? info.tokenizer_hash : 0));
      CHECK(c.files()[0].info().text_bytes == (version == 2 ? info.text_bytes : 0));
      REQUIRE(c.size() == int64_t(tokens.size()));
      for (size_t i = 0; i < tokens.size(); ++i) CHECK(c.token(int64_t(i)) == tokens[i]);
    }
}

TEST_CASE("shard errors name the file and the offset", "[data]") {
  TempDir tmp;
  const std::string good = tmp.file("good.bin");
  std::vector<int32_t> tokens(200);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(i % 250);
  write_shard(good, tokens, 250, 2);
  const auto base = read_bytes(good);
  REQUIRE_NOTHROW(Corpus::load(good, DataFormat::shard));

  auto broken = [&](const std::string& name, auto&& edit) {
    auto b = base;
    edit(b);
    write_bytes(tmp.file(name), b);
    return load_error(tmp.file(name), DataFormat::shard);
  };
  using Catch::Contains;

  std::string m = broken("magic.bin", [](auto& b) { std::copy_n("ABCDEFGH", 8, b.begin()); });
  CHECK_THAT(m, Contains(tmp.file("magic.bin") + ": offset 0: bad magic 'ABCDEFGH' (expected 'XXTOKENS'"));

  m = broken("version.bin", [](auto& b) { put_u32(b, 8, 3); });
  CHECK_THAT(m, Contains(tmp.file("version.bin") + ": offset 8:") && Contains("version 3 (expected 1 or 2)"));

  m = broken("width.bin", [](auto& b) { put_u32(b, 12, 3); });
  CHECK_THAT(m, Contains(tmp.file("width.bin") + ": offset 12:") && Contains("expected 2 or 4"));

  m = broken("short.bin", [](auto& b) { b.resize(64 + 100 * 2 + 1); });
  CHECK_THAT(m, Contains(tmp.file("short.bin") + ": offset 264: file holds 100 tokens, header says 200"));

  m = broken("short_header.bin", [](auto& b) { b.resize(40); });
  CHECK_THAT(m, Contains(tmp.file("short_header.bin") + ": offset 40:") && Contains("64-byte version-2 shard header"));

  m = broken("header.bin", [](auto& b) { b.resize(20); });
  CHECK_THAT(m, Contains(tmp.file("header.bin") + ": offset 20:") && Contains("32-byte shard header"));

  m = broken("vocab.bin", [](auto& b) { b[64 + 5 * 2] = 250; });  // token 5 := 250 = vocab
  CHECK_THAT(m, Contains(tmp.file("vocab.bin") + ": offset 74:") && Contains("token 250"));

  m = broken("trailing.bin", [](auto& b) { b.push_back(0); });
  CHECK_THAT(m, Contains(tmp.file("trailing.bin") + ": offset 464:"));

  m = broken("count.bin", [](auto& b) { std::fill(b.begin() + 16, b.begin() + 24, 0); });
  CHECK_THAT(m, Contains(tmp.file("count.bin") + ": offset 16:"));

  m = broken("reserved.bin", [](auto& b) { put_u32(b, 28, 9); });
  CHECK_THAT(m, Contains(tmp.file("reserved.bin") + ": offset 28:"));

  m = broken("reserved2.bin", [](auto& b) { b[50] = 1; });
  CHECK_THAT(m, Contains(tmp.file("reserved2.bin") + ": offset 50: reserved byte is 1 (expected 0)"));

  CHECK_THROWS_AS(write_shard(tmp.file("bad.bin"), {1, 2}, 256, 3), InputError);
  CHECK_THROWS_AS(write_shard(tmp.file("bad.bin"), {1, 256}, 256, 2), InputError);
  CHECK(!fs::exists(tmp.file("bad.bin")));
}

TEST_CASE("split_windows counts and the too-small corpus", "[data]") {
  TempDir tmp;
  auto corpus_of = [&](size_t n) {
    write_bytes(tmp.file("c.txt"), random_bytes(n, 1));
    return Corpus::load(tmp.file("c.txt"), DataFormat::bytes);
  };
  const Corpus c101 = corpus_of(101);  // (101-1)/10 = 10 windows
  WindowSplit s = split_windows(c101, 10, 0.1);
  CHECK(s.seq == 10);
  CHECK(s.train_windows == 9);
  CHECK(s.valid_windows == 1);
  s = split_windows(c101, 10, 0.0);  // at least one validation window
  CHECK((s.train_windows == 9 && s.valid_windows == 1));
  s = split_windows(c101, 10, 0.25);  // 2.5 rounds to 3
  CHECK((s.train_windows == 7 && s.valid_windows == 3));

  const Corpus c100 = corpus_of(100);  // 99/10 = 9: the last window needs token 100
  s = split_windows(c100, 10, 0.1);
  CHECK((s.train_windows + s.valid_windows == 9));
  CHECK((s.train_windows + s.valid_windows) * 10 <= c100.size() - 1);

  const Corpus c21 = corpus_of(21);
  s = split_windows(c21, 10, 0.1);
  CHECK((s.train_windows == 1 && s.valid_windows == 1));

  const Corpus c20 = corpus_of(20);
  try {
    split_windows(c20, 10, 0.1);
    FAIL("no InputError for a 20-token corpus at seq 10");
  } catch (const InputError& e) {
    CHECK_THAT(std::string(e.what()), Catch::Contains(c20.path()) && Catch::Contains("20 tokens") &&
                                          Catch::Contains("need at least 21 tokens"));
  }
  // A large valid fraction needs more windows: 0.75 of 2 rounds to 2, leaving
  // none; 0.75 of 3 rounds to 2, leaving one.
  try {
    split_windows(c21, 10, 0.75);
    FAIL("no InputError for valid_fraction 0.75 with two windows");
  } catch (const InputError& e) {
    CHECK_THAT(std::string(e.what()), Catch::Contains("need at least 31 tokens"));
  }
  CHECK_THROWS_AS(split_windows(c101, 10, 1.0), InputError);
  CHECK_THROWS_AS(split_windows(c101, 0, 0.1), InputError);
}

TEST_CASE("permutation is a deterministic, seed-dependent, uniform shuffle", "[data]") {
  const auto p = permutation(1000, 7);
  auto sorted = p;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1000; ++i) REQUIRE(sorted[i] == i);
  CHECK(permutation(1000, 7) == p);
  CHECK(permutation(1000, 8) != p);
  CHECK(permutation(0, 1).empty());
  CHECK(permutation(1, 1) == std::vector<int64_t>{0});
  // Pinned against an independent Python implementation of the same
  // splitmix64 + Lemire + Fisher-Yates: any platform must reproduce these.
  CHECK(permutation(10, 42) == std::vector<int64_t>{8, 3, 6, 5, 4, 0, 9, 2, 1, 7});
  CHECK(permutation(16, 0xdeadbeef) == std::vector<int64_t>{9, 8, 11, 10, 15, 12, 1, 14, 6, 3, 7, 2, 5, 0, 13, 4});
  // All 6 orders of 3 elements about equally often (a biased shuffle is not).
  std::map<std::vector<int64_t>, int> seen;
  for (uint64_t seed = 0; seed < 6000; ++seed) ++seen[permutation(3, seed)];
  CHECK(seen.size() == 6);
  for (const auto& [perm, n] : seen) {
    INFO("order " << perm[0] << perm[1] << perm[2]);
    CHECK((n > 850 && n < 1150));
  }
}

TEST_CASE("sampler: each epoch is complete across ranks, disjoint but for the padding", "[data]") {
  for (int world : {1, 2, 3, 4}) {
    for (int64_t n : {2, 3, 7, 12, 13, 48, 101}) {
      INFO("world " << world << ", windows " << n);
      std::vector<DistributedSampler> ranks;
      for (int r = 0; r < world; ++r) ranks.emplace_back(n, world, r, 1234);
      const int64_t per = (n + world - 1) / world;
      for (const auto& s : ranks) REQUIRE(s.per_rank_per_epoch() == per);

      // Rebuild the padded permutation of each epoch from the ranks' streams:
      // rank r's i-th sample of the epoch sits at position r + i*W.
      std::vector<std::vector<int64_t>> padded(2, std::vector<int64_t>(per * world));
      for (int64_t e = 0; e < 2; ++e)
        for (int r = 0; r < world; ++r)
          for (int64_t i = 0; i < per; ++i) {
            const int64_t k = e * per + i;
            REQUIRE(ranks[r].epoch(k) == e);
            padded[e][r + i * world] = ranks[r].window(k);
          }

      for (int64_t e = 0; e < 2; ++e) {
        const auto& p = padded[e];
        // Complete: the union over ranks covers every window.
        std::set<int64_t> all(p.begin(), p.end());
        CHECK(int64_t(all.size()) == n);
        CHECK(*all.begin() == 0);
        CHECK(*all.rbegin() == n - 1);
        // Duplicates are exactly the padding.
        CHECK(int64_t(p.size()) - int64_t(all.size()) == per * world - n);
        // All ranks agree on one permutation: its first N positions are
        // distinct, and the padding repeats its start.
        CHECK(std::set<int64_t>(p.begin(), p.begin() + n).size() == size_t(n));
        for (int64_t j = n; j < per * world; ++j) CHECK(p[j] == p[j % n]);
        if (n % world == 0) {
          for (int a = 0; a < world; ++a)
            for (int b = a + 1; b < world; ++b)
              for (int64_t i = 0; i < per; ++i)
                for (int64_t j = 0; j < per; ++j) CHECK(p[a + i * world] != p[b + j * world]);
        }
      }
      if (n >= 7) CHECK(padded[0] != padded[1]);  // reshuffled each epoch
    }
  }
  // The stream is a pure function of k: random access matches sequential.
  DistributedSampler seq_s(37, 3, 2, 99), rand_s(37, 3, 2, 99), other(37, 3, 2, 100);
  std::vector<int64_t> forward;
  for (int64_t k = 0; k < 100; ++k) forward.push_back(seq_s.window(k));
  for (int64_t k = 99; k >= 0; k -= 7) CHECK(rand_s.window(k) == forward[k]);
  std::vector<int64_t> other_w;
  for (int64_t k = 0; k < 100; ++k) other_w.push_back(other.window(k));
  CHECK(other_w != forward);
  CHECK_THROWS(DistributedSampler(10, 2, 2, 0));
  CHECK_THROWS(DistributedSampler(0, 1, 0, 0));
}

namespace {

struct LoaderFixture {
  TempDir tmp;
  Corpus corpus;
  int64_t seq = 8;
  int batch = 4;
  WindowSplit split;
  LoaderFixture() {
    write_bytes(tmp.file("c.bin"), random_bytes(8 * 53 + 1, 5));  // 53 windows
    corpus = Corpus::load(tmp.file("c.bin"), DataFormat::bytes);
    split = split_windows(corpus, seq, 0.1);
  }
  DistributedSampler sampler() const { return DistributedSampler(split.train_windows, 3, 1, 2024); }
  // Batch i built directly from the sampler, with no loader involved.
  Batch reference(int64_t i) const {
    auto s = sampler();
    std::vector<int64_t> w;
    for (int64_t j = 0; j < batch; ++j) w.push_back(s.window(i * batch + j));
    return make_batch(corpus, w, 0, seq, i);
  }
};

}  // namespace

TEST_CASE("loader: batches do not depend on workers or queue size", "[data]") {
  LoaderFixture f;
  REQUIRE(f.split.train_windows == 48);
  std::vector<Batch> ref;
  for (int64_t i = 0; i < 20; ++i) ref.push_back(f.reference(i));  // 80 samples: crosses epochs of 16
  for (int workers : {0, 1, 3})
    for (int queue : {1, 4}) {
      INFO("workers " << workers << ", queue " << queue);
      BatchLoader loader(f.corpus, f.sampler(), 0, f.batch, f.seq, workers, queue, 0);
      for (int64_t i = 0; i < 20; ++i) {
        const Batch b = loader.next();
        CHECK(b.index == i);
        CHECK(b.inputs == ref[i].inputs);
        CHECK(b.targets == ref[i].targets);
        CHECK(loader.position() == i + 1);
      }
    }
}

TEST_CASE("loader: start_batch resumes at the same batch", "[data]") {
  LoaderFixture f;
  for (int64_t k : {0, 7, 13, 31}) {
    INFO("start_batch " << k);
    BatchLoader fresh(f.corpus, f.sampler(), 0, f.batch, f.seq, 2, 2, 0);
    Batch kth;
    for (int64_t i = 0; i <= k; ++i) kth = fresh.next();
    BatchLoader resumed(f.corpus, f.sampler(), 0, f.batch, f.seq, 2, 2, k);
    CHECK(resumed.position() == k);
    const Batch b = resumed.next();
    CHECK(b.index == k);
    CHECK(b.inputs == kth.inputs);
    CHECK(b.targets == kth.targets);
    CHECK(resumed.next().inputs == fresh.next().inputs);
  }
}

TEST_CASE("loader: windows hold the corpus tokens, targets shifted by one", "[data]") {
  LoaderFixture f;
  auto s = f.sampler();
  BatchLoader loader(f.corpus, f.sampler(), 0, f.batch, f.seq, 1, 2, 0);
  for (int64_t i = 0; i < 5; ++i) {
    const Batch b = loader.next();
    REQUIRE(b.inputs.size() == size_t(f.batch * f.seq));
    REQUIRE(b.targets.size() == size_t(f.batch * f.seq));
    for (int64_t j = 0; j < f.batch; ++j) {
      const int64_t start = s.window(i * f.batch + j) * f.seq;
      for (int64_t t = 0; t < f.seq; ++t) {
        CHECK(b.inputs[j * f.seq + t] == f.corpus.token(start + t));
        CHECK(b.targets[j * f.seq + t] == f.corpus.token(start + t + 1));
        if (t + 1 < f.seq) CHECK(b.targets[j * f.seq + t] == b.inputs[j * f.seq + t + 1]);
      }
    }
  }
  // Validation windows count from first_window = train_windows.
  const int64_t v = f.split.valid_windows - 1;
  const Batch vb = make_batch(f.corpus, {v}, f.split.train_windows, f.seq, 0);
  const int64_t start = (f.split.train_windows + v) * f.seq;
  for (int64_t t = 0; t < f.seq; ++t) {
    CHECK(vb.inputs[t] == f.corpus.token(start + t));
    CHECK(vb.targets[t] == f.corpus.token(start + t + 1));
  }
  CHECK(start + f.seq == f.corpus.size() - 1);  // the last window ends at the last token
  CHECK_THROWS(make_batch(f.corpus, {v + 1}, f.split.train_windows, f.seq, 0));
  // A sampler reaching past the corpus is caught at construction.
  CHECK_THROWS(BatchLoader(f.corpus, DistributedSampler(54, 1, 0, 0), 0, f.batch, f.seq, 1, 1, 0));
}

TEST_CASE("loader: destructor returns promptly while workers wait", "[data]") {
  LoaderFixture f;
  using clock = std::chrono::steady_clock;
  for (int taken : {0, 1}) {
    auto loader = std::make_unique<BatchLoader>(f.corpus, f.sampler(), 0, f.batch, f.seq, 3, 1, 0);
    for (int i = 0; i < taken; ++i) loader->next();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // queue full, all workers blocked
    const auto t0 = clock::now();
    loader.reset();
    CHECK(clock::now() - t0 < std::chrono::milliseconds(500));
  }
}

// ---------------------------------------------------------------------------
// shuffle fixed|chaos|independent and the common pool (docs/DATA.md)

namespace {

SamplerOptions shuffle_options(Shuffle mode, uint64_t seed, double common = 0, double rate = 0) {
  SamplerOptions o;
  o.shuffle = mode;
  o.seed = seed;
  o.common = common;
  o.common_rate = rate;
  return o;
}

std::vector<int64_t> stream(DistributedSampler s, int64_t count) {
  std::vector<int64_t> out;
  for (int64_t k = 0; k < count; ++k) out.push_back(s.window(k));
  return out;
}

// Shard samples of one epoch over `world` simulated ranks: every shard window
// at least once, and duplicates only as padding (fewer than W).
void check_epoch_partition(int64_t n, int world, const SamplerOptions& options, int64_t epoch) {
  std::vector<int64_t> seen;
  std::set<int64_t> pool;
  for (int r = 0; r < world; ++r) {
    DistributedSampler s(n, world, r, options);
    pool.insert(s.pool_windows().begin(), s.pool_windows().end());
    int64_t taken = 0;
    for (int64_t k = 0; taken < s.per_rank_per_epoch() * (epoch + 1); ++k) {
      const Sample x = s.sample(k);
      if (x.pool_slot >= 0) continue;
      if (s.epoch(k) == epoch) seen.push_back(x.window);
      ++taken;
    }
  }
  const int64_t shard = n - int64_t(pool.size());
  std::set<int64_t> distinct(seen.begin(), seen.end());
  INFO("windows " << n << ", world " << world << ", epoch " << epoch << ", pool " << pool.size());
  CHECK(int64_t(distinct.size()) == shard);
  CHECK(int64_t(seen.size()) - shard == ((shard + world - 1) / world) * world - shard);
  for (int64_t w : distinct) CHECK(pool.count(w) == 0);
}

}  // namespace

TEST_CASE("shuffle fixed: the same windows as before the shuffle modes", "[data]") {
  // Computed by the sampler as it was before shuffle modes and the pool
  // existed (N 37, W 3, seed 99): fixed must not move a single window.
  const std::vector<std::vector<int64_t>> before = {
      {8, 4, 5, 10, 28, 17, 19, 14, 0, 27, 26, 31, 1, 11, 27, 25, 36, 12, 0, 26, 30, 31, 2, 32, 14, 6, 31, 1, 17, 7},
      {24, 11, 29, 21, 25, 34, 7, 2, 22, 9, 30, 13, 8, 15, 19, 34, 35, 8, 10, 16, 9, 3, 13, 18, 29, 11, 32, 36, 12, 8},
      {35, 32, 23, 33, 16, 12, 6, 18, 20, 3, 15, 36, 24, 17, 7, 23, 24, 33, 4, 20, 5, 1, 28, 21, 22, 15, 0, 33, 13, 34}};
  for (int r = 0; r < 3; ++r) {
    CHECK(stream(DistributedSampler(37, 3, r, 99), 30) == before[r]);
    CHECK(stream(DistributedSampler(37, 3, r, shuffle_options(Shuffle::fixed, 99)), 30) == before[r]);
  }
  DistributedSampler s(37, 3, 0, 99);
  CHECK(s.pool_windows().empty());
  for (int64_t k = 0; k < 100; ++k) CHECK(s.sample(k).pool_slot == -1);
}

TEST_CASE("shuffle chaos: a seed gives one reproducible stream, complete and disjoint per epoch", "[data]") {
  for (int world : {1, 2, 4})
    for (int64_t n : {7, 12, 48, 101})
      for (int64_t e : {0, 1}) check_epoch_partition(n, world, shuffle_options(Shuffle::chaos, 0xc4a05), e);
  const auto a = stream(DistributedSampler(101, 4, 3, shuffle_options(Shuffle::chaos, 77)), 200);
  CHECK(stream(DistributedSampler(101, 4, 3, shuffle_options(Shuffle::chaos, 77)), 200) == a);  // replay
  CHECK(stream(DistributedSampler(101, 4, 3, shuffle_options(Shuffle::chaos, 78)), 200) != a);  // another seed
  // chaos is fixed's partition driven by the chaos seed instead of the run seed.
  CHECK(stream(DistributedSampler(101, 4, 3, 77), 200) == a);
}

TEST_CASE("shuffle independent: per-rank streams, reproducible, each a sequence of full passes", "[data]") {
  const int64_t n = 50;
  std::vector<std::vector<int64_t>> ranks;
  for (int r = 0; r < 4; ++r) {
    DistributedSampler s(n, 4, r, shuffle_options(Shuffle::independent, 5));
    CHECK(s.per_rank_per_epoch() == n);
    ranks.push_back(stream(s, 3 * n));
    CHECK(stream(DistributedSampler(n, 4, r, shuffle_options(Shuffle::independent, 5)), 3 * n) == ranks.back());
    CHECK(stream(DistributedSampler(n, 4, r, shuffle_options(Shuffle::independent, 6)), 3 * n) != ranks.back());
    // Every window once in each pass of N samples, a new order each pass.
    for (int64_t pass = 0; pass < 3; ++pass) {
      std::set<int64_t> once(ranks.back().begin() + pass * n, ranks.back().begin() + (pass + 1) * n);
      CHECK(int64_t(once.size()) == n);
    }
    CHECK(!std::equal(ranks.back().begin(), ranks.back().begin() + n, ranks.back().begin() + n));
  }
  for (int a = 0; a < 4; ++a)
    for (int b = a + 1; b < 4; ++b) CHECK(ranks[a] != ranks[b]);
  // Overlap is allowed: the first N/W samples of two ranks share some windows
  // by chance (with these seeds they do), where chaos would share none.
  std::set<int64_t> first(ranks[0].begin(), ranks[0].begin() + n / 4);
  int64_t shared = 0;
  for (int64_t i = 0; i < n / 4; ++i) shared += first.count(ranks[1][i]);
  CHECK(shared > 0);
}

TEST_CASE("common pool: size, mixing rate, disjoint shards, every rank walks the whole pool", "[data]") {
  const int64_t n = 101;
  for (Shuffle mode : {Shuffle::fixed, Shuffle::chaos, Shuffle::independent}) {
    INFO("shuffle " << mode_name(mode));
    const auto options = shuffle_options(mode, 31, 0.2, 0.25);
    DistributedSampler s0(n, 4, 0, options), s1(n, 4, 1, options);
    REQUIRE(s0.pool_windows().size() == 20);  // round(101 * 0.2)
    CHECK(s0.pool_windows() == s1.pool_windows());
    CHECK(std::is_sorted(s0.pool_windows().begin(), s0.pool_windows().end()));
    // A seeded choice, not a slice of the corpus.
    CHECK(s0.pool_windows().back() - s0.pool_windows().front() > 20);
    // Exactly floor(k * rate) pool samples among the first k, evenly spread.
    std::vector<int64_t> slots0, slots1;
    for (int64_t k = 0; k < 1000; ++k) {
      const Sample a = s0.sample(k), b = s1.sample(k);
      CHECK(s0.pool_draws_before(k) == k / 4);
      CHECK((a.pool_slot >= 0) == (k % 4 == 3));
      if (a.pool_slot >= 0) {
        CHECK(a.window == s0.pool_windows()[a.pool_slot]);
        slots0.push_back(a.pool_slot);
        slots1.push_back(b.pool_slot);
      } else {
        CHECK(!std::binary_search(s0.pool_windows().begin(), s0.pool_windows().end(), a.window));
      }
    }
    // Each rank sees every pool window once per 20 pool draws, in its own order.
    for (int64_t cycle = 0; cycle < 5; ++cycle)
      CHECK(std::set<int64_t>(slots0.begin() + cycle * 20, slots0.begin() + (cycle + 1) * 20).size() == 20);
    CHECK(slots0 != slots1);
    // Deterministic: random access equals the sequential stream, and a replay is identical.
    const auto forward = stream(DistributedSampler(n, 4, 2, options), 300);
    DistributedSampler random_access(n, 4, 2, options);
    for (int64_t k = 299; k >= 0; k -= 13) CHECK(random_access.window(k) == forward[k]);
    if (mode != Shuffle::independent)
      for (int64_t e : {0, 1, 2}) check_epoch_partition(n, 4, options, e);
  }
  // A rate that is not a power of two: floor(k * 0.1) pool samples before k.
  DistributedSampler tenth(200, 2, 0, shuffle_options(Shuffle::chaos, 3, 0.1, 0.1));
  int64_t pooled = 0;
  for (int64_t k = 0; k < 1000; ++k) pooled += tenth.sample(k).pool_slot >= 0;
  CHECK(pooled == 100);
  // The pool must leave at least one shard window.
  CHECK_THROWS_AS(DistributedSampler(10, 2, 0, shuffle_options(Shuffle::fixed, 1, 0.96, 0.1)), std::invalid_argument);
  CHECK(DistributedSampler(10, 2, 0, shuffle_options(Shuffle::fixed, 1, 0.01, 0.1)).pool_windows().size() == 1);
}

TEST_CASE("loader: pool samples from the shared copy equal the corpus windows", "[data]") {
  LoaderFixture f;
  const auto options = shuffle_options(Shuffle::chaos, 11, 0.25, 0.3);
  DistributedSampler s(f.split.train_windows, 3, 1, options);
  // The node's copy, as CommonPool lays it out: seq+1 tokens per slot.
  std::vector<int32_t> copy;
  for (int64_t w : s.pool_windows())
    for (int64_t t = 0; t <= f.seq; ++t) copy.push_back(f.corpus.token(w * f.seq + t));
  const PoolTokens pool{copy.data(), int64_t(s.pool_windows().size()), f.seq};
  for (int workers : {0, 2}) {
    BatchLoader from_pool(f.corpus, s, 0, f.batch, f.seq, workers, 3, 0, pool);
    BatchLoader resumed(f.corpus, s, 0, f.batch, f.seq, workers, 3, 9, pool);
    std::vector<Batch> ref;
    for (int64_t i = 0; i < 20; ++i) ref.push_back(from_pool.next());
    for (int64_t i = 9; i < 20; ++i) CHECK(resumed.next().inputs == ref[i].inputs);
    BatchLoader again(f.corpus, s, 0, f.batch, f.seq, 0, 1, 0);  // no copy: pool windows from the corpus
    for (int64_t i = 0; i < 20; ++i) {
      const Batch b = again.next();
      CHECK(b.inputs == ref[i].inputs);
      CHECK(b.targets == ref[i].targets);
    }
  }
  // The pool rows really come from the copy: zero it and they read zero.
  std::fill(copy.begin(), copy.end(), 0);
  BatchLoader zeroed(f.corpus, s, 0, f.batch, f.seq, 0, 1, 0, pool);
  DistributedSampler probe = s;
  int64_t zero_rows = 0;
  for (int64_t i = 0; i < 10; ++i) {
    const Batch b = zeroed.next();
    for (int64_t j = 0; j < f.batch; ++j) {
      const bool pooled = probe.sample(i * f.batch + j).pool_slot >= 0;
      const bool zero = std::all_of(b.inputs.begin() + j * f.seq, b.inputs.begin() + (j + 1) * f.seq,
                                    [](int32_t t) { return t == 0; });
      CHECK(pooled == zero);
      zero_rows += zero;
    }
  }
  CHECK(zero_rows == 12);  // floor(40 * 0.3)
  const PoolTokens wrong_seq{copy.data(), pool.windows, f.seq + 1};
  CHECK_THROWS_AS(BatchLoader(f.corpus, s, 0, f.batch, f.seq, 0, 1, 0, wrong_seq), std::invalid_argument);
}

TEST_CASE("chaos seed: deck, draw, resume and their conflicts", "[data]") {
  DataConfig d;
  CHECK(choose_chaos_seed(MPI_COMM_SELF, d, "", 0, "deck:1") == 0);  // fixed
  d.shuffle = Shuffle::chaos;
  const uint64_t drawn = choose_chaos_seed(MPI_COMM_SELF, d, "", 0, "deck:1");
  CHECK(drawn != 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK(choose_chaos_seed(MPI_COMM_SELF, d, "", 0, "deck:1") != drawn);  // the clock moved
  d.chaos_seed = 4242;
  CHECK(choose_chaos_seed(MPI_COMM_SELF, d, "", 0, "deck:1") == 4242);   // replay
  CHECK(choose_chaos_seed(MPI_COMM_SELF, d, "ck.h5", 4242, "deck:1") == 4242);
  CHECK_THROWS_WITH(choose_chaos_seed(MPI_COMM_SELF, d, "ck.h5", 17, "deck:1"),
                    Catch::Contains("deck:1") && Catch::Contains("differs from the checkpoint's 17"));
  d.chaos_seed = 0;
  CHECK(choose_chaos_seed(MPI_COMM_SELF, d, "ck.h5", 17, "deck:1") == 17);  // a resume continues its stream
  CHECK_THROWS_WITH(choose_chaos_seed(MPI_COMM_SELF, d, "ck.h5", 0, "deck:1"),
                    Catch::Contains("ck.h5") && Catch::Contains("shuffle fixed run"));
  d.shuffle = Shuffle::fixed;
  CHECK_THROWS_AS(choose_chaos_seed(MPI_COMM_SELF, d, "ck.h5", 17, "deck:1"), InputError);
  // Independent and chaos take the chaos seed; fixed keeps the run seed.
  d.shuffle = Shuffle::independent;
  CHECK(sampler_options(d, 5, 99).seed == 99);
  d.shuffle = Shuffle::fixed;
  CHECK(sampler_options(d, 5, 99).seed == 5);
}

TEST_CASE("deck: data shuffle, chaos_seed, common and common_rate", "[data]") {
  TempDir tmp;
  auto program = [&](const std::string& data_line, std::map<std::string, std::string> vars = {}) {
    std::ofstream(tmp.file("d.deck")) << "variable chaos_seed 0\n"
                                         "model dense vocab 256 dim 8 layers 1 heads 2 ffn 16 seq 8\n"
                                      << data_line << "\nrun 1\n";
    return build_program(read_deck(tmp.file("d.deck"), vars), false);
  };
  const auto plain = program("data bytes x.txt").phases[0].config.data;
  CHECK(plain.shuffle == Shuffle::fixed);
  CHECK(plain.common == 0.0);
  CHECK(plain.common_rate == 0.1);
  const auto d = program("data bytes x.txt shuffle chaos chaos_seed ${chaos_seed} common 0.1 common_rate 0.2",
                         {{"chaos_seed", "18446744073709551615"}})
                     .phases[0].config.data;
  CHECK(d.shuffle == Shuffle::chaos);
  CHECK(d.chaos_seed == 18446744073709551615ULL);  // any 64-bit seed replays
  CHECK(d.common == 0.1);
  CHECK(d.common_rate == 0.2);
  auto error = [&](const std::string& line) {
    try {
      program(line);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(error("data bytes x.txt shuffle random"), Catch::Contains("d.deck:3") && Catch::Contains("fixed, chaos, independent"));
  CHECK_THAT(error("data bytes x.txt common 1"), Catch::Contains("d.deck:3") && Catch::Contains("'common'"));
  CHECK_THAT(error("data bytes x.txt common 0.1 common_rate 0"), Catch::Contains("'common_rate'"));
  CHECK_THAT(error("data bytes x.txt chaos_seed -3"), Catch::Contains("'chaos_seed'"));
  CHECK_THAT(error("data bytes x.txt chaos_seed 5"), Catch::Contains("d.deck:3") && Catch::Contains("shuffle fixed"));
}

TEST_CASE("sampler: another world size continues the epoch without skipping or repeating a window", "[data]") {
  const int64_t N = 103;
  for (const auto& [shuffle, seed] : {std::pair{Shuffle::fixed, uint64_t(7)}, {Shuffle::chaos, uint64_t(99)}})
    for (auto [w_old, w_new, k] : {std::tuple{4, 2, 10}, {2, 4, 13}, {4, 3, 25}, {3, 5, 0}}) {
      INFO(mode_name(shuffle) << ": " << w_old << " ranks for " << k << " samples, then " << w_new);
      SamplerOptions o;
      o.shuffle = shuffle, o.seed = seed;
      std::multiset<int64_t> seen;
      Continuation next;
      for (int r = 0; r < w_old; ++r) {
        DistributedSampler old(N, w_old, r, o);
        for (int64_t i = 0; i < k; ++i) seen.insert(old.window(i));
        next = old.after(k);  // the same on every rank
      }
      REQUIRE(next.epoch == 0);
      REQUIRE(next.position == std::min<int64_t>(N, k * w_old));
      o.start = next;
      const int64_t left = (N - next.position + w_new - 1) / w_new;
      for (int r = 0; r < w_new; ++r) {
        DistributedSampler now(N, w_new, r, o);
        for (int64_t i = 0; i < left; ++i) seen.insert(now.window(i));
        // then the plain rule: epoch 1, position r
        DistributedSampler fresh(N, w_new, r, [&] { auto f = o; f.start = {}; return f; }());
        REQUIRE(now.window(left) == fresh.window(fresh.per_rank_per_epoch()));
        REQUIRE(now.after(left) == Continuation{1, 0});
      }
      // Every window once, plus at most w_new - 1 padding repeats at the end.
      std::set<int64_t> distinct(seen.begin(), seen.end());
      REQUIRE(int64_t(distinct.size()) == N);
      REQUIRE(int64_t(seen.size()) - N < w_new);
    }
  // A fresh start is the continuation {0, 0}: the same stream as before.
  DistributedSampler plain(N, 3, 1, uint64_t(5));
  SamplerOptions o;
  o.seed = 5;
  DistributedSampler continued(N, 3, 1, o);
  for (int64_t i = 0; i < 200; ++i) REQUIRE(plain.window(i) == continued.window(i));
  // independent streams cannot be continued by another world.
  o.shuffle = Shuffle::independent, o.start = {0, 10};
  REQUIRE_THROWS_AS(DistributedSampler(N, 3, 1, o), std::invalid_argument);
}

// ---------------------------------------------------------------------------
// many shards: one corpus of memory-mapped files (data shard 'DIR/*.bin')

namespace {

// Three shards whose tokens are their flat index in the concatenation, so a
// window's tokens say where it came from. 12 + 7 + 28 = 47 windows of seq 8.
struct ShardsFixture {
  TempDir tmp;
  int64_t seq = 8;
  std::vector<int64_t> lengths = {101, 57, 230};
  Corpus corpus;
  ShardsFixture() {
    int32_t next = 0;
    for (size_t s = 0; s < lengths.size(); ++s) {
      std::vector<int32_t> t(static_cast<size_t>(lengths[s]));  // not size_t(...): nvcc reads a declaration
      for (auto& x : t) x = next++;
      write_shard(tmp.file(fmt::format("train_{:04d}.bin", s)), t, 100000, 4);
    }
    corpus = Corpus::load(tmp.file("train_*.bin"), DataFormat::shard);
  }
  int64_t shard_of(int32_t flat) const {
    int64_t s = 0, end = lengths[0];
    while (flat >= end) end += lengths[size_t(++s)];
    return s;
  }
  // The window a batch row holds, from its first token; checks it stays in one shard.
  int64_t window_of(const int32_t* inputs, const int32_t* targets) const {
    const int32_t first = inputs[0];
    for (int64_t t = 0; t < seq; ++t) {
      REQUIRE(inputs[t] == first + t);
      REQUIRE(targets[t] == first + t + 1);
    }
    REQUIRE(shard_of(first) == shard_of(first + int32_t(seq)));  // never spans two shards
    for (int64_t w = 0; w < corpus.windows(seq); ++w)
      if (corpus.window_start(w, seq) == first) return w;
    FAIL("no window starts at token " << first);
    return -1;
  }
  // Every window of one epoch of `world` ranks' loaders, batch 1.
  std::multiset<int64_t> epoch(int world, const SamplerOptions& o, int64_t per_rank = -1) const {
    std::multiset<int64_t> seen;
    for (int r = 0; r < world; ++r) {
      DistributedSampler s(corpus.windows(seq), world, r, o);
      const int64_t n = per_rank >= 0 ? per_rank : s.per_rank_per_epoch();
      BatchLoader loader(corpus, s, 0, 1, seq, 2, 3, 0);
      for (int64_t i = 0; i < n; ++i) {
        const Batch b = loader.next();
        seen.insert(window_of(b.inputs.data(), b.targets.data()));
      }
    }
    return seen;
  }
};

}  // namespace

TEST_CASE("shards: a glob in name order, windows cut per shard, tokens as the files hold them", "[data]") {
  ShardsFixture f;
  REQUIRE(f.corpus.files().size() == 3);
  for (size_t s = 0; s < 3; ++s) CHECK(f.corpus.files()[s].path() == f.tmp.file(fmt::format("train_{:04d}.bin", s)));
  CHECK(f.corpus.size() == 101 + 57 + 230);
  CHECK(f.corpus.windows(f.seq) == 12 + 7 + 28);
  // Window 12 is the second shard's first: it starts at token 101, not 96.
  CHECK(f.corpus.window_start(11, f.seq) == 88);
  CHECK(f.corpus.window_start(12, f.seq) == 101);
  CHECK(f.corpus.window_start(19, f.seq) == 158);
  for (int64_t w = 0; w < f.corpus.windows(f.seq); ++w) {
    std::vector<int32_t> t(size_t(f.seq + 1));
    f.corpus.read_window(w, f.seq, t.data());
    for (int64_t i = 0; i <= f.seq; ++i) REQUIRE(t[size_t(i)] == f.corpus.window_start(w, f.seq) + i);
  }
  for (int64_t i = 0; i < f.corpus.size(); i += 13) CHECK(f.corpus.token(i) == i);
  CHECK_THROWS_AS(f.corpus.read_window(47, f.seq, std::vector<int32_t>(9).data()), std::out_of_range);
  // validation: a split over all shards takes its windows from the last ones
  const WindowSplit split = split_windows(f.corpus, f.seq, 0.1);
  CHECK(split.train_windows + split.valid_windows == 47);
  CHECK(split.valid_windows == 5);
}

TEST_CASE("shards: the sampler, chaos shuffle, common pool and another world size keep their guarantees", "[data]") {
  ShardsFixture f;
  const int64_t N = f.corpus.windows(f.seq);
  for (Shuffle shuffle : {Shuffle::fixed, Shuffle::chaos}) {
    INFO(mode_name(shuffle));
    SamplerOptions o;
    o.shuffle = shuffle, o.seed = shuffle == Shuffle::fixed ? 7 : 0xc4a05;
    // One epoch at 3 ranks: every window of every shard, the padding the only repeats.
    const auto seen = f.epoch(3, o);
    CHECK(int64_t(std::set<int64_t>(seen.begin(), seen.end()).size()) == N);
    CHECK(int64_t(seen.size()) - N < 3);

    // Resumed at another world size mid-epoch: 3 ranks took 5 windows each, 2 ranks finish the epoch.
    const int64_t k = 5;
    auto part = f.epoch(3, o, k);
    o.start = DistributedSampler(N, 3, 0, o).after(k);
    REQUIRE(o.start.position == 3 * k);
    const int64_t left = (N - o.start.position + 1) / 2;
    const auto rest = f.epoch(2, o, left);
    part.insert(rest.begin(), rest.end());
    CHECK(int64_t(std::set<int64_t>(part.begin(), part.end()).size()) == N);
    CHECK(int64_t(part.size()) - N < 2);
  }
  // The common pool draws windows from every shard; each pool sample is a
  // whole window of one shard (window_of checks) and the shards stay disjoint.
  SamplerOptions o;
  o.shuffle = Shuffle::chaos, o.seed = 99, o.common = 0.3, o.common_rate = 0.25;
  DistributedSampler s(N, 2, 0, o);
  std::set<int64_t> shards_hit;
  for (int64_t w : s.pool_windows()) shards_hit.insert(f.shard_of(int32_t(f.corpus.window_start(w, f.seq))));
  CHECK(shards_hit.size() == 3);
  BatchLoader loader(f.corpus, s, 0, 1, f.seq, 0, 1, 0);
  int64_t pooled = 0;
  for (int64_t i = 0; i < 40; ++i) {
    const Batch b = loader.next();
    const int64_t w = f.window_of(b.inputs.data(), b.targets.data());
    const Sample sample = DistributedSampler(N, 2, 0, o).sample(i);
    CHECK(w == sample.window);
    pooled += sample.pool_slot >= 0;
  }
  CHECK(pooled == 10);  // 40 * 0.25
}

TEST_CASE("shards: no match, one truncated shard among many, tokenizers that disagree", "[data]") {
  ShardsFixture f;
  using Catch::Contains;
  std::string m = load_error(f.tmp.file("nothing_*.bin"), DataFormat::shard);
  CHECK_THAT(m, Contains(f.tmp.file("nothing_*.bin") + ": the shard pattern matches no file"));

  // train_0001.bin cut in the middle of its tokens: named, with the offset where its data stops.
  auto raw = read_bytes(f.tmp.file("train_0001.bin"));
  raw.resize(64 + 4 * 30 + 2);
  write_bytes(f.tmp.file("train_0001.bin"), raw);
  m = load_error(f.tmp.file("train_*.bin"), DataFormat::shard);
  CHECK_THAT(m, Contains(f.tmp.file("train_0001.bin") + ": offset 184: file holds 30 tokens, header says 57"));

  // Shards of two tokenizers, and a shard that is not the deck tokenizer's.
  TempDir tmp;
  std::ofstream(tmp.file("tok.model")) << "not really a model, but it hashes";
  const uint64_t h = tokenizer_hash(tmp.file("tok.model"));
  write_shard(tmp.file("a_0.bin"), {1, 2, 3}, 256, 2, {h, 3});
  write_shard(tmp.file("a_1.bin"), {1, 2, 3}, 256, 2, {h + 1, 3});
  const Corpus two = Corpus::load(tmp.file("a_*.bin"), DataFormat::shard);
  const auto bytes = load_tokenizer("");
  auto check_error = [&](const Corpus& c, const std::string& tok, int32_t vocab) {
    try {
      check_tokenizer(c, tok, *bytes, vocab, "deck:3");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  m = check_error(two, "", 256);
  CHECK_THAT(m, Contains(tmp.file("a_1.bin")) && Contains(tmp.file("a_0.bin")) &&
                    Contains(fmt::format("{:#018x}", h + 1)) && Contains(fmt::format("{:#018x}", h)));
  m = check_error(two, tmp.file("tok.model"), 256);
  CHECK_THAT(m, Contains(tmp.file("a_1.bin")) && Contains(tmp.file("tok.model")) &&
                    Contains(fmt::format("{:#018x}", h + 1)) && Contains(fmt::format("{:#018x}", h)));
  m = check_error(Corpus::load(tmp.file("a_0.bin"), DataFormat::shard), tmp.file("tok.model"), 512);
  CHECK_THAT(m, Contains("deck:3: model vocab 512") && Contains(tmp.file("tok.model") + " has vocab 256"));
  CHECK(check_error(Corpus::load(tmp.file("a_0.bin"), DataFormat::shard), tmp.file("tok.model"), 256) == "no error");
  // A version-1 shard has no hash to check: only its vocab.
  write_shard(tmp.file("v1.bin"), {1, 2, 3}, 300, 2, {}, 1);
  m = check_error(Corpus::load(tmp.file("v1.bin"), DataFormat::shard), tmp.file("tok.model"), 256);
  CHECK_THAT(m, Contains(tmp.file("v1.bin") + ": vocab 300 in its header") && Contains("has vocab 256"));
}

TEST_CASE("tokenizer: bytes, and the FNV-1a hash shards record", "[data]") {
  const auto bytes = load_tokenizer("");
  const std::string text = "h\xc3\xa9llo\n";
  const auto ids = bytes->encode(text);
  CHECK(ids.size() == text.size());
  CHECK(ids[1] == 0xc3);
  CHECK(bytes->decode(ids) == text);
  CHECK(bytes->bytes_of(200) == 1);
  TempDir tmp;
  std::ofstream(tmp.file("a")) << "a";
  // FNV-1a 64 of "a", the published test vector.
  CHECK(tokenizer_hash(tmp.file("a")) == 0xaf63dc4c8601ec8cull);
  CHECK_THROWS_AS(tokenizer_hash(tmp.file("missing")), InputError);
  CHECK_THROWS_AS(load_tokenizer(tmp.file("missing")), InputError);
  CHECK_THROWS_AS(load_tokenizer(tmp.file("a")), InputError);  // not a SentencePiece model
}

TEST_CASE("partition contiguous: each rank its own slice, complete per epoch, reshuffled, beside the pool", "[data]") {
  for (Shuffle shuffle : {Shuffle::fixed, Shuffle::chaos})
    for (int world : {1, 2, 3, 4})
      for (int64_t n : {4, 7, 48, 101}) {
        INFO(mode_name(shuffle) << ", world " << world << ", windows " << n);
        SamplerOptions o;
        o.shuffle = shuffle, o.seed = 77, o.contiguous = true;
        std::set<int64_t> all;
        int64_t next_begin = 0;
        for (int r = 0; r < world; ++r) {
          DistributedSampler s(n, world, r, o);
          const int64_t per = s.per_rank_per_epoch();
          REQUIRE(per == (n + world - 1) / world);
          std::vector<int64_t> e0, e1;
          for (int64_t k = 0; k < per; ++k) e0.push_back(s.window(k));
          for (int64_t k = per; k < 2 * per; ++k) e1.push_back(s.window(k));
          // Its own contiguous slice, all of it every epoch (a short slice wraps: the only repeats).
          const std::set<int64_t> mine(e0.begin(), e0.end());
          const int64_t lo = *mine.begin(), hi = *mine.rbegin();
          CHECK(lo == next_begin);
          CHECK(int64_t(mine.size()) == hi - lo + 1);
          CHECK(std::set<int64_t>(e1.begin(), e1.end()) == mine);
          if (mine.size() >= 5) CHECK(e0 != e1);  // reshuffled each epoch
          next_begin = hi + 1;
          all.insert(mine.begin(), mine.end());
        }
        CHECK(int64_t(all.size()) == n);  // the slices cover every window, disjoint
      }
  // Beside a common pool: the slices partition the shard windows, never the pool's.
  SamplerOptions o;
  o.shuffle = Shuffle::chaos, o.seed = 5, o.contiguous = true, o.common = 0.2, o.common_rate = 0.25;
  std::set<int64_t> shard_windows;
  for (int r = 0; r < 3; ++r) {
    DistributedSampler s(60, 3, r, o);
    for (int64_t k = 0; k < 200; ++k) {
      const Sample x = s.sample(k);
      if (x.pool_slot < 0) shard_windows.insert(x.window);
      else CHECK(std::binary_search(s.pool_windows().begin(), s.pool_windows().end(), x.window));
    }
    for (int64_t w : s.pool_windows()) CHECK(shard_windows.count(w) == 0);
  }
  CHECK(shard_windows.size() == 60 - 12);
  // What it cannot do: independent streams, a continued epoch, fewer windows than ranks.
  o = SamplerOptions{};
  o.contiguous = true, o.shuffle = Shuffle::independent;
  CHECK_THROWS_AS(DistributedSampler(10, 2, 0, o), std::invalid_argument);
  o.shuffle = Shuffle::fixed, o.start = {0, 3};
  CHECK_THROWS_AS(DistributedSampler(10, 2, 0, o), std::invalid_argument);
  o.start = {};
  CHECK_THROWS_AS(DistributedSampler(3, 4, 0, o), std::invalid_argument);
}

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
#include "core/error.h"
#include "data/corpus.h"
#include "data/loader.h"
#include "data/sampler.h"
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
std::string load_error(const std::string& path, const std::string& format) {
  try {
    Corpus::load(path, format);
  } catch (const InputError& e) {
    return e.what();
  }
  FAIL("no InputError loading " << path << " as " << format);
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
  const Corpus c = Corpus::load(tmp.file("a.txt"), "bytes");
  REQUIRE(c.size() == int64_t(bytes.size()));
  CHECK(c.vocab() == 256);
  CHECK(c.path() == tmp.file("a.txt"));
  for (size_t i = 0; i < bytes.size(); ++i) CHECK(c.token(int64_t(i)) == int32_t(bytes[i]));
}

TEST_CASE("bytes corpus errors: empty, missing file, unknown format", "[data]") {
  TempDir tmp;
  write_bytes(tmp.file("empty.txt"), {});
  std::string m = load_error(tmp.file("empty.txt"), "bytes");
  CHECK_THAT(m, Catch::Contains(tmp.file("empty.txt")) && Catch::Contains("offset 0"));
  m = load_error(tmp.file("missing.txt"), "bytes");
  CHECK_THAT(m, Catch::Contains(tmp.file("missing.txt")) && Catch::Contains("cannot open"));
  write_bytes(tmp.file("a.txt"), {'x'});
  m = load_error(tmp.file("a.txt"), "shards");
  CHECK_THAT(m, Catch::Contains("unknown corpus format 'shards'") && Catch::Contains("did you mean 'shard'"));
}

TEST_CASE("shard round-trip with 2- and 4-byte tokens", "[data]") {
  TempDir tmp;
  for (int width : {2, 4}) {
    const int32_t vocab = width == 2 ? 65536 : 100000;
    const std::vector<int32_t> tokens = {0, 1, 255, 256, 4660, vocab - 1, 7};
    const std::string path = tmp.file(fmt::format("w{}.bin", width));
    write_shard(path, tokens, vocab, width);

    // The layout on disk, read independently of the loader.
    const auto raw = read_bytes(path);
    REQUIRE(raw.size() == 32 + tokens.size() * width);
    CHECK(std::string(raw.begin(), raw.begin() + 8) == "XXTOKENS");
    CHECK(raw[8] == 1);
    CHECK(raw[12] == width);
    CHECK(raw[16] == tokens.size());
    CHECK(raw[24 + 2] == ((uint32_t(vocab) >> 16) & 0xff));
    CHECK((raw[32 + 4 * width] | raw[32 + 4 * width + 1] << 8) == 4660);  // little-endian 0x1234
    CHECK(!fs::exists(path + ".tmp." + std::to_string(::getpid())));

    const Corpus c = Corpus::load(path, "shard");
    CHECK(c.vocab() == vocab);
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
  REQUIRE_NOTHROW(Corpus::load(good, "shard"));

  auto broken = [&](const std::string& name, auto&& edit) {
    auto b = base;
    edit(b);
    write_bytes(tmp.file(name), b);
    return load_error(tmp.file(name), "shard");
  };
  using Catch::Contains;

  std::string m = broken("magic.bin", [](auto& b) { std::copy_n("ABCDEFGH", 8, b.begin()); });
  CHECK_THAT(m, Contains(tmp.file("magic.bin") + ": offset 0: bad magic 'ABCDEFGH' (expected 'XXTOKENS'"));

  m = broken("version.bin", [](auto& b) { put_u32(b, 8, 2); });
  CHECK_THAT(m, Contains(tmp.file("version.bin") + ": offset 8:") && Contains("version 2"));

  m = broken("width.bin", [](auto& b) { put_u32(b, 12, 3); });
  CHECK_THAT(m, Contains(tmp.file("width.bin") + ": offset 12:") && Contains("expected 2 or 4"));

  m = broken("short.bin", [](auto& b) { b.resize(32 + 100 * 2 + 1); });
  CHECK_THAT(m, Contains(tmp.file("short.bin") + ": offset 32: file holds 100 tokens, header says 200"));

  m = broken("header.bin", [](auto& b) { b.resize(20); });
  CHECK_THAT(m, Contains(tmp.file("header.bin") + ": offset 20:") && Contains("32-byte shard header"));

  m = broken("vocab.bin", [](auto& b) { b[32 + 5 * 2] = 250; });  // token 5 := 250 = vocab
  CHECK_THAT(m, Contains(tmp.file("vocab.bin") + ": offset 42:") && Contains("token 250"));

  m = broken("trailing.bin", [](auto& b) { b.push_back(0); });
  CHECK_THAT(m, Contains(tmp.file("trailing.bin") + ": offset 432:"));

  m = broken("count.bin", [](auto& b) { std::fill(b.begin() + 16, b.begin() + 24, 0); });
  CHECK_THAT(m, Contains(tmp.file("count.bin") + ": offset 16:"));

  m = broken("reserved.bin", [](auto& b) { put_u32(b, 28, 9); });
  CHECK_THAT(m, Contains(tmp.file("reserved.bin") + ": offset 28:"));

  CHECK_THROWS_AS(write_shard(tmp.file("bad.bin"), {1, 2}, 256, 3), InputError);
  CHECK_THROWS_AS(write_shard(tmp.file("bad.bin"), {1, 256}, 256, 2), InputError);
  CHECK(!fs::exists(tmp.file("bad.bin")));
}

TEST_CASE("split_windows counts and the too-small corpus", "[data]") {
  TempDir tmp;
  auto corpus_of = [&](size_t n) {
    write_bytes(tmp.file("c.txt"), random_bytes(n, 1));
    return Corpus::load(tmp.file("c.txt"), "bytes");
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
    corpus = Corpus::load(tmp.file("c.bin"), "bytes");
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

// Deck reader and command registry: the language (comments, continuation,
// variables, include), every error class with its FILE:LINE prefix, run
// phases, and the broadcast encoding.
#include <catch2/catch.hpp>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <stdlib.h>  // mkdtemp
#include "mode_words.h"
#include "core/error.h"
#include "deck/deck.h"
#include "source_dir.h"
#include "temp_dir.h"

namespace fs = std::filesystem;
using namespace xx;
using xx::test::TempDir;

namespace {


// The smallest deck that builds; tests append to it.
const std::string kBase =
    "model dense vocab 256 dim 16 layers 1 heads 2 ffn 32 seq 8\n"
    "data bytes corpus.txt\n";

// Reads and builds `text`, returning the InputError message ("" if none).
std::string error_of(const TempDir& t, const std::string& text, bool check_files = false,
                     const std::map<std::string, std::string>& vars = {}) {
  try {
    build_program(read_deck(t.write("test.deck", text), vars), check_files);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

Program build(const TempDir& t, const std::string& text, const std::map<std::string, std::string>& vars = {}) {
  return build_program(read_deck(t.write("test.deck", text), vars), false);
}

}  // namespace

TEST_CASE("deck: comments, blank lines and continuation", "[deck]") {
  TempDir t;
  const auto lines = read_deck(t.write("test.deck",
                                       "# header comment\n"
                                       "\n"
                                       "seed 7   # trailing comment\n"
                                       "model dense vocab 256 &\n"
                                       "   dim 16   # comment before the next part\n"
                                       "run 5\n"
                                       "eval every 2 &   # comment after the &\n"
                                       "  batches 3\n"),
                               {});
  REQUIRE(lines.size() == 4);
  CHECK(lines[0].text == "seed 7");
  CHECK(lines[0].line == 3);
  CHECK(lines[1].words == std::vector<std::string>{"model", "dense", "vocab", "256", "dim", "16"});
  CHECK(lines[1].line == 4);  // where the command started
  CHECK(lines[2].line == 6);
  CHECK(lines[3].text == "eval every 2 batches 3");
  CHECK(lines[3].line == 7);
  CHECK(lines[3].file == (t.dir / "test.deck").string());
}

TEST_CASE("deck: variables, substitution and -var overrides", "[deck]") {
  TempDir t;
  const std::string deck =
      "variable steps 100\n"
      "variable dir runs/a b\n"  // the value is the rest of the words
      "variable tag ${steps}x\n"
      "run ${steps}\n"
      "output dir ${dir}/${tag}\n";
  auto lines = read_deck(t.write("test.deck", deck), {});
  REQUIRE(lines.size() == 2);  // variable lines are consumed
  CHECK(lines[0].text == "run 100");
  CHECK(lines[1].words == std::vector<std::string>{"output", "dir", "runs/a", "b/100x"});

  lines = read_deck(t.write("test.deck", deck), {{"steps", "20"}});
  CHECK(lines[0].text == "run 20");
  CHECK(lines[1].text == "output dir runs/a b/20x");

  SECTION("a '#' inside ${...} is not a comment") {
    lines = read_deck(t.write("test.deck", "variable a 5\nrun ${a} # note\n"), {});
    CHECK(lines[0].text == "run 5");
  }
}

TEST_CASE("deck: undefined variable names it, with did-you-mean", "[deck]") {
  TempDir t;
  try {
    read_deck(t.write("test.deck", "variable steps 10\n\nrun ${stpes}\n"), {});
    FAIL("no error");
  } catch (const InputError& e) {
    const std::string msg = e.what();
    CHECK_THAT(msg, Catch::StartsWith((t.dir / "test.deck").string() + ":3: undefined variable 'stpes'"));
    CHECK_THAT(msg, Catch::Contains("did you mean 'steps'?"));
    CHECK(msg.find('\n') == std::string::npos);
  }
}

TEST_CASE("deck: include is relative to the including deck", "[deck]") {
  TempDir t;
  t.write("parts/model.deck", "variable dim 32\nmodel dense vocab 256 dim ${dim} layers 1 heads 2 ffn 32 seq 8\n");
  const auto lines = read_deck(t.write("test.deck", "seed 1\ninclude parts/model.deck\nrun 3 # ${dim}\n"), {});
  REQUIRE(lines.size() == 3);
  CHECK(lines[1].words[0] == "model");
  CHECK(lines[1].words[5] == "32");
  CHECK(lines[1].file == (t.dir / "parts/model.deck").string());
  CHECK(lines[1].line == 2);
  CHECK(lines[2].file == (t.dir / "test.deck").string());
}

TEST_CASE("deck: include errors", "[deck]") {
  TempDir t;
  SECTION("cycle") {
    t.write("a.deck", "seed 1\ninclude b.deck\n");
    t.write("b.deck", "\ninclude a.deck\n");
    try {
      read_deck((t.dir / "a.deck").string(), {});
      FAIL("no error");
    } catch (const InputError& e) {
      CHECK_THAT(e.what(), Catch::StartsWith((t.dir / "b.deck").string() + ":2: include cycle"));
    }
  }
  SECTION("missing file names the including file and line") {
    try {
      read_deck(t.write("test.deck", "seed 1\n\ninclude nope.deck\n"), {});
      FAIL("no error");
    } catch (const InputError& e) {
      CHECK_THAT(e.what(), Catch::StartsWith((t.dir / "test.deck").string() + ":3: cannot open included deck"));
      CHECK_THAT(e.what(), Catch::Contains("nope.deck"));
    }
  }
  SECTION("missing top deck") {
    const std::string path = (t.dir / "absent.deck").string();
    try {
      read_deck(path, {});
      FAIL("no error");
    } catch (const InputError& e) {
      CHECK(std::string(e.what()) == path + ": cannot open deck (expected a readable file)");
    }
  }
}

TEST_CASE("deck: each error names FILE:LINE", "[deck]") {
  TempDir t;
  const std::string file = (t.dir / "test.deck").string();
  auto check = [&](const std::string& text, int line, const std::string& what) {
    const std::string msg = error_of(t, text);
    INFO(msg);
    CHECK_THAT(msg, Catch::StartsWith(file + ":" + std::to_string(line) + ": " + what));
    CHECK(msg.find('\n') == std::string::npos);
    return msg;
  };

  auto msg = check(kBase + "seed 1\n\noptimiser adamw\nrun 1\n", 5, "unknown command 'optimiser' (expected one of: seed,");
  CHECK_THAT(msg, Catch::EndsWith("(did you mean 'optimizer'?)"));
  msg = check(kBase + "frobnicate 3\nrun 1\n", 3, "unknown command 'frobnicate'");
  CHECK_THAT(msg, !Catch::Contains("did you mean"));

  msg = check(kBase + "schedule cosine lr_min 0.1\nrun 1\n", 3,
              "unknown keyword 'lr_min' for 'schedule cosine' (expected one of: warmup, min_lr, total) (did you mean 'min_lr'?)");
  check(kBase + "schedule linear\nrun 1\n", 3, "unknown kind 'linear' for 'schedule' (expected one of: cosine, sgdr, step)");
  msg = check("data shards x.bin\n", 1, "unknown kind 'shards' for 'data' (expected one of: bytes, shard)");
  CHECK_THAT(msg, Catch::EndsWith("(did you mean 'shard'?)"));
  check("model dense vocab 256 dim\n", 1, "keyword 'dim' needs a value (expected an integer)");
  check("model dense vocab 256 dim abc layers 1 heads 2 ffn 32 seq 8\n", 1, "bad value 'abc' for 'dim' (expected an integer)");
  check("model dense vocab 256 dim 12x layers 1 heads 2 ffn 32 seq 8\n", 1, "bad value '12x' for 'dim'");
  check("model dense vocab 256 dim 1.5 layers 1 heads 2 ffn 32 seq 8\n", 1, "bad value '1.5' for 'dim'");
  check("seed 1\nmodel dense vocab 256 dim 16 layers 1 heads 0 ffn 32 seq 8\n", 2,
        "value 0 for 'heads' is out of range (expected >= 1)");
  check("\nmodel dense vocab 256 dim 100 layers 1 heads 3 ffn 32 seq 8\n", 2,
        "'dim' 100 is not divisible by 'heads' 3 (expected dim % heads == 0)");
  check("model dense vocab 256 dim 12 layers 1 heads 4 ffn 32 seq 8\n", 1, "head_dim = dim / heads = 3 is odd");
  check("model dense vocab 256 dim 16 dim 16 layers 1 heads 2 ffn 32 seq 8\n", 1, "keyword 'dim' given twice");
  check("model dense vocab 256 dim 16 layers 1 heads 2 ffn 32\n", 1, "'model dense' is missing keyword 'seq'");
  check(kBase + "data bytes x valid 0.6\nrun 1\n", 3, "value 0.6 for 'valid' is out of range (expected a fraction in (0, 0.5], or a validation shard)");
  check(kBase + "data bytes x workers 65\nrun 1\n", 3, "value 65 for 'workers' is out of range (expected in [0, 64])");
  check(kBase + "optimizer adamw beta1 1\nrun 1\n", 3, "value 1 for 'beta1' is out of range (expected in [0, 1))");
  check(kBase + "optimizer adamw lr 1e-3 clip x\nrun 1\n", 3, "bad value 'x' for 'clip' (expected a number)");
  check(kBase + "grad_check missing warning\nrun 1\n", 3,
        "bad value 'warning' for 'missing' (expected one of: warn, error, off) (did you mean 'warn'?)");
  check(kBase + "checkpoint at_end maybe\nrun 1\n", 3, "bad value 'maybe' for 'at_end' (expected yes or no)");
  check(kBase + "seed -1\nrun 1\n", 3, "bad value '-1' for 'seed'");
  check(kBase + "run 0\n", 3, "value 0 for 'steps' is out of range (expected >= 1)");
  check(kBase + "run\n", 3, "'run' needs a value for 'steps'");
  check(kBase + "run 1 2\n", 3, "unexpected word '2' after 'run'");
  check(kBase + "seed 1\n", 3, "no run command: nothing to do");
  check("data bytes x\nrun 1\n", 2, "'run' before any 'model' command");
  check("model dense vocab 256 dim 16 layers 1 heads 2 ffn 32 seq 8\n\nrun 1\n", 3, "'run' before any 'data' command");
}

TEST_CASE("deck: optimizer adamw ... moments fp32|bf16, one per job", "[deck][optimizer]") {
  TempDir t;
  const std::string file = (t.dir / "test.deck").string();
  CHECK(build(t, kBase + "run 1\n").phases[0].config.optimizer.moments == Precision::fp32);  // the default
  CHECK(build(t, kBase + "optimizer adamw moments fp32\nrun 1\n").phases[0].config.optimizer.moments == Precision::fp32);
  const Program p = build(t, kBase + "optimizer adamw lr 1e-3 moments bf16\nrun 1\noptimizer adamw lr 1e-4 moments bf16\nrun 1\n");
  CHECK((p.phases[0].config.optimizer.moments == Precision::bf16 && p.phases[1].config.optimizer.moments == Precision::bf16));
  // bad input: DECK:LINE, what was expected
  CHECK_THAT(error_of(t, kBase + "optimizer adamw moments fp16\nrun 1\n"),
             Catch::StartsWith(file + ":3: bad value 'fp16' for 'moments' (expected one of: fp32, bf16)"));
  CHECK_THAT(error_of(t, kBase + "optimizer adamw moments int8\nrun 1\n"),
             Catch::StartsWith(file + ":3: bad value 'int8' for 'moments' (expected one of: fp32, bf16)"));
  CHECK(error_of(t, kBase + "optimizer adamw moments\nrun 1\n") ==
        file + ":3: keyword 'moments' needs a value (expected one of: fp32, bf16)");
  // The storage is chosen once: a later phase may not change it.
  CHECK_THAT(error_of(t, kBase + "optimizer adamw moments bf16\nrun 1\noptimizer adamw moments fp32\nrun 1\n"),
             Catch::StartsWith(file + ":6: optimizer moments fp32 (" + file + ":5), unlike the first phase's bf16 "
                                      "(expected one moments type per job"));
}

TEST_CASE("deck: compress ... exchange allgather|partitioned", "[deck]") {
  TempDir t;
  const std::string file = (t.dir / "test.deck").string();
  CHECK(build(t, kBase + "compress topk 0.1\nrun 1\n").phases[0].config.compress.exchange == Exchange::allgather);
  const Program p = build(t, kBase + "compress topk 0.1 quant int8 exchange partitioned\nrun 1\n");
  CHECK(p.phases[0].config.compress.exchange == Exchange::partitioned);
  CHECK(p.phases[0].config.compress.quant == Quant::int8);
  CHECK(build(t, kBase + "compress topk 1 quant bf16 exchange partitioned\nrun 1\n").phases[0].config.compress.quant == Quant::bf16);
  CHECK(build(t, kBase + "compress topk 0.1 exchange allgather\nrun 1\n").phases[0].config.compress.exchange == Exchange::allgather);
  CHECK(error_of(t, kBase + "compress topk 0.1 exchange ring\nrun 1\n") ==
        file + ":3: bad value 'ring' for 'exchange' (expected one of: allgather, partitioned)");
  CHECK(error_of(t, kBase + "compress topk 0.1 exchange\nrun 1\n") ==
        file + ":3: keyword 'exchange' needs a value (expected one of: allgather, partitioned)");
  // The owner residual is laid out for one fixed group: the whole world.
  CHECK_THAT(error_of(t, kBase + "topology clusters 2\ncompress topk 0.1 exchange partitioned\nrun 1\n"),
             Catch::StartsWith(file + ":5: compress exchange partitioned with topology clusters (expected topology "
                                      "full, or exchange allgather"));
  CHECK(error_of(t, kBase + "topology clusters 2\ncompress topk 0.1 exchange allgather\nrun 1\n").empty());
}

TEST_CASE("deck: rope_scaling off | yarn, DeepSeek's defaults, and attention mla's latent_eps", "[deck][rope]") {
  TempDir t;
  const std::string file = (t.dir / "test.deck").string();
  const ModelConfig plain = build(t, kBase + "run 1\n").phases[0].config.model;
  CHECK((!plain.rope_scaling.yarn() && plain.attention.latent_eps == 0 && plain.latent_eps() == plain.norm_eps));
  const auto y =
      build(t, kBase + "rope_scaling yarn factor 40 original_seq 4096\nrun 1\n").phases[0].config.model.rope_scaling;
  CHECK((y.yarn() && y.factor == 40 && y.original_seq == 4096 && y.beta_fast == 32 && y.beta_slow == 1 &&
         y.mscale == 1 && y.mscale_all_dim == 0));
  const auto z = build(t, kBase + "rope_scaling yarn factor 0.5 original_seq 2 beta_fast 0.2 beta_slow 0.1 mscale 0 "
                                  "mscale_all_dim 0.707\nrun 1\n").phases[0].config.model.rope_scaling;
  CHECK((z.factor == 0.5 && z.original_seq == 2 && z.beta_fast == 0.2 && z.beta_slow == 0.1 && z.mscale == 0 &&
         z.mscale_all_dim == 0.707));
  const std::string mla = "model deepseek vocab 256 dim 16 layers 1 heads 2 ffn 32 seq 8 norm_eps 1e-5\n"
                          "data bytes corpus.txt\n"
                          "attention mla kv_lora_rank 8 qk_nope_dim 4 rope_dim 4 v_dim 4";
  const ModelConfig m = build(t, mla + " latent_eps 1e-6\nrun 1\n").phases[0].config.model;
  CHECK((m.attention.latent_eps == 1e-6 && m.latent_eps() == 1e-6 && m.norm_eps == 1e-5));
  // bad input: DECK:LINE, what was expected
  CHECK(error_of(t, kBase + "rope_scaling yarn factor 4\nrun 1\n") ==
        file + ":3: 'rope_scaling yarn' is missing keyword 'original_seq' (expected rope_scaling off | yarn factor F "
               "original_seq T [beta_fast X] [beta_slow X] [mscale X] [mscale_all_dim X])");
  CHECK(error_of(t, kBase + "rope_scaling yarn factor 0 original_seq 64\nrun 1\n") ==
        file + ":3: value 0 for 'factor' is out of range (expected > 0)");
  CHECK(error_of(t, kBase + "rope_scaling yarn factor 4 original_seq 1\nrun 1\n") ==
        file + ":3: value 1 for 'original_seq' is out of range (expected >= 2)");
  CHECK(error_of(t, kBase + "rope_scaling yarn factor 4 original_seq 64 beta_slow 0\nrun 1\n") ==
        file + ":3: value 0 for 'beta_slow' is out of range (expected > 0)");
  CHECK_THAT(error_of(t, kBase + "rope_scaling yarn factor 4 original_seq 64 beta_fast 1 beta_slow 2\nrun 1\n"),
             Catch::StartsWith(file + ":3: 'beta_fast' 1 is not above 'beta_slow' 2 (expected beta_fast > "
                                      "beta_slow > 0"));
  CHECK(error_of(t, kBase + "rope_scaling yarn factor 4 original_seq 64 mscale -1\nrun 1\n") ==
        file + ":3: value -1 for 'mscale' is out of range (expected >= 0)");
  CHECK_THAT(error_of(t, kBase + "rope_scaling off factor 4\nrun 1\n"),
             Catch::StartsWith(file + ":3: unexpected word 'factor' after 'rope_scaling off'"));
  CHECK_THAT(error_of(t, kBase + "rope_scaling linear factor 4\nrun 1\n"),
             Catch::StartsWith(file + ":3: unknown kind 'linear' for 'rope_scaling' (expected one of: off, yarn)"));
  CHECK_THAT(error_of(t, "model dense vocab 256 dim 16 layers 1 heads 2 ffn 32 seq 8 rope_theta 1\ndata bytes x\n"
                         "rope_scaling yarn factor 4 original_seq 64\nrun 1\n"),
             Catch::StartsWith(file + ":4: rope_scaling yarn with 'rope_theta' 1 (expected rope_theta > 1"));
  CHECK(error_of(t, mla + " latent_eps 0\nrun 1\n") ==
        file + ":3: value 0 for 'latent_eps' is out of range (expected > 0)");
  CHECK_THAT(error_of(t, kBase + "attention mha latent_eps 1e-6\nrun 1\n"),
             Catch::StartsWith(file + ":3: unexpected word 'latent_eps' after 'attention mha'"));
}

TEST_CASE("deck: model ... tie_embeddings yes|no, default no", "[deck][tied]") {
  TempDir t;
  const std::string file = (t.dir / "test.deck").string();
  const std::string model = "model dense vocab 256 dim 16 layers 1 heads 2 ffn 32 seq 8";
  CHECK_FALSE(build(t, kBase + "run 1\n").phases[0].config.model.tie_embeddings);
  CHECK(build(t, model + " tie_embeddings yes\ndata bytes x\nrun 1\n").phases[0].config.model.tie_embeddings);
  CHECK_FALSE(build(t, model + " tie_embeddings no\ndata bytes x\nrun 1\n").phases[0].config.model.tie_embeddings);
  CHECK(build(t, "model deepseek vocab 256 dim 16 layers 1 heads 2 ffn 32 seq 8 tie_embeddings yes\ndata bytes x\n"
                 "attention mla kv_lora_rank 8 qk_nope_dim 4 rope_dim 4 v_dim 4\nrun 1\n")
            .phases[0].config.model.tie_embeddings);
  // bad input: DECK:LINE, what was expected
  CHECK_THAT(error_of(t, model + " tie_embeddings maybe\ndata bytes x\nrun 1\n"),
             Catch::StartsWith(file + ":1: bad value 'maybe' for 'tie_embeddings' (expected yes or no)"));
  CHECK_THAT(error_of(t, model + " tie_embeddings\ndata bytes x\nrun 1\n"),
             Catch::StartsWith(file + ":1: keyword 'tie_embeddings' needs a value (expected yes or no)"));
  CHECK_THAT(error_of(t, model + " tied_embeddings yes\ndata bytes x\nrun 1\n"),
             Catch::Contains("did you mean 'tie_embeddings'?"));
  // per-job: a later phase may not change it
  CHECK_THAT(error_of(t, kBase + "run 1\n" + model + " tie_embeddings yes\nrun 1\n"),
             Catch::StartsWith(file + ":4:"));
}

TEST_CASE("deck: reals parse strictly and accept exponents", "[deck]") {
  TempDir t;
  const auto p = build(t, kBase + "optimizer adamw lr 1e-3 eps 1E-10\nrun 1\n");
  CHECK(p.phases[0].config.optimizer.lr == 1e-3);
  CHECK(p.phases[0].config.optimizer.eps == 1e-10);
  CHECK_THAT(error_of(t, kBase + "optimizer adamw lr 1e-3x\nrun 1\n"), Catch::Contains("bad value '1e-3x' for 'lr'"));
  CHECK_THAT(error_of(t, kBase + "optimizer adamw lr nan\nrun 1\n"), Catch::Contains("bad value 'nan' for 'lr'"));
}

TEST_CASE("deck: run phases snapshot the configuration", "[deck]") {
  TempDir t;
  const auto p = build(t, kBase +
                              "optimizer adamw lr 1e-3 weight_decay 0.05\n"
                              "run 100\n"
                              "optimizer adamw lr 1e-4\n"
                              "run 50\n");
  REQUIRE(p.phases.size() == 2);
  CHECK(p.phases[0].steps == 100);
  CHECK(p.phases[1].steps == 50);
  CHECK(p.phases[0].config.optimizer.lr == 1e-3);
  CHECK(p.phases[1].config.optimizer.lr == 1e-4);
  CHECK(p.phases[1].config.optimizer.weight_decay == 0.05);  // keywords not given keep their value
  CHECK(p.phases[0].config.schedule.total == 150);           // total 0: the sum of every run
  CHECK(p.phases[1].config.schedule.total == 150);
  CHECK(p.phases[1].where == (t.dir / "test.deck").string() + ":6");
  CHECK(p.deck_text.find("optimizer adamw lr 1e-4\nrun 50\n") != std::string::npos);

  const auto q = build(t, kBase + "schedule cosine total 500\nrun 100\n");
  CHECK(q.phases[0].config.schedule.total == 500);
}

TEST_CASE("deck: the model may not change after the first run", "[deck]") {
  TempDir t;
  const std::string model = "model dense vocab 256 dim 16 layers 1 heads 2 ffn 32 seq 8\n";
  CHECK(error_of(t, kBase + "run 1\n" + model + "run 1\n") == "");  // the same model is fine
  CHECK(error_of(t, kBase + model + "run 1\n") == "");
  CHECK_THAT(error_of(t, kBase + "run 1\n\nmodel dense vocab 256 dim 16 layers 2 heads 2 ffn 32 seq 8\nrun 1\n"),
             Catch::StartsWith((t.dir / "test.deck").string() + ":5: model cannot change after the first run"));
}

TEST_CASE("deck: data files are checked only with check_files", "[deck]") {
  TempDir t;
  const std::string deck = "model dense vocab 256 dim 16 layers 1 heads 2 ffn 32 seq 8\n"
                           "data bytes " + (t.dir / "corpus.txt").string() + "\nrun 1\n";
  CHECK(error_of(t, deck, false) == "");
  const std::string msg = error_of(t, deck, true);
  CHECK_THAT(msg, Catch::StartsWith((t.dir / "test.deck").string() + ":2: cannot read data file"));
  CHECK_THAT(msg, Catch::Contains("corpus.txt"));
  t.write("corpus.txt", "hello world\n");
  CHECK(error_of(t, deck, true) == "");
}

TEST_CASE("deck: serialize round-trips", "[deck]") {
  std::vector<DeckLine> lines = {
      {"a.deck", 3, "seed 1", {"seed", "1"}},
      {"dir with space/b:c.deck", 12, "output dir x:y 12:3", {"output", "dir", "x:y", "12:3"}},
      {"", 0, "", {}},
  };
  const auto back = deserialize(serialize(lines));
  REQUIRE(back.size() == lines.size());
  for (size_t i = 0; i < lines.size(); ++i) {
    CHECK(back[i].file == lines[i].file);
    CHECK(back[i].line == lines[i].line);
    CHECK(back[i].text == lines[i].text);
    CHECK(back[i].words == lines[i].words);
  }
  CHECK(deserialize(serialize({})).empty());
  CHECK_THROWS_AS(deserialize(serialize(lines).substr(0, 20)), InputError);
}

TEST_CASE("deck: command_names and describe", "[deck]") {
  const auto names = command_names();
  for (const char* n : {"seed", "model", "data", "optimizer", "schedule", "run", "variable", "include"})
    CHECK(std::find(names.begin(), names.end(), n) != names.end());
  Config c;
  c.model.dim = 96;
  c.data.path = "x.txt";
  const std::string table = describe(c);
  CHECK_THAT(table, Catch::Contains("model.dim"));
  CHECK_THAT(table, Catch::Contains("96\n"));
  CHECK_THAT(table, Catch::Contains("data.path"));
  CHECK_THAT(table, Catch::Contains("grad_check.missing"));
  CHECK_THAT(table, Catch::Contains("checkpoint.at_end"));
  CHECK_THAT(table, Catch::StartsWith("seed "));
}

TEST_CASE("deck: input/tiny.deck parses", "[deck]") {
  const auto p = build_program(read_deck(test::input_path("tiny.deck"), {}), false);
  REQUIRE(p.phases.size() == 1);
  const Config& c = p.phases[0].config;
  CHECK(p.phases[0].steps == 300);
  CHECK(c.model.dim == 128);
  CHECK(c.data.path == "data/fortunes.txt");
  CHECK(c.output.dir == "runs/tiny");
  CHECK(c.schedule.total == 300);

  const auto q = build_program(read_deck(test::input_path("tiny.deck"), {{"steps", "20"}, {"run_dir", "/tmp/x"}}), false);
  CHECK(q.phases[0].steps == 20);
  CHECK(q.phases[0].config.output.dir == "/tmp/x");
}

// One rule for phases: every command of the registry, given again after the
// first `run` with a new value, is either refused (per-job: one value for the
// whole deck) or takes effect in the second phase (per-phase).
TEST_CASE("deck: every command is per-job (refused in a later phase) or per-phase (takes effect)", "[deck]") {
  TempDir t;
  struct Example {
    std::string command, line;
    bool per_job;
  };
  const std::vector<Example> examples = {
      {"seed", "seed 99", true},
      {"init", "init hf somewhere expanded yes", true},
      {"peak_gflops", "peak_gflops 12", true},
      {"model", "model dense vocab 256 dim 32 layers 1 heads 2 ffn 32 seq 8", true},
      {"attention", "attention mla kv_lora_rank 8 qk_nope_dim 4 rope_dim 4 v_dim 4", true},
      {"moe", "moe on routed 4 topk 2 ffn 8", true},
      {"mtp", "mtp depth 1", true},
      {"rope_scaling", "rope_scaling yarn factor 4 original_seq 64", true},
      {"data", "data bytes other.txt", true},
      {"data", "data bytes corpus.txt batch 3", true},
      {"precision", "precision bf16", true},
      {"gemm", "gemm blas", true},
      {"attention_kernel", "attention_kernel flash", true},
      {"recompute", "recompute selective", true},
      {"shard", "shard optimizer", true},
      {"pipeline", "pipeline stages 1 micro 2", true},
      {"timeout", "timeout 1", true},
      {"preempt", "preempt requeue on", true},
      {"fault", "fault kill rank 0 step 5", true},
      {"output", "output dir elsewhere", true},
      {"output", "output dir runs/default tensorboard off", true},
      {"output", "output dir runs/default log_every 3", false},
      {"optimizer", "optimizer adamw lr 1e-4", false},
      {"schedule", "schedule sgdr period 4", false},
      {"sync", "sync dense bucket_mb 7", false},
      {"topology", "topology ring", false},
      {"compress", "compress topk 0.1", false},
      {"eval", "eval every 5", false},
      {"sample", "sample every 5 prompt 'Once upon' tokens 8", false},
      {"checkpoint", "checkpoint every 5", false},
      {"health", "health every 3", false},
      {"grad_check", "grad_check missing warn", false},
      {"lossagg", "lossagg mean", false},
  };
  // Every command but the reader's and `run` has an example: a new command must say which it is.
  for (const auto& name : command_names()) {
    if (name == "variable" || name == "include" || name == "run") continue;
    CAPTURE(name);
    CHECK(std::any_of(examples.begin(), examples.end(), [&](const Example& e) { return e.command == name; }));
  }
  for (const auto& e : examples) {
    CAPTURE(e.line);
    const std::string deck = kBase + "run 2\n" + e.line + "\nrun 2\n";  // e.line is line 4
    const std::string error = error_of(t, deck);
    const std::string file = (t.dir / "test.deck").string();
    if (e.per_job) {
      INFO(error);
      CHECK_THAT(error, Catch::StartsWith(file + ":4: '" + e.command + "'") || Catch::StartsWith(file + ":4: model"));
      CHECK(error.find("cannot change after the first run") != std::string::npos);
      continue;
    }
    REQUIRE(error.empty());
    const Program p = build(t, deck);
    REQUIRE(p.phases.size() == 2);
    CHECK(describe(p.phases[0].config) != describe(p.phases[1].config));
    // ... and it is the same line before the first run: the change is the phase's own.
    const Program same = build(t, kBase + e.line + "\nrun 2\nrun 2\n");
    CHECK(describe(same.phases[0].config) == describe(same.phases[1].config));
  }
}

TEST_CASE("deck: a per-job command given again with the same value is fine, and the error names the first line",
          "[deck]") {
  TempDir t;
  CHECK(error_of(t, kBase + "seed 5\nrun 2\nseed 5\nrun 2\n").empty());
  const std::string error = error_of(t, kBase + "timeout 30\nrun 2\ntimeout 1\nrun 2\n");
  const std::string file = (t.dir / "test.deck").string();
  CHECK_THAT(error, Catch::StartsWith(file + ":5: 'timeout' cannot change after the first run"));
  CHECK_THAT(error, Catch::Contains("(set at " + file + ":3)"));
}

TEST_CASE("deck: quoted words, data's valid fraction or file, the stored deck reads back the same", "[deck]") {
  TempDir t;
  const Program p = build(t, kBase + "data shard 'runs/my data/train_*.bin' valid \"v al.bin\" tokenizer tok.model\n"
                                     "sample every 5 prompt \"Q: it's\" tokens 8\nrun 1\n");
  const Config& c = p.phases.front().config;
  CHECK(c.data.path == "runs/my data/train_*.bin");
  CHECK(c.data.valid_path == "v al.bin");
  CHECK(c.data.valid_fraction == 0);
  CHECK(c.data.tokenizer == "tok.model");
  CHECK(c.sample.prompt == "Q: it's");
  CHECK(c.sample.every == 5);
  // The resolved deck (what checkpoints keep) parses into the same words.
  const Program again = build(t, p.deck_text);
  CHECK(again.phases.front().config.sample.prompt == "Q: it's");
  CHECK(again.phases.front().config.data.path == "runs/my data/train_*.bin");
  const Program fraction = build(t, kBase + "data bytes x valid 0.2 partition contiguous\nrun 1\n");
  CHECK(fraction.phases.front().config.data.partition == Partition::contiguous);
  CHECK(build(t, kBase + "run 1\n").phases.front().config.data.partition == Partition::shuffled);
  CHECK_THAT(error_of(t, kBase + "data bytes x partition sliced\nrun 1\n"),
             Catch::Contains("bad value 'sliced' for 'partition' (expected one of: shuffled, contiguous)"));
  CHECK(fraction.phases.front().config.data.valid_fraction == 0.2);
  CHECK(fraction.phases.front().config.data.valid_path.empty());
}

// shard (per job; src/deck/commands.cpp, check_shard): what it cannot shard
// is refused at the run line, naming the shard line and the other one.
TEST_CASE("deck: shard with sync local, another topology, compress, another bucket size, or params with sample",
          "[deck][shard]") {
  TempDir t;
  const std::string file = (t.dir / "test.deck").string();
  auto at = [&](int line) { return file + ":" + std::to_string(line); };
  const std::string why = "(expected sync dense or accumulate over topology full, without compress: a sharded "
                          "optimizer needs the same averaged gradients and weights on every rank)";
  auto check = [&](const std::string& text, const std::string& start) {
    const std::string msg = error_of(t, text);
    INFO(msg);
    CHECK_THAT(msg, Catch::StartsWith(start));
    CHECK(msg.find('\n') == std::string::npos);
    return msg;
  };
  for (const std::string level : {"optimizer", "gradients", "params"}) {
    CAPTURE(level);
    const std::string shard = "shard " + level + " (" + at(3) + ")";
    // kBase is lines 1-2, shard line 3; in the first phase the other line is 4 and run 5,
    // in a later phase run 4, the other line 5 and run 6.
    const std::vector<std::pair<std::string, std::string>> others = {
        {"sync local 4", "sync local"},
        {"topology clusters 2", "topology clusters"},
        {"topology ring", "topology ring"},
        {"compress topk 0.1", "compress topk"},
    };
    for (const auto& [line, named] : others) {
      CAPTURE(line);
      check(kBase + "shard " + level + "\n" + line + "\nrun 2\n",
            at(5) + ": " + shard + " with " + named + " (" + at(4) + ") " + why);
      check(kBase + "shard " + level + "\nrun 2\n" + line + "\nrun 2\n",
            at(6) + ": " + shard + " with " + named + " (" + at(5) + ") " + why);
    }
    // One bucket size per job: the pieces are cut from the first phase's buckets.
    const auto msg = check(kBase + "shard " + level + "\nsync dense bucket_mb 1\nrun 2\nsync dense bucket_mb 2\nrun 2\n",
                           at(7) + ": " + shard + " with sync bucket_mb 2 (" + at(6) + "), unlike the first phase's 1 "
                           "(expected one bucket size per job");
    CHECK_THAT(msg, Catch::Contains(at(3)) && Catch::Contains(at(6)));
    // What it can shard: dense or accumulate, the same bucket size in every phase; any order of the lines.
    CHECK(error_of(t, kBase + "shard " + level + "\nsync accumulate 2 bucket_mb 3\nrun 2\nsync dense bucket_mb 3\nrun 2\n")
              .empty());
    CHECK(error_of(t, kBase + "sync dense\ntopology full\ncompress off\nshard " + level + "\nrun 2\n").empty());
    const Program p = build(t, kBase + "shard " + level + "\nrun 2\n");
    CHECK(p.phases[0].config.shard.level == level);
  }
  // shard params: rank 0 cannot decode a sample alone.
  check(kBase + "shard params\nsample every 5\nrun 2\n",
        at(5) + ": shard params (" + at(3) + ") with sample every 5 (" + at(4) + ") (expected no sample line");
  CHECK(error_of(t, kBase + "shard off\nsync local 4\ntopology ring\nrun 2\n").empty());
  check(kBase + "shard zero\nrun 2\n",
        at(3) + ": unknown kind 'zero' for 'shard' (expected one of: off, optimizer, gradients, params)");
}

// moe ... ep N (src/deck/commands.cpp, check_expert_parallel): a rank holds
// only its own experts, so what averages, shards, compresses or decodes the
// whole weight buffer as if every rank held the same tensors is refused at
// the run line, naming the moe line and the other one; the moe line itself
// refuses an ep that does not divide routed, and ep without moe.
TEST_CASE("deck: moe ep with sync local, another topology, compress, shard, sample, restart_from best", "[deck][ep]") {
  TempDir t;
  const std::string file = (t.dir / "test.deck").string();
  auto at = [&](int line) { return file + ":" + std::to_string(line); };
  auto check = [&](const std::string& text, const std::string& start) {
    const std::string msg = error_of(t, text);
    INFO(msg);
    CHECK_THAT(msg, Catch::StartsWith(start));
    CHECK(msg.find('\n') == std::string::npos);
  };
  const std::string moe = "moe on routed 4 topk 2 ffn 8 ep 2\n";  // line 3, after kBase's two
  const std::string ep = "moe ep 2 (" + at(3) + ")";
  const std::string why = "(expected sync dense or accumulate over topology full, without compress: each expert's "
                          "gradient is averaged over the ranks that hold it)";
  const std::vector<std::pair<std::string, std::string>> others = {
      {"sync local 4", "sync local (LINE) " + why},
      {"topology clusters 2", "topology clusters (LINE) " + why},
      {"topology ring", "topology ring (LINE) " + why},
      {"compress topk 0.1", "compress topk (LINE) " + why},
      {"sample every 5", "sample every 5 (LINE) (expected no sample line: rank 0 decodes alone and holds only its own "
                         "experts; sample from a checkpoint with xuanxue generate)"},
      {"schedule sgdr period 5 restart_from best",
       "schedule restart_from best (LINE) (expected restart_from last: the best weights are kept per rank)"},
  };
  for (const auto& [line, named] : others) {
    CAPTURE(line);
    auto naming = [&](int other) {
      std::string n = named;
      return n.replace(n.find("LINE"), 4, at(other));
    };
    // in the first phase: the other line 4, run 5; in a later phase: run 4, the other line 5, run 6
    check(kBase + moe + line + "\nrun 2\n", at(5) + ": " + ep + " with " + naming(4));
    check(kBase + moe + "run 2\n" + line + "\nrun 2\n", at(6) + ": " + ep + " with " + naming(5));
    // without ep the same line is no concern of ep's
    const std::string msg = error_of(t, kBase + "moe on routed 4 topk 2 ffn 8\n" + line + "\nrun 2\n");
    CHECK(msg.find("moe ep") == std::string::npos);
  }
  check(kBase + "moe on routed 4 topk 2 ffn 8 ep 3\nrun 2\n",
        at(3) + ": 'routed' 4 is not divisible by 'ep' 3 (expected routed % ep == 0: each rank of an expert-parallel "
                "group holds routed / ep experts)");
  check(kBase + "moe off ep 2\nrun 2\n",
        at(3) + ": 'ep' 2 with moe off (expected moe on: expert parallelism spreads routed experts)");
  // What ep works with: sync dense or accumulate over topology full, without compress, at any shard level.
  CHECK(error_of(t, kBase + moe + "sync accumulate 2\ntopology full\ncompress off\nshard off\nrun 2\nsync dense\nrun 2\n")
            .empty());
  for (const char* level : {"optimizer", "gradients", "params"})
    CHECK(error_of(t, kBase + moe + "shard " + level + "\nrun 2\n").empty());
  const Program p = build(t, kBase + moe + "run 2\n");
  CHECK(p.phases[0].config.model.moe.ep == 2);
  CHECK(where_given(p, "moe") == at(3));
  CHECK(where_given(p, "mtp") == "deck");
}

// moe ... groups G topk_groups g layer_freq N: group-limited routing and MoE on
// every N-th block (HF's moe_layer_freq), each bad combination refused at the
// moe line with what was expected.
TEST_CASE("deck: moe groups, topk_groups and layer_freq; which blocks are MoE", "[deck]") {
  TempDir t;
  const std::string file = (t.dir / "test.deck").string();
  const std::string model = "model deepseek vocab 256 dim 16 layers 6 heads 2 ffn 32 seq 8\ndata bytes corpus.txt\n";
  auto moe_of = [&](const std::string& line) {
    return build(t, model + line + "\nrun 2\n").phases[0].config.model.moe;
  };
  // defaults: no grouping, MoE on every block from dense_layers on
  const MoeConfig plain = moe_of("moe on dense_layers 2 routed 8 topk 2 ffn 8");
  CHECK((plain.groups == 1 && plain.kept_groups() == 1 && plain.layer_freq == 1));
  for (int l = 0; l < 8; ++l) CHECK(plain.is_moe_layer(l) == (l >= 2));
  // topk_groups defaults to every group; layer_freq: HF's rule, past dense_layers and a multiple of N
  const MoeConfig grouped = moe_of("moe on dense_layers 1 routed 8 topk 2 ffn 8 groups 4 layer_freq 2");
  CHECK((grouped.groups == 4 && grouped.topk_groups == 0 && grouped.kept_groups() == 4 && grouped.layer_freq == 2));
  std::vector<int> moe_blocks;
  for (int l = 0; l < 8; ++l)
    if (grouped.is_moe_layer(l)) moe_blocks.push_back(l);
  CHECK(moe_blocks == std::vector<int>{2, 4, 6});
  CHECK(moe_of("moe on routed 8 topk 3 ffn 8 groups 4 topk_groups 2").kept_groups() == 2);
  CHECK_FALSE(moe_of("moe off").is_moe_layer(3));
  // a repeated line changes only the grouping
  const MoeConfig again = moe_of("moe on routed 8 topk 2 ffn 8\nmoe on groups 2 topk_groups 1");
  CHECK((again.routed == 8 && again.groups == 2 && again.kept_groups() == 1));

  auto refused = [&](const std::string& line, const std::string& says) {
    CAPTURE(line);
    const std::string msg = error_of(t, model + line + "\nrun 2\n");
    CHECK_THAT(msg, Catch::StartsWith(file + ":3: " + says));
    CHECK(msg.find('\n') == std::string::npos);
  };
  refused("moe on routed 8 topk 2 ffn 8 groups 3",
          "'routed' 8 is not divisible by 'groups' 3 (expected routed % groups == 0");
  refused("moe on routed 8 topk 2 ffn 8 groups 4 topk_groups 5",
          "'topk_groups' 5 exceeds 'groups' 4 (expected 1 <= topk_groups <= groups)");
  refused("moe on routed 8 topk 2 ffn 8 groups 4 topk_groups 0", "value 0 for 'topk_groups' is out of range");
  refused("moe on routed 8 topk 5 ffn 8 groups 4 topk_groups 2",
          "'topk' 5 exceeds the 4 experts of topk_groups 2 groups of 2 (expected topk <= topk_groups x routed / groups)");
  refused("moe on routed 8 topk 2 ffn 8 gate sigmoid balance bias groups 8 topk_groups 4",
          "'groups' 8 leaves 1 expert per group under gate sigmoid (expected at least 2 per group");
  refused("moe on routed 256 topk 2 ffn 8 groups 128",
          "'groups' 128 exceeds 64 (expected groups <= 64: the router keeps a token's chosen groups as one 64-bit mask)");
  refused("moe on routed 8 topk 2 ffn 8 layer_freq 0", "value 0 for 'layer_freq' is out of range");
  // one expert per group is fine under softmax (a group's largest score is that expert's)
  CHECK(error_of(t, model + "moe on routed 8 topk 2 ffn 8 groups 8 topk_groups 4\nrun 2\n").empty());
}

TEST_CASE("deck: a repeated line of one kind changes what it names; init hf stands above the model lines", "[deck]") {
  TempDir t;
  const std::string file = (t.dir / "test.deck").string();
  const Program p = build(t, kBase + "model dense seq 16\nmoe on routed 4 topk 2 ffn 8\nmoe on ep 2\nrun 2\n");
  const ModelConfig& m = p.phases[0].config.model;
  CHECK(m.seq == 16);
  CHECK(m.dim == 16);  // kept from the first model line
  CHECK(m.moe.routed == 4);
  CHECK(m.moe.ep == 2);
  // another kind is a new line: its required keywords are needed
  CHECK_THAT(error_of(t, kBase + "moe off\nmoe on ep 2\nrun 2\n"),
             Catch::StartsWith(file + ":4: 'moe on' is missing keyword 'routed'"));
  // init hf: config.json describes the model, so no model line may come first
  CHECK_THAT(error_of(t, kBase + "init hf somewhere expanded yes\nrun 2\n"),
             Catch::StartsWith(file + ":3: init hf after 'model' (" + file + ":1)"));
  const Program hf = build(t, "init hf somewhere expanded yes\n" + kBase + "run 2\n");
  CHECK(hf.phases[0].config.init.kind == "hf");
  CHECK(hf.phases[0].config.init.dir == "somewhere");
  CHECK(hf.phases[0].config.init.expanded);
  CHECK(build(t, kBase + "run 2\n").phases[0].config.init.kind == "random");
}

TEST_CASE("deck: moe aux_scope belongs to balance aux, seq_aux to balance bias; the loss coefficients they resolve to",
          "[deck]") {
  TempDir t;
  const std::string file = (t.dir / "test.deck").string();
  const std::string moe = "moe on routed 4 topk 2 ffn 8 ";  // line 3, after kBase's two
  auto moe_of = [&](const std::string& words) {
    return build(t, kBase + moe + words + "\nrun 2\n").phases[0].config.model.moe;
  };
  // the defaults: today's batch-level loss, alpha = balance_coef; no sequence-wise loss
  const MoeConfig plain = moe_of("");
  CHECK((plain.aux_scope == AuxScope::batch && plain.seq_aux == 0));
  CHECK((plain.batch_loss_coef() == 0.001 && plain.sequence_loss_coef() == 0));
  const MoeConfig v2 = moe_of("balance aux balance_coef 0.003 aux_scope sequence");
  CHECK((v2.batch_loss_coef() == 0 && v2.sequence_loss_coef() == 0.003));
  const MoeConfig v3 = moe_of("gate sigmoid balance bias balance_coef 0.02 seq_aux 0.0001");
  CHECK((v3.batch_loss_coef() == 0 && v3.sequence_loss_coef() == 0.0001));
  const MoeConfig bias = moe_of("gate sigmoid balance bias");
  CHECK((bias.batch_loss_coef() == 0 && bias.sequence_loss_coef() == 0));
  // each keyword with the other mode: one error naming the line and which belongs to which
  CHECK(error_of(t, kBase + moe + "balance bias aux_scope sequence\nrun 2\n") ==
        file + ":3: 'aux_scope' sequence with balance bias (expected balance aux: aux_scope belongs to balance aux; "
               "balance bias takes the sequence-wise loss as seq_aux X)");
  CHECK(error_of(t, kBase + moe + "balance aux seq_aux 0.01\nrun 2\n") ==
        file + ":3: 'seq_aux' 0.01 with balance aux (expected balance bias: seq_aux belongs to balance bias; balance "
               "aux takes the sequence-wise loss as aux_scope sequence)");
  CHECK_THAT(error_of(t, kBase + moe + "aux_scope token\nrun 2\n"),
             Catch::StartsWith(file + ":3: bad value 'token' for 'aux_scope' (expected one of: batch, sequence)"));
  CHECK_THAT(error_of(t, kBase + moe + "balance bias seq_aux -1\nrun 2\n"),
             Catch::StartsWith(file + ":3: value -1 for 'seq_aux' is out of range (expected >= 0)"));
  // a repeated line keeps what it does not name: switching to bias under aux_scope sequence is refused there
  CHECK_THAT(error_of(t, kBase + moe + "aux_scope sequence\nmoe on balance bias\nrun 2\n"),
             Catch::StartsWith(file + ":4: 'aux_scope' sequence with balance bias"));
}

TEST_CASE("deck: pipeline stages P [schedule] [virtual V] [micro M]: defaults, and each bad input at its line",
          "[deck][pipeline]") {
  TempDir t;
  const std::string file = (t.dir / "test.deck").string();
  auto at = [&](int line) { return file + ":" + std::to_string(line); };
  const std::string four = "model dense vocab 256 dim 16 layers 4 heads 2 ffn 32 seq 8\ndata bytes corpus.txt\n";
  // (a checkpoint line before run: where P > 1 refused checkpoints)
  auto staged = [](std::string text) { return text.insert(text.rfind("run "), "checkpoint at_end no\n"); };
  {
    const Program p = build(t, kBase + "run 2\n");
    CHECK(p.phases[0].config.pipeline == PipelineConfig{});  // stages 1: no pipeline
    const Program q = build(t, staged(four + "pipeline stages 2 schedule 1f1b micro 4\nrun 2\n"));
    const PipelineConfig& c = q.phases[0].config.pipeline;
    CHECK(c.stages == 2);
    CHECK(c.schedule == "1f1b");
    CHECK(c.micro == 4);
    CHECK(c.virtual_stages == 1);
    CHECK(build(t, staged(four + "pipeline stages 4 micro 2\nrun 2\n")).phases[0].config.pipeline.schedule == "gpipe");
  }
  auto check = [&](const std::string& text, const std::string& start, const std::string& also = "") {
    const std::string msg = error_of(t, staged(text));
    INFO(msg);
    CHECK_THAT(msg, Catch::StartsWith(start));
    CHECK(msg.find(also) != std::string::npos);
  };
  check(four + "pipeline stages 3\nrun 2\n", at(3) + ": pipeline stages 3 does not divide the model's 4 layers",
        "expected stages x virtual dividing layers");
  check(four + "pipeline stages 4 schedule interleaved virtual 2 micro 4\nrun 2\n",
        at(3) + ": pipeline stages 4 x virtual 2 does not divide the model's 4 layers");
  check(four + "pipeline stages 4 schedule 1f1b micro 2\nrun 2\n",
        at(3) + ": pipeline 'micro' 2 is fewer than 'stages' 4 with schedule 1f1b", "expected micro >= stages");
  CHECK(error_of(t, staged(four + "pipeline stages 2 schedule interleaved virtual 2 micro 4\nrun 2\n")).empty());
  CHECK(error_of(t, staged(four + "pipeline stages 2 schedule dualpipev virtual 2 micro 4\nrun 2\n")).empty());
  check(four + "pipeline stages 2 schedule dualpipev micro 4\nrun 2\n",
        at(3) + ": pipeline schedule dualpipev with virtual 1", "expected virtual 2");
  check(four + "pipeline stages 2 schedule dualpipev virtual 2 micro 2\nrun 2\n",
        at(3) + ": pipeline 'micro' 2 is fewer than 2 x 'stages' 2 with schedule dualpipev", "expected micro >= 4");
  check(four + "pipeline stages 4 schedule interleaved virtual 1 micro 6\nrun 2\n",
        at(3) + ": pipeline 'micro' 6 is not a multiple of 'stages' 4 with schedule interleaved",
        "expected micro a multiple of stages");
  check(four + "pipeline stages 1 schedule interleaved virtual 2 micro 4\nrun 2\n",
        at(3) + ": pipeline schedule interleaved with stages 1", "expected stages >= 2");
  check(four + "pipeline stages 2 schedule interleaved virtual 2 micro 4 cut 3,1\nrun 2\n",
        at(3) + ": pipeline cut 3,1 names 2 chunks, not 'stages' 2 x 'virtual' 2", "expected one block count per chunk");
  check(four + "pipeline stages 1 schedule dualpipev virtual 3\nrun 2\n",
        at(3) + ": pipeline schedule dualpipev with 3 chunks (stages 1 x virtual 3)", "expected an even number");
  check(four + "pipeline stages 2 virtual 2\nrun 2\n", at(3) + ": pipeline 'virtual' 2 with schedule gpipe");
  check(four + "pipeline stages 2 micro 3\nrun 2\n",
        at(3) + ": pipeline micro 3 does not divide the data batch 8 (" + at(2) + ")", "expected micro dividing batch");
  CHECK(error_of(t, four + "pipeline stages 2\nmoe on routed 4 topk 2 ffn 8 ep 2\nrun 2\n").empty());  // ep in a stage
  CHECK(error_of(t, four + "pipeline stages 2\nshard optimizer\nrun 2\n").empty());  // ZeRO-1 over a stage's replicas
  CHECK(error_of(t, four + "pipeline stages 2\nshard gradients\nrun 2\n").empty());  // ZeRO-2 too
  // cut N0,N1,...: each stage's blocks, uneven where P does not divide L, summing to L
  {
    const Program p = build(t, four + "pipeline stages 2 cut 3,1\nrun 2\n");
    CHECK(p.phases[0].config.pipeline.cut == std::vector<int>{3, 1});
  }
  CHECK(error_of(t, "model dense vocab 256 dim 16 layers 3 heads 2 ffn 32 seq 8\ndata bytes corpus.txt\n"
                    "pipeline stages 2 cut 2,1\nrun 2\n").empty());
  check(four + "pipeline stages 2 cut 3,2\nrun 2\n",
        at(3) + ": pipeline cut 3,2 gives 5 blocks, the model has 4 layers (" + at(1) + ")", "expected a cut summing");
  check(four + "pipeline stages 2 cut 4\nrun 2\n", at(3) + ": pipeline cut 4 names 1 chunks, not 'stages' 2 x 'virtual' 1",
        "expected one block count per chunk");
  check(four + "pipeline stages 2 cut 4,0\nrun 2\n", at(3) + ": bad value '4,0' for 'cut'", "integers >= 1");
  check(four + "pipeline stages 2 cut 3,,1\nrun 2\n", at(3) + ": bad value '3,,1' for 'cut'", "separated by commas");
  check("model dense vocab 256 dim 16 layers 3 heads 2 ffn 32 seq 8\ndata bytes corpus.txt\npipeline stages 2\nrun 2\n",
        at(3) + ": pipeline stages 2 does not divide the model's 3 layers", "or cut N0,N1,... naming each chunk's");
  check(four + "pipeline stages 1 micro 2\nshard params\nrun 2\n",
        at(3) + ": pipeline stages 1 micro 2 with shard params (" + at(4) + "): sharding the weights is not built");
  check(four + "pipeline stages 2\nsync accumulate 2\nrun 2\n",
        at(3) + ": pipeline stages 2 with sync accumulate", "pipeline micro M takes the place of sync accumulate");
  check(four + "pipeline stages 2\ntopology ring\nrun 2\n", at(3) + ": pipeline stages 2 with sync dense topology ring");
  CHECK(error_of(t, staged(four + "pipeline stages 2 schedule gpipe micro 1\nrun 2\n")).empty());  // gpipe takes M < P
  // What needs the whole model on one rank is refused under P > 1, naming its line; checkpoints are not.
  CHECK(error_of(t, four + "pipeline stages 2\nrun 2\n").empty());
  check(four + "pipeline stages 2\nsample every 5\nrun 2\n",
        at(3) + ": pipeline stages 2 with sample every 5 (" + at(4) + "): sampling is not built");
  check(four + "pipeline stages 2\nlossagg mean\nrun 2\n", at(3) + ": pipeline stages 2 with lossagg mean");
}

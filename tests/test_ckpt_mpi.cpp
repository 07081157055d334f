// Per-rank checkpoints (docs/CHECKPOINT.md, version 2): every rank's own
// state in /ranks/<r>, written collectively with parallel HDF5, so a run
// whose ranks disagree (sync local, clusters, compression residuals) resumes
// bit for bit from any step; diff codecs rebuild each rank within their bounds.
#include <catch2/catch.hpp>
#include <hdf5.h>
#include <cmath>
#include <filesystem>
#include "mode_words.h"
#include "core/device_memory.h"
#include "core/error.h"
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
  return run_trainer(program, resume,
                     [](Trainer& t) { return Outcome{t.losses(), all_fingerprints(t.model().params())}; });
}

}  // namespace

TEST_CASE("per-rank checkpoints resume bit for bit where ranks disagree", "[mpi][ckpt][host]") {
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

TEST_CASE("one deck with every per-rank state: local SGD in clusters, then compression, diff checkpoints",
          "[mpi][ckpt]") {
  const auto dir = shared_scratch("ckpt_phases");
  const auto corpus = make_corpus(dir);
  // Phase 1 (steps 1-5): sync local 3 with an outer Nesterov step in redrawn
  // clusters; phase 2 (6-10): dense with top-k compression and error
  // feedback. Diff checkpoints every 3 steps land inside both phases.
  const std::string extra =
      "checkpoint every 3 mode diff codec lossless\n"
      "sync local 3 outer nesterov lr 0.7 momentum 0.5\ntopology clusters 2 redraw 2\nrun 5\n"
      "sync dense\ntopology full\ncompress topk 0.05 quant int8 feedback on\n";
  const auto program = make_program(dir, "deck", small_deck(corpus, dir + "/run", 5, extra));
  const auto full = run(program);
  REQUIRE(full.losses.size() == 10);
  // Phase 1 ends in consensus, moments included, so the dense phase keeps every rank equal.
  REQUIRE(all_equal(full.fingerprints));
  for (int at : {3, 6, 9}) {
    INFO("resumed from step " << at);
    const auto resumed = run(program, ckpt(dir + "/run", at));
    REQUIRE(resumed.losses.size() == size_t(10 - at));
    for (int i = 0; i < 10 - at; ++i) REQUIRE(resumed.losses[i] == full.losses[at + i]);
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
  Frame layout_of_run;
  for (const auto& [name, line] : modes) {
    const auto extra = "sync local 4\ncheckpoint every 2 at_end no " + line + "\n";
    RunOptions options;
    options.quiet = true;
    Trainer trainer(MPI_COMM_WORLD, make_program(dir, name, small_deck(corpus, dir + "/" + name, 3, extra)), options);
    trainer.run();
    layout_of_run = whole_frame(trainer.model().layout());
    files[name] = ckpt(dir + "/" + name, 2);
  }
  if (mpi_rank() != 0) return;
  const Frame& layout = layout_of_run;
  const auto base = read_checkpoint(files["full"], layout);
  const int64_t n = frame_total(layout);
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

TEST_CASE("resume on half and on twice the ranks: merged ranks average, new ranks start from the base", "[mpi][ckpt]") {
  const int W = mpi_size();
  if (W < 2) return;  // needs two world sizes (runs at 2 and 4 ranks)
  const int half = W / 2;
  const auto dir = shared_scratch("ckpt_world");
  const auto corpus = make_corpus(dir);
  MPI_Comm small;
  MPI_Comm_split(MPI_COMM_WORLD, mpi_rank() < half ? 0 : MPI_UNDEFINED, mpi_rank(), &small);
  // sync local 4, a checkpoint after step 2 of 3: the ranks disagree in it.
  const std::string extra = "sync local 4\ncheckpoint every 2 at_end no mode diff codec lossless\n";
  RunOptions quiet;
  quiet.quiet = true;
  auto train = [&](MPI_Comm comm, const std::string& name) {
    Trainer t(comm, make_program(dir, name, small_deck(corpus, dir + "/" + name, 3, extra)), quiet);
    t.run();
    return ckpt(dir + "/" + name, 2);
  };
  // Rank r' of the new world must hold the mean of the old ranks that map to it.
  auto expect_params = [&](Trainer& t, const std::string& file, int old_world, const std::vector<int>& sources) {
    const Frame layout = whole_frame(t.model().layout());
    const auto base = read_checkpoint(file, layout);
    std::vector<double> sum(frame_total(layout), 0.0);
    for (int r : sources) {
      const auto s = read_rank_state(file, layout, base, r);
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += s.params[i];
    }
    auto got = xx::host_copy(t.model().params());
    int64_t wrong = 0;
    for (size_t i = 0; i < sum.size(); ++i) wrong += got(i) != float(sum[i] / double(sources.size()));
    REQUIRE(wrong == 0);
    (void)old_world;
  };
  const std::vector<double> no_losses;

  // (decks are made by every rank together: make_program synchronises the world)
  SECTION("W ranks, resumed on W/2") {
    const std::string file = train(MPI_COMM_WORLD, "big");
    const auto program = make_program(dir, "big_on_half", small_deck(corpus, dir + "/big", 3, extra));
    if (small != MPI_COMM_NULL) {
      quiet.resume = file;
      Trainer t(small, program, quiet);
      const int r = mpi_rank();
      std::vector<int> sources;
      for (int old = 0; old < W; ++old)
        if (old * half / W == r) sources.push_back(old);
      REQUIRE(sources.size() == size_t(W / half));
      expect_params(t, file, W, sources);
      // 2 batches of 4 windows on each of W ranks are done: the epoch goes on at 8 W.
      REQUIRE(t.data_start() == Continuation{0, 2 * 4 * W});
      t.run();
      REQUIRE(t.losses().size() == 1);
      REQUIRE(std::isfinite(t.losses()[0]));
    }
  }
  SECTION("W/2 ranks, resumed on W") {
    std::string file;
    const auto program = make_program(dir, "small", small_deck(corpus, dir + "/small", 3, extra));
    if (small != MPI_COMM_NULL) {
      Trainer first(small, program, quiet);
      first.run();
      file = ckpt(dir + "/small", 2);
    }
    int n = int(file.size());
    MPI_Bcast(&n, 1, MPI_INT, 0, MPI_COMM_WORLD);
    file.resize(n);
    MPI_Bcast(file.data(), n, MPI_CHAR, 0, MPI_COMM_WORLD);
    quiet.resume = file;
    Trainer t(MPI_COMM_WORLD, make_program(dir, "small_on_all", small_deck(corpus, dir + "/small", 3, extra)), quiet);
    const int r = mpi_rank();
    std::vector<int> sources;
    for (int old = 0; old < half; ++old)
      if (old * W / half == r) sources.push_back(old);
    if (sources.empty())  // a new rank: the mean of all old ranks
      for (int old = 0; old < half; ++old) sources.push_back(old);
    expect_params(t, file, half, sources);
    REQUIRE(t.data_start() == Continuation{0, 2 * 4 * half});
    t.run();
    REQUIRE(t.losses().size() == 1);
  }
  if (small != MPI_COMM_NULL) MPI_Comm_free(&small);
}

// Diff across time (base_every): a base file every M checkpoints, deltas
// against it in between; restore reads the base and one delta.
TEST_CASE("base_every 3: resuming from a delta inside a chain is bit-identical to the uninterrupted run",
          "[mpi][ckpt]") {
  const auto dir = shared_scratch("ckpt_chain");
  const auto corpus = make_corpus(dir);
  // Checkpoints at steps 2 (base), 4 and 6 (deltas of step 2), 8 (base).
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"local_diff", "sync local 3\ncheckpoint every 2 mode diff codec lossless base_every 3\n"},
      {"local_full", "sync local 3\ncheckpoint every 2 mode full codec lossless base_every 3\n"},
  };
  for (const auto& [name, extra] : cases) {
    INFO(name);
    const auto full = run(make_program(dir, name + "_full", small_deck(corpus, dir + "/" + name + "_full", 8, extra)));
    const auto program = make_program(dir, name, small_deck(corpus, dir + "/" + name, 8, extra));
    const auto first = run(program);
    REQUIRE(first.losses == full.losses);
    const std::string run_dir = dir + "/" + name;
    REQUIRE(read_chain_link(ckpt(run_dir, 2)).kind == "base");
    for (int at : {4, 6}) {
      const auto link = read_chain_link(ckpt(run_dir, at));
      REQUIRE(link.kind == "delta");
      REQUIRE(link.parent == "step_00000002.h5");
    }
    REQUIRE(read_chain_link(ckpt(run_dir, 8)).kind == "base");
    for (int at : {6, 4}) {  // 6 first: resuming from 4 rewrites 6 (as a new base)
      INFO("resumed from step " << at);
      const auto resumed = run(program, ckpt(run_dir, at));
      REQUIRE(resumed.losses.size() == size_t(8 - at));
      for (int i = 0; i < 8 - at; ++i) REQUIRE(resumed.losses[i] == full.losses[at + i]);
      REQUIRE(resumed.fingerprints == full.fingerprints);
    }
  }
}

TEST_CASE("keep 2 with base_every 3 never deletes a base a kept delta needs; a missing base is one clear error",
          "[mpi][ckpt]") {
  const auto dir = shared_scratch("ckpt_chain_keep");
  const auto corpus = make_corpus(dir);
  // Steps 1 (base) 2 3 (deltas), 4 (base) 5 6 (deltas): keep 2 keeps 5 and 6, and 4 for them.
  const std::string extra = "sync local 3\ncheckpoint every 1 mode diff codec int8 base_every 3 keep 2\n";
  const auto program = make_program(dir, "keep", small_deck(corpus, dir + "/keep", 6, extra));
  Trainer trainer(MPI_COMM_WORLD, program, RunOptions{"", true});
  trainer.run();
  REQUIRE(trainer.losses().size() == 6);
  const Frame layout = whole_frame(trainer.model().layout());
  if (mpi_rank() == 0) {
    namespace fs = std::filesystem;
    std::vector<std::string> left;
    for (const auto& e : fs::directory_iterator(dir + "/keep/ckpt"))
      if (e.path().extension() == ".h5") left.push_back(e.path().filename().string());
    std::sort(left.begin(), left.end());
    REQUIRE(left == std::vector<std::string>{"step_00000004.h5", "step_00000005.h5", "step_00000006.h5"});
    REQUIRE(read_chain_link(ckpt(dir + "/keep", 6)).parent == "step_00000004.h5");
    // A delta without its base: one InputError naming the delta and the missing base.
    fs::create_directories(dir + "/lone/ckpt");
    fs::copy_file(ckpt(dir + "/keep", 6), ckpt(dir + "/lone", 6), fs::copy_options::overwrite_existing);
    REQUIRE_THROWS_AS(read_checkpoint(ckpt(dir + "/lone", 6), layout), InputError);
    REQUIRE_THROWS_WITH(read_checkpoint(ckpt(dir + "/lone", 6), layout),
                        Catch::Contains(ckpt(dir + "/lone", 6)) && Catch::Contains("step_00000004.h5") &&
                            Catch::Contains("missing"));
    // With its base next to it, the delta reads.
    fs::copy_file(ckpt(dir + "/keep", 4), ckpt(dir + "/lone", 4), fs::copy_options::overwrite_existing);
    REQUIRE_NOTHROW(read_checkpoint(ckpt(dir + "/lone", 6), layout));
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("async on writes the same tensors as async off, and resumes bit for bit", "[mpi][ckpt]") {
  const auto dir = shared_scratch("ckpt_async");
  const auto corpus = make_corpus(dir);
  const std::string line = "sync local 3\ncheckpoint every 2 mode diff codec lossless base_every 3 async ";
  const auto sync_program = make_program(dir, "off", small_deck(corpus, dir + "/off", 6, line + "off\n"));
  const auto async_program = make_program(dir, "on", small_deck(corpus, dir + "/on", 6, line + "on\n"));
  const auto off = run(sync_program);
  Trainer trainer(MPI_COMM_WORLD, async_program, RunOptions{"", true});
  trainer.run();
  REQUIRE(trainer.losses() == off.losses);
  const Frame layout = whole_frame(trainer.model().layout());
  if (mpi_rank() == 0) {
    for (int at : {2, 4, 6}) {
      INFO("step " << at);
      const auto a = read_checkpoint(ckpt(dir + "/off", at), layout), b = read_checkpoint(ckpt(dir + "/on", at), layout);
      REQUIRE(a.chain_kind == b.chain_kind);
      REQUIRE(a.chain_parent == b.chain_parent);
      REQUIRE(a.params == b.params);
      REQUIRE(a.adam_m == b.adam_m);
      REQUIRE(a.adam_v == b.adam_v);
      REQUIRE(a.buffers == b.buffers);
      REQUIRE(a.series == b.series);
      for (int r = 0; r < mpi_size(); ++r) {
        const auto ra = read_rank_state(ckpt(dir + "/off", at), layout, a, r);
        const auto rb = read_rank_state(ckpt(dir + "/on", at), layout, b, r);
        REQUIRE(ra.params == rb.params);
        REQUIRE(ra.adam_m == rb.adam_m);
        REQUIRE(ra.adam_v == rb.adam_v);
        REQUIRE(ra.extra == rb.extra);
        REQUIRE(ra.sampler_batches == rb.sampler_batches);
      }
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const auto resumed = run(async_program, ckpt(dir + "/on", 4));  // a delta
  REQUIRE(resumed.losses.size() == 2);
  for (int i = 0; i < 2; ++i) REQUIRE(resumed.losses[i] == off.losses[4 + i]);
  REQUIRE(resumed.fingerprints == off.fingerprints);
}

namespace {

// Everything a checkpoint file holds, by name: each dataset's values
// ("/ranks/1/params") and each attribute's ("/ranks/1/params@crc32c", "@deck" at the root),
// as raw bytes of their native types.
using Content = std::map<std::string, std::vector<char>>;

herr_t add_attribute(hid_t obj, const char* name, const H5A_info_t*, void* out) {
  auto& [content, where] = *static_cast<std::pair<Content*, std::string>*>(out);
  const hid_t attr = H5Aopen(obj, name, H5P_DEFAULT), type = H5Aget_type(attr);
  std::vector<char> bytes(H5Aget_storage_size(attr));
  H5Aread(attr, type, bytes.data());
  (*content)[where + "@" + name] = bytes;
  H5Tclose(type), H5Aclose(attr);
  return 0;
}

void add_attributes(hid_t obj, const std::string& where, Content& content) {
  std::pair<Content*, std::string> out{&content, where};
  H5Aiterate2(obj, H5_INDEX_NAME, H5_ITER_INC, nullptr, add_attribute, &out);
}

herr_t add_object(hid_t group, const char* name, const H5L_info_t*, void* out) {
  auto& content = *static_cast<Content*>(out);
  const hid_t obj = H5Oopen(group, name, H5P_DEFAULT);
  const std::string where = std::string("/") + name;
  if (H5Iget_type(obj) == H5I_DATASET) {
    const hid_t type = H5Dget_type(obj), native = H5Tget_native_type(type, H5T_DIR_DEFAULT), space = H5Dget_space(obj);
    std::vector<char> bytes(size_t(H5Sget_simple_extent_npoints(space)) * H5Tget_size(native));
    if (!bytes.empty()) H5Dread(obj, native, H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes.data());
    content[where] = bytes;
    H5Sclose(space), H5Tclose(native), H5Tclose(type);
  } else {
    content[where + "/"] = {};  // a group
  }
  add_attributes(obj, where, content);
  H5Oclose(obj);
  return 0;
}

Content file_content(const std::string& path) {
  Content content;
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  REQUIRE(file >= 0);
  add_attributes(file, "", content);
  H5Lvisit(file, H5_INDEX_NAME, H5_ITER_INC, add_object, &content);
  H5Fclose(file);
  return content;
}

// Values that differ between tensors, ranks and calls.
std::vector<float> wiggly(int64_t n, double seed) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = float(std::sin(seed + 0.37 * double(i)) * (1 + 0.001 * double(i % 97)));
  return v;
}

}  // namespace

TEST_CASE("writer rank0 writes the file writer collective writes: every dataset and attribute, every rank's state",
          "[mpi][ckpt]") {
  const auto dir = shared_scratch("ckpt_writer");
  ModelConfig m;
  m.dim = 16, m.layers = 2, m.heads = 2, m.ffn = 32, m.vocab = 64, m.seq = 8;
  const Frame layout = whole_frame(ParamLayout(m));
  const int64_t n = frame_total(layout);
  const int rank = mpi_rank();
  // The base (the same on every rank) and each rank's own state, which differs.
  CheckpointData data;
  data.params = wiggly(n, 1), data.adam_m = wiggly(n, 2), data.adam_v = wiggly(n, 3);
  for (auto& x : data.adam_v) x = x * x;
  data.buffers["layers.0.ffn.gate_bias"] = wiggly(8, 4);
  data.series["adam_steps"] = {7};
  data.state.step = 7, data.state.world_size = mpi_size(), data.state.seed = 99;
  data.deck = "seed 99\n";
  data.state_index = "/train adam_steps\n/ranks/* residual\n";
  auto own_state = [&](int r) {
    RankState s;
    s.params = data.params, s.adam_m = data.adam_m, s.adam_v = data.adam_v;
    const auto nudge = wiggly(n, 10 + r);
    for (int64_t i = 0; i < n; i += 3) s.params[i] += 1e-3f * nudge[i], s.adam_m[i] -= 1e-4f * nudge[i];
    s.extra["residual"] = wiggly(n, 20 + r);
    s.sampler_batches = 5 + r;
    return s;
  };
  const RankState mine = own_state(rank);

  const std::vector<std::pair<std::string, std::string>> formats = {
      {"full", "full"}, {"diff_lossless", "lossless"}, {"diff_int8", "int8"}};
  for (const auto& [name, codec] : formats) {
    INFO(name);
    CheckpointFormat format;
    format.mode = name == "full" ? CheckpointMode::full : CheckpointMode::diff;
    format.codec.kind = *mode_from_name<Codec>(codec);
    // One encoding, written by each writer: any difference is the writers'.
    const auto encoded = encode_checkpoint(MPI_COMM_WORLD, layout, data, &mine, format);
    const std::string collective = write_encoded(MPI_COMM_WORLD, dir + "/c_" + name, *encoded);
    const std::string rank0 = write_encoded(MPI_COMM_WORLD, dir + "/r_" + name, *encoded, CheckpointWriter::rank0);
    if (rank != 0) continue;
    const Content a = file_content(collective), b = file_content(rank0);
    REQUIRE(a.count("/ranks/" + std::to_string(mpi_size() - 1) + "/residual"));
    REQUIRE(a.count("@complete"));
    REQUIRE(a.size() > 50);
    for (const auto& [key, bytes] : a) {
      INFO(key);
      REQUIRE(b.count(key));
      REQUIRE(b.at(key) == bytes);
    }
    REQUIRE(b.size() == a.size());
    const auto base_a = read_checkpoint(collective, layout), base_b = read_checkpoint(rank0, layout);
    REQUIRE(base_b.params == base_a.params);
    REQUIRE(base_b.adam_v == base_a.adam_v);
    for (int r = 0; r < mpi_size(); ++r) {
      INFO("rank " << r);
      const auto ra = read_rank_state(collective, layout, base_a, r), rb = read_rank_state(rank0, layout, base_b, r);
      REQUIRE(rb.params == ra.params);
      REQUIRE(rb.adam_m == ra.adam_m);
      REQUIRE(rb.adam_v == ra.adam_v);
      REQUIRE(rb.extra == ra.extra);
      // Each rank's own state, not rank 0's (int8 rebuilds params within its bound only).
      const RankState truth = own_state(r);
      REQUIRE(rb.sampler_batches == truth.sampler_batches);
      REQUIRE(rb.extra == truth.extra);
      if (codec != "int8") REQUIRE(rb.params == truth.params);
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("writer rank0 in a run: async on and off write the collective run's files and resume bit for bit",
          "[mpi][ckpt]") {
  const auto dir = shared_scratch("ckpt_writer_run");
  const auto corpus = make_corpus(dir);
  const std::string line = "sync local 3\ncheckpoint every 2 mode diff codec lossless base_every 2 ";
  const auto collective = run(make_program(dir, "c", small_deck(corpus, dir + "/c", 6, line + "\n")));
  for (const std::string async : {"off", "on"}) {
    INFO("async " << async);
    const auto program =
        make_program(dir, "r" + async, small_deck(corpus, dir + "/r" + async, 6, line + "writer rank0 async " + async + "\n"));
    Trainer trainer(MPI_COMM_WORLD, program, RunOptions{"", true});
    trainer.run();
    REQUIRE(trainer.losses() == collective.losses);
    const Frame layout = whole_frame(trainer.model().layout());
    if (mpi_rank() == 0)
      for (int at : {2, 4, 6}) {
        INFO("step " << at);
        const auto a = read_checkpoint(ckpt(dir + "/c", at), layout), b = read_checkpoint(ckpt(dir + "/r" + async, at), layout);
        REQUIRE(b.chain_kind == a.chain_kind);
        REQUIRE(b.params == a.params);
        for (int r = 0; r < mpi_size(); ++r)
          REQUIRE(read_rank_state(ckpt(dir + "/r" + async, at), layout, b, r).params ==
                  read_rank_state(ckpt(dir + "/c", at), layout, a, r).params);
      }
    MPI_Barrier(MPI_COMM_WORLD);
    const auto resumed = run(program, ckpt(dir + "/r" + async, 4));  // a delta (base_every 2: 4 is a delta of 2)
    REQUIRE(resumed.losses.size() == 2);
    for (int i = 0; i < 2; ++i) REQUIRE(resumed.losses[i] == collective.losses[4 + i]);
    REQUIRE(resumed.fingerprints == collective.fingerprints);
  }
}

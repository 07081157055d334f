// AdamW's moments in bf16 (deck: optimizer adamw ... moments bf16;
// kernels/moments.h): every shard level follows shard off's losses and
// weights, as it does with fp32 moments (test_shard_mpi.cpp: AdamW is
// elementwise, so the rank that owns a piece updates it as shard off does),
// under fp32, bf16 and fp16 precision and under ep; a checkpoint keeps the
// moments' values and type and resumes bit for bit, at every level.
#include <catch2/catch.hpp>
#include <hdf5.h>
#include <algorithm>
#include <cmath>
#include <cstring>
#include "mode_words.h"
#include "ckpt/h5.h"
#include "mpi_fixture.h"

using namespace xx;
using namespace xx::test;
using xx::h5::H5;
using xx::h5::read_string_attr;

namespace {

const std::vector<std::string> kLevels = {"optimizer", "gradients", "params"};

// test_shard_mpi.cpp's small DeepSeek (MLA, 2 shared + 4 routed experts, MTP),
// and its dense model.
const std::string kDeepseek =
    "model deepseek vocab 256 dim 32 layers 2 heads 2 ffn 96 seq 32\n"
    "attention mla kv_lora_rank 16 q_lora_rank 0 qk_nope_dim 8 rope_dim 8 v_dim 8\n"
    "moe on dense_layers 1 shared 2 routed 4 topk 2 ffn 24 gate softmax balance aux balance_coef 0.001{}\n"
    "mtp depth 1 weight 0.3\n";
const std::string kDense = "model dense vocab 256 dim 32 layers 2 heads 2 ffn 96 seq 32\n";

std::string deck(const std::string& model, const std::string& corpus, const std::string& out, const std::string& level,
                 int steps, const std::string& moments, const std::string& extra = "") {
  return "seed 1234\n" + model + "data bytes " + corpus +
         " valid 0.1 batch 4 workers 2\n"
         "optimizer adamw lr 3e-3 beta1 0.9 beta2 0.95 weight_decay 0.1 clip 1.0 moments " + moments + "\n"
         "schedule cosine warmup 10 min_lr 3e-4\n"
         "sync dense bucket_mb 0.01\n"
         "shard " + level + "\n"
         "output dir " + out + " log_every 1\n"
         "eval every 0 batches 2\n"
         "grad_check missing error\n" + extra +
         "run " + std::to_string(steps) + "\n";
}

struct Outcome {
  std::vector<double> losses;
  std::vector<uint64_t> fingerprints;  // every rank's whole weights at the end
  std::string backends;
};

Outcome run(const Program& program, const std::string& resume = "") {
  RunOptions options;
  options.quiet = true;
  options.resume = resume;
  Trainer trainer(MPI_COMM_WORLD, program, options);
  REQUIRE(trainer.optimizer().moments_type() == program.phases[0].config.optimizer.moments);
  trainer.run();
  const std::vector<float> whole = trainer.whole_params();
  const uint64_t mine = fingerprint(Buffer<float>(const_cast<float*>(whole.data()), whole.size()));
  std::vector<uint64_t> all(static_cast<size_t>(mpi_size()));
  MPI_Allgather(&mine, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD);
  return {trainer.losses(), all, trainer.backends()};
}

void require_steps_equal(const std::vector<double>& got, const std::vector<double>& want, size_t from = 0) {
  REQUIRE(got.size() + from == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("step " << from + i + 1);
    REQUIRE(got[i] == want[from + i]);
  }
}

std::string ckpt(const std::string& run_dir, int64_t step) {
  return fmt::format("{}/ckpt/step_{:08d}.h5", run_dir, step);
}

// /optimizer's attribute moments, whether every stored moment is a bf16
// value, and the bytes each takes in the file's type (bf16: uint16 bits,
// encoding "bfloat16", widened here as docs/CHECKPOINT.md says).
struct StoredMoments {
  std::string type;
  bool all_bf16 = true;
  size_t bytes = 0;  // the largest stored element size over the moments' datasets
};
StoredMoments stored_moments(const std::string& path) {
  H5 file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  H5 opt(H5Gopen2(file, "optimizer", H5P_DEFAULT), H5Gclose);
  StoredMoments out{.type = read_string_attr(opt, "moments", path)};
  for (const char* g : {"m", "v"}) {
    H5 group(H5Gopen2(opt, g, H5P_DEFAULT), H5Gclose);
    hsize_t n = 0;
    H5Gget_num_objs(group, &n);
    for (hsize_t i = 0; i < n; ++i) {
      char name[256];
      H5Gget_objname_by_idx(group, i, name, sizeof(name));
      H5 ds(H5Dopen2(group, name, H5P_DEFAULT), H5Dclose);
      H5 space(H5Dget_space(ds), H5Sclose);
      H5 type(H5Dget_type(ds), H5Tclose);
      out.bytes = std::max(out.bytes, H5Tget_size(type));
      std::vector<uint32_t> u(static_cast<size_t>(H5Sget_simple_extent_npoints(space)));
      if (H5Tget_size(type) == 2) {
        REQUIRE(read_string_attr(ds, "encoding", path) == "bfloat16");
        std::vector<uint16_t> bits(u.size());
        H5Dread(ds, H5T_NATIVE_UINT16, H5S_ALL, H5S_ALL, H5P_DEFAULT, bits.data());
        for (size_t k = 0; k < u.size(); ++k) u[k] = uint32_t(bits[k]) << 16;
      } else {
        H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, u.data());
      }
      for (uint32_t x : u) out.all_bf16 &= (x & 0xffffu) == 0;
    }
  }
  return out;
}

}  // namespace

// 1. Each case under shard off, then under each level: the same losses and
// weights, step for step; the bf16 moments are not fp32's (the mode is in
// use); and a checkpoint of each level, holding bf16 values and saying so,
// resumes to the uninterrupted run's losses and weights.
TEST_CASE("moments bf16: every shard level follows shard off, and resumes bit for bit", "[mpi][shard][moments]") {
  const int kSteps = device_emulated() ? 8 : 20, kAt = kSteps / 2;
  const auto dir = shared_scratch("moments_bf16");
  const auto corpus = make_corpus(dir, 100000);
  struct Case {
    std::string name, model, extra;
  };
  std::vector<Case> cases = {
      {"deepseek", fmt::format(fmt::runtime(kDeepseek), ""), ""},
      {"deepseek_bf16", fmt::format(fmt::runtime(kDeepseek), ""), "precision bf16\n"},
      {"dense_fp16", kDense, "precision fp16 loss_scale dynamic scale_window 5\n"},
  };
  if (mpi_size() % 2 == 0) cases.push_back({"deepseek_ep2", fmt::format(fmt::runtime(kDeepseek), " ep 2"), ""});
  // Under the device emulation (the slowest suite), DeepSeek in bf16 alone, as the shard tests there.
  if (device_emulated()) cases = {cases[1]};
  // At 4 ranks ep 2 alone: what 4 adds to 2 is two holders of each expert (the levels' pieces cut across them).
  else if (mpi_size() > 2) cases = {cases.back()};
  const std::string every = fmt::format("checkpoint every {}\n", kAt);
  for (const auto& c : cases) {
    INFO(c.name);
    const auto name = [&](const std::string& s) { return c.name + "_" + s; };
    const auto program = [&](const std::string& tag, const std::string& level, const std::string& moments,
                             const std::string& extra) {
      return make_program(dir, name(tag), deck(c.model, corpus, dir + "/" + name(tag), level, kSteps, moments, c.extra + extra));
    };
    const auto off = run(program("off", "off", "bf16", every));
    REQUIRE(off.losses.size() == size_t(kSteps));
    REQUIRE(all_equal(off.fingerprints));
    const auto fp32 = run(program("fp32", "off", "fp32", "checkpoint every 0\n"));
    REQUIRE(fp32.losses.front() == off.losses.front());  // the first step's loss precedes any update
    REQUIRE(fp32.losses != off.losses);                  // after it, the moments' rounding shows
    for (const auto& level : kLevels) {
      INFO("shard " << level);
      const auto sharded = run(program(level, level, "bf16", every));
      require_steps_equal(sharded.losses, off.losses);
      REQUIRE(sharded.fingerprints == off.fingerprints);
      const std::string path = ckpt(dir + "/" + name(level), kAt);
      if (mpi_rank() == 0) {
        const StoredMoments stored = stored_moments(path);
        REQUIRE(stored.type == "bf16");
        REQUIRE(stored.all_bf16);    // the file keeps the moments as they were kept
        REQUIRE(stored.bytes == 2);  // ... in 2 bytes each
      }
      MPI_Barrier(MPI_COMM_WORLD);
      const auto resumed = run(program(level + "_resumed", level, "bf16", "checkpoint every 0\n"), path);
      require_steps_equal(resumed.losses, off.losses, size_t(kAt));
      REQUIRE(resumed.fingerprints == off.fingerprints);
    }
    // Across levels too: shard off's checkpoint resumed under params.
    const auto across = run(program("off_to_params", "params", "bf16", "checkpoint every 0\n"), ckpt(dir + "/" + name("off"), kAt));
    require_steps_equal(across.losses, off.losses, size_t(kAt));
    REQUIRE(across.fingerprints == off.fingerprints);
  }
}

// 2. A checkpoint of fp32 moments resumes a bf16-moments run (rounded) and one
// of bf16 moments an fp32 run (widened exactly): the file says which it holds.
TEST_CASE("moments: an fp32 checkpoint resumes a bf16 run and a bf16 one an fp32 run", "[mpi][shard][moments]") {
  const auto dir = shared_scratch("moments_cross");
  const auto corpus = make_corpus(dir);
  const std::string model = fmt::format(fmt::runtime(kDeepseek), "");
  const auto program = [&](const std::string& tag, const std::string& moments, const std::string& extra) {
    return make_program(dir, tag, deck(model, corpus, dir + "/" + tag, "optimizer", 8, moments, extra));
  };
  const auto f = run(program("f", "fp32", "checkpoint every 4\n"));
  const auto b = run(program("b", "bf16", "checkpoint every 4\n"));
  if (mpi_rank() == 0) {
    const StoredMoments f_file = stored_moments(ckpt(dir + "/f", 4)), b_file = stored_moments(ckpt(dir + "/b", 4));
    REQUIRE(f_file.type == "fp32");
    REQUIRE(f_file.bytes == 4);
    REQUIRE(b_file.type == "bf16");
    REQUIRE(b_file.all_bf16);
    REQUIRE(b_file.bytes == 2);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const auto f_to_b = run(program("f_to_b", "bf16", "checkpoint every 0\n"), ckpt(dir + "/f", 4));
  const auto b_to_f = run(program("b_to_f", "fp32", "checkpoint every 0\n"), ckpt(dir + "/b", 4));
  REQUIRE(f_to_b.losses.size() == 4);
  REQUIRE(b_to_f.losses.size() == 4);
  // The first resumed step's loss is the checkpoint's weights' (the moments act after it).
  REQUIRE(f_to_b.losses.front() == f.losses[4]);
  REQUIRE(b_to_f.losses.front() == b.losses[4]);
  for (double l : f_to_b.losses) REQUIRE(std::fabs(l - f.losses.back()) < 0.5);
  REQUIRE(all_equal(f_to_b.fingerprints));
  REQUIRE(all_equal(b_to_f.fingerprints));
}

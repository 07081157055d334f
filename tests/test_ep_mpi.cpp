// Expert parallelism (deck: moe ... ep N; src/model/ffn.cpp's parallel_*,
// comm/expert_exchange_mpi.*, the expert buckets of comm/bucket_reducer.cpp):
// ep N follows ep 1's losses and routing, every expert's averaged gradient is
// ep 1's (not N times it: DeepSpeed#5618), reruns are bit-identical, and a
// checkpoint holds the whole model whatever ep wrote it, so it resumes at
// another ep and world size exactly. Run at 1, 2 and 4 ranks (ctest mpi_np*).
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include "mode_words.h"
#include "core/device_memory.h"
#include "ckpt/checkpoint.h"
#include "comm/expert_exchange_mpi.h"
#include "core/error.h"
#include "mpi_fixture.h"

using namespace xx;
using namespace xx::test;

namespace {

// deepseek-tiny's features at dim 32 (MLA, 2 shared + 4 routed experts after
// one dense block, MTP depth 1, whose block is MoE too), at lr 3e-4: at
// deepseek-tiny's 3e-3 a last-bit difference grows to ~1e-3 of the loss in
// 50 steps, for ep 1 against itself too (measured: two GEMM backends differ
// by 1.5e-3 there, by 6e-9 at 3e-4; ep 2 against ep 1 by 7e-4 and 4e-9).
std::string deck(const std::string& corpus, const std::string& out, int ep, const std::string& gate, int steps,
                 const std::string& extra = "") {
  const std::string balance = gate == Gate::softmax ? "aux" : "bias";
  return "seed 1234\n"
         "model deepseek vocab 256 dim 32 layers 2 heads 2 ffn 96 seq 32\n"
         "attention mla kv_lora_rank 16 q_lora_rank 0 qk_nope_dim 8 rope_dim 8 v_dim 8\n"
         "moe on dense_layers 1 shared 2 routed 4 topk 2 ffn 24 gate " + gate + " balance " + balance +
         " balance_coef 0.001 ep " + std::to_string(ep) + "\n"
         "mtp depth 1 weight 0.3\n"
         "data bytes " + corpus + " valid 0.1 batch 4 workers 2\n"
         "optimizer adamw lr 3e-4 beta1 0.9 beta2 0.95 weight_decay 0.1 clip 1.0\n"
         "schedule cosine warmup 10 min_lr 3e-5\n"
         "sync dense bucket_mb 0.01\n"
         "output dir " + out + " log_every 1\n"
         "eval every 0 batches 2\n"
         "grad_check missing error\n"
         "checkpoint every 0 at_end no\n" + extra +
         "run " + std::to_string(steps) + "\n";
}

// Tokens per routed expert of each step, from rank 0's metrics.jsonl (empty elsewhere).
std::vector<std::vector<int64_t>> expert_tokens(const std::string& run_dir) {
  std::vector<std::vector<int64_t>> out;
  if (mpi_rank() != 0) return out;
  std::ifstream in(run_dir + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const auto r = nlohmann::json::parse(line);
    if (r.contains("expert_tokens")) out.push_back(r["expert_tokens"].get<std::vector<int64_t>>());
  }
  return out;
}

struct Outcome {
  std::vector<double> losses;
  std::vector<std::vector<int64_t>> tokens;
  std::vector<float> whole;  // the whole model's weights at the end
  std::string backends;
};

Outcome run(const Program& program, MPI_Comm comm = MPI_COMM_WORLD, const std::string& resume = "") {
  RunOptions options;
  options.quiet = true;
  options.resume = resume;
  Trainer trainer(comm, program, options);
  trainer.run();
  return {trainer.losses(), expert_tokens(program.phases[0].config.output.dir), trainer.whole_params(),
          trainer.backends()};
}

double relative(double a, double b) { return std::fabs(a - b) / std::max(std::fabs(b), 1e-30); }

// The norm of a - b relative to b's.
double relative(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, ref = 0;
  for (size_t i = 0; i < a.size(); ++i) diff += double(a[i] - b[i]) * (a[i] - b[i]), ref += double(b[i]) * b[i];
  return std::sqrt(diff / std::max(ref, 1e-300));
}

// The ep values this world can run with 4 routed experts.
std::vector<int> eps_here() {
  std::vector<int> out;
  for (int ep : {2, 4})
    if (mpi_size() % ep == 0) out.push_back(ep);
  return out;
}

}  // namespace

// 1. Parity: the forward is ep 1's GEMMs on the same rows; the expert weight
// gradients add the group's ranks in another order, and the norm sums its
// squares per group, so the bits may part in the last place.
TEST_CASE("ep N follows ep 1's losses and routing for 50 steps, softmax/aux and sigmoid/bias", "[mpi][ep]") {
  if (eps_here().empty()) return;  // (1 rank: the refusal below)
  // (under the device emulation, which checks the staged exchange and not the
  // long agreement, 20 steps)
  const int kSteps = device_emulated() ? 20 : 50;
  const auto dir = shared_scratch("ep_parity");
  const auto corpus = make_corpus(dir, 100000);
  for (const std::string gate : {"softmax", "sigmoid"}) {
    INFO("gate " << gate);
    const auto one = run(make_program(dir, gate + "_ep1", deck(corpus, dir + "/" + gate + "_ep1", 1, gate, kSteps)));
    REQUIRE(one.losses.size() == size_t(kSteps));
    REQUIRE(one.losses.back() < one.losses.front() - (device_emulated() ? 0.1 : 0.3));  // it learns: a real run
    for (int ep : eps_here()) {
      INFO("ep " << ep);
      const std::string name = gate + "_ep" + std::to_string(ep);
      const auto program = make_program(dir, name, deck(corpus, dir + "/" + name, ep, gate, kSteps));
      const auto spread = run(program);
      REQUIRE_THAT(spread.backends, Catch::Contains(fmt::format("moe ep {}", ep)));
      REQUIRE(spread.losses.size() == one.losses.size());
      double worst = 0;
      for (size_t i = 0; i < one.losses.size(); ++i) {
        INFO("step " << i + 1);
        worst = std::max(worst, relative(spread.losses[i], one.losses[i]));
        REQUIRE(relative(spread.losses[i], one.losses[i]) < 1e-5);
      }
      REQUIRE(spread.tokens == one.tokens);  // every step's tokens per expert (rank 0 reads them)
      if (mpi_rank() == 0) REQUIRE(spread.tokens.size() == size_t(kSteps));
      REQUIRE(relative(spread.whole, one.whole) < 1e-5);
      if (mpi_rank() == 0)
        fmt::print(stderr, "[ep] {} ranks, gate {}, ep {}: losses within {:.2g} of ep 1, weights within {:.2g}\n",
                   mpi_size(), gate, ep, worst, relative(spread.whole, one.whole));
      // A rerun: the all-to-all places every source's rows at fixed offsets.
      const auto again = run(program);
      REQUIRE(again.losses == spread.losses);
      REQUIRE(again.whole == spread.whole);
    }
  }
}

// 2. DeepSpeed#5618: expert gradients ep times too large. After one step the
// averaged gradient of every tensor a rank holds is ep 1's, expert or not.
TEST_CASE("each expert's averaged gradient equals ep 1's", "[mpi][ep]") {
  if (eps_here().empty()) return;
  const auto dir = shared_scratch("ep_gradients");
  const auto corpus = make_corpus(dir);
  RunOptions options;
  options.quiet = true;
  // sync accumulate 2: two micro-batches summed before the reduction; with the
  // balance loss per sequence, whose sequences are each rank's own rows
  for (const std::string extra : {"", "sync accumulate 2 bucket_mb 0.01\n",
                                  "sync accumulate 2 bucket_mb 0.01\nmoe on aux_scope sequence balance_coef 0.1\n"}) {
    INFO("extra: " << extra);
    Trainer one(MPI_COMM_WORLD, make_program(dir, "one", deck(corpus, dir + "/one", 1, "softmax", 1, extra)), options);
    one.train_step();
    for (int ep : eps_here()) {
      INFO("ep " << ep);
      const std::string name = "ep" + std::to_string(ep);
      Trainer spread(MPI_COMM_WORLD, make_program(dir, name, deck(corpus, dir + "/" + name, ep, "softmax", 1, extra)),
                     options);
      spread.train_step();
      ExecSpace().fence();
      int experts = 0;
      for (const auto& t : spread.model().layout().tensors()) {
        INFO(t.name);
        auto mine = xx::host_copy(spread.model().grad(t.name));
        auto want = xx::host_copy(one.model().grad(t.name));
        std::vector<float> a(mine.data(), mine.data() + t.size), b(want.data(), want.data() + t.size);
        REQUIRE(relative(a, b) < 1e-6);
        experts += t.expert >= 0;
      }
      // this rank holds 1/ep of each MoE layer's experts (the main block and the MTP block)
      REQUIRE(experts == 2 * 3 * 4 / ep);
    }
  }
}

// 3. A checkpoint holds the whole model whatever ep wrote it: the file is
// ep 1's layout, every owner's experts in the same datasets; it resumes at
// ep 4 on 4 ranks into ep 2 on 2 ranks and into ep 1, exactly.
TEST_CASE("an ep checkpoint holds the whole model and resumes at another ep and world size exactly",
          "[mpi][ep]") {
  const int W = mpi_size();
  const auto dir = shared_scratch("ep_resume");
  const auto corpus = make_corpus(dir);
  if (W == 1) {  // the world size ep must divide
    const auto program = make_program(dir, "ep2", deck(corpus, dir + "/ep2", 2, "softmax", 2));
    RunOptions options;
    options.quiet = true;
    try {
      Trainer trainer(MPI_COMM_WORLD, program, options);
      FAIL("ep 2 on 1 rank was not refused");
    } catch (const InputError& e) {
      REQUIRE_THAT(e.what(), Catch::Contains("ep2.deck:4: moe ep 2 does not divide the 1 ranks"));
    }
    return;
  }
  const std::string ckpt_extra = "checkpoint every 6\n";
  const auto wrote = run(make_program(dir, "write", deck(corpus, dir + "/write", W, "sigmoid", 6, ckpt_extra)));
  const std::string path = dir + "/write/ckpt/step_00000006.h5";
  // The file's tensors are the whole model the ranks gathered, bit for bit.
  ModelConfig whole_model = make_program(dir, "probe", deck(corpus, dir + "/probe", 1, "sigmoid", 1)).phases[0].config.model;
  const Frame whole = whole_frame(ParamLayout(whole_model));
  if (mpi_rank() == 0) {
    const CheckpointData data = read_checkpoint(path, whole);
    REQUIRE(data.params == wrote.whole);
    REQUIRE(read_checkpoint_layout(path) == std::pair<int, int>{W, W});
  }
  // Into ep W/2 on W/2 ranks, and ep 1 on 1 rank: the weights and moments
  // each rank holds are the file's, then it trains on.
  RunOptions options;
  options.quiet = true;
  options.resume = path;
  for (int ranks : {W / 2, 1}) {
    const int ep = ranks;
    INFO(ranks << " ranks at ep " << ep);
    // (every rank makes the deck: make_program synchronises the world)
    const std::string name = "resume" + std::to_string(ranks);
    const auto program = make_program(dir, name, deck(corpus, dir + "/" + name, ep, "sigmoid", 10));
    MPI_Comm comm;
    MPI_Comm_split(MPI_COMM_WORLD, mpi_rank() < ranks ? 0 : MPI_UNDEFINED, mpi_rank(), &comm);
    if (comm != MPI_COMM_NULL) {
      Trainer trainer(comm, program, options);
      REQUIRE(trainer.step() == 6);
      REQUIRE(trainer.whole_params() == wrote.whole);
      CheckpointData data;
      data.adam_m.resize(frame_total(whole));
      if (mpi_rank() == 0) data = read_checkpoint(path, whole);
      MPI_Bcast(data.adam_m.data(), int(frame_total(whole)), MPI_FLOAT, 0, comm);
      const std::vector<float> m = trainer.optimizer().m().to_host();
      for (const auto& t : trainer.model().layout().tensors()) {
        INFO(t.name);
        REQUIRE(std::equal(m.data() + t.offset, m.data() + t.offset + t.size, data.adam_m.begin() + t.full_offset));
      }
      trainer.run();
      REQUIRE(trainer.losses().size() == 4);
      MPI_Comm_free(&comm);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  // At a world size the deck's ep does not divide, both layouts are named.
  if (W == 4) {
    const auto program = make_program(dir, "wrong", deck(corpus, dir + "/wrong", 4, "sigmoid", 10));
    MPI_Comm comm;
    MPI_Comm_split(MPI_COMM_WORLD, mpi_rank() < 2 ? 0 : MPI_UNDEFINED, mpi_rank(), &comm);
    if (comm != MPI_COMM_NULL) {
      try {
        Trainer trainer(comm, program, options);
        FAIL("ep 4 on 2 ranks was not refused");
      } catch (const InputError& e) {
        REQUIRE_THAT(e.what(), Catch::Contains("moe ep 4 does not divide the 2 ranks of this run"));
        REQUIRE_THAT(e.what(), Catch::Contains("was written by 4 ranks at ep 4"));
      }
      MPI_Comm_free(&comm);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

// 4. With the training state sharded (11/13): replicated buckets over all
// ranks, expert buckets over the ranks holding those experts. Every level
// follows shard off at the same ep, and its checkpoint holds the same model.
TEST_CASE("every shard level follows shard off under ep", "[mpi][ep][shard]") {
  if (eps_here().empty()) return;
  constexpr int kSteps = 20;
  const auto dir = shared_scratch("ep_shard");
  const auto corpus = make_corpus(dir);
  // (at 4 ranks ep 2 has two holders per expert, whose buckets are cut in two; ep 4 one)
  // The first ep also under bf16, where optimizer and gradients keep the fp32
  // master as pieces, the experts' cut over their holders.
  // (under the device emulation bf16 alone: its master pieces stage every
  // path fp32's do; fp32 at each ep is the host suites')
  // (4 ranks: ep 2 alone, two holders per expert, what 4 adds; ep 4's one holder is as ep 2 at 2 ranks)
  std::vector<std::pair<int, std::string>> cases;
  if (!device_emulated()) cases.push_back({eps_here().front(), "fp32"});
  cases.push_back({eps_here().front(), "bf16"});
  for (const auto& [ep, precision] : cases) {
  INFO("ep " << ep << ", " << precision);
  const std::string tag = "ep" + std::to_string(ep) + "_" + precision + "_", with = "precision " + precision + "\n";
  const auto off =
      run(make_program(dir, tag + "off", deck(corpus, dir + "/" + tag + "off", ep, "softmax", kSteps, with)));
  for (const std::string level : {"optimizer", "gradients", "params"}) {
    INFO("shard " << level);
    const auto sharded = run(make_program(dir, tag + level,
                                          deck(corpus, dir + "/" + tag + level, ep, "softmax", kSteps,
                                               with + "shard " + level + "\ncheckpoint every 10 at_end no\n")));
    REQUIRE_THAT(sharded.backends, Catch::Contains("ZeRO"));
    REQUIRE(sharded.losses.size() == off.losses.size());
    double worst = 0;
    for (size_t i = 0; i < off.losses.size(); ++i) {
      INFO("step " << i + 1);
      worst = std::max(worst, relative(sharded.losses[i], off.losses[i]));
      REQUIRE(relative(sharded.losses[i], off.losses[i]) < 1e-6);
    }
    REQUIRE(sharded.tokens == off.tokens);
    REQUIRE(relative(sharded.whole, off.whole) < 1e-6);
    if (mpi_rank() == 0)
      fmt::print(stderr, "[ep] {} ranks, ep {}, {}, shard {}: losses within {:.2g} of shard off, weights within {:.2g}\n",
                 mpi_size(), ep, precision, level, worst, relative(sharded.whole, off.whole));
    // Its checkpoint, each rank's pieces of its experts written into the
    // whole model's datasets, resumes under the same level bit for bit (each
    // rank reading its own pieces back) and under shard off.
    const std::string path = dir + "/" + tag + level + "/ckpt/step_00000010.h5";
    REQUIRE(written_by_slabs(path));
    for (const std::string& again : {level, std::string("off")}) {
      INFO("resumed under shard " << again);
      const auto resumed = run(make_program(dir, tag + level + "_" + again,
                                            deck(corpus, dir + "/" + tag + level + "_" + again, ep, "softmax", kSteps,
                                                 with + "shard " + again + "\n")),
                               MPI_COMM_WORLD, path);
      REQUIRE(resumed.losses.size() == size_t(kSteps - 10));
      for (size_t i = 0; i < resumed.losses.size(); ++i) {
        INFO("step " << 11 + i);
        if (again == level) REQUIRE(resumed.losses[i] == sharded.losses[10 + i]);
        else REQUIRE(relative(resumed.losses[i], sharded.losses[10 + i]) < 1e-6);
      }
      if (again == level) REQUIRE(resumed.whole == sharded.whole);
    }
  }
  }
}

// 5. capacity_factor C: an expert runs at most ceil(C x its group's mean load)
// rows, in arrival order (source rank, then token order), and drops the rest.
// With one MoE layer and the group the whole world (ep W; at 1 rank ep 1), the
// rows dropped each step follow from the tokens per expert alone; a capacity
// no step reaches changes no bit of the dropless run.
TEST_CASE("capacity_factor drops the rows past an expert's capacity and says how many", "[mpi][ep]") {
  const int W = mpi_size();
  if (4 % W != 0) return;
  constexpr int kSteps = 10;
  const auto dir = shared_scratch("ep_capacity");
  const auto corpus = make_corpus(dir);
  auto one_layer = [&](const std::string& name, const std::string& capacity) {
    std::string text = deck(corpus, dir + "/" + name, W, "softmax", kSteps);
    text.replace(text.find("mtp depth 1 weight 0.3\n"), 23, "");  // one MoE layer: the tokens are its own
    text.replace(text.find(" ep "), 0, capacity);
    return make_program(dir, name, text);
  };
  const auto dropless = run(one_layer("dropless", ""));
  const auto roomy = run(one_layer("roomy", " capacity_factor 100"));
  REQUIRE(roomy.losses == dropless.losses);
  REQUIRE(roomy.whole == dropless.whole);
  const auto capped = run(one_layer("capped", " capacity_factor 1.0"));
  REQUIRE(capped.losses.size() == size_t(kSteps));
  REQUIRE(std::isfinite(capped.losses.back()));
  if (mpi_rank() != 0) return;
  const int64_t capacity = (4 * 32) * 2 * W / 4;  // ceil(1.0 x W ranks x 128 tokens x top-2 / 4 experts)
  std::ifstream in(dir + "/capped/metrics.jsonl");
  int64_t steps = 0, total = 0;
  for (std::string line; std::getline(in, line);) {
    const auto r = nlohmann::json::parse(line);
    if (!r.contains("expert_tokens")) continue;
    int64_t want = 0;
    for (int64_t t : r["expert_tokens"].get<std::vector<int64_t>>()) want += std::max<int64_t>(0, t - capacity);
    INFO("step " << r["step"]);
    REQUIRE(r["expert_dropped"].get<int64_t>() == want);
    total += want, ++steps;
  }
  REQUIRE(steps == kSteps);
  REQUIRE(total > 0);  // the router at this size is uneven enough that some step drops
  fmt::print(stderr, "[ep] {} ranks, capacity_factor 1.0: {} rows dropped over {} steps\n", W, total, steps);
}

// 6. The exchange itself: every source's rows arrive in source order, each
// row whole, whatever the row counts (empty ones too); staged through host
// buffers (as a CUDA build's is) the same bytes arrive.
TEST_CASE("the expert exchange delivers every row, directly and through host buffers", "[mpi][ep]") {
  const int P = mpi_size(), me = mpi_rank();
  constexpr int64_t kRowFloats = 5;
  // rank q sends (q + 2 p) % 3 rows to rank p; row i of them holds 1000 q + 10 p + i + k / 10
  auto rows = [](int q, int p) { return int64_t((q + 2 * p) % 3); };
  std::vector<int64_t> send_rows(P), recv_rows(P);
  for (int p = 0; p < P; ++p) send_rows[p] = rows(me, p), recv_rows[p] = rows(p, me);
  std::vector<float> send, want;
  for (int p = 0; p < P; ++p)
    for (int64_t i = 0; i < send_rows[p]; ++i)
      for (int64_t k = 0; k < kRowFloats; ++k) send.push_back(float(1000 * me + 10 * p + i) + float(k) / 10);
  for (int q = 0; q < P; ++q)
    for (int64_t i = 0; i < recv_rows[q]; ++i)
      for (int64_t k = 0; k < kRowFloats; ++k) want.push_back(float(1000 * q + 10 * me + i) + float(k) / 10);
  for (bool staged : {false, true}) {
    INFO((staged ? "through host buffers" : "directly"));
    MpiExpertExchange exchange(MPI_COMM_WORLD, staged);
    REQUIRE_THAT(exchange.describe(), Catch::Contains(staged ? "through host buffers" : "MPI_Ialltoallv"));
    Buffer<float> from("send", send.size() + 1), to("recv", want.size() + 1);
    Kokkos::deep_copy(Kokkos::subview(from, std::pair<size_t, size_t>(0, send.size())),
                      Kokkos::View<const float*, Kokkos::HostSpace, Unmanaged>(send.data(), send.size()));
    Kokkos::deep_copy(to, -1.0f);
    for (int round = 0; round < 2; ++round) {  // twice: the staging buffers are reused
      exchange.start(from.data(), send_rows, to.data(), recv_rows, kRowFloats * int64_t(sizeof(float)));
      exchange.wait();
      std::vector<float> got(want.size());
      Kokkos::deep_copy(Kokkos::View<float*, Kokkos::HostSpace, Unmanaged>(got.data(), got.size()),
                        Kokkos::subview(to, std::pair<size_t, size_t>(0, want.size())));
      REQUIRE(got == want);
    }
    auto tail = xx::host_copy(to);
    REQUIRE(tail(want.size()) == -1.0f);  // nothing past the arrivals
  }
}

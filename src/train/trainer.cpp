#include "train/trainer.h"
#include "train/transfer.h"
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <limits>
#include <thread>
#include <unistd.h>
#include <fmt/format.h>
#include "core/error.h"
#include "core/peak.h"
#include "core/rng.h"
#include "data/seeding.h"
#include "resilience/health.h"
#include "resilience/signals.h"
#include "kernels/elementwise.h"
#include "kernels/health.h"
#include "kernels/precision.h"
#include "kernels/sync.h"

namespace xx {
namespace fs = std::filesystem;
using namespace transfer;

namespace {

double allreduce_sum(double x, MPI_Comm comm) {
  double out = 0;
  MPI_Allreduce(&x, &out, 1, MPI_DOUBLE, MPI_SUM, comm);
  return out;
}

void copy_tokens(Kokkos::View<int32_t*, MemSpace>& dst, const std::vector<int32_t>& src) {
  Kokkos::deep_copy(dst, Kokkos::View<const int32_t*, Kokkos::HostSpace, Unmanaged>(src.data(), src.size()));
}

// poison_batches_for_testing: tokens drawn uniformly from the vocabulary.
std::vector<int32_t> random_tokens(size_t n, int vocab, uint64_t stream) {
  std::vector<int32_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = int32_t(uniform01(stream, i) * vocab) % vocab;
  return out;
}

}  // namespace

Trainer::Trainer(MPI_Comm comm, const Program& program, const RunOptions& options)
    : comm_(comm), program_(program), options_(options) {
  MPI_Comm_rank(comm, &rank_);
  MPI_Comm_size(comm, &world_);
  if (program.phases.empty()) throw InputError("deck: no run command: nothing to do");
  cfg_ = program.phases.front().config;
  // One model and one data stream per job: phases may change the optimizer,
  // schedule, intervals and output, not what is trained on.
  for (const auto& p : program.phases) {
    const auto& m = p.config.model;
    const auto& d = p.config.data;
    if (m.dim != cfg_.model.dim || m.layers != cfg_.model.layers || m.heads != cfg_.model.heads ||
        m.ffn != cfg_.model.ffn || m.vocab != cfg_.model.vocab || m.seq != cfg_.model.seq)
      input_error("{}: the model differs from the first run's (expected one model per deck)", p.where);
    if (d.path != cfg_.data.path || d.format != cfg_.data.format || d.batch != cfg_.data.batch ||
        d.valid_fraction != cfg_.data.valid_fraction || d.shuffle != cfg_.data.shuffle ||
        d.chaos_seed != cfg_.data.chaos_seed || d.common != cfg_.data.common || d.common_rate != cfg_.data.common_rate)
      input_error("{}: the data differs from the first run's (expected one data set per deck)", p.where);
  }

  // Rank 0 validates the data first, so a bad file stops every rank alike.
  auto load_data = [&] {
    corpus_ = Corpus::load(cfg_.data.path, cfg_.data.format);
    if (corpus_.vocab() > cfg_.model.vocab)
      input_error("{}: corpus vocabulary {} exceeds the model's vocab {} (expected model vocab >= {})",
                  cfg_.data.path, corpus_.vocab(), cfg_.model.vocab, corpus_.vocab());
    split_ = split_windows(corpus_, cfg_.model.seq, cfg_.data.valid_fraction);
  };
  on_rank0_or_throw(comm_, rank_, load_data);
  if (rank_ != 0) load_data();

  std::string resume_path;
  on_rank0_or_throw(comm_, rank_, [&] { resume_path = resolve_resume(options_.resume); });
  int n = int(resume_path.size());
  MPI_Bcast(&n, 1, MPI_INT, 0, comm_);
  resume_path.resize(n);
  MPI_Bcast(resume_path.data(), n, MPI_CHAR, 0, comm_);

  // Compression: one `compress topk` setting per deck (phases may turn it off
  // and on), for gradient averaging over everyone or over clusters.
  const CompressConfig* topk = nullptr;
  for (const auto& p : program.phases) {
    const auto& c = p.config.compress;
    if (c.kind != "topk") continue;
    if (p.config.sync.kind == "local")
      input_error("{}: compress topk with sync local (expected sync dense or accumulate: compression applies to "
                  "gradients)", p.where);
    if (p.config.topology.kind == "ring")
      input_error("{}: compress topk with topology ring (expected topology full or clusters)", p.where);
    if (topk && c != *topk)
      input_error("{}: a second, different compress topk setting (expected one per deck; phases may switch it off)",
                  p.where);
    topk = &c;
  }
  comm_ops_ = std::make_unique<Communicator>(comm_, topk ? topk->transport : "");

  model_ = std::make_unique<Transformer<float>>(cfg_.model, cfg_.data.batch);
  model_->init(cfg_.seed);
  optimizer_ = std::make_unique<AdamW<float>>(model_->layout());
  // Mixed precision: one setting per deck (the scaler's state spans phases).
  for (const auto& p : program.phases) {
    if (p.config.precision.kind != cfg_.precision.kind || p.config.precision.loss_scale != cfg_.precision.loss_scale ||
        p.config.precision.scale_window != cfg_.precision.scale_window)
      input_error("{}: the precision differs from the first run's (expected one precision line per deck)", p.where);
    if (p.config.precision.kind != "fp32" && p.config.compress.kind == "topk")
      input_error("{}: precision {} with compress topk (expected precision fp32: a skipped inf/NaN step would "
                  "poison the error-feedback residual)", p.where, p.config.precision.kind);
  }
  precision_ = kernels::precision_from_name(cfg_.precision.kind);
  if (precision_ != kernels::Precision::fp32) {
    model_->set_precision(precision_);
    master_ = Buffer<float>("Trainer::master_params", model_->layout().total());
    const std::string& s = cfg_.precision.loss_scale;
    const bool fp16 = precision_ == kernels::Precision::fp16;
    scaler_ = std::make_unique<LossScaler>(
        LossScaler::from_setting(s == "auto" ? (fp16 ? "dynamic" : "1") : s, cfg_.precision.scale_window));
  }
  sync_ = std::make_unique<GradientSync>(comm_, model_->grads(), cfg_.sync.bucket_mb);
  if (std::string(comm_ops_->dense().name()) != "mpi")
    sync_->use_device_allreduce([this](float* p, int64_t n, MPI_Comm g, CommStats& st) {
      comm_ops_->dense().execute(p, n, g, st);
    });
  if (topk && topk->target == "update") {
    update_before_ = Buffer<float>("Trainer::update_before", model_->layout().total());
    update_delta_ = Buffer<float>("Trainer::update_delta", model_->layout().total());
  }
  if (topk)
    compressed_ = std::make_unique<CompressedSync>(model_->layout(),
                                                   topk->target == "update" ? update_delta_ : model_->grads(), *topk,
                                                   cfg_.sync.bucket_mb);
  topology_ = std::make_unique<Topology>(comm_, cfg_.seed);
  inputs_ = Kokkos::View<int32_t*, MemSpace>("Trainer::inputs", int64_t(cfg_.data.batch) * cfg_.model.seq);
  targets_ = Kokkos::View<int32_t*, MemSpace>("Trainer::targets", inputs_.extent(0));
  // Loss aggregation: weighing ranks needs their gradients averaged over all
  // of them, once, by an all-reduce; per-loss weights (uncertainty) work anywhere.
  for (const auto& p : program.phases) {
    const auto& agg = p.config.lossagg;
    if (agg.kind != "robust" && agg.kind != "softmax") continue;
    if (p.config.sync.kind == "local")
      input_error("{}: lossagg {} with sync local (expected sync dense or accumulate: each rank's own AdamW would "
                  "undo its weight)", p.where, agg.kind);
    if (p.config.topology.kind != "full")
      input_error("{}: lossagg {} with topology {} (expected topology full: the weights are over all ranks)",
                  p.where, agg.kind, p.config.topology.kind);
    if (p.config.compress.kind == "topk" && p.config.compress.target == "update")
      input_error("{}: lossagg {} with compress target update (expected target gradient: each rank's own AdamW "
                  "would undo its weight)", p.where, agg.kind);
  }
  for (const auto& p : program.phases)
    if (p.config.lossagg.kind != "off" && !lossagg_) {
      const auto& m = cfg_.model;
      const bool aux = m.moe.balance == "aux" && m.moe.balance_coef > 0 && !model_->moe_layers().empty();
      const std::array<bool, LossAggregator::kKinds> active = {true, m.mtp.depth > 0, aux};  // main, mtp, aux
      lossagg_ = std::make_unique<LossAggregator>(comm_, active);
    }
  for (const auto& p : program.phases)
    if (Schedule(p.config.optimizer, p.config.schedule, p.config.seed).restart_from_best() &&
        best_.params.extent(0) == 0) {
      const int64_t P = model_->layout().total();
      best_.params = Buffer<float>("Trainer::best_params", P);
      best_.adam_m = Buffer<float>("Trainer::best_adam_m", P);
      best_.adam_v = Buffer<float>("Trainer::best_adam_v", P);
    }
  if (!resume_path.empty()) restore(resume_path), resumed_ = true;

  for (const auto& p : program.phases)
    if (p.config.sync.kind == "local" && p.config.sync.outer != "average" && initial_params_.extent(0) == 0) {
      initial_params_ = Buffer<float>("Trainer::initial_params", model_->layout().total());
      Kokkos::deep_copy(initial_params_, model_->params());
    }
  log_ = std::make_unique<RunLog>(cfg_.output.dir, rank_, !resume_path.empty(), options_.quiet, cfg_.output.tensorboard);
  watchdog_ = std::make_unique<Watchdog>(cfg_.output.dir, rank_, cfg_.resilience.timeout);
  if (!resume_path.empty()) log_->console(fmt::format("resumed from {} at step {}", resume_path, step_));
  if (!log_note_.empty()) log_->console(log_note_);
  // The training stream: chaos seed (restore may have set it), sampler, common pool, loader.
  const std::string& data_where = program.phases.front().where;
  chaos_seed_ = choose_chaos_seed(comm_, cfg_.data, resume_path, chaos_seed_, data_where);
  SamplerOptions sampling = sampler_options(cfg_.data, cfg_.seed, chaos_seed_);
  sampling.start = sampler_start_;  // a resume on another world size continues the epoch
  DistributedSampler sampler = training_sampler(split_.train_windows, world_, rank_, sampling, data_where);
  if (!sampler.pool_windows().empty())
    pool_ = std::make_unique<CommonPool>(comm_, corpus_, sampler.pool_windows(), cfg_.model.seq);
  if (cfg_.data.shuffle != "fixed" || pool_) log_->console("data: " + describe_sampling(cfg_.data, chaos_seed_, sampler));
  if (rank_ == 0)
    write_run_metadata(cfg_.output.dir, cfg_.data, cfg_.seed, chaos_seed_, int64_t(sampler.pool_windows().size()), world_);
  const int64_t samples_per_epoch = sampler.per_rank_per_epoch();
  loader_ = std::make_unique<BatchLoader>(corpus_, std::move(sampler), 0, cfg_.data.batch, cfg_.model.seq,
                                          cfg_.data.workers, cfg_.data.queue, start_batch_,
                                          pool_ ? pool_->tokens() : PoolTokens{});
  flops_per_token_ = flops_per_token(cfg_.model, model_->layout());
  peak_gflops_ = cfg_.peak_gflops;
  if (peak_gflops_ <= 0) {
    if (rank_ == 0) peak_gflops_ = measure_sgemm_gflops(cfg_.model, cfg_.data.batch, 0.3);
    MPI_Bcast(&peak_gflops_, 1, MPI_DOUBLE, 0, comm_);
  }
  log_->rank(fmt::format("rank {} of {}: {} train windows, {} valid windows, {} samples per epoch", rank_, world_,
                         split_.train_windows, split_.valid_windows, samples_per_epoch));
}

Trainer::~Trainer() {
  // A checkpoint write in flight finishes; a failure the run never waited
  // for is printed, since a destructor cannot throw it.
  if (writer_.joinable()) writer_.join();
  if (writer_error_) try {
      std::rethrow_exception(writer_error_);
    } catch (const std::exception& e) {
      fmt::print(stderr, "xuanxue: rank {}: background checkpoint write failed: {}\n", rank_, e.what());
    }
  watchdog_.reset();  // after the join: a writer stuck in a collective is still caught
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (writer_comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&writer_comm_);
}

std::string Trainer::backends() const {
  int len = 0;
  char mpi[MPI_MAX_LIBRARY_VERSION_STRING];
  MPI_Get_library_version(mpi, &len);
  std::string mpi_name(mpi, len);
  mpi_name = mpi_name.substr(0, mpi_name.find_first_of(",\n"));
  std::string out;
  out += fmt::format("  {:<18} {}\n", "kernels", fmt::format("Kokkos {} ({})", KOKKOS_VERSION, ExecSpace::name()));
  out += fmt::format("  {:<18} {}\n", "gemm", "KokkosBlas::gemm -> BLAS (host)");
  out += fmt::format("  {:<18} {}\n", "control", mpi_name);
  out += fmt::format("  {:<18} {} buckets of {} MB, all-reduced during the backward\n", "gradient sync",
                     sync_->buckets(), cfg_.sync.bucket_mb);
  if (compressed_) out += fmt::format("  {:<18} {}\n", "compression", compressed_->describe());
  out += comm_ops_->report() + "\n";
  const auto& ck = cfg_.checkpoint;
  out += fmt::format("  {:<18} parallel HDF5 (MPI-IO, collective), per-rank state {}{}, fletcher32 + crc32c\n",
                     "checkpoints", ck.mode, ck.mode == "diff" ? " " + ck.codec : "");
  out += fmt::format("  {:<18} {} threads, queue {}\n", "data loader", cfg_.data.workers, cfg_.data.queue);
  out += fmt::format("  {:<18} {:.1f} GFLOP/s per core{}\n", "peak (MFU)", peak_gflops_,
                     cfg_.peak_gflops > 0 ? " (from deck)" : " (measured SGEMM)");
  out += fmt::format("  {:<18} {} ({} per token in matmuls), {:.3g} FLOP/token", "parameters", model_->layout().total(),
                     model_->layout().matmul_per_token(), flops_per_token_);
  return out;
}

std::vector<std::string> tensors_without_gradient(const ParamLayout& layout, const Buffer<float>& grads,
                                                  int64_t begin, int64_t end,
                                                  const std::function<bool(const TensorInfo&)>& excused) {
  std::vector<std::string> missing;
  for (const auto& t : layout.tensors()) {
    if (t.offset < begin || t.offset >= end) continue;
    if (excused && excused(t)) continue;
    if (kernels::sum_squares<float>(Vec<const float>(grads.data() + t.offset, t.size)) == 0.0)
      missing.push_back(t.name);
  }
  return missing;
}

void Trainer::check_missing_gradients(int64_t begin, int64_t end) {
  if (cfg_.grad_check.missing == "off") return;
  const auto missing = tensors_without_gradient(model_->layout(), model_->grads(), begin, end,
                                                [&](const TensorInfo& t) { return model_->idle_expert(t); });
  if (missing.empty()) return;
  const std::string msg = fmt::format("rank {}: step {}: no gradient reached {} tensor(s): {}", rank_, step_ + 1,
                                      missing.size(), fmt::join(missing, ", "));
  log_->rank(msg);
  if (cfg_.grad_check.missing == "error") throw std::runtime_error(msg + " (grad_check missing error)");
  fmt::print(stderr, "warning: {}\n", msg);
}

// ---------------------------------------------------------------------------
// TRAINING STEP BEGIN
double Trainer::train_step() {
  // sync dense: all-reduce every step; accumulate K: K micro-batches, one
  // all-reduce; local K: no gradient all-reduce, parameters averaged every K steps.
  const bool local = cfg_.sync.kind == "local";
  const int micro = cfg_.sync.kind == "accumulate" ? cfg_.sync.every : 1;
  topology_->update(cfg_.topology, step_, phase_start_);
  // Gradients are all-reduced in buckets during the backward, within the
  // group; the ring gossips after it.
  const bool compress = cfg_.compress.kind == "topk";
  const bool compress_update = compress && cfg_.compress.target == "update";
  const bool overlap = !local && !topology_->is_ring() && !compress;
  model_->zero_grads();
  sync_->begin(topology_->group());
  // Mixed precision: the forward and backward read the weights rounded to the
  // type, and the backward starts from the scaled loss.
  use_working_weights();
  const double loss_scale = scaler_ ? scaler_->scale() : 1.0;
  if (scaler_) model_->set_loss_scale(loss_scale);
  LossParts mean;
  bool own_nonfinite = false;  // inf or NaN in this rank's loss or gradients (without a loss scaler)
  for (int m = 0; m < micro; ++m) {
    const Batch batch = loader_->next();
    copy_tokens(inputs_, batch.inputs);
    copy_tokens(targets_, batch.targets);
    if (rank_ == poison_rank_) {
      const uint64_t stream = mix_seed(cfg_.seed, 0xbad, uint64_t(step_ * micro + m));
      copy_tokens(inputs_, random_tokens(batch.inputs.size(), cfg_.model.vocab, stream));
      copy_tokens(targets_, random_tokens(batch.targets.size(), cfg_.model.vocab, stream + 1));
    }
    const LossParts parts = model_->forward(inputs_, targets_);
    // Loss aggregation: every rank's losses weigh its seeds for this backward.
    LossWeights seeds;
    if (lossagg_ && cfg_.lossagg.kind != "off")
      seeds = lossagg_->weigh(cfg_.lossagg, {parts.main, cfg_.model.mtp.weight * parts.mtp, parts.aux},
                              double(inputs_.extent(0)));
    model_->set_loss_weights(seeds);
    mean.total += parts.total / micro, mean.main += parts.main / micro;
    mean.mtp += parts.mtp / micro, mean.aux += parts.aux / micro;
    const bool last = m + 1 == micro;
    int64_t final_from = model_->layout().total();
    model_->backward(inputs_, targets_, [&](int64_t offset) {
      if (!last) return;
      if (fault_step_ == step_ + 1 && fault_rank_ == rank_ && final_from == model_->layout().total())
        Kokkos::deep_copy(Kokkos::subview(model_->grads(), final_from - 1), fault_value_);
      // before the sum hides one rank's miss; a rank lossagg robust trimmed has none by design
      if (seeds.main != 0) check_missing_gradients(offset, final_from);
      // Each rank's gradients are in the type once final, before they travel
      // (after the check: an fp16 underflow to zero is not a missing path).
      kernels::round_inplace(Vec<float>(model_->grads().data() + offset, final_from - offset), precision_);
      // This rank's own gradients, before a sum spreads an inf to every rank:
      // the NaN policy can then name the rank it came from.
      if (!scaler_)
        own_nonfinite |= kernels::has_nonfinite(Vec<const float>(model_->grads().data() + offset, final_from - offset));
      final_from = offset;
      if (overlap) sync_->ready(offset);
    });
  }
  restore_master_weights();
  step_comm_ = CommStats{};
  if (overlap) sync_->finish(micro), step_comm_ = sync_->stats();
  if (compress && !compress_update)
    compressed_->reduce(topology_->members(), topology_->group(), step_, micro, *comm_ops_, step_comm_);
  if (compress_update && micro > 1)  // the local mean; the ranks' updates are averaged below
    kernels::scale_inplace<float>(Vec<float>(model_->grads().data(), model_->grads().extent(0)), 1.0f / float(micro));
  if (!local && topology_->is_ring()) {
    auto& g = model_->grads();
    if (micro > 1) kernels::scale_inplace<float>(Vec<float>(g.data(), g.extent(0)), 1.0f / float(micro));
    topology_->average(g.data(), g.extent(0), step_comm_);
  }
  if (lossagg_ && cfg_.lossagg.kind != "off" && world_ > 1)  // one loss gather per micro-batch
    step_comm_.rounds += micro, step_comm_.bytes_sent += micro * int64_t((LossAggregator::kKinds + 1) * sizeof(double));
  // Loss scaling: skip the step on every rank when any rank's gradients hold
  // an inf or NaN; otherwise unscale, so clipping sees the true gradients.
  bool skip = scaler_ && scaler_->update(gradients_overflowed());
  if (!skip && loss_scale != 1.0)
    kernels::scale_inplace<float>(Vec<float>(model_->grads().data(), model_->grads().extent(0)),
                                  float(1.0 / loss_scale));
  own_loss_ = mean.total;
  own_nonfinite |= !scaler_ && !std::isfinite(mean.total);
  double parts[5] = {mean.total, mean.main, mean.mtp, mean.aux, own_nonfinite ? 1.0 : 0.0}, sums[5];
  MPI_Allreduce(parts, sums, 5, MPI_DOUBLE, MPI_SUM, comm_);
  last_loss_ = {sums[0] / world_, sums[1] / world_, sums[2] / world_, sums[3] / world_};
  // NaN policy (health nan skip|stop): every rank saw the same count, so all
  // skip together or all stop with the same message.
  last_skipped_ = false;
  if (sums[4] > 0) {
    const std::string who = ranks_with(comm_, own_nonfinite);
    const std::string what = fmt::format("step {}: inf or NaN in the loss or gradients of {}", step_ + 1, who);
    if (cfg_.health.nan == "stop")
      throw HealthError(what + " (health nan stop; `health nan skip` skips such steps)");
    if (++nonfinite_in_row_ > cfg_.health.max_skips)
      throw HealthError(fmt::format("{}: {} non-finite steps in a row (health max_skips {})", what, nonfinite_in_row_,
                                    cfg_.health.max_skips));
    log_->console(fmt::format("{}: step skipped on every rank ({} in a row, at most {})", what, nonfinite_in_row_,
                              cfg_.health.max_skips));
    skip = last_skipped_ = true;
    ++nonfinite_skipped_;
  } else if (!scaler_) {
    nonfinite_in_row_ = 0;
  }
  // Under dense and accumulate the gradients are identical on every rank now,
  // so is the norm and the update; under local and compress target update
  // each rank clips its own.
  const double norm = skip ? std::numeric_limits<double>::quiet_NaN()
                          : std::sqrt(kernels::sum_squares<float>(Vec<const float>(model_->grads().data(),
                                                                                   model_->grads().extent(0))));
  const double lr = Schedule(cfg_.optimizer, cfg_.schedule, cfg_.seed).lr(step_ + 1);
  if (compress_update) Kokkos::deep_copy(update_before_, model_->params());
  if (!skip)  // a skipped step leaves the weights and AdamW's moments and step count alone
    optimizer_->step(model_->params(), model_->grads(), cfg_.optimizer, lr, clip_factor(norm, cfg_.optimizer.clip));
  if (lossagg_) lossagg_->end_step(skip ? 0.0 : lr);  // uncertainty: SGD on the log-variances
  if (compress_update) {
    // Every rank stepped its own AdamW; the group averages the compressed
    // changes (what was not sent stays in the residual) and applies the mean.
    const int64_t P = model_->params().extent(0);
    Vec<float> params(model_->params().data(), P), delta(update_delta_.data(), P);
    Vec<const float> before(update_before_.data(), P);
    kernels::update_delta(delta, params, before);
    compressed_->reduce(topology_->members(), topology_->group(), step_, 1, *comm_ops_, step_comm_);
    kernels::apply_delta(params, before, delta);
  }
  if (!skip) balance_experts();  // a skipped step moves no selection bias either
  ++step_;
  if (local && step_ % cfg_.sync.every == 0) average_parameters(false);
  ExecSpace().fence();
  last_norm_ = norm;
  last_lr_ = lr;
  return last_loss_.total;
}

// Mixed precision: the forward and backward read weights rounded to the type;
// AdamW updates the fp32 master copy. No-ops under fp32.
void Trainer::use_working_weights() {
  if (precision_ == kernels::Precision::fp32) return;
  Kokkos::deep_copy(master_, model_->params());
  kernels::round_inplace(Vec<float>(model_->params().data(), model_->params().extent(0)), precision_);
}

void Trainer::restore_master_weights() {
  if (precision_ != kernels::Precision::fp32) Kokkos::deep_copy(model_->params(), master_);
}

// After the gradients are final (averaged, or this rank's own under sync
// local): one flag, the max over all ranks, so every rank skips together.
bool Trainer::gradients_overflowed() {
  ExecSpace().fence();
  int mine = kernels::has_nonfinite(Vec<const float>(model_->grads().data(), model_->grads().extent(0))) ? 1 : 0, any = 0;
  MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, comm_);
  return any != 0;
}

// sync local: measure how far the ranks drifted apart, then average their
// parameters (outer average) or take an outer SGD/Nesterov step on the
// pseudo-gradient anchor - mean (DiLoCo). Every rank ends with the same bits.
void Trainer::average_parameters(bool global) {
  auto& params = model_->params();
  const int64_t P = params.extent(0);
  if (mean_.extent(0) == 0) mean_ = Buffer<float>("Trainer::mean", P);
  if (cfg_.sync.kind == "local" && cfg_.sync.outer != "average" && anchor_.extent(0) == 0) {
    // The anchor starts at the common initial point and moves only at syncs.
    anchor_ = Buffer<float>("Trainer::anchor", P);
    momentum_ = Buffer<float>("Trainer::momentum", P);
    Kokkos::deep_copy(anchor_, initial_params_);
  }
  Kokkos::deep_copy(mean_, params);
  if (global && world_ > 1) {
    ExecSpace().fence();
    comm_ops_->dense().execute(mean_.data(), P, comm_, step_comm_);
    kernels::scale_inplace<float>(Vec<float>(mean_.data(), P), 1.0f / float(world_));
  } else if (!global) {
    topology_->average(mean_.data(), P, step_comm_);
  }
  const double local_sq = kernels::squared_distance(Vec<const float>(params.data(), P), Vec<const float>(mean_.data(), P));
  consensus_ = std::sqrt(allreduce_sum(local_sq, comm_) / (double(world_) * double(P)));
  if (world_ > 1) step_comm_.rounds += 1, step_comm_.bytes_sent += int64_t(sizeof(double));
  if (global) {
    // The phase-end consensus: every rank takes the global mean. Outer steps
    // were taken per group, so the anchors (and outer momenta) are made one
    // too: a later local phase starts its outer loop from the consensus.
    Kokkos::deep_copy(params, mean_);
    if (anchor_.extent(0) > 0) {
      Kokkos::deep_copy(anchor_, mean_);
      if (world_ > 1) comm_ops_->dense().execute(momentum_.data(), P, comm_, step_comm_);
      kernels::scale_inplace<float>(Vec<float>(momentum_.data(), P), 1.0f / float(world_));
    }
  } else if (cfg_.sync.kind != "local" || cfg_.sync.outer == "average") {
    Kokkos::deep_copy(params, mean_);
  } else {
    kernels::outer_step(Vec<float>(params.data(), P), Vec<float>(anchor_.data(), P), Vec<float>(momentum_.data(), P),
                        Vec<const float>(mean_.data(), P), float(cfg_.sync.outer_lr), float(cfg_.sync.momentum),
                        cfg_.sync.outer == "nesterov");
  }
  ExecSpace().fence();
}

// Every rank's AdamW moments become their mean over all ranks.
void Trainer::average_moments() {
  if (world_ == 1) return;
  ExecSpace().fence();
  for (auto* b : {&optimizer_->m(), &optimizer_->v()}) {
    const int64_t n = b->extent(0);
    comm_ops_->dense().execute(b->data(), n, comm_, step_comm_);
    kernels::scale_inplace<float>(Vec<float>(b->data(), n), 1.0f / float(world_));
  }
  ExecSpace().fence();
}

// MoE: the global expert load (one all-reduce), and for balance bias the
// V3 update of each layer's selection bias from its own global load.
void Trainer::balance_experts() {
  auto layers = model_->moe_layers();
  if (layers.empty()) return;
  const int64_t E = cfg_.model.moe.routed;
  std::vector<double> local(layers.size() * E), global(local.size());
  for (size_t l = 0; l < layers.size(); ++l)
    for (int64_t e = 0; e < E; ++e) local[l * E + e] = layers[l].second->expert_counts()[e];
  MPI_Allreduce(local.data(), global.data(), int(local.size()), MPI_DOUBLE, MPI_SUM, comm_);
  expert_load_.assign(E, 0.0);
  for (size_t l = 0; l < layers.size(); ++l) {
    std::vector<double> load(global.begin() + l * E, global.begin() + (l + 1) * E);
    for (int64_t e = 0; e < E; ++e) expert_load_[e] += load[e];
    if (cfg_.model.moe.balance == "bias") layers[l].second->update_bias(load, cfg_.model.moe.balance_coef);
  }
}
// TRAINING STEP END
// ---------------------------------------------------------------------------

double Trainer::evaluate() {
  // K batches per rank; batch j of rank r takes validation windows
  // ((j*W + r)*B + b) mod V, so the ranks together cover K*W*B windows.
  const int64_t B = cfg_.data.batch;
  double sum = 0;
  use_working_weights();
  for (int j = 0; j < cfg_.eval.batches; ++j) {
    std::vector<int64_t> windows(B);
    for (int64_t b = 0; b < B; ++b) windows[b] = ((int64_t(j) * world_ + rank_) * B + b) % split_.valid_windows;
    const Batch batch = make_batch(corpus_, windows, split_.train_windows, cfg_.model.seq, j);
    copy_tokens(inputs_, batch.inputs);
    copy_tokens(targets_, batch.targets);
    sum += model_->forward(inputs_, targets_).main;
  }
  restore_master_weights();
  return allreduce_sum(sum, comm_) / double(world_ * cfg_.eval.batches);
}

// The schedule of the phase that takes 1-based step `step`; none past the deck's end.
std::optional<Schedule> Trainer::schedule_of(int64_t step) const {
  int64_t end = 0;
  for (const auto& p : program_.phases)
    if (step <= (end += p.steps)) return Schedule(p.config.optimizer, p.config.schedule, cfg_.seed);
  return std::nullopt;
}

// restart_from best: the state at the cycle's lowest validation loss so far.
void Trainer::note_validation(double val) {
  if (!Schedule(cfg_.optimizer, cfg_.schedule, cfg_.seed).restart_from_best()) return;
  if (best_.step >= 0 && !(val < best_.val_loss)) return;
  Kokkos::deep_copy(best_.params, model_->params());
  Kokkos::deep_copy(best_.adam_m, optimizer_->m());
  Kokkos::deep_copy(best_.adam_v, optimizer_->v());
  for (auto& [prefix, ffn] : model_->moe_layers()) best_.gate_bias[prefix] = to_host(ffn->bias());
  best_.step = step_, best_.val_loss = val, best_.adam_steps = optimizer_->steps_taken();
}

// A cycle ended at step_; the next step starts the next one at its peak.
// Records (step, lr, val_loss, cycle) in RUN_DIR/lr_history.jsonl and, under
// restart_from best, goes back to the cycle's best validation point (the
// step counter, the LR schedule and the data stream go on).
void Trainer::warm_restart(const Schedule& schedule, double val) {
  if (!std::isfinite(val)) {
    val = evaluate();
    note_validation(val);
  }
  Restart r;
  r.step = step_ + 1, r.lr = schedule.lr(r.step), r.val_loss = val, r.cycle = schedule.cycle(r.step);
  if (schedule.restart_from_best() && best_.step >= 0 && best_.step != step_) {
    Kokkos::deep_copy(model_->params(), best_.params);
    Kokkos::deep_copy(optimizer_->m(), best_.adam_m);
    Kokkos::deep_copy(optimizer_->v(), best_.adam_v);
    for (auto& [prefix, ffn] : model_->moe_layers()) from_host(ffn->bias(), best_.gate_bias[prefix]);
    optimizer_->set_steps_taken(best_.adam_steps);
    r.restored_from = best_.step;
  }
  nlohmann::json record = {{"step", r.step}, {"lr", r.lr}, {"val_loss", r.val_loss}, {"cycle", r.cycle}};
  if (r.restored_from >= 0) record["restored_from"] = r.restored_from, record["restored_val_loss"] = best_.val_loss;
  log_->restart(record);
  log_->console(fmt::format("step {:>6} | warm restart: cycle {} at lr {:.2e} (val_loss {:.4f}){}", step_, r.cycle,
                            r.lr, val,
                            r.restored_from >= 0 ? fmt::format(", back to step {} (val_loss {:.4f})",
                                                               r.restored_from, best_.val_loss)
                                                 : ""));
  restarts_.push_back(r);
  best_.step = -1;  // a new cycle, a new best
}

// ---------------------------------------------------------------------------
// resilience (docs/RESILIENCE.md)

// health every N: one all-gather of every rank's health; a failure ends the
// job on every rank with the same message.
void Trainer::check_health_now() {
  ExecSpace().fence();
  const auto P = model_->params().extent(0);
  // A step skipped for an inf or NaN (health nan skip, or the loss scaler's
  // overflow) was already decided on every rank: not a failure here.
  const bool decided = last_skipped_ || scaler_;
  RankHealth mine;
  mine.finite_loss = decided || std::isfinite(own_loss_);
  mine.finite_grads = decided || !kernels::has_nonfinite(Vec<const float>(model_->grads().data(), P));
  mine.step = step_;
  mine.available_mb = available_memory_mb();
  mine.params_fingerprint = kernels::fingerprint(Vec<const float>(model_->params().data(), P));
  // Ranks hold the same bits after every step of sync dense/accumulate over
  // the full topology, and right after a sync local average.
  const bool same = topology_->is_full() && !(cfg_.compress.kind == "topk" && cfg_.compress.target == "update") &&
                    (cfg_.sync.kind != "local" || step_ % cfg_.sync.every == 0);
  const HealthVerdict verdict = check_health(comm_, mine, same);
  if (!verdict.failure.empty()) throw HealthError(fmt::format("step {}: health check failed: {}", step_, verdict.failure));
  log_->rank(verdict.summary);
}

// Stop signals: every rank looks at the step boundary, and one all-reduce
// makes a signal to any rank stop them all.
bool Trainer::stop_requested() {
  // With the signal, whether a background checkpoint write failed: its
  // writers fail on every rank alike, but the ranks see it at different steps.
  int mine[2] = {pending_stop_signal(), checkpoint_write_failed()};
  if (world_ > 1) MPI_Allreduce(MPI_IN_PLACE, mine, 2, MPI_INT, MPI_MAX, comm_);
  if (mine[1]) {
    finish_checkpoint();  // rethrows the writer's CheckpointWriteError
    throw CheckpointWriteError("a background checkpoint write failed on another rank");
  }
  stop_signal_ = mine[0];
  return mine[0] != 0;
}

void Trainer::stop_on_signal(double loss) {
  save_checkpoint(loss);  // a no-op when this step's checkpoint was just written
  finish_checkpoint();    // durably on disk before anyone exits
  ignore_stop_signals();  // the state is safe: a requeue's SIGTERM need not cut the exit short
  if (rank_ == 0) write_stop_marker(cfg_.output.dir, step_, stop_signal_, world_);  // a launcher's proof of it
  log_->console(fmt::format("stopped at step {} on {}; resume with -resume auto", step_, signal_name(stop_signal_)));
  const char* job = std::getenv("SLURM_JOB_ID");
  if (rank_ == 0 && cfg_.resilience.requeue && job) {
    const std::string command = fmt::format("scontrol requeue {}", job);
    const int rc = std::system(command.c_str());
    log_->console(fmt::format("preempt requeue: `{}` {}", command,
                              rc == 0 ? std::string("done") : fmt::format("failed (exit {})", rc)));
  }
}

// fault kill|hang|nan|signal rank R step S: tests of the machinery above.
void Trainer::inject_fault(int64_t step) {
  const auto& f = cfg_.fault;
  // A resumed run injects nothing: the test that killed a run can resume the same deck.
  if (f.kind == "off" || resumed_ || f.step != step || f.rank != rank_) return;
  log_->rank(fmt::format("fault {} injected at step {}", f.kind, step));
  if (f.kind == "kill") {
    std::raise(SIGKILL);
  } else if (f.kind == "hang") {
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  } else if (f.kind == "signal") {
    std::raise(SIGTERM);
  } else if (f.kind == "throw") {
    throw std::runtime_error(fmt::format("fault throw injected at step {}", step));
  } else if (f.kind == "nan") {  // train_step's gradient hook, in this step's backward
    inject_gradient_fault(step, rank_);
    fault_value_ = std::numeric_limits<float>::quiet_NaN();
  }
}

// ---------------------------------------------------------------------------
// main training loop

// A failure of this rank is written to its own log before it ends the job
// (app.cpp: the message on stderr, then MPI_Abort).
void Trainer::run() {
  try {
    run_phases();
  } catch (const HealthError&) {
    throw;  // every rank agreed; rank 0 says it once
  } catch (const std::exception& e) {
    log_->rank(fmt::format("rank {} failed at step {}: {}", rank_, step_, e.what()));
    throw;
  }
}

namespace {
std::string duration(double seconds) {
  const int64_t s = std::llround(std::max(0.0, seconds));
  return s >= 3600 ? fmt::format("{}h{:02}m", s / 3600, s / 60 % 60) : fmt::format("{}m{:02}s", s / 60, s % 60);
}
}  // namespace

void Trainer::run_phases() {
  // Tokens trained on, all ranks: B*T*W per micro-batch, K micro-batches a step under accumulate K.
  const int64_t tokens_per_batch = int64_t(cfg_.data.batch) * cfg_.model.seq * world_;
  int64_t tokens_here = 0, interval_tokens = 0;
  double train_seconds = 0, interval_seconds = 0;
  int64_t steps_here = 0, interval_steps = 0, phase_end = 0, total_steps = 0;
  double loss = 0, step_seconds = 0;
  for (const auto& phase : program_.phases) total_steps += phase.steps;
  const auto& out = program_.phases.front().config.output;
  // Open MPI's mpirun gives every rank a pseudo-terminal even when its own
  // output goes to a pipe or file, so `auto` cannot trust isatty there.
  const bool terminal = ::isatty(STDOUT_FILENO) && !std::getenv("OMPI_COMM_WORLD_SIZE");
  log_->show_progress(out.progress == "on" || (out.progress == "auto" && terminal));
  for (const auto& phase : program_.phases) {
    phase_end += phase.steps;
    if (step_ >= phase_end) continue;  // done before the checkpoint we resumed from
    cfg_.optimizer = phase.config.optimizer;
    cfg_.schedule = phase.config.schedule;
    cfg_.eval = phase.config.eval;
    cfg_.checkpoint = phase.config.checkpoint;
    cfg_.output.log_every = phase.config.output.log_every;
    cfg_.grad_check = phase.config.grad_check;
    cfg_.lossagg = phase.config.lossagg;
    phase_start_ = phase_end - phase.steps;
    cfg_.topology = phase.config.topology;
    cfg_.compress = phase.config.compress;
    cfg_.sync.kind = phase.config.sync.kind;
    cfg_.sync.every = phase.config.sync.every;
    cfg_.sync.outer = phase.config.sync.outer;
    cfg_.sync.outer_lr = phase.config.sync.outer_lr;
    cfg_.sync.momentum = phase.config.sync.momentum;
    cfg_.health = phase.config.health;
    while (step_ < phase_end) {
      inject_fault(step_ + 1);
      const double t0 = MPI_Wtime();
      loss = train_step();
      // Every phase ends in consensus, so the next one (and its eval) starts
      // from one model: a last sync local in the group, then a global average
      // when the ranks averaged only in groups.
      if (step_ == phase_end) {
        if (cfg_.sync.kind == "local" && step_ % cfg_.sync.every != 0) average_parameters(false);
        if (!topology_->is_full()) average_parameters(true);
        // Each rank stepped its own AdamW (local) or its group's (clusters,
        // ring): the moments are averaged too, or a dense phase after this one
        // would move equal weights apart.
        if (cfg_.sync.kind == "local" || !topology_->is_full()) average_moments();
      }
      const double dt = MPI_Wtime() - t0;
      train_seconds += dt, interval_seconds += dt;
      const int64_t tokens = tokens_per_batch * (cfg_.sync.kind == "accumulate" ? cfg_.sync.every : 1);
      step_seconds = steps_here == 0 ? dt : 0.9 * step_seconds + 0.1 * dt;  // smoothed, for the ETA
      log_->progress(fmt::format("step {}/{} | loss {:.4f} | {:.0f} tok/s | ETA {}", step_, total_steps, loss,
                                 tokens / step_seconds, duration((total_steps - step_) * step_seconds)));
      ++steps_here, ++interval_steps;
      tokens_here += tokens, interval_tokens += tokens;
      losses_.push_back(loss);
      if (cfg_.health.every > 0 && step_ % cfg_.health.every == 0) check_health_now();

      const bool log_now = step_ % cfg_.output.log_every == 0 || step_ == phase_end;
      const bool eval_now = (cfg_.eval.every > 0 && step_ % cfg_.eval.every == 0) || step_ == phase_end;
      nlohmann::json record;
      if (log_now) {
        const double ms = 1e3 * interval_seconds / interval_steps;
        const double tok_s = interval_tokens / interval_seconds;
        const double mfu = flops_per_token_ * tok_s / (peak_gflops_ * 1e9 * world_);
        const auto& c = step_comm_;
        record = {{"step", step_}, {"loss", loss}, {"loss_main", last_loss_.main}, {"lr", last_lr_},
                  {"grad_norm", last_norm_}, {"ms_per_step", ms}, {"tokens_per_s", tok_s}, {"mfu", mfu},
                  {"comm_rounds", c.rounds}, {"comm_bytes", c.bytes_sent}, {"comm_s", c.seconds}};
        if (cfg_.model.mtp.depth > 0) record["loss_mtp"] = last_loss_.mtp;
        if (consensus_ >= 0) record["consensus_distance"] = consensus_;
        if (nonfinite_skipped_ > 0) record["nonfinite_skipped"] = nonfinite_skipped_;  // health nan skip
        if (cfg_.compress.kind == "topk") record["compress_ratio"] = compressed_->ratio_at(step_ - 1);
        if (scaler_) {
          record["loss_scale"] = scaler_->scale();
          record["skipped_steps"] = scaler_->skipped();
          record["overflows"] = scaler_->overflows();
        }
        if (lossagg_ && cfg_.lossagg.kind != "off") {
          // the last micro-batch's weights; `loss` above stays the plain mean
          const auto& w = lossagg_->rank_weights();
          record["lossagg_weight_min"] = *std::min_element(w.begin(), w.end());
          record["lossagg_weight_max"] = *std::max_element(w.begin(), w.end());
          if (w.size() <= 64) {
            record["lossagg_weights"] = w;
            std::vector<double> main(w.size());
            for (size_t r = 0; r < w.size(); ++r) main[r] = lossagg_->gathered_losses()[r * LossAggregator::kKinds];
            record["lossagg_rank_loss_main"] = main;
          }
          if (cfg_.lossagg.kind == "uncertainty") {
            const auto lw = lossagg_->loss_weights();
            record["lossagg_loss_weight_main"] = lw[0];
            if (lossagg_->active()[1]) record["lossagg_loss_weight_mtp"] = lw[1];
            if (lossagg_->active()[2]) record["lossagg_loss_weight_aux"] = lw[2];
          }
          log_->rank(fmt::format("step {} lossagg {} weight {:.6g} seed multiplier {:.6g}", step_, cfg_.lossagg.kind,
                                 w[rank_], lossagg_->own_multiplier()));
        }
        std::string extra;
        if (!expert_load_.empty()) {
          // expert load across routed experts (all MoE layers, all ranks): min and max
          // as a fraction of the mean, and the coefficient of variation
          double mean = 0, var = 0, lo = 1e300, hi = 0;
          for (double l : expert_load_) mean += l / expert_load_.size(), lo = std::min(lo, l), hi = std::max(hi, l);
          for (double l : expert_load_) var += (l - mean) * (l - mean) / expert_load_.size();
          record["loss_aux"] = last_loss_.aux;
          record["expert_load_min"] = lo / mean;
          record["expert_load_max"] = hi / mean;
          record["expert_load_cv"] = std::sqrt(var) / mean;
          extra = fmt::format(" | load cv {:.2f}", std::sqrt(var) / mean);
        }
        log_->console(fmt::format("step {:>6}/{} | loss {:.4f} | lr {:.2e} | norm {:.3f} | {:.1f} ms | {:.0f} tok/s "
                                  "| MFU {:.1f}%{}",
                                  step_, phase_end, loss, last_lr_, last_norm_, ms, tok_s, 100 * mfu, extra));
        log_->rank(fmt::format("step {} local batch {} comm {} B in {} rounds, {:.3f} s", step_,
                               loader_->position(), c.bytes_sent, c.rounds, c.seconds));
        log_->rank_scalars(step_, {{"loss", own_loss_}, {"ms_per_step", ms}, {"comm_bytes", double(c.bytes_sent)},
                                   {"comm_rounds", double(c.rounds)}, {"comm_s", c.seconds},
                                   {"batch_position", double(loader_->position())}});
        interval_seconds = 0, interval_steps = 0, interval_tokens = 0;
      }
      double val = std::numeric_limits<double>::quiet_NaN();
      if (eval_now) {
        val = evaluate();
        note_validation(val);
        record["step"] = step_;
        record["val_loss"] = val;
        record["val_ppl"] = std::exp(val);
        log_->console(fmt::format("step {:>6}/{} | val_loss {:.4f} | val_ppl {:.2f}", step_, phase_end, val,
                                  std::exp(val)));
      }
      if (!record.empty()) log_->metrics(record);
      if (const auto next = schedule_of(step_ + 1); next && next->is_restart(step_ + 1)) warm_restart(*next, val);
      // Every rank's own state is in the checkpoint, so it need not wait
      // for the ranks to agree (sync local, clusters, ring).
      if ((cfg_.checkpoint.every > 0 && step_ % cfg_.checkpoint.every == 0) ||
          (cfg_.checkpoint.at_end && step_ == phase_end))
        save_checkpoint(loss);
      if (stop_requested()) return stop_on_signal(loss);
    }
  }
  finish_checkpoint();  // the last checkpoint is on disk before the run reports
  const double tok_s = steps_here ? tokens_here / train_seconds : 0;
  const double mfu = flops_per_token_ * tok_s / (peak_gflops_ * 1e9 * world_);
  log_->console(fmt::format("PERFORMANCE steps={} ranks={} tokens_per_s={:.0f} ms_per_step={:.2f} mfu={:.4f} "
                            "peak_gflops_per_core={:.1f} final_loss={:.6f}",
                            steps_here, world_, tok_s, steps_here ? 1e3 * train_seconds / steps_here : 0.0, mfu,
                            peak_gflops_, loss));
}

}  // namespace xx

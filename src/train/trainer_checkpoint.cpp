// The trainer's checkpoints (docs/CHECKPOINT.md): which one to resume from,
// restoring every rank's exact state, and saving it, in place or from a
// background writer. The training loop itself is in trainer.cpp.
#include <algorithm>
#include <filesystem>
#include <fmt/format.h>
#include "core/error.h"
#include "data/seeding.h"
#include "train/trainer.h"
#include "train/transfer.h"

namespace xx {
namespace fs = std::filesystem;
using namespace transfer;

// Which checkpoint to start from, if any. Never silently starts over on top
// of an earlier run's checkpoints: that would overwrite them.
std::string Trainer::resolve_resume(const std::string& resume) const {
  const std::string ckpt = (fs::path(cfg_.output.dir) / "ckpt").string();
  const size_t earlier = fs::is_directory(ckpt) ? step_files(ckpt).size() : 0;
  if (resume.empty()) {
    if (earlier > 0)
      input_error("{}: holds {} checkpoint(s) of an earlier run (expected -resume auto to continue it, or another "
                  "output dir)", ckpt, earlier);
    return "";
  }
  if (resume == "auto") {
    const std::string latest = latest_checkpoint(ckpt);
    if (latest.empty() && earlier > 0)
      input_error("{}: none of its {} checkpoint file(s) is complete (expected at least one with attribute "
                  "complete = 1; move the broken ones away to start over)", ckpt, earlier);
    return latest;
  }
  if (!fs::exists(resume)) input_error("{}: no such checkpoint (given to -resume)", resume);
  return resume;
}

void Trainer::restore(const std::string& path) {
  finish_checkpoint();  // one HDF5 user at a time
  CheckpointData data;
  int per_rank = 0, old_world = world_;
  on_rank0_or_throw(comm_, rank_, [&] {
    data = read_checkpoint(path, model_->layout(), model_buffers());
    old_world = data.state.world_size;
    if (old_world != world_ && cfg_.data.shuffle == "independent")
      input_error("{}: written by {} ranks, resumed on {} (shuffle independent streams cannot be re-partitioned; "
                  "expected {} ranks)", path, old_world, world_, old_world);
    // Every rank's state is checked before any rank takes its own: no partial restore.
    per_rank = has_rank_state(path);
    if (per_rank)
      for (int r = 0; r < old_world; ++r) read_rank_state(path, model_->layout(), data, r, rank_buffers());
  });
  MPI_Bcast(&per_rank, 1, MPI_INT, 0, comm_);
  MPI_Bcast(&old_world, 1, MPI_INT, 0, comm_);
  // Rank 0 read and checked the file; every rank gets all of it.
  const int64_t total = model_->layout().total();
  if (rank_ != 0) data.params.resize(total), data.adam_m.resize(total), data.adam_v.resize(total);
  MPI_Bcast(data.params.data(), int(total), MPI_FLOAT, 0, comm_);
  MPI_Bcast(data.adam_m.data(), int(total), MPI_FLOAT, 0, comm_);
  MPI_Bcast(data.adam_v.data(), int(total), MPI_FLOAT, 0, comm_);
  MPI_Bcast(&data.state.step, 1, MPI_INT64_T, 0, comm_);
  MPI_Bcast(&data.state.sampler_batches, 1, MPI_INT64_T, 0, comm_);
  MPI_Bcast(&data.state.chaos_seed, 1, MPI_UINT64_T, 0, comm_);
  for (const auto& [name, size] : model_buffers()) bcast_vector(data.buffers[name], MPI_FLOAT, comm_);
  bcast_map(data.series, MPI_DOUBLE, comm_);
  RankState mine;
  if (per_rank) {  // this rank's own tensors, residuals, outer optimizer and data position
    mine = merged_rank_state(path, data, old_world);
    data.params = mine.params, data.adam_m = mine.adam_m, data.adam_v = mine.adam_v;
    data.state.sampler_batches = mine.sampler_batches;
    if (compressed_) {
      from_host(compressed_->residual(), mine.extra.at("compress.residual"));
      if (mine.extra.count("compress.momentum")) from_host(compressed_->momentum(), mine.extra.at("compress.momentum"));
    }
  }
  const int64_t P = model_->layout().total();
  auto restore_buffer = [&](const char* name, Buffer<float>& b) {
    if (!mine.extra.count(name)) return;
    if (int64_t(mine.extra.at(name).size()) != P)
      input_error("{}: dataset '/ranks/{}/{}' has {} values (expected {})", path, rank_, name,
                  mine.extra.at(name).size(), P);
    b = Buffer<float>(std::string("Trainer::") + name, P);
    from_host(b, mine.extra.at(name));
  };
  restore_buffer("outer.anchor", anchor_);
  restore_buffer("outer.momentum", momentum_);
  restore_buffer("outer.initial", initial_params_);

  from_host(model_->params(), data.params);
  from_host(optimizer_->m(), data.adam_m);
  from_host(optimizer_->v(), data.adam_v);
  for (auto& [prefix, ffn] : model_->moe_layers()) from_host(ffn->bias(), data.buffers[prefix + "ffn.gate_bias"]);
  chaos_seed_ = data.state.chaos_seed;  // the constructor checks it against the deck
  // The data stream: the same world continues its own counter; another world
  // continues the epoch where the old ranks left it, counting from zero.
  const auto& start = data.series["data_start"];
  sampler_start_ = start.size() == 2 ? Continuation{int64_t(start[0]), int64_t(start[1])} : Continuation{};
  start_batch_ = data.state.sampler_batches;
  if (old_world != world_) {
    SamplerOptions old = sampler_options(cfg_.data, cfg_.seed, chaos_seed_);
    old.start = sampler_start_;
    sampler_start_ = DistributedSampler(split_.train_windows, old_world, 0, old).after(start_batch_ * cfg_.data.batch);
    start_batch_ = 0;
    log_note_ = fmt::format("resumed {} ranks on {}: epoch {} continues at position {} of {}", old_world, world_,
                            sampler_start_.epoch, sampler_start_.position, split_.train_windows);
  }
  step_ = last_saved_ = data.state.step;
  // AdamW's own count (bias correction) lags the step after skipped steps and
  // restart_from best; checkpoints from before it lack it.
  const auto& series = data.series;
  optimizer_->set_steps_taken(series.count("adam_steps") ? int64_t(series.at("adam_steps").at(0)) : step_);
  if (scaler_ && series.count("loss_scale")) scaler_->restore(series.at("loss_scale"));
  if (lossagg_ && series.count(LossAggregator::kLogVarSeries))
    lossagg_->set_log_var(series.at(LossAggregator::kLogVarSeries));
  // sgdr: the restarts so far and, under restart_from best, the cycle's best state
  restarts_.clear();
  if (series.count("lr_restarts"))
    for (size_t i = 0, n = series.at("lr_restarts").size(); i + 5 <= n; i += 5) {
      const auto* r = series.at("lr_restarts").data() + i;
      restarts_.push_back({int64_t(r[0]), r[1], r[2], int(r[3]), int64_t(r[4])});
    }
  if (best_.params.extent(0) > 0 && series.count("restart_best")) {
    const auto& b = series.at("restart_best");
    best_.step = int64_t(b.at(0)), best_.val_loss = b.at(1), best_.adam_steps = int64_t(b.at(2));
    from_host(best_.params, data.buffers["restart_best.params"]);
    from_host(best_.adam_m, data.buffers["restart_best.adam_m"]);
    from_host(best_.adam_v, data.buffers["restart_best.adam_v"]);
    for (auto& [prefix, ffn] : model_->moe_layers())
      best_.gate_bias[prefix] = data.buffers["restart_best." + prefix + "ffn.gate_bias"];
  }
}

// This rank's state from a checkpoint of `old_world` ranks: its own at the
// same world size; otherwise the average of the old ranks r with
// floor(r * W / old_world) == rank (ranks merge), or of all of them when none
// maps here (a new rank starts from the base).
RankState Trainer::merged_rank_state(const std::string& path, const CheckpointData& base, int old_world) {
  std::vector<int> sources;
  for (int r = 0; r < old_world; ++r)
    if (int64_t(r) * world_ / old_world == rank_) sources.push_back(r);
  if (sources.empty())
    for (int r = 0; r < old_world; ++r) sources.push_back(r);
  RankState out = read_rank_state(path, model_->layout(), base, sources[0], rank_buffers());
  if (sources.size() == 1) return out;
  auto average = [&](std::vector<float>& into, auto get) {
    std::vector<double> sum(into.begin(), into.end());
    for (size_t i = 1; i < sources.size(); ++i) {
      RankState other = read_rank_state(path, model_->layout(), base, sources[i], rank_buffers());
      const std::vector<float>& v = get(other);
      for (size_t j = 0; j < sum.size(); ++j) sum[j] += v[j];
    }
    for (size_t j = 0; j < sum.size(); ++j) into[j] = float(sum[j] / double(sources.size()));
  };
  average(out.params, [](RankState& s) -> std::vector<float>& { return s.params; });
  average(out.adam_m, [](RankState& s) -> std::vector<float>& { return s.adam_m; });
  average(out.adam_v, [](RankState& s) -> std::vector<float>& { return s.adam_v; });
  for (auto& [name, values] : out.extra)
    average(values, [name = name](RankState& s) -> std::vector<float>& { return s.extra.at(name); });
  return out;
}

// Per-rank buffers in /ranks/<r> besides the tensors: what this deck needs.
std::map<std::string, int64_t> Trainer::rank_buffers() {
  std::map<std::string, int64_t> out;
  if (compressed_) {
    out["compress.residual"] = compressed_->residual().extent(0);
    if (compressed_->momentum().extent(0) > 0) out["compress.momentum"] = compressed_->momentum().extent(0);
  }
  return out;
}

std::map<std::string, int64_t> Trainer::model_buffers() {
  std::map<std::string, int64_t> out;
  for (auto& [prefix, ffn] : model_->moe_layers()) out[prefix + "ffn.gate_bias"] = int64_t(ffn->bias().extent(0));
  if (best_.params.extent(0) > 0) {  // restart_from best keeps the cycle's best state
    for (const char* name : {"params", "adam_m", "adam_v"})
      out[std::string("restart_best.") + name] = model_->layout().total();
    for (auto& [prefix, ffn] : model_->moe_layers())
      out["restart_best." + prefix + "ffn.gate_bias"] = int64_t(ffn->bias().extent(0));
  }
  return out;
}

// Collective. The base (/model, /optimizer) is the ranks' average, rank 0's
// bits on every rank; each rank's own state goes to /ranks/<r> as it is
// (mode full) or as its difference from the base (mode diff, by the codec).
void Trainer::save_checkpoint(double loss) {
  if (last_saved_ == step_) return;
  last_saved_ = step_;
  const double t0 = MPI_Wtime();
  finish_checkpoint();  // one write at a time: the previous one is on disk before this one starts
  const double waited = MPI_Wtime() - t0;
  ExecSpace().fence();
  RankState mine;
  mine.params = to_host(model_->params());
  mine.adam_m = to_host(optimizer_->m());
  mine.adam_v = to_host(optimizer_->v());
  mine.sampler_batches = loader_->position();
  if (compressed_) {
    mine.extra["compress.residual"] = to_host(compressed_->residual());
    if (compressed_->momentum().extent(0) > 0) mine.extra["compress.momentum"] = to_host(compressed_->momentum());
  }
  CheckpointData data;
  data.params = mine.params, data.adam_m = mine.adam_m, data.adam_v = mine.adam_v;
  const bool may_differ = cfg_.sync.kind == "local" || !topology_->is_full() ||
                          (cfg_.compress.kind == "topk" && cfg_.compress.target == "update");
  // Every rank encodes its state against the same base bits: the ranks'
  // average where they are expected to differ, else rank 0's own (equal to
  // every rank's unless an earlier phase left, say, different moments).
  if (world_ > 1)
    for (auto* v : {&data.params, &data.adam_m, &data.adam_v}) {
      if (may_differ) {
        MPI_Reduce(rank_ == 0 ? MPI_IN_PLACE : v->data(), v->data(), int(v->size()), MPI_FLOAT, MPI_SUM, 0, comm_);
        if (rank_ == 0)
          for (auto& x : *v) x /= float(world_);
      }
      MPI_Bcast(v->data(), int(v->size()), MPI_FLOAT, 0, comm_);
    }
  for (auto& [prefix, ffn] : model_->moe_layers()) data.buffers[prefix + "ffn.gate_bias"] = to_host(ffn->bias());
  if (anchor_.extent(0) > 0) {  // sync local with an outer optimizer (per cluster under topology clusters)
    mine.extra["outer.anchor"] = to_host(anchor_);
    mine.extra["outer.momentum"] = to_host(momentum_);
  } else if (initial_params_.extent(0) > 0) {
    mine.extra["outer.initial"] = to_host(initial_params_);
  }
  data.state.step = step_;
  data.state.sampler_batches = loader_->position();
  data.state.chaos_seed = chaos_seed_;
  data.state.epoch = cfg_.data.batch * loader_->position() / std::max<int64_t>(1, split_.train_windows);
  data.state.seed = cfg_.seed;
  data.state.world_size = world_;
  data.state.last_loss = loss;
  data.series["adam_steps"] = {double(optimizer_->steps_taken())};
  data.series["data_start"] = {double(sampler_start_.epoch), double(sampler_start_.position)};
  for (const auto& r : restarts_)
    data.series["lr_restarts"].insert(data.series["lr_restarts"].end(),
                                      {double(r.step), r.lr, r.val_loss, double(r.cycle), double(r.restored_from)});
  if (best_.params.extent(0) > 0) {  // restart_from best: the cycle's best state so far (step -1: none yet)
    data.series["restart_best"] = {double(best_.step), best_.val_loss, double(best_.adam_steps)};
    data.buffers["restart_best.params"] = to_host(best_.params);
    data.buffers["restart_best.adam_m"] = to_host(best_.adam_m);
    data.buffers["restart_best.adam_v"] = to_host(best_.adam_v);
    for (const auto& [prefix, bias] : best_.gate_bias) data.buffers["restart_best." + prefix + "ffn.gate_bias"] = bias;
  }
  if (scaler_) data.series["loss_scale"] = scaler_->state();
  if (lossagg_) data.series[LossAggregator::kLogVarSeries] = lossagg_->log_var();
  data.deck = program_.deck_text;
  CheckpointFormat format;
  format.mode = cfg_.checkpoint.mode;
  format.codec.kind = *kernels::ckpt_codec::codec_from_name(cfg_.checkpoint.codec);
  format.codec.ratio = cfg_.checkpoint.ratio;
  format.codec.block = cfg_.checkpoint.block;
  format.base_every = cfg_.checkpoint.base_every;
  const std::string dir = (fs::path(cfg_.output.dir) / "ckpt").string();
  // The codec kernels run here: Kokkos' host backend shares its reduction
  // scratch between threads, so only the HDF5 write (deflate, checksums, I/O)
  // goes to the background.
  const auto encoded = encode_checkpoint(comm_, model_->layout(), data, &mine, format, &chain_);
  pending_ = {};
  pending_.waited = waited;
  pending_.kind = chain_kind_of(*encoded) == "delta" ? "delta of " + chain_.name : "base";
  pending_.how = format.mode == "diff" ? "diff " + cfg_.checkpoint.codec : "full copies";
  if (cfg_.checkpoint.async && !async_checked_) {
    int provided = MPI_THREAD_SINGLE;
    MPI_Query_thread(&provided);
    async_ok_ = provided == MPI_THREAD_MULTIPLE, async_checked_ = true;
    if (!async_ok_)
      log_->console("warning: checkpoint async on needs MPI_THREAD_MULTIPLE, which this MPI does not provide: "
                    "checkpoints are written synchronously");
  }
  const int64_t keep = cfg_.checkpoint.keep;
  if (cfg_.checkpoint.async && async_ok_) {
    if (writer_comm_ == MPI_COMM_NULL) MPI_Comm_dup(comm_, &writer_comm_);
    pending_.async = true;
    pending_.stall = MPI_Wtime() - t0;
    writer_ = std::thread([this, dir, encoded, keep] {
      try {
        write_checkpoint_now(writer_comm_, dir, *encoded, keep);
      } catch (...) {
        writer_error_ = std::current_exception();
      }
    });
    return;
  }
  write_checkpoint_now(comm_, dir, *encoded, keep);
  pending_.stall = MPI_Wtime() - t0;
  log_checkpoint();
}

// The HDF5 part of a checkpoint, on the training thread or the writer's.
void Trainer::write_checkpoint_now(MPI_Comm comm, const std::string& dir, const EncodedCheckpoint& encoded,
                                   int64_t keep) {
  const double t0 = MPI_Wtime();
  pending_.path = write_encoded(comm, dir, encoded);
  if (rank_ == 0 && keep > 0) prune_checkpoints(dir, keep);
  pending_.write_s = MPI_Wtime() - t0;
}

void Trainer::finish_checkpoint() {
  if (!writer_.joinable()) return;
  writer_.join();
  if (writer_error_) std::rethrow_exception(std::exchange(writer_error_, nullptr));
  log_checkpoint();
}

// One console line per checkpoint: stall is what the training thread spent in save_checkpoint.
void Trainer::log_checkpoint() {
  const auto& p = pending_;
  const double mb = rank_ == 0 && fs::exists(p.path) ? double(fs::file_size(p.path)) / 1e6 : 0.0;
  log_->console(fmt::format("checkpoint {} ({}, {}, {:.2f} MB, write {:.3f} s{}, stall {:.3f} s, of which waiting for "
                            "the previous write {:.3f} s)",
                            p.path, p.how, p.kind, mb, p.write_s, p.async ? " in background" : "", p.stall, p.waited));
}

}  // namespace xx

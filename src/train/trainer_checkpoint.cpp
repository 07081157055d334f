// The trainer's checkpoints (docs/CHECKPOINT.md): which one to resume from,
// restoring every rank's exact state, and saving it, in place or from a
// background writer. The training loop itself is in trainer.cpp.
#include <algorithm>
#include <filesystem>
#include <fmt/format.h>
#include "core/error.h"
#include "data/seeding.h"
#include "ckpt/state_io.h"
#include "train/trainer.h"
#include "comm/agree.h"
#include "train/transfer.h"

namespace xx {
namespace fs = std::filesystem;
using namespace transfer;

// Which checkpoint to start from, if any. Never silently starts over on top
// of an earlier run's checkpoints: that would overwrite them.
std::string Trainer::resolve_resume(const ResumeFrom& resume) const {
  const std::string ckpt = (fs::path(cfg_.output.dir) / "ckpt").string();
  const size_t earlier = fs::is_directory(ckpt) ? step_files(ckpt).size() : 0;
  if (resume.kind == ResumeFrom::Kind::fresh) {
    if (earlier > 0)
      input_error("{}: holds {} checkpoint(s) of an earlier run (expected -resume auto to continue it, or another "
                  "output dir)", ckpt, earlier);
    return "";
  }
  if (resume.kind == ResumeFrom::Kind::latest) {
    const std::string latest = latest_checkpoint(ckpt);
    if (latest.empty() && earlier > 0)
      input_error("{}: none of its {} checkpoint file(s) is complete (expected at least one with attribute "
                  "complete = 1; move the broken ones away to start over)", ckpt, earlier);
    return latest;
  }
  if (!fs::exists(resume.path)) input_error("{}: no such checkpoint (given to -resume)", resume.path);
  return resume.path;
}

// Every part registers its state once (core/state.h); save, restore and
// resharding below walk those lists. The model's tensors and AdamW's moments
// (flat, like the parameters) and the run's counters are the file's frame.
void Trainer::register_state() {
  for (auto& [prefix, ffn] : model_->moe_layers())
    state_.add(buffer_entry(prefix + "ffn.gate_bias", StatePlace::shared_buffer, ffn->bias()));
  // AdamW's own count (bias correction) lags the step after skipped steps and
  // restart_from best; checkpoints from before it lack it (restore sets the step).
  StateEntry adam{"adam_steps", StatePlace::shared_series};
  adam.save_doubles = [this] { return std::vector<double>{double(optimizer_->steps_taken())}; };
  adam.load_doubles = [this](const std::vector<double>& v) { optimizer_->set_steps_taken(int64_t(v.at(0))); };
  state_.add(std::move(adam));
  data_->register_state(state_);
  precision_->register_state(state_);
  if (lossagg_) {
    StateEntry agg{LossAggregator::kLogVarSeries, StatePlace::shared_series};
    agg.save_doubles = [this] { return lossagg_->log_var(); };
    agg.load_doubles = [this](const std::vector<double>& v) { lossagg_->set_log_var(v); };
    state_.add(std::move(agg));
  }
  restarts_->register_state(state_);
}

// Names and sizes of the required entries in `place`: the parts', and the
// strategy's when it continues from the checkpoint.
std::map<std::string, int64_t> Trainer::required_buffers(StatePlace place) const {
  std::map<std::string, int64_t> out;
  for (const auto* registry : {&state_, &strategy_state_})
    for (const auto* e : registry->in(place))
      if (e->required) out[e->name] = e->size;
  return out;
}

void Trainer::restore(const std::string& path) {
  finish_checkpoint();  // one HDF5 user at a time
  CheckpointData data;
  int per_rank = 0, old_world = world_, by_slabs = 0;
  // The ranks that split the data: the world, or under pipeline stages each stage's replicas (then and now).
  const int readers = stages_ ? stages_->cut().replicas : world_;
  int old_readers = readers;
  on_rank0_or_throw(comm_, rank_, [&] {
    // A sharded or staged run reads its own slabs of a file that holds no per-rank tensors.
    by_slabs = (placement_.sharded() || !placement_.stage().whole()) && written_by_slabs(path);
    data = read_checkpoint(path, placement_.frame(), required_buffers(StatePlace::shared_buffer), !by_slabs);
    old_world = data.state.world_size;
    if (old_world % data.state.stages != 0)
      input_error("{}: /train world_size {} with stages {} (expected a world size that the stages divide)", path,
                  old_world, data.state.stages);
    old_readers = old_world / data.state.stages;
    const std::string ranks = data.state.stages > 1 || stages_ ? " data-parallel replicas" : " ranks";
    if (old_readers != readers && cfg_.data.shuffle == Shuffle::independent)
      input_error("{}: written by {}{}, resumed on {} (shuffle independent streams cannot be re-partitioned; "
                  "expected {}{})", path, old_readers, ranks, readers, old_readers, ranks);
    if (old_readers != readers && cfg_.data.partition == Partition::contiguous)
      input_error("{}: written by {}{}, resumed on {} (partition contiguous gives each rank its own slice: "
                  "another world size would give each rank other data; expected {}{})", path, old_readers, ranks,
                  readers, old_readers, ranks);
    per_rank = has_rank_state(path);
  });
  from_rank0(per_rank, comm_), from_rank0(by_slabs, comm_), from_rank0(old_world, comm_), from_rank0(old_readers, comm_);
  from_rank0(data.state, comm_);
  // The phase the checkpoint continues, and its strategy: the strategy's
  // state comes back unless the checkpoint ended the phase before a change.
  step_ = last_saved_ = data.state.step;
  size_t phase = 0;
  for (int64_t end = program_.phases[0].steps; phase + 1 < program_.phases.size() && step_ >= end;)
    end += program_.phases[++phase].steps;
  enter_phase(phase);
  const bool strategy_goes_on = step_ > phase_start_ || keeps_strategy(phase);
  if (!strategy_goes_on) strategy_state_ = StateRegistry();  // a fresh strategy: nothing of it is in the file
  // Every rank's state is checked before any rank takes its own: no partial restore.
  on_rank0_or_throw(comm_, rank_, [&] {
    if (per_rank)
      for (int r = 0; r < old_world; ++r)
        read_rank_state(path, placement_.frame(), data, r, required_buffers(StatePlace::rank_buffer));
  });
  // Rank 0 read and checked the file; every rank gets all of it (but the slabs, which each reads itself).
  if (!by_slabs)
    for (auto* v : {&data.params, &data.adam_m, &data.adam_v}) from_rank0(*v, comm_);
  from_rank0(data.buffers, comm_);
  from_rank0(data.series, comm_);
  RankState mine;
  if (per_rank) {  // this rank's own tensors, strategy state and data position
    mine = merged_rank_state(path, placement_.frame(), data, old_world, world_, rank_,
                             required_buffers(StatePlace::rank_buffer));
    if (!by_slabs) data.params = mine.params, data.adam_m = mine.adam_m, data.adam_v = mine.adam_v;
    data.state.sampler_batches = mine.sampler_batches;
  }
  if (by_slabs) {
    // This rank's pieces of the moments, and of the weights (whole unless they are sharded too);
    // under stages, every tensor the stage holds (the last stage's echo of the embedding too).
    const bool weights_sharded = placement_.master_sharded();
    std::array<TensorSlabs, 3> slabs;
    slabs[1].slabs = slabs[2].slabs = placement_.piece_slabs();
    slabs[0].slabs = weights_sharded ? slabs[1].slabs : placement_.whole_tensors();
    read_slabs(comm_, path, placement_.frame(), slabs);
    if (weights_sharded) put_pieces(model_->params(), slabs[0].values, placement_.owned());
    else from_host(model_->params(), slabs[0].values);
    optimizer_->m().from_host(slabs[1].values);
    optimizer_->v().from_host(slabs[2].values);
  } else {
    from_host(model_->params(), placed_->from_file_frame(data.params));  // ep: this rank's experts
    // under shard: this rank's pieces
    optimizer_->m().from_host(placed_->owned_part(placed_->from_file_frame(data.adam_m)));
    optimizer_->v().from_host(placed_->owned_part(placed_->from_file_frame(data.adam_v)));
  }
  optimizer_->set_steps_taken(step_);
  for (const auto* registry : {&state_, &strategy_state_})
    load_state(*registry, data, per_rank ? &mine : nullptr, path, rank_);
  if (!strategy_goes_on) strategy_->register_state(strategy_state_);  // saved from here on
  log_note_ = data_->resume(data.state.chaos_seed, data.state.sampler_batches, old_readers);
  // The moments as the file kept them: bf16 into an fp32 run widens exactly;
  // fp32 into a bf16 run was rounded to nearest even by Moments::from_host.
  int file_moments = int(data.moments);
  from_rank0(file_moments, comm_);
  if (Precision(file_moments) != optimizer_->moments_type()) {
    const std::string note =
        fmt::format("{}: AdamW moments were kept in {}, this run keeps them in {}: {}", path, Precision(file_moments),
                    optimizer_->moments_type(),
                    optimizer_->moments_type() == Precision::bf16 ? "rounded to bf16 (nearest even)" : "widened exactly");
    log_note_ = log_note_.empty() ? note : log_note_ + "\n" + note;
  }
}

std::vector<float> Trainer::whole_params() {
  ExecSpace().fence();
  std::vector<float> out = to_host(model_->params());
  if (placement_.master_sharded()) placed_->gather_in_place(out);
  return placed_->to_file_frame(out);
}

// Sharded, with every rank holding the same model (the sharded strategy
// guarantees it), or under pipeline stages, writing one base file at a time
// with parallel HDF5: each rank writes its own pieces (each stage its own
// tensors). Otherwise the pieces are gathered whole first.
bool Trainer::writes_slabs() const {
  return (placement_.sharded() || !placement_.stage().whole()) && cfg_.checkpoint.base_every == 1 &&
         cfg_.checkpoint.writer == CheckpointWriter::collective &&
         strategy_->agreement(step_).all();
}

// Collective. The base (/model, /optimizer) is the ranks' average, rank 0's
// bits on every rank; each rank's own state goes to /ranks/<r> as it is
// (mode full) or as its difference from the base (mode diff, by the codec).
CheckpointData Trainer::snapshot(double loss, RankState& mine) {
  ExecSpace().fence();
  CheckpointData data;
  if (writes_slabs()) {  // this rank's pieces only: no whole copies
    std::array<TensorSlabs, 3> slabs;
    slabs[0].slabs = slabs[1].slabs = slabs[2].slabs = placement_.written_slabs();
    slabs[0].values = take_pieces(model_->params(), placement_.owned());
    slabs[1].values = optimizer_->m().to_host();  // exact: bf16 moments widen to fp32
    slabs[2].values = optimizer_->v().to_host();
    data.slabs = std::move(slabs);
  } else {
    mine.params = whole_params();
    // under shard: the ranks' pieces put together; under ep: the group's experts
    mine.adam_m = placed_->to_file_frame(placed_->gather_whole(optimizer_->m().to_host()));
    mine.adam_v = placed_->to_file_frame(placed_->gather_whole(optimizer_->v().to_host()));
  }
  mine.sampler_batches = data_->position();
  for (const auto* registry : {&state_, &strategy_state_}) save_state(*registry, data, mine);
  if (stages_ && stages_->cut().stages > 1) {  // each stage's own buffers (its MoE layers' biases), all in the file
    std::map<std::string, std::vector<float>> own = data.buffers;
    union_over_ranks(data.buffers, stages_->chain());
    for (const auto& [name, values] : data.buffers)
      if (!own.count(name)) data.state_index += "/buffers " + name + "\n";
  }
  data.params = mine.params, data.adam_m = mine.adam_m, data.adam_v = mine.adam_v;
  // Every rank encodes its state against the same base bits: the ranks'
  // average where they may differ, else rank 0's own (equal to every
  // rank's unless an earlier phase left, say, different moments).
  const bool may_differ = !strategy_->agreement(step_).all();
  if (world_ > 1 && !data.slabs)
    for (auto* v : {&data.params, &data.adam_m, &data.adam_v}) may_differ ? mean_from_rank0(*v, comm_) : from_rank0(*v, comm_);
  data.state.step = step_;
  data.state.sampler_batches = data_->position();
  data.state.chaos_seed = data_->chaos_seed();
  data.state.epoch = data_->epoch();
  data.state.seed = cfg_.seed;
  data.state.world_size = world_;
  data.state.ep = placement_.experts().ep;
  data.state.stages = stages_ ? stages_->cut().stages : 1;
  data.state.last_loss = loss;
  data.deck = program_.deck_text;
  data.moments = optimizer_->moments_type();
  return data;
}

void Trainer::save_checkpoint(double loss) {
  if (last_saved_ == step_) return;
  last_saved_ = step_;
  saver_->save(cfg_.checkpoint, (fs::path(cfg_.output.dir) / "ckpt").string(),
               [&](RankState& mine) { return snapshot(loss, mine); });
}

void Trainer::finish_checkpoint() { saver_->finish(); }

}  // namespace xx

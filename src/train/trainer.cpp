// THE training loop: one step (train_step, between TRAINING STEP BEGIN and
// END), and the phases with what falls due after each step (run_phases).
// Set-up is in trainer_setup.cpp, checkpoints in trainer_checkpoint.cpp,
// health and signals in trainer_resilience.cpp, a pipeline stage's passes in
// trainer_stages.cpp.
#include "core/device_memory.h"
#include "train/trainer.h"
#include "comm/agree.h"
#include <algorithm>
#include <cmath>
#include <limits>
#include <unistd.h>
#include <fmt/format.h>
// uniform01, mix_seed: the noise_rank tokens
#include "core/rng.h"
// sum_squares: the missing-gradient check
#include "kernels/elementwise.h"
// peak_resident_bytes: the closing line's memory
#include "core/host_memory.h"
// HealthError: a verdict every rank reached, rethrown as it is
#include "resilience/health.h"
// from_host: the whole weights for a sample
#include "train/transfer.h"

namespace xx {


// ---------------------------------------------------------------------------
// TRAINING STEP BEGIN
double Trainer::train_step() {
  SyncStrategy& sync = *strategy_;
  const int micro = sync.micro_batches();
  for (auto& x : exchanges_) x->stats() = {};  // (an evaluation's all-to-alls are not the step's)
  sync.begin_step(step_);
  sync.zero_gradients();
  precision_->begin_step();  // 16-bit weights for the GEMMs, the backward from the scaled loss
  nonfinite_.own = false;
  std::fill(step_load_.begin(), step_load_.end(), 0.0);
  const LossParts mean = (this->*passes_)();
  last_.comm = CommStats{};
  sync.reduce_gradients(step_, last_.comm);
  if (stages_) share_embedding(sync.reduced_gradients());
  if (!exchanges_.empty()) last_.comm += expert_traffic();  // ep: the tokens' all-to-alls, forward and backward
  if (lossagg_on_ && world_ > 1) {  // one loss gather per micro-batch; on the wire, what it hands MPI
    const int64_t gathered = micro * int64_t((LossAggregator::kKinds + 1) * sizeof(double));
    last_.comm.rounds += micro, last_.comm.bytes_sent += gathered, last_.comm.wire_bytes += gathered;
  }
  const Vec<float> grads = sync.reduced_gradients();  // whole, or this rank's shard (the placement's)
  const bool overflow = precision_->skip_or_unscale(comm_, grads);
  const bool skip = agree_on_losses(mean) || overflow;  // the one NaN verdict, the same on every rank
  const double norm = skip     ? std::numeric_limits<double>::quiet_NaN()
                     : stages_ ? std::sqrt(placed_->tensor_sum_squares(grads, stages_->chain()))  // the same bits at any P
                               : std::sqrt(placed_->gradient_sum_squares(grads));
  const double lr = Schedule(cfg_.optimizer, cfg_.schedule, cfg_.seed).lr(step_ + 1);
  sync.before_update();
  // clip_order scaled (the wrong order, for measuring it): the factor that
  // clipping the still-scaled gradient would have applied.
  const double clip_norm = cfg_.precision.clip_order == ClipOrder::scaled ? norm * precision_->step_scale() : norm;
  if (!skip)  // a skipped step leaves the weights, AdamW's moments and count, and the MoE biases alone
    optimizer_->step(model_->params(), grads.data(), cfg_.optimizer, lr,
                     clip_factor(clip_norm, cfg_.optimizer.clip));
  if (lossagg_) lossagg_->end_step(skip ? 0.0 : lr);  // uncertainty: SGD on the log-variances
  sync.after_update(step_, last_.comm);
  if (!skip) balance_experts();
  sync.after_step(++step_, last_.comm);
  ExecSpace().fence();
  last_.norm = norm, last_.lr = lr;
  if (sync.consensus_distance() >= 0) last_.consensus = sync.consensus_distance();
  return last_.parts.total;
}

// Every micro-batch forward and backward through the whole model, in turn
// (sync accumulate K: K of them), each from its own batch.
LossParts Trainer::micro_batch_passes() {
  const int micro = strategy_->micro_batches();
  LossParts mean;
  for (int m = 0; m < micro; ++m) {
    data_->load_training_batch(step_ * micro + m);
    const LossParts parts = model_->forward(data_->inputs, data_->targets);
    count_expert_load();
    model_->set_loss_weights(weigh_losses(parts));
    mean.total += parts.total / micro, mean.main += parts.main / micro;
    mean.mtp += parts.mtp / micro, mean.aux += parts.aux / micro;
    model_->backward(data_->inputs, data_->targets, gradient_hook(m + 1 == micro));
  }
  return mean;
}

// From the last micro-batch's backward: each final range is checked, then
// handed to the strategy (dense starts its bucket all-reduces).
std::function<void(int64_t)> Trainer::gradient_hook(bool last) {
  if (!last) return {};
  return [this, final_from = model_->layout().total()](int64_t offset) mutable {
    for (auto& check : on_gradients_) check(offset, final_from);
    final_from = offset;
    strategy_->gradients_ready(offset);
  };
}
// TRAINING STEP END
// ---------------------------------------------------------------------------

CommStats Trainer::expert_traffic() {
  ExchangeStats s;
  for (auto& x : exchanges_) s += x->stats(), x->stats() = {};
  exchange_total_ += s;
  // point to point: what leaves this rank is on the wire; the time is what the step spent waiting for them
  return CommStats{.rounds = s.rounds, .bytes_sent = s.bytes_sent, .wire_bytes = s.bytes_sent, .seconds = s.waited};
}

// Loss aggregation: every rank's losses weigh its seeds for this backward.
LossWeights Trainer::weigh_losses(const LossParts& parts) {
  LossWeights seeds;
  if (lossagg_on_)
    seeds = lossagg_->weigh(cfg_.lossagg, {parts.main, cfg_.model.mtp.weight * parts.mtp, parts.aux},
                            double(data_->inputs.extent(0)));
  seed_main_ = seeds.main;
  return seeds;
}

// MoE: the global expert load (one all-reduce), and for balance bias the
// V3 update of each layer's selection bias from its own global load.
void Trainer::balance_experts() {
  auto layers = model_->moe_layers();
  if (layers.empty() && (!stages_ || !cfg_.model.moe.enabled())) return;  // (a stage without one joins the others)
  const int64_t E = cfg_.model.moe.routed;
  const bool capped = cfg_.model.moe.capacity_factor > 0;
  std::vector<double> global(layers.size() * E + capped);
  if (!layers.empty()) std::copy_n(step_load_.begin(), global.size(), global.begin());
  sum_over_ranks(global, replicas_);  // (pipeline stages: the ranks holding this stage's layers)
  last_.expert_dropped = capped ? global.back() : -1;
  last_.expert_load.assign(E, 0.0);
  for (size_t l = 0; l < layers.size(); ++l) {
    std::vector<double> load(global.begin() + l * E, global.begin() + (l + 1) * E);
    for (int64_t e = 0; e < E; ++e) last_.expert_load[e] += load[e];
    if (cfg_.model.moe.balance == Balance::bias) layers[l].second->update_bias(load, cfg_.model.moe.balance_coef);
  }
  if (stages_) {  // the record's load is every stage's layers'
    last_.expert_load.push_back(last_.expert_dropped);
    sum_over_ranks(last_.expert_load, stages_->chain());
    last_.expert_dropped = capped ? last_.expert_load.back() : -1;
    last_.expert_load.pop_back();
  }
}

// MoE: the last forward's tokens per routed expert (and rows dropped past
// capacity), added to this step's: every micro-batch counts. `run`: the
// forward was that run's of the stage's layers alone (-1: all of them).
void Trainer::count_expert_load(int run) {
  const auto all = model_->moe_layers();
  if (all.empty()) return;
  const int64_t E = cfg_.model.moe.routed;
  step_load_.resize(all.size() * E + 1, 0.0);
  size_t from = 0, to = all.size();  // the run's layers: a span of all of them (runs in model order)
  if (run >= 0) {
    for (int r = 0; r < run; ++r) from += model_->moe_layers(r).size();
    to = from + model_->moe_layers(run).size();
  }
  for (size_t l = from; l < to; ++l) {
    for (int64_t e = 0; e < E; ++e) step_load_[l * E + e] += all[l].second->expert_counts()[e];
    step_load_.back() += double(all[l].second->dropped_rows());  // (under ep the owners' count)
  }
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

// Before the sum hides one rank's miss.
void Trainer::check_missing_gradients(int64_t begin, int64_t end) {
  // (the last stage's copy of the embedding gets stage 0's gradient after the sum: share_embedding)
  const auto echo = placement_.echo();
  const auto missing = tensors_without_gradient(model_->layout(), model_->grads(), begin, end, [&](const TensorInfo& t) {
    return model_->idle_expert(t) || (echo.second > echo.first && t.offset == echo.first);
  });
  if (missing.empty()) return;
  const std::string msg = fmt::format("rank {}: step {}: no gradient reached {} tensor(s): {}", rank_, step_ + 1,
                                      missing.size(), fmt::join(missing, ", "));
  log_->rank(msg);
  if (cfg_.grad_check.missing == MissingGradient::error) throw std::runtime_error(msg + " (grad_check missing error)");
  fmt::print(stderr, "warning: {}\n", msg);
}

// A sample of the model as it stands, as llm.c prints one: on the console,
// in rank 0's log and in TensorBoard (samples/text). Nothing it does reaches
// the training: its own cache and scratch, its own random stream.
void Trainer::write_sample() {
  // The decoder reads fp32 weights: where a rank keeps only its pieces, rank
  // 0 takes them whole for the sample (the next step releases them again).
  if (placement_.master_sharded()) {
    const std::vector<float> whole = placed_->from_file_frame(whole_params());
    if (rank_ == 0) transfer::from_host(model_->params(), whole);
  }
  if (rank_ != 0) return;
  const SampleConfig& s = cfg_.sample;
  if (!decoder_) decoder_ = std::make_unique<Decoder>(*model_, cfg_.model.seq);
  const std::vector<int32_t> prompt = data_->tokenizer().encode(s.prompt);
  SamplingOptions o{s.temperature, s.top_k, s.top_p, mix_seed(s.seed, uint64_t(step_))};
  const double t0 = MPI_Wtime();
  const std::vector<int32_t> out = generate(*decoder_, prompt, s.tokens, o);
  const double seconds = MPI_Wtime() - t0;
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), out.begin(), out.end());
  const std::string text = data_->tokenizer().decode(all);
  log_->console(fmt::format("step {:>6} | sample ({} tokens, {:.0f} tok/s):\n{}\n---", step_, out.size(),
                            double(out.size()) / std::max(seconds, 1e-9), text));
  log_->text(step_, "samples/text", text);
}

// Collective. Validation batches in runs of the model's batch (pipeline
// stages: through every stage, the last one scoring; else the batch at once).
Validation Trainer::evaluate() {
  const int runs = cfg_.data.batch / micro_;
  const int64_t N = int64_t(micro_) * cfg_.model.seq;
  double sums[5] = {0, 0, 0, 0, 0};  // mean losses, nats, bytes of text predicted, argmax hits, tokens
  precision_->refresh_weights();
  const bool scores = !stages_ || stages_->cut().last();
  for (int j = 0; j < cfg_.eval.batches; ++j) {
    const std::vector<int32_t> targets = data_->load_validation_batch(j);
    for (int r = 0; r < runs; ++r) {
      const Tokens in(data_->inputs.data() + r * N, N), tgt(data_->targets.data() + r * N, N);
      double loss = 0;
      if (!stages_) {
        loss = model_->forward(in, tgt).main;
      } else {  // activations go forward by the stage messages (validation runs count as micro-batches 0..)
        const StageCut& c = stages_->cut();
        std::vector<float>& act = stage_host_;
        const auto h = transfer::host_view(act);
        for (size_t k = 0; k < c.runs.size(); ++k) {  // in chunk order: no stage waits on a later chunk
          const LayerRun& run = c.runs[k];
          const int64_t n = int64_t(act.size());
          Buffer<float>& in_k = stage_in_[k];
          Buffer<float>& out_k = stage_out_[k];
          if (run.chunk > 0) stages_->recv_activation(run.chunk, r, act.data(), n), Kokkos::deep_copy(in_k, h);
          const double main = model_->forward_stage(run.begin, run.end, in, tgt, in_k.data(), out_k.data()).main;
          if (run.chunk + 1 < c.chunks) Kokkos::deep_copy(h, out_k), stages_->send_activation(run.chunk, r, act.data(), n);
          else loss = main;
        }
      }
      if (!scores) continue;
      sums[0] += loss / runs, sums[1] += loss * double(N);
      for (int64_t i = 0; i < N; ++i) sums[2] += data_->tokenizer().bytes_of(targets[size_t(r * N + i)]);
      // next-token accuracy: the main head's argmax (the lowest id among equals) is the target
      auto logits = host_copy(model_->logits());
      const int64_t V = cfg_.model.vocab;
      for (int64_t i = 0; i < N; ++i) {
        const float* row = &logits(i, 0);
        sums[3] += int64_t(std::max_element(row, row + V) - row) == targets[size_t(r * N + i)];
      }
      sums[4] += double(N);
    }
  }
  if (stages_) stages_->finish_step();
  sum_over_ranks(sums, comm_);  // over every scoring rank's batches
  int scorers = world_;
  if (stages_) scorers = stages_->cut().replicas;
  // bits per byte = nats per token * tokens / bytes / ln 2
  const double bpb = data_->bytes_known() && sums[2] > 0 ? sums[1] / sums[2] / std::log(2.0)
                                                  : std::numeric_limits<double>::quiet_NaN();
  return {sums[0] / double(scorers * cfg_.eval.batches), bpb, sums[3] / sums[4]};
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

void Trainer::run_phases() {
  int64_t total_steps = 0;
  for (const auto& p : program_.phases) total_steps += p.steps;
  // Open MPI's mpirun gives every rank a pseudo-terminal even when its own
  // output goes to a pipe or file, so `auto` cannot trust isatty there.
  const auto& progress = cfg_.output.progress;
  const bool terminal = ::isatty(STDOUT_FILENO) && !std::getenv("OMPI_COMM_WORLD_SIZE");
  log_->show_progress(progress == Progress::on || (progress == Progress::automatic && terminal));
  report_ = std::make_unique<StepReport>(*log_, rank_, world_, flops_per_token_, mfu_, total_steps);
  double loss = 0;
  // init hf: the published model's validation loss before the first step (a
  // fine-tune's baseline), and a step-0 checkpoint a requeued job resumes from.
  if (step_ == 0 && !resumed_ && cfg_.init.kind == InitKind::hf) {
    if (cfg_.eval.every > 0) report_->log_validation(0, phase_end_, evaluate()), report_->flush();
    if (cfg_.checkpoint.every > 0) save_checkpoint(std::numeric_limits<double>::quiet_NaN());
  }
  for (size_t phase = phase_; phase < program_.phases.size(); ++phase) {
    if (phase != phase_) enter_phase(phase);
    while (step_ < phase_end_) {
      inject_fault(step_ + 1);
      const double t0 = MPI_Wtime();
      loss = train_step();
      if (step_ == phase_end_) {  // every phase ends in consensus: the next one starts from one model
        strategy_->end_phase(step_, last_.comm);
        if (strategy_->consensus_distance() >= 0) last_.consensus = strategy_->consensus_distance();
      }
      after_step(loss, MPI_Wtime() - t0);
      if (stop_requested()) return stop_on_signal(loss);
    }
  }
  finish_checkpoint();  // the last checkpoint is on disk before the run reports
  report_->performance(loss, peak_resident_mib());
  if (!exchanges_.empty()) {  // ep: how much of the tokens' travel other work hid, summed over the ranks
    const ExchangeStats& x = exchange_total_;
    double sum[4] = {double(x.rounds), double(x.bytes_sent), x.seconds, x.waited};
    sum_over_ranks(sum, comm_);
    const std::string overlap = pipeline_ && pipeline_->overlaps()
                                    ? fmt::format(" (the shared experts and the paired pass: {} hand-overs on rank 0)",
                                                  pipeline_->pair().hand_overs())
                                    : " (the shared experts)";
    log_->console(fmt::format("all-to-all (moe ep {}), all ranks: {:.0f} rounds, {:.1f} MB sent, {:.3f} s in flight, "
                              "{:.3f} s waited: {:.0f}% hidden behind other work{}", placement_.experts().ep, sum[0],
                              sum[1] / 1e6, sum[2], sum[3], sum[2] > 0 ? 100.0 * (1.0 - sum[3] / sum[2]) : 0.0, overlap));
  }
}

// What is due after a step: health, the step line, evaluation, a warm
// restart, a checkpoint.
void Trainer::after_step(double loss, double seconds) {
  const bool end = step_ == phase_end_;
  auto due = [this](int64_t every) { return every > 0 && step_ % every == 0; };
  // tokens trained this step: every replica's batch (pipeline stages: each replica's M micro-batches once)
  const int64_t batches = stages_ ? stages_->cut().replicas : int64_t(world_) * strategy_->micro_batches();
  report_->step_done(step_, loss, seconds, int64_t(cfg_.data.batch) * cfg_.model.seq * batches);
  losses_.push_back(loss);
  if (due(cfg_.health.every)) check_health_now();
  if (due(cfg_.output.log_every) || end) {
    report_->log_step(figures(loss));
    // output barrier on: every rank waits for the others after logging, as the
    // folklore has it (10/13's B6 measures what that costs; nothing needs it).
    if (cfg_.output.barrier) every_rank_arrives(comm_);
  }
  double val = std::numeric_limits<double>::quiet_NaN();
  if (due(cfg_.eval.every) || end) {
    const Validation v = evaluate();
    val = v.loss;
    restarts_->note_validation(val, step_);
    report_->log_validation(step_, phase_end_, v);
  }
  report_->flush();
  if (due(cfg_.sample.every)) write_sample();
  if (restarts_->due(step_ + 1)) {
    if (!std::isfinite(val)) restarts_->note_validation(val = evaluate().loss, step_);
    restarts_->restart(step_ + 1, val, *log_);
  }
  // Every rank's own state is in the checkpoint, so it need not wait for
  // the ranks to agree (sync local, clusters, ring).
  if (due(cfg_.checkpoint.every) || (cfg_.checkpoint.at_end && end)) save_checkpoint(loss);
}

// Collective: every rank's peak resident memory so far (VmHWM), then every
// rank's resident memory before the model was built, in MiB.
std::vector<double> Trainer::peak_resident_mib() const {
  const double mine[2] = {double(peak_resident_bytes()) / (1024.0 * 1024.0), resident_before_model_};
  const std::vector<double> both = rows_of_all_ranks(mine, comm_);
  std::vector<double> out(2 * world_);
  for (int r = 0; r < world_; ++r) out[r] = both[2 * r], out[world_ + r] = both[2 * r + 1];
  return out;
}

StepFigures Trainer::figures(double loss) const {
  StepFigures f = last_;
  f.step = step_, f.phase_end = phase_end_;
  f.loss = loss;
  f.mtp = cfg_.model.mtp.depth > 0;
  if (const auto* c = strategy_->compressor()) f.compress_ratio = c->ratio_at(step_ - 1);
  f.scaler = precision_->scaler();
  f.lossagg = lossagg_.get();
  f.lossagg_kind = cfg_.lossagg.kind;
  f.batch_position = data_->position();
  return f;
}

}  // namespace xx

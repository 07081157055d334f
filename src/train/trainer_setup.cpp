// The trainer's set-up: data, model and parts, the data stream, and what
// each phase switches (its settings, its sync strategy, the checks on the
// gradients). The loop is in trainer.cpp.
#include <unistd.h>
#include <optional>
#include <fmt/format.h>
#include "core/device_memory.h"
#include "core/error.h"
#include "data/seeding.h"
#include "kernels/gemm.h"
#include "kernels/precision.h"
#include "model/attention.h"
#include "train/trainer.h"
#include "core/host_memory.h"
#include "hf/import.h"
#include "comm/agree.h"
#include "train/transfer.h"

namespace xx {
using namespace transfer;

Trainer::Trainer(MPI_Comm comm, const Program& program, const RunOptions& options)
    : comm_(comm), program_(program), options_(options) {
  MPI_Comm_rank(comm, &rank_);
  MPI_Comm_size(comm, &world_);
  if (program.phases.empty()) throw InputError("deck: no run command: nothing to do");
  cfg_ = program.phases.front().config;  // per-job settings are the same in every phase (deck/commands.cpp)
  check_pipeline_stages();
  build_stages();
  data_ = std::make_unique<TrainingData>(comm_, replicas_, program_);
  std::string resume_path;
  on_rank0_or_throw(comm_, rank_, [&] { resume_path = resolve_resume(options_.resume); });
  from_rank0(resume_path, comm_);
  resident_before_model_ = double(resident_bytes()) / (1024.0 * 1024.0);
  check_expert_groups(resume_path);
  build_model(resume_path.empty());
  register_state();
  const double restore_start = MPI_Wtime();
  if (!resume_path.empty()) restore(resume_path), resumed_ = true;
  else enter_phase(0);
  const double restore_s = MPI_Wtime() - restore_start;  // rank 0 reads the file, every rank gets it
  log_ = std::make_unique<RunLog>(cfg_.output.dir, rank_, resumed_, options_.quiet, cfg_.output.tensorboard);
  watchdog_ = std::make_unique<Watchdog>(cfg_.output.dir, rank_, cfg_.resilience.timeout);
  if (resumed_)
    log_->console(fmt::format("resumed from {} at step {} (read and broadcast in {:.3f} s)", resume_path, step_,
                              restore_s));
  if (!log_note_.empty()) log_->console(log_note_);
  data_->start_stream(resume_path, [this](const std::string& line) { log_->console(line); },
                      [this](const std::string& line) { log_->rank(line); });
  flops_per_token_ = flops_per_token(cfg_.model, model_->layout());
  // The MFU denominator: the deck's, or the peak file's entry for this
  // machine; a run never measures it. Only rank 0 reports an MFU.
  if (rank_ == 0) {
    std::string why_none;
    const Precision precision = cfg_.precision.kind;
    const PeakKey machine = this_machine(kernels::gemm_kernel(precision), std::string(mode_name(precision)));
    auto peak = resolve_peak(cfg_.peak_gflops, default_peak_file(), machine, &why_none);
    mfu_ = MfuMeter(std::move(peak), why_none);
    if (!mfu_.peak_gflops()) log_->console(no_peak_hint(why_none));
    // 16-bit GEMMs are not faster everywhere (without AMX, some CPUs run
    // bf16 dot products at half the fp32 rate): say so when the peak file knows.
    if (precision != Precision::fp32 && cfg_.peak_gflops == 0 && mfu_.peak_gflops()) {
      const PeakKey fp32 = this_machine(kernels::gemm_kernel(kernels::Precision::fp32), "fp32");
      if (auto f = resolve_peak(0, default_peak_file(), fp32); f && f->gflops_per_core > *mfu_.peak_gflops())
        log_->console(fmt::format("note: on this CPU {} GEMMs reach {:.1f} GFLOP/s per core, fp32 ones {:.1f} ({}): "
                                  "{} saves activation memory here, not time ('precision {} products widened' "
                                  "multiplies on the fp32 kernel)",
                                  precision, *mfu_.peak_gflops(), f->gflops_per_core, default_peak_file(),
                                  precision, precision));
    }
  }
}

Trainer::~Trainer() {
  saver_.reset();     // a checkpoint write in flight finishes (and a failure nobody waited for is printed)
  watchdog_.reset();  // after it: a writer stuck in a collective is still caught
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  exchanges_.clear();
}

// moe ... ep N: groups of N consecutive ranks share the routed experts out
// (one node's ranks, where the all-to-all is cheapest); a world size N does
// not divide is refused, naming the deck's line and a checkpoint's layout.
void Trainer::check_expert_groups(const std::string& resume_path) {
  const int ep = cfg_.model.moe.enabled() ? cfg_.model.moe.ep : 1;
  if (world_ % ep == 0) return;
  const std::string where = where_given(program_, "moe");
  std::string written;
  on_rank0_or_throw(comm_, rank_, [&] {
    if (resume_path.empty()) return;
    const auto [w, e] = read_checkpoint_layout(resume_path);
    written = fmt::format("; {} was written by {} ranks at ep {} and holds every expert", resume_path, w, e);
  });
  from_rank0(written, comm_);
  input_error("{}: moe ep {} does not divide the {} ranks of this run{} (expected a world size that is a multiple "
              "of ep, or an ep that divides {} and routed {})", where, ep, world_, written, world_,
              cfg_.model.moe.routed);
}

// pipeline stages P: world = P x ep x dp ranks (ep is refused under P > 1
// for now: deck/commands.cpp), each stage's replicas consecutive ranks
// (core/placement.h, StageCut).
void Trainer::check_pipeline_stages() const {
  const PipelineConfig& p = cfg_.pipeline;
  if (p.stages == 1) return;
  const int ep = cfg_.model.moe.enabled() ? cfg_.model.moe.ep : 1;
  if (world_ % (p.stages * ep) != 0)
    input_error("{}: pipeline stages {} x moe ep {} does not fill the {} ranks of this run (expected a world size "
                "that is a multiple of stages x ep: stages x ep x data-parallel replicas)",
                where_given(program_, "pipeline"), p.stages, ep, world_);
}

// pipeline stages P > 1: rank r runs stage r / dp (its layers alone: the
// model is built for it), as replica r % dp, whose data it reads; a step is
// the schedule's passes over M micro-batches of batch / M sequences. At
// P = 1 with micro M > 1, the one stage runs those M micro-batches in turn:
// the same deck's losses at any P, to rounding.
void Trainer::build_stages() {
  const PipelineConfig& p = cfg_.pipeline;
  replicas_ = comm_;
  micro_ = cfg_.data.batch;
  if (p.stages == 1 && p.micro == 1) return;
  stages_ = std::make_unique<StageLink>(comm_, stage_cut(world_, rank_, p.stages, cfg_.model.layers, p.cut,
                                                         p.virtual_stages, p.schedule == PipelineSchedule::dualpipev));
  replicas_ = stages_->data_parallel();
  // dualpipev under ep: each F&B pair's passes interleave at their all-to-alls (train/pass_pair.h)
  const bool overlap = p.schedule == PipelineSchedule::dualpipev && cfg_.model.moe.enabled() && cfg_.model.moe.ep > 1;
  pipeline_ = std::make_unique<PipelineExecutor>(p.schedule, p.micro, *stages_, overlap);
  micro_ = cfg_.data.batch / p.micro;
  passes_ = &Trainer::stage_passes;
  mtp_travels_ = p.stages > 1 && cfg_.model.mtp.depth > 0;
}

void Trainer::build_model(bool fresh) {
  comm_ops_ = std::make_unique<Communicator>(comm_, cfg_.sync.transport, sparse_transport(program_.phases));
  kernels::set_widened_products(cfg_.precision.products == Products::widened);
  kernels::set_tf32_products(cfg_.precision.kind == Precision::fp32 && cfg_.precision.products == Products::tf32);
  try {
    kernels::select_gemm_backend(cfg_.gemm);
  } catch (const std::runtime_error& e) {
    input_error("deck: {} (expected gemm auto, or a backend this binary has)", e.what());
  }
  // the ranks sharing this rank's tensors (all of them without stages): the
  // expert shares and the pieces are cut over them
  int replicas = 1, replica = 0;
  MPI_Comm_size(replicas_, &replicas), MPI_Comm_rank(replicas_, &replica);
  const int ep = cfg_.model.moe.enabled() ? cfg_.model.moe.ep : 1;
  model_ = std::make_unique<Transformer<float>>(cfg_.model, micro_, cfg_.precision.kind, replica % ep,
                                                stages_ ? stages_->cut() : StageCut{},
                                                pipeline_ ? pipeline_->in_flight() : std::vector<int>{},
                                                pipeline_ && pipeline_->overlaps());
  if (stages_) {
    stage_sets_.clear();
    for (int r = 0; r < int(stages_->cut().runs.size()); ++r) stage_sets_.emplace_back(model_->activation_sets(r));
    const int64_t width = int64_t(micro_) * cfg_.model.seq * cfg_.model.dim;
    stage_in_.clear(), stage_out_.clear();
    for (size_t r = 0; r < stages_->cut().runs.size(); ++r)
      stage_in_.emplace_back("Trainer::stage_in", width), stage_out_.emplace_back("Trainer::stage_out", width);
    stage_host_.resize(size_t(width));
    const StageCut& c = stages_->cut();
    if (mtp_travels_ && (c.first() || c.last())) {
      stage_lookups_.resize(size_t(model_->mtp_lookups_size()));
      if (c.first()) lookups_ = Buffer<float>("Trainer::lookups", model_->mtp_lookups_size());
    }
  }
  // shard: this rank's pieces of every gradient bucket (the first phase's
  // buckets; the deck keeps them one size per job), under params cut inside
  // the weight units the model asks for.
  const int64_t bucket = std::max<int64_t>(1, int64_t(cfg_.sync.bucket_mb * 1024 * 1024 / sizeof(float)));
  placement_ = place_model(cfg_.model, model_->layout(), cfg_.shard.level, bucket, replicas,
                           replica, fp32_weights_in_pieces(cfg_, replicas));
  placed_ = std::make_unique<PlacementMpi>(comm_, replicas_, placement_);
  saver_ = std::make_unique<CheckpointSaver>(comm_, placement_.frame(), [this](const std::string& line) {
    log_->console(line);
  });
  if (ep > 1) {
    exchanges_.clear();
    if (pipeline_ && pipeline_->overlaps()) {  // the two runs' layers each their own (one request in flight each)
      for (int r = 0; r < 2; ++r) {
        exchanges_.push_back(std::make_unique<PairedExchange>(
            std::make_unique<MpiExpertExchange>(placed_->expert_group()), pipeline_->pair()));
        model_->set_expert_exchange(exchanges_.back().get(), r);
      }
    } else {
      exchanges_.push_back(std::make_unique<MpiExpertExchange>(placed_->expert_group()));
      model_->set_expert_exchange(exchanges_.back().get());
    }
  }
  // A rank writes only the weights it keeps: all of them; or its pieces (and
  // below params the runs the model reads in fp32, which every rank keeps).
  std::vector<std::pair<int64_t, int64_t>> mine{{0, model_->layout().total()}};
  if (placement_.master_sharded()) {
    mine.clear();
    for (const auto& p : placement_.owned().pieces()) mine.emplace_back(p.begin, p.end);
    if (placement_.level() != ShardLevel::params)
      for (const auto& run : model_->layout().fp32_read_runs()) mine.push_back(run);
  }
  const bool from_hf = fresh && cfg_.init.kind == InitKind::hf;
  if (from_hf) {
    model_->init_sharded(cfg_.seed, {});  // no random weights to overwrite
    import_hf(mine);
  } else if (placement_.level() != ShardLevel::off) {
    model_->init_sharded(cfg_.seed, mine);
  } else {
    model_->init(cfg_.seed);
  }
  optimizer_ = std::make_unique<AdamW<float>>(model_->layout(), placement_, cfg_.optimizer.moments);  // one type per job (deck)
  precision_ = std::make_unique<MixedPrecision>(cfg_.precision, *model_);
  restarts_ = std::make_unique<WarmRestarts>(*placed_, program_, *model_, *optimizer_);
  for (const auto& p : program_.phases)
    if (p.config.lossagg.kind != LossAggKind::off && !lossagg_) {
      const auto& m = cfg_.model;
      const bool aux =
          (m.moe.batch_loss_coef() > 0 || m.moe.sequence_loss_coef() > 0) && !model_->moe_layers().empty();
      lossagg_ = std::make_unique<LossAggregator>(comm_, std::array<bool, LossAggregator::kKinds>{
                                                             true, m.mtp.depth > 0, aux});  // main, mtp, aux
    }
}

// Rank 0 checks the files first (every tensor's name, shape, dtype and FP8
// scales), so a bad file ends every rank alike with one error; then each
// rank reads its own ranges from the mapped files, in chunks, into its
// buffer. A directory some rank cannot read is that rank's failure.
void Trainer::import_hf(const std::vector<std::pair<int64_t, int64_t>>& mine) {
  const double start = MPI_Wtime();
  std::optional<HfWeights> hf;
  std::string summary;
  on_rank0_or_throw(comm_, rank_, [&] {
    hf.emplace(cfg_.init.dir, cfg_.model, placement_.frame());
    summary = hf->summary();
  });
  from_rank0(summary, comm_);
  if (!hf) try {
      hf.emplace(cfg_.init.dir, cfg_.model, placement_.frame());
    } catch (const InputError& e) {  // rank 0 read them: this rank sees other files
      throw std::runtime_error(fmt::format("init hf {}: {} (rank 0 read it; every rank must see the same directory)",
                                           cfg_.init.dir, e.what()));
    }
  constexpr int64_t kChunk = int64_t(1) << 22;  // floats read and copied at a time
  std::vector<float> values;
  for (const FrameTensor& t : placement_.frame()) {
    if (t.local < 0) continue;  // another rank's expert
    for (const auto& [begin, end] : mine)
      for (int64_t lo = std::max(begin, t.local), hi = std::min(end, t.local + t.size); lo < hi; lo += kChunk) {
        const int64_t n = std::min(kChunk, hi - lo);
        values.resize(size_t(n));
        hf->read(t, lo - t.local, n, values.data());
        Kokkos::deep_copy(Kokkos::subview(model_->params(), std::pair(lo, lo + n)),
                          Kokkos::View<const float*, Kokkos::HostSpace, Unmanaged>(values.data(), size_t(n)));
      }
  }
  if (cfg_.model.moe.enabled() && cfg_.model.moe.balance == Balance::bias)
    for (auto& [prefix, ffn] : model_->moe_layers()) from_host(ffn->bias(), hf->selection_bias(prefix));
  log_note_ = fmt::format("init hf {}: {}; this rank's part read in {:.2f} s", cfg_.init.dir, summary,
                          MPI_Wtime() - start);
}

// The phase's settings take effect; its sync strategy is built, or kept when
// the sync, topology and compression settings did not change.
void Trainer::enter_phase(size_t phase) {
  const Phase& p = program_.phases[phase];
  phase_ = phase, cfg_ = p.config;
  lossagg_on_ = lossagg_ && cfg_.lossagg.kind != LossAggKind::off;
  phase_end_ = 0;
  for (size_t i = 0; i <= phase; ++i) phase_end_ += program_.phases[i].steps;
  phase_start_ = phase_end_ - p.steps;
  if (strategy_ && keeps_strategy(phase)) {
    strategy_->continue_into(phase_start_);
  } else {
    SyncBuffers buffers{replicas_, model_->params(), model_->grads(), {optimizer_->m(), optimizer_->v()},
                        comm_ops_.get(), cfg_.seed, [this](Buffer<float> target, const CompressConfig& c, double mb) {
                          return std::make_unique<CompressedSync>(model_->layout().spans(), target, c, mb);
                        },
                        placement_.owned(), placement_.units(), placed_->expert_runs(),
                        model_->grads_in_huge_pages()};
    buffers.half_params = model_->half_params();
    buffers.half_type = model_->gemm_type();
    buffers.fp32_read = model_->layout().fp32_read_runs();
    model_->set_weight_gate(nullptr);  // the old strategy's gate and source go with it
    model_->set_half_weight_source(nullptr);
    strategy_ = choose_sync_strategy(buffers, phase_sync(cfg_, phase_start_), &strategy_report_);
    model_->set_weight_gate(strategy_->weight_gate());
    model_->set_half_weight_source(strategy_->half_weight_source());
    strategy_state_ = StateRegistry();
    strategy_->register_state(strategy_state_);
    if (log_ && phase > 0) log_->console(fmt::format("{}: sync {}", p.where, strategy_report_));
  }
  inject_gradient_fault(injected_.step, injected_.rank, injected_.value);  // the checks on the gradients, for this phase
}

bool Trainer::keeps_strategy(size_t phase) const {
  return phase > 0 && phase_sync(program_.phases[phase - 1].config, 0) == phase_sync(program_.phases[phase].config, 0);
}

// A phase's sync settings; under pipeline stages the M micro-batches take
// the place of sync accumulate M: a stage's replicas average the gradients
// summed over them.
SyncSettings Trainer::phase_sync(const Config& c, int64_t phase_start) const {
  SyncSettings s = sync_settings(c, phase_start);
  if (stages_) s.sync.kind = SyncKind::accumulate, s.sync.every = c.pipeline.micro;
  return s;
}

// Checks on each final range of this rank's gradients, in order: an
// injected fault, the missing-gradient check, rounding to the precision, the
// inf/NaN test behind the NaN policy (a loss scaler tests after the sum).
void Trainer::inject_gradient_fault(int64_t step, int rank, float value) {
  injected_.step = step, injected_.rank = rank, injected_.value = value;
  on_gradients_.clear();
  const int64_t total = model_->layout().total();
  if (injected_.rank == rank_ && injected_.step > 0)
    on_gradients_.push_back([this, total](int64_t, int64_t end) {
      if (injected_.step == step_ + 1 && end == total)
        Kokkos::deep_copy(Kokkos::subview(model_->grads(), total - 1), injected_.value);
    });
  if (cfg_.fault.kind == FaultKind::detach && cfg_.fault.rank == rank_) {
    const TensorInfo last = model_->layout().tensors().back();
    on_gradients_.push_back([this, last, total](int64_t, int64_t end) {
      if (!resumed_ && step_ + 1 >= cfg_.fault.step && end == total)
        Kokkos::deep_copy(Kokkos::subview(model_->grads(), std::make_pair(last.offset, last.offset + last.size)), 0.0f);
    });
  }
  if (cfg_.grad_check.missing != MissingGradient::off)  // a rank that lossagg robust trimmed has no gradient by design
    on_gradients_.push_back([this](int64_t b, int64_t e) { if (seed_main_ != 0) check_missing_gradients(b, e); });
  if (!precision_->scaler())
    on_gradients_.push_back([this](int64_t b, int64_t e) {
      nonfinite_.own |= kernels::has_nonfinite(Vec<const float>(model_->grads().data() + b, e - b));
    });
}

std::string Trainer::backends() const {
  int len = 0;
  char mpi[MPI_MAX_LIBRARY_VERSION_STRING];
  MPI_Get_library_version(mpi, &len);
  std::string mpi_name(mpi, len);
  mpi_name = mpi_name.substr(0, mpi_name.find_first_of(",\n"));
  std::string out;
  auto row = [&out](const char* what, const std::string& value) { out += fmt::format("  {:<18} {}\n", what, value); };
  row("kernels", fmt::format("Kokkos {} ({})", KOKKOS_VERSION, ExecSpace::name()));
  if (device_emulated()) row("kernel memory", device_emulation_report());
  row("gemm", kernels::gemm_report(precision_->type()));
  row("attention", attention_kernel_report(cfg_.model.attention));
  row("recompute", recompute_report(cfg_.model));
  row("control", mpi_name);
  row("sync strategy", strategy_report_);
  if (stages_) {
    const StageCut& c = stages_->cut();
    const PipelineConfig& p = cfg_.pipeline;
    std::vector<std::string> runs, sets;
    for (size_t r = 0; r < c.runs.size(); ++r) {
      runs.push_back(fmt::format("chunk {} blocks [{}, {})", c.runs[r].chunk, c.runs[r].begin, c.runs[r].end));
      sets.push_back(std::to_string(model_->activation_sets(int(r))));
    }
    row("pipeline", fmt::format("{} stages x {} replicas, schedule {}, virtual {} ({} chunks), {} micro-batches of {} "
                                "sequences; this rank stage {} ({}), replica {}, keeping {} micro-batches' "
                                "activations; expected bubble {:.1f}%{}",
                                p.stages, c.replicas, p.schedule, p.virtual_stages, c.chunks, p.micro, micro_, c.stage,
                                fmt::join(runs, ", "), c.replica, fmt::join(sets, " + "),
                                100.0 * theory_bubble(p.schedule, p.stages, p.micro, p.virtual_stages),
                                pipeline_->overlaps() ? "; each F&B pair's passes interleaved at their all-to-alls, "
                                                        "each run with its own scratch"
                                                      : ""));
  }
  out += comm_ops_->report() + "\n";
  const auto& ck = cfg_.checkpoint;
  const char* writer = ck.writer == CheckpointWriter::rank0 ? "rank 0 writes (HDF5 POSIX driver, the ranks' state gathered)"
                                            : "parallel HDF5 (MPI-IO, collective)";
  row("checkpoints", fmt::format("{}, per-rank state {}{}, fletcher32 + crc32c", writer, ck.mode,
                                 ck.mode == CheckpointMode::diff ? fmt::format(" {}", ck.codec) : ""));
  row("data loader", fmt::format("{} threads, queue {}", cfg_.data.workers, cfg_.data.queue));
  row("peak (MFU)", mfu_.describe());
  if (const ExpertShare& x = placement_.experts(); x.ep > 1) {
    const int routed = cfg_.model.moe.routed;
    row("experts", fmt::format("moe ep {}: routed experts [{}, {}) of each MoE layer here, tokens moved by "
                               "{} in groups of {} consecutive ranks, each expert's gradient averaged "
                               "over its {} holder(s)", x.ep, x.share * routed / x.ep, (x.share + 1) * routed / x.ep,
                               exchanges_.front()->describe(), x.ep, x.holders));
  }
  out += fmt::format("  {:<18} {} ({} per token in matmuls), {:.3g} FLOP/token", "parameters",
                     model_->layout().total(), model_->layout().matmul_per_token(), flops_per_token_);
  return out;
}

}  // namespace xx

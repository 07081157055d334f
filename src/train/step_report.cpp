#include "train/step_report.h"
#include <algorithm>
#include <cmath>
#include <fmt/format.h>
#include <fmt/ranges.h>

namespace xx {
namespace {

std::string duration(double seconds) {
  const int64_t s = std::llround(std::max(0.0, seconds));
  return s >= 3600 ? fmt::format("{}h{:02}m", s / 3600, s / 60 % 60) : fmt::format("{}m{:02}s", s / 60, s % 60);
}

// Loss aggregation: the last micro-batch's weights (the logged loss stays the plain mean).
void add_lossagg(nlohmann::json& record, const StepFigures& f, int rank, RunLog& log) {
  const auto& w = f.lossagg->rank_weights();
  record["lossagg_weight_min"] = *std::min_element(w.begin(), w.end());
  record["lossagg_weight_max"] = *std::max_element(w.begin(), w.end());
  if (w.size() <= 64) {
    record["lossagg_weights"] = w;
    std::vector<double> main(w.size());
    for (size_t r = 0; r < w.size(); ++r) main[r] = f.lossagg->gathered_losses()[r * LossAggregator::kKinds];
    record["lossagg_rank_loss_main"] = main;
  }
  if (f.lossagg_kind == LossAggKind::uncertainty) {
    const auto lw = f.lossagg->loss_weights();
    record["lossagg_loss_weight_main"] = lw[0];
    if (f.lossagg->active()[1]) record["lossagg_loss_weight_mtp"] = lw[1];
    if (f.lossagg->active()[2]) record["lossagg_loss_weight_aux"] = lw[2];
  }
  log.rank(fmt::format("step {} lossagg {} weight {:.6g} seed multiplier {:.6g}", f.step, f.lossagg_kind, w[rank],
                       f.lossagg->own_multiplier()));
}

// Expert load across routed experts: min and max as a fraction of the mean,
// and the coefficient of variation; returns the console's part.
std::string add_expert_load(nlohmann::json& record, const StepFigures& f) {
  const auto& load = f.expert_load;
  double mean = 0, var = 0, lo = 1e300, hi = 0;
  for (double l : load) mean += l / load.size(), lo = std::min(lo, l), hi = std::max(hi, l);
  for (double l : load) var += (l - mean) * (l - mean) / load.size();
  record["loss_aux"] = f.parts.aux;
  record["expert_load_min"] = lo / mean;
  record["expert_load_max"] = hi / mean;
  record["expert_load_cv"] = std::sqrt(var) / mean;
  // tokens each routed expert got this step, summed over the MoE layers and ranks
  record["expert_tokens"] = std::vector<int64_t>(load.begin(), load.end());
  if (f.expert_dropped < 0) return fmt::format(" | load cv {:.2f}", std::sqrt(var) / mean);
  record["expert_dropped"] = int64_t(f.expert_dropped);
  return fmt::format(" | load cv {:.2f} | dropped {:.0f}", std::sqrt(var) / mean, f.expert_dropped);
}

}  // namespace

StepReport::StepReport(RunLog& log, int rank, int world, double flops_per_token, MfuMeter& mfu, int64_t total_steps)
    : log_(log), rank_(rank), world_(world), flops_per_token_(flops_per_token), mfu_(mfu), total_steps_(total_steps) {}

void StepReport::step_done(int64_t step, double loss, double seconds, int64_t tokens) {
  seconds_ += seconds, interval_seconds_ += seconds;
  smoothed_ = steps_ == 0 ? seconds : 0.9 * smoothed_ + 0.1 * seconds;  // for the ETA
  log_.progress(fmt::format("step {}/{} | loss {:.4f} | {:.0f} tok/s | ETA {}", step, total_steps_, loss,
                            tokens / smoothed_, duration((total_steps_ - step) * smoothed_)));
  ++steps_, ++interval_steps_;
  tokens_ += tokens, interval_tokens_ += tokens;
}

void StepReport::log_step(const StepFigures& f) {
  const double ms = 1e3 * interval_seconds_ / interval_steps_;
  const double tok_s = interval_tokens_ / interval_seconds_;
  const auto& c = f.comm;
  const std::optional<double> mfu = mfu_.mfu(flops_per_token_, tok_s, world_);
  record_ = {{"step", f.step}, {"loss", f.loss}, {"loss_main", f.parts.main}, {"lr", f.lr},
             {"grad_norm", f.norm}, {"ms_per_step", ms}, {"tokens_per_s", tok_s},
             {"comm_rounds", c.rounds}, {"comm_bytes", c.bytes_sent},
             {"comm_wire_bytes", c.wire_bytes}, {"comm_s", c.seconds}};
  if (mfu) record_["mfu"] = *mfu;  // no peak, or a wrong one: no mfu
  if (f.mtp) record_["loss_mtp"] = f.parts.mtp;
  if (f.consensus >= 0) record_["consensus_distance"] = f.consensus;
  if (!f.bubble.empty()) record_["pipeline_bubble"] = f.bubble, record_["pipeline_bubble_theory"] = f.bubble_theory;
  if (f.nonfinite_skipped > 0) record_["nonfinite_skipped"] = f.nonfinite_skipped;
  if (f.compress_ratio) record_["compress_ratio"] = *f.compress_ratio;
  if (f.scaler) {
    record_["loss_scale"] = f.scaler->scale();
    record_["skipped_steps"] = f.scaler->skipped();
    record_["overflows"] = f.scaler->overflows();
  }
  if (f.lossagg && f.lossagg_kind != LossAggKind::off) add_lossagg(record_, f, rank_, log_);
  const std::string extra = f.expert_load.empty() ? "" : add_expert_load(record_, f);
  log_.console(fmt::format("step {:>6}/{} | loss {:.4f} | lr {:.2e} | norm {:.3f} | {:.1f} ms | {:.0f} tok/s "
                           "| {}{}",
                           f.step, f.phase_end, f.loss, f.lr, f.norm, ms, tok_s, mfu_.format(mfu), extra));
  log_.rank(fmt::format("step {} local batch {} comm {} B ({} B on the wire) in {} rounds, {:.3f} s", f.step,
                        f.batch_position, c.bytes_sent, c.wire_bytes, c.rounds, c.seconds));
  log_.rank_scalars(f.step, {{"loss", f.own_loss}, {"ms_per_step", ms}, {"comm_bytes", double(c.bytes_sent)},
                             {"comm_wire_bytes", double(c.wire_bytes)},
                             {"comm_rounds", double(c.rounds)}, {"comm_s", c.seconds},
                             {"batch_position", double(f.batch_position)}});
  interval_seconds_ = 0, interval_steps_ = 0, interval_tokens_ = 0;
}

void StepReport::log_validation(int64_t step, int64_t phase_end, const Validation& v) {
  record_["step"] = step;
  record_["val_loss"] = v.loss;
  record_["val_ppl"] = std::exp(v.loss);
  const bool bpb = std::isfinite(v.bpb);
  if (bpb) record_["val_bpb"] = v.bpb;
  record_["val_acc"] = v.acc;
  log_.console(fmt::format("step {:>6}/{} | val_loss {:.4f} | val_ppl {:.2f}{} | val_acc {:.4f}", step, phase_end,
                           v.loss, std::exp(v.loss), bpb ? fmt::format(" | val_bpb {:.4f}", v.bpb) : "", v.acc));
}

void StepReport::flush() {
  if (!record_.empty()) log_.metrics(record_);
  record_ = nlohmann::json();
}

void StepReport::performance(double final_loss, const std::vector<double>& peak_rss_mib) {
  const double tok_s = steps_ ? tokens_ / seconds_ : 0;
  const std::optional<double> mfu = mfu_.mfu(flops_per_token_, tok_s, world_);
  const std::optional<double> peak = mfu_.peak_gflops();
  log_.console(fmt::format("PERFORMANCE steps={} ranks={} tokens_per_s={:.0f} ms_per_step={:.2f} mfu={} "
                           "peak_gflops_per_core={} final_loss={:.6f} peak_rss_mib={:.1f}",
                           steps_, world_, tok_s, steps_ ? 1e3 * seconds_ / steps_ : 0.0,
                           mfu ? fmt::format("{:.4f}", *mfu) : "n/a", peak ? fmt::format("{:.1f}", *peak) : "n/a",
                           final_loss, *std::max_element(peak_rss_mib.begin(), peak_rss_mib.begin() + world_)));
  log_.console(fmt::format("memory: peak resident per rank (VmHWM), MiB: {:.1f}; before the model: {:.1f}",
                           fmt::join(peak_rss_mib.begin(), peak_rss_mib.begin() + world_, " "),
                           fmt::join(peak_rss_mib.begin() + world_, peak_rss_mib.end(), " ")));
}

}  // namespace xx

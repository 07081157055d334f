#include "train/mixed_precision.h"
#include "comm/agree.h"
#include "kernels/elementwise.h"

namespace xx {

MixedPrecision::MixedPrecision(const PrecisionConfig& cfg, Transformer<float>& model)
    : type_(cfg.kind), model_(model) {
  if (type_ == kernels::Precision::fp32) return;
  const bool fp16 = type_ == kernels::Precision::fp16;
  scaler_ = std::make_unique<LossScaler>(
      LossScaler::from_setting(cfg.loss_scale_kind, cfg.loss_scale_value, fp16, cfg.scale_window));
}

void MixedPrecision::begin_step() {
  refresh_weights();
  step_scale_ = scaler_ ? scaler_->scale() : 1.0;
  if (scaler_) model_.set_loss_scale(step_scale_);
}

void MixedPrecision::refresh_weights() { model_.refresh_half_weights(); }

bool MixedPrecision::skip_or_unscale(MPI_Comm comm, Vec<float> g) {
  bool skip = false;
  if (scaler_) {
    ExecSpace().fence();
    skip = scaler_->update(any_rank(kernels::has_nonfinite(Vec<const float>(g.data(), g.extent(0))), comm));
  }
  if (!skip && step_scale_ != 1.0) kernels::scale_inplace<float>(g, float(1.0 / step_scale_));
  return skip;
}

void MixedPrecision::register_state(StateRegistry& registry) {
  if (!scaler_) return;
  StateEntry e{"loss_scale", StatePlace::shared_series};
  e.save_doubles = [this] { return scaler_->state(); };
  e.load_doubles = [this](const std::vector<double>& v) { scaler_->restore(v); };
  registry.add(std::move(e));
}

}  // namespace xx

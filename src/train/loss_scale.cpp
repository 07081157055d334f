#include "train/loss_scale.h"
#include <stdexcept>
#include <fmt/format.h>

namespace xx {

LossScaler::LossScaler(double scale, bool dynamic, int64_t window)
    : scale_(scale), dynamic_(dynamic), window_(window) {
  if (!(scale > 0) || window < 1)
    throw std::invalid_argument(fmt::format("LossScaler: scale {} and window {} (expected > 0 and >= 1)", scale, window));
}

LossScaler LossScaler::from_setting(LossScaleKind kind, double value, bool fp16, int64_t window) {
  if (kind == LossScaleKind::automatic) kind = fp16 ? LossScaleKind::dynamic : LossScaleKind::fixed, value = 1;
  if (kind == LossScaleKind::dynamic) return LossScaler(kInitialDynamic, true, window);
  return LossScaler(value, false, window);  // the deck checked it is a positive number
}

bool LossScaler::update(bool overflow) {
  if (overflow) {
    ++overflows_, ++skipped_;
    clean_ = 0;
    if (dynamic_) scale_ *= 0.5;
    return true;
  }
  if (dynamic_ && ++clean_ >= window_) {
    scale_ *= 2.0;
    clean_ = 0;
  }
  return false;
}

std::vector<double> LossScaler::state() const {
  return {scale_, double(clean_), double(skipped_), double(overflows_)};
}

void LossScaler::restore(const std::vector<double>& state) {
  if (state.size() != 4 || !(state[0] > 0))
    throw std::invalid_argument(fmt::format("loss_scale state has {} values (expected 4: scale, clean steps, "
                                            "skipped, overflows, with scale > 0)", state.size()));
  scale_ = state[0];
  clean_ = int64_t(state[1]), skipped_ = int64_t(state[2]), overflows_ = int64_t(state[3]);
}

}  // namespace xx

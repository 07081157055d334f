// Loss scaling for 16-bit gradients (deck: precision ... loss_scale).
// The backward starts from loss * scale, so small gradients stay above
// fp16's underflow; the optimizer sees gradients * (1 / scale). A step whose
// gradients hold an inf or NaN is skipped on every rank. Dynamic scaling
// halves the scale on such a step and doubles it after `window` clean steps
// in a row; a static scale never moves. Scales are powers of two when
// dynamic, so scaling and unscaling are exact.
#pragma once
#include <cstdint>
#include <string>
#include <vector>
#include "core/modes.h"  // LossScaleKind

namespace xx {

class LossScaler {
 public:
  static constexpr double kInitialDynamic = 65536.0;  // 2^16, PyTorch GradScaler's start

  // A scale > 0 (the first one when dynamic); window: clean steps before doubling.
  LossScaler(double scale, bool dynamic, int64_t window);
  // The deck's precision line: dynamic, or a fixed scale (value); auto is
  // dynamic under fp16 and none (1) under bf16.
  static LossScaler from_setting(LossScaleKind kind, double value, bool fp16, int64_t window);

  double scale() const { return scale_; }
  bool dynamic() const { return dynamic_; }
  int64_t clean_steps() const { return clean_; }  // since the last change of scale
  int64_t skipped() const { return skipped_; }    // optimizer steps skipped for inf/NaN
  int64_t overflows() const { return overflows_; }

  // After the gradients of one step are checked (one flag agreed by every
  // rank): true when the optimizer step must be skipped.
  bool update(bool overflow);

  // For checkpoints: {scale, clean steps, skipped, overflows}.
  std::vector<double> state() const;
  void restore(const std::vector<double>& state);

 private:
  double scale_;
  bool dynamic_;
  int64_t window_;
  int64_t clean_ = 0, skipped_ = 0, overflows_ = 0;
};

}  // namespace xx

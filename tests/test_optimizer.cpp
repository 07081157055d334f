// AdamW and clipping on their own (train/optimizer.h), without a Trainer:
// three steps over a tiny model's flat buffer against the update written out
// in double, weight decay only where the layout says, and the clip factor.
#include <catch2/catch.hpp>
#include <cmath>
#include "core/device_memory.h"
#include "train/optimizer.h"

using namespace xx;

TEST_CASE("AdamW: three steps equal the formula in double; norms are not decayed", "[optimizer]") {
  ModelConfig m;
  m.dim = 8, m.layers = 1, m.heads = 2, m.ffn = 8, m.vocab = 16, m.seq = 4;
  const ParamLayout layout(m);
  const int64_t P = layout.total();
  OptimizerConfig cfg;
  cfg.lr = 1e-2, cfg.beta1 = 0.8, cfg.beta2 = 0.9, cfg.eps = 1e-6, cfg.weight_decay = 0.3;
  AdamW<double> adam(layout);
  Buffer<double> params("params", P), grads("grads", P);
  std::vector<double> p(P), mom(P, 0), var(P, 0);
  for (int64_t i = 0; i < P; ++i) p[i] = 0.5 + 0.01 * double(i % 13);
  auto host_params = host_staging(params), host_grads = host_staging(grads);
  for (int64_t i = 0; i < P; ++i) host_params(i) = p[i];
  Kokkos::deep_copy(params, host_params);
  const double scale = 0.5;  // the clip factor the trainer would pass
  for (int t = 1; t <= 3; ++t) {
    for (int64_t i = 0; i < P; ++i) host_grads(i) = std::sin(double(i * t)) * 0.1;
    Kokkos::deep_copy(grads, host_grads);
    adam.step(params, grads, cfg, cfg.lr, scale);
    for (const auto& tensor : layout.tensors())
      for (int64_t i = tensor.offset; i < tensor.offset + tensor.size; ++i) {
        const double g = host_grads(i) * scale;
        mom[i] = cfg.beta1 * mom[i] + (1 - cfg.beta1) * g;
        var[i] = cfg.beta2 * var[i] + (1 - cfg.beta2) * g * g;
        const double mhat = mom[i] / (1 - std::pow(cfg.beta1, t)), vhat = var[i] / (1 - std::pow(cfg.beta2, t));
        const double decay = tensor.decay ? cfg.weight_decay : 0.0;
        p[i] -= cfg.lr * (mhat / (std::sqrt(vhat) + cfg.eps) + decay * p[i]);
      }
  }
  REQUIRE(adam.steps_taken() == 3);
  // The moments are fp32 (as in training): agreement to float precision.
  const auto result = host_copy(params);
  for (int64_t i = 0; i < P; ++i) REQUIRE(result(i) == Approx(p[i]).epsilon(1e-5));
  // A norm weight saw no decay: with a zero gradient it stays where it was.
  AdamW<double> quiet(layout);
  Buffer<double> ones("ones", P), zero("zero", P);
  Kokkos::deep_copy(ones, 1.0);
  quiet.step(ones, zero, cfg, cfg.lr, 1.0);
  const auto after = host_copy(ones);
  int norms = 0;
  for (const auto& tensor : layout.tensors()) {
    if (tensor.decay) {
      CHECK(after(tensor.offset) == Approx(1.0 - cfg.lr * cfg.weight_decay));
    } else {
      CHECK(after(tensor.offset) == 1.0);
      ++norms;
    }
  }
  CHECK(norms > 0);
}

TEST_CASE("clip_factor scales a norm above the limit down to it and leaves the rest", "[optimizer]") {
  CHECK(clip_factor(4.0, 1.0) == 0.25);
  CHECK(clip_factor(0.5, 1.0) == 1.0);
  CHECK(clip_factor(4.0, 0.0) == 1.0);  // clip 0: off
  CHECK(clip_factor(std::nan(""), 1.0) == 1.0);
}

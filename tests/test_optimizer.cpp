// AdamW and clipping on their own (train/optimizer.h), without a Trainer:
// three steps over a tiny model's flat buffer against the update written out
// in double, weight decay only where the layout says, and the clip factor.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include "core/device_memory.h"
#include "kernels/adamw.h"
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

// ---------------------------------------------------------------------------
// moments bf16 (deck: optimizer adamw ... moments bf16; kernels/moments.h)

namespace {

// The nearest bf16 value to x, written independently of kernels/precision.h:
// the two bf16 neighbours of x compared in double, a tie to the even mantissa.
float bf16_nearest(float x) {
  uint32_t u = 0;
  std::memcpy(&u, &x, 4);
  const uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;  // toward zero, away from it
  float flo = 0, fhi = 0;
  std::memcpy(&flo, &lo, 4);
  std::memcpy(&fhi, &hi, 4);
  const double dlo = std::fabs(double(x) - double(flo)), dhi = std::fabs(double(fhi) - double(x));
  if (dlo != dhi) return dlo < dhi ? flo : fhi;
  return ((lo >> 16) & 1u) ? fhi : flo;
}

bool is_bf16(float x) {
  uint32_t u = 0;
  std::memcpy(&u, &x, 4);
  return (u & 0xffffu) == 0;
}

struct Tiny {
  ModelConfig m;
  Tiny() { m.dim = 8, m.layers = 1, m.heads = 2, m.ffn = 8, m.vocab = 16, m.seq = 4; }
};

OptimizerConfig tiny_cfg() {
  OptimizerConfig cfg;
  cfg.lr = 1e-2, cfg.beta1 = 0.8, cfg.beta2 = 0.9, cfg.eps = 1e-6, cfg.weight_decay = 0.3;
  return cfg;
}

// `steps` AdamW<float> steps over a tiny layout; the update written out as a
// plain loop in float beside it, its moments rounded to bf16 when `bf16`.
struct Reference {
  std::vector<float> p, m, v;
};
Reference reference_steps(const ParamLayout& layout, const OptimizerConfig& cfg, bool bf16, int steps,
                          const std::vector<std::vector<float>>& grads, std::vector<float> p) {
  const size_t P = p.size();
  std::vector<float> m(P, 0), v(P, 0);
  for (int t = 1; t <= steps; ++t) {
    const float b1 = float(cfg.beta1), b2 = float(cfg.beta2), lr = float(cfg.lr), eps = float(cfg.eps);
    const float bias1 = float(1.0 - std::pow(cfg.beta1, double(t))), bias2 = float(1.0 - std::pow(cfg.beta2, double(t)));
    for (const auto& tensor : layout.tensors())
      for (int64_t i = tensor.offset; i < tensor.offset + tensor.size; ++i) {
        const float wd = tensor.decay ? float(cfg.weight_decay) : 0.0f;
        const float g = grads[size_t(t - 1)][size_t(i)] * 0.5f;
        const float mi = b1 * m[i] + (1.0f - b1) * g;
        const float vi = b2 * v[i] + (1.0f - b2) * g * g;
        m[i] = bf16 ? bf16_nearest(mi) : mi;
        v[i] = bf16 ? bf16_nearest(vi) : vi;
        const float mhat = mi / bias1, vhat = vi / bias2;  // this step's fp32 moments, before rounding
        p[i] = p[i] - lr * (mhat / (std::sqrt(vhat) + eps) + wd * p[i]);
      }
  }
  return {p, m, v};
}

}  // namespace

TEST_CASE("AdamW moments bf16: fp32 arithmetic, moments kept rounded to nearest even, against a plain loop",
          "[optimizer]") {
  const Tiny tiny;
  const ParamLayout layout(tiny.m);
  const int64_t P = layout.total();
  const OptimizerConfig cfg = tiny_cfg();
  const int steps = 5;
  std::vector<float> p0(static_cast<size_t>(P));
  std::vector<std::vector<float>> grads(steps, std::vector<float>(size_t(P)));
  for (int64_t i = 0; i < P; ++i) p0[i] = 0.5f + 0.01f * float(i % 13);
  for (int t = 0; t < steps; ++t)
    for (int64_t i = 0; i < P; ++i) grads[t][i] = float(std::sin(double(i * (t + 1)) + 0.3)) * 0.1f;
  for (const bool bf16 : {false, true}) {
    INFO((bf16 ? "moments bf16" : "moments fp32"));
    AdamW<float> adam(layout, bf16 ? Precision::bf16 : Precision::fp32);
    CHECK(adam.moments_type() == (bf16 ? Precision::bf16 : Precision::fp32));
    Buffer<float> params("params", P), g("grads", P);
    auto hp = host_staging(params), hg = host_staging(g);
    for (int64_t i = 0; i < P; ++i) hp(i) = p0[i];
    Kokkos::deep_copy(params, hp);
    for (int t = 0; t < steps; ++t) {
      for (int64_t i = 0; i < P; ++i) hg(i) = grads[t][i];
      Kokkos::deep_copy(g, hg);
      adam.step(params, g, cfg, cfg.lr, 0.5);
    }
    const Reference want = reference_steps(layout, cfg, bf16, steps, grads, p0);
    const std::vector<float> m = adam.m().to_host(), v = adam.v().to_host();
    const auto got = host_copy(params);
    // The same float operations in the same order: equal, but where the
    // compiler fused a multiply-add differently (then a float ulp, which can
    // move a bf16 rounding by one bf16 ulp, 2^-8 relative).
    int64_t exact = 0;
    for (int64_t i = 0; i < P; ++i) {
      INFO("i " << i);
      if (bf16) REQUIRE((is_bf16(m[i]) && is_bf16(v[i])));
      REQUIRE(m[i] == Approx(want.m[i]).epsilon(bf16 ? 1.0 / 128 : 1e-6).margin(1e-30));
      REQUIRE(v[i] == Approx(want.v[i]).epsilon(bf16 ? 1.0 / 128 : 1e-6).margin(1e-30));
      REQUIRE(got(i) == Approx(want.p[i]).epsilon(1e-5));
      exact += m[i] == want.m[i] && v[i] == want.v[i] && got(i) == want.p[i];
    }
    CHECK(exact >= P * 99 / 100);
  }
}

TEST_CASE("AdamW moments bf16: the kernel rounds ties to even and reads what it kept", "[optimizer]") {
  // beta1 = beta2 = 0.5, moments 0: m = g/2 and v = g^2/2 (exact in float).
  // g = 2 + 2^-7: m = 1 + 2^-8, halfway between 1 and 1 + 2^-7: kept as 1 (even).
  // g = 2 + 3*2^-7: m = 1 + 3*2^-8, halfway between 1 + 2^-7 and 1 + 2^-6: kept as 1 + 2^-6 (even).
  // g = -(2 + 2^-6): m = -(1 + 2^-7), a bf16 value: kept exactly.
  const std::vector<float> g = {2.0f + 0x1p-7f, 2.0f + 3 * 0x1p-7f, -(2.0f + 0x1p-6f)};
  const std::vector<float> want_m = {1.0f, 1.0f + 0x1p-6f, -(1.0f + 0x1p-7f)};
  const int64_t n = int64_t(g.size());
  Buffer<float> p("p", n), grad("g", n);
  Buffer<uint16_t> m("m", n), v("v", n);
  auto hg = host_staging(grad);
  for (int64_t i = 0; i < n; ++i) hg(i) = g[size_t(i)];
  Kokkos::deep_copy(grad, hg);
  kernels::AdamWStep s{};
  s.lr = 0, s.beta1 = 0.5f, s.beta2 = 0.5f, s.eps = 1e-8f, s.weight_decay = 0, s.bias1 = 1, s.bias2 = 1, s.grad_scale = 1;
  kernels::adamw_update<float, uint16_t>(Vec<float>(p.data(), n), Vec<uint16_t>(m.data(), n),
                                         Vec<uint16_t>(v.data(), n), Vec<const float>(grad.data(), n), s);
  const auto hm = host_copy(m), hv = host_copy(v);
  for (int64_t i = 0; i < n; ++i) {
    INFO("i " << i);
    CHECK(kernels::bf16_bits_to_float(hm(i)) == want_m[size_t(i)]);
    CHECK(kernels::bf16_bits_to_float(hv(i)) == bf16_nearest(0.5f * g[size_t(i)] * g[size_t(i)]));
  }
  // A second step reads the kept (rounded) moments: m = 0.5 * kept + 0.5 * g.
  kernels::adamw_update<float, uint16_t>(Vec<float>(p.data(), n), Vec<uint16_t>(m.data(), n),
                                         Vec<uint16_t>(v.data(), n), Vec<const float>(grad.data(), n), s);
  const auto hm2 = host_copy(m);
  for (int64_t i = 0; i < n; ++i)
    CHECK(kernels::bf16_bits_to_float(hm2(i)) == bf16_nearest(0.5f * want_m[size_t(i)] + 0.5f * g[size_t(i)]));
}

TEST_CASE("Moments: fp32 kept as given, bf16 rounded on the way in and widened exactly on the way out", "[optimizer]") {
  const std::vector<float> values = {1.0f, 1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -3.14159f, 1e-30f, 0.0f, 65504.5f};
  kernels::Moments f("f", int64_t(values.size()), Precision::fp32), b("b", int64_t(values.size()), Precision::bf16);
  CHECK((f.type() == Precision::fp32 && b.type() == Precision::bf16 && b.size() == int64_t(values.size())));
  CHECK((kernels::Moments::bytes_per_value(Precision::fp32) == 4 && kernels::Moments::bytes_per_value(Precision::bf16) == 2));
  CHECK_THROWS_AS(kernels::Moments("h", 3, Precision::fp16), std::invalid_argument);
  f.from_host(values);
  b.from_host(values);
  CHECK(f.to_host() == values);
  const std::vector<float> kept = b.to_host();
  for (size_t i = 0; i < values.size(); ++i) CHECK(kept[i] == bf16_nearest(values[i]));
  b.from_host(kept);  // bf16 values go in and come out unchanged
  CHECK(b.to_host() == kept);
  // in_fp32: a change in fp32, kept rounded (bf16) or as it is (fp32).
  auto add_third = [](Buffer<float>& x) {
    auto h = host_copy(x);
    for (size_t i = 0; i < h.extent(0); ++i) h(i) += 1.0f / 3;
    Kokkos::deep_copy(x, h);
  };
  f.in_fp32(add_third);
  b.in_fp32(add_third);
  const std::vector<float> f3 = f.to_host(), b3 = b.to_host();
  for (size_t i = 0; i < values.size(); ++i) {
    CHECK(f3[i] == values[i] + 1.0f / 3);
    CHECK(b3[i] == bf16_nearest(kept[i] + 1.0f / 3));
  }
  // copy_from: bit for bit, same type.
  kernels::Moments c = b.like("c");
  CHECK(c.type() == Precision::bf16);
  c.copy_from(b);
  CHECK(c.to_host() == b3);
}

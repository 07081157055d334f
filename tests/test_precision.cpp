// Mixed precision: the 16-bit conversions against a brute-force nearest-value
// reference built from the formats' definitions, the rounding and inf/NaN
// kernels, the loss scaler's state machine, and what loss scaling must not
// change (the clip, the gradient up to the exact power-of-two factor).
#include <catch2/catch.hpp>
#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>
#include "mode_words.h"
#include "core/device_memory.h"
#include "core/error.h"
#include "deck/deck.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/precision.h"
#include "model/transformer.h"
#include "train/loss_scale.h"
#include "train/optimizer.h"
#include "model_fixture.h"
#include "temp_dir.h"

using namespace xx;
namespace k = xx::kernels;


namespace {

// The value of fp16 bits straight from IEEE 754's definition, in double.
double fp16_reference_value(uint16_t h) {
  const int sign = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  const double mag = e == 0 ? std::ldexp(double(m), -24) : std::ldexp(1.0 + m / 1024.0, e - 15);
  return sign ? -mag : mag;
}

// bf16 is float's top half: sign, 8-bit exponent (bias 127), 7-bit mantissa.
double bf16_reference_value(uint16_t b) {
  const int sign = b >> 15, e = (b >> 7) & 0xff, m = b & 0x7f;
  const double mag = e == 0 ? std::ldexp(double(m), -133) : std::ldexp(1.0 + m / 128.0, e - 127);
  return sign ? -mag : mag;
}

// Nearest-value rounding by search over every finite non-negative value of a
// format (sorted by bits = sorted by value): the nearer neighbour, on a tie
// the one with the even bit pattern; at or past the midpoint between the
// largest value and the next power step, inf.
struct Reference {
  std::vector<double> values;  // index = bit pattern, 0 .. largest finite
  uint16_t inf_bits;
  double overflow_at;  // |x| >= this rounds to inf
  uint16_t round(float x) const {
    const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
    const double a = std::fabs(double(x));
    if (a >= overflow_at) return sign | inf_bits;
    const auto hi = std::lower_bound(values.begin(), values.end(), a);
    if (hi == values.end()) return sign | uint16_t(values.size() - 1);  // above the largest, below overflow_at
    if (*hi == a) return sign | uint16_t(hi - values.begin());
    const auto lo = hi - 1;
    const double dlo = a - *lo, dhi = *hi - a;
    uint16_t pick = uint16_t((dlo < dhi ? lo : hi) - values.begin());
    if (dlo == dhi) pick = uint16_t(lo - values.begin()) % 2 == 0 ? uint16_t(lo - values.begin()) : uint16_t(hi - values.begin());
    return sign | pick;
  }
};

Reference fp16_reference() {
  Reference r;
  for (uint32_t h = 0; h < 0x7c00; ++h) r.values.push_back(fp16_reference_value(uint16_t(h)));
  r.inf_bits = 0x7c00;
  r.overflow_at = 65504.0 + 16.0;  // halfway to 2^16; 65504's mantissa is odd, so the tie goes up
  return r;
}

Reference bf16_reference() {
  Reference r;
  for (uint32_t b = 0; b < 0x7f80; ++b) r.values.push_back(bf16_reference_value(uint16_t(b)));
  r.inf_bits = 0x7f80;
  r.overflow_at = (r.values.back() + std::ldexp(1.0, 128)) / 2;
  return r;
}

bool is_nan16(uint16_t h, int exp_mask, int mant_mask) { return (h & exp_mask) == exp_mask && (h & mant_mask) != 0; }

// Floats to test: the exact midpoints between neighbours (ties), one float
// ulp either side of them, and random bit patterns within the format's range.
std::vector<float> probe_values(const Reference& r, float max_random, uint64_t seed) {
  std::vector<float> out;
  for (size_t i = 0; i + 1 < r.values.size(); i += 7) {
    const float mid = float((r.values[i] + r.values[i + 1]) / 2);
    REQUIRE(double(mid) == (r.values[i] + r.values[i + 1]) / 2);  // exact in float: a true tie
    for (float v : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) out.push_back(v), out.push_back(-v);
  }
  std::mt19937_64 rng(seed);
  const uint32_t top = std::bit_cast<uint32_t>(max_random);
  for (int i = 0; i < 200000; ++i) {
    const float v = std::bit_cast<float>(uint32_t(rng() % top));
    out.push_back(i % 2 ? -v : v);
  }
  return out;
}

}  // namespace

TEST_CASE("fp16: every value decodes as IEEE binary16 defines it and round-trips", "[precision]") {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = k::fp16_bits_to_float(uint16_t(h));
    if (is_nan16(uint16_t(h), 0x7c00, 0x3ff)) {
      REQUIRE(std::isnan(f));
      REQUIRE(std::isnan(k::fp16_bits_to_float(k::float_to_fp16_bits(f))));
      continue;
    }
    if ((h & 0x7fff) == 0x7c00) REQUIRE(std::isinf(f));
    else REQUIRE(double(f) == fp16_reference_value(uint16_t(h)));
    REQUIRE(k::float_to_fp16_bits(f) == h);
  }
}

TEST_CASE("bf16: every value decodes as float's top half and round-trips", "[precision]") {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float f = k::bf16_bits_to_float(uint16_t(b));
    if (is_nan16(uint16_t(b), 0x7f80, 0x7f)) {
      REQUIRE(std::isnan(f));
      REQUIRE(std::isnan(k::bf16_bits_to_float(k::float_to_bf16_bits(f))));
      continue;
    }
    if ((b & 0x7fff) == 0x7f80) REQUIRE(std::isinf(f));
    else REQUIRE(double(f) == bf16_reference_value(uint16_t(b)));
    REQUIRE(k::float_to_bf16_bits(f) == b);
  }
}

TEST_CASE("float -> fp16 and bf16 round to the nearest value, ties to even, as a brute-force search does",
          "[precision]") {
  SECTION("fp16, subnormals and overflow included") {
    const Reference r = fp16_reference();
    for (float x : probe_values(r, 70000.0f, 1)) {
      CAPTURE(x);
      REQUIRE(k::float_to_fp16_bits(x) == r.round(x));
    }
  }
  SECTION("bf16, over float's whole finite range") {
    const Reference r = bf16_reference();
    for (float x : probe_values(r, std::numeric_limits<float>::max(), 2)) {
      CAPTURE(x);
      REQUIRE(k::float_to_bf16_bits(x) == r.round(x));
    }
  }
}

TEST_CASE("hand-made halfway, subnormal, overflow and NaN cases", "[precision]") {
  auto fp16 = [](float x) { return k::round_to(x, k::Precision::fp16); };
  auto bf16 = [](float x) { return k::round_to(x, k::Precision::bf16); };
  // fp16 has 10 mantissa bits: 1 + 2^-11 is halfway between 1 (even) and 1 + 2^-10 (odd).
  CHECK(fp16(1.0f + std::ldexp(1.0f, -11)) == 1.0f);
  CHECK(fp16(1.0f + 3 * std::ldexp(1.0f, -11)) == 1.0f + std::ldexp(1.0f, -9));  // ties up to the even 1 + 2^-9
  CHECK(fp16(std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f)) == 1.0f + std::ldexp(1.0f, -10));
  // bf16 has 7 mantissa bits: the same cases three bits further left.
  CHECK(bf16(1.0f + std::ldexp(1.0f, -8)) == 1.0f);
  CHECK(bf16(1.0f + 3 * std::ldexp(1.0f, -8)) == 1.0f + std::ldexp(1.0f, -6));
  CHECK(bf16(-(1.0f + 3 * std::ldexp(1.0f, -8))) == -(1.0f + std::ldexp(1.0f, -6)));
  // fp16 subnormals: multiples of 2^-24.
  const float tiny = std::ldexp(1.0f, -24);
  CHECK(fp16(tiny) == tiny);
  CHECK(fp16(tiny / 2) == 0.0f);                                   // tie between 0 (even) and 2^-24
  CHECK(fp16(std::nextafter(tiny / 2, 1.0f)) == tiny);
  CHECK(fp16(1.5f * tiny) == 2 * tiny);                            // tie between 1 and 2 units: 2
  CHECK(fp16(2.5f * tiny) == 2 * tiny);                            // tie between 2 and 3 units: 2
  CHECK(std::signbit(fp16(-tiny / 4)));                             // -0 keeps its sign
  CHECK(fp16(std::ldexp(1023.5f, -24)) == std::ldexp(1.0f, -14));  // rounds up into the smallest normal
  // overflow
  CHECK(fp16(65504.0f) == 65504.0f);
  CHECK(fp16(65519.0f) == 65504.0f);
  CHECK(std::isinf(fp16(65520.0f)));
  CHECK(fp16(-1e6f) == -INFINITY);
  CHECK(std::isinf(bf16(std::numeric_limits<float>::max())));
  CHECK(bf16(std::ldexp(255.0f, 120)) == std::ldexp(255.0f, 120));  // the largest finite bf16
  // NaN stays NaN, inf stays inf
  CHECK(std::isnan(fp16(NAN)));
  CHECK(std::isnan(bf16(-NAN)));
  CHECK(fp16(-INFINITY) == -INFINITY);
  CHECK(bf16(INFINITY) == INFINITY);
}

TEST_CASE("pack_half and unpack_half apply the scalar conversions to every entry", "[precision]") {
  const int64_t n = 5000;  // more than one chunk
  std::vector<float> x(n), back(n);
  std::vector<uint16_t> bits(n);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1000.0f);
  for (int64_t i = 0; i < n; ++i) x[i] = normal(rng) * (i % 3 == 0 ? 1e-6f : 1.0f);
  for (auto p : {k::Precision::bf16, k::Precision::fp16}) {
    k::pack_half(bits.data(), x.data(), n, p);
    k::unpack_half(back.data(), bits.data(), n, p);
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t want = p == k::Precision::bf16 ? k::float_to_bf16_bits(x[i]) : k::float_to_fp16_bits(x[i]);
      REQUIRE(bits[i] == want);
      REQUIRE(std::bit_cast<uint32_t>(back[i]) == std::bit_cast<uint32_t>(k::round_to(x[i], p)));
    }
  }
}

TEST_CASE("has_nonfinite finds one inf or NaN anywhere and nothing in finite data", "[precision]") {
  const int64_t n = 4097;
  Buffer<float> x("x", n);
  Kokkos::deep_copy(x, 65504.0f);
  CHECK_FALSE(k::has_nonfinite(Vec<const float>(x.data(), n)));
  for (int64_t at : {int64_t(0), int64_t(2048), n - 1})
    for (float bad : {INFINITY, -INFINITY, NAN}) {
      Kokkos::deep_copy(x, 1.0f);
      Kokkos::deep_copy(Kokkos::subview(x, at), bad);
      CHECK(k::has_nonfinite(Vec<const float>(x.data(), n)));
    }
}

TEST_CASE("the loss scaler halves and skips on overflow, doubles after N clean steps; a static scale never moves",
          "[precision]") {
  SECTION("dynamic") {
    LossScaler s = LossScaler::from_setting(LossScaleKind::dynamic, 1, false, 3);
    REQUIRE(s.scale() == LossScaler::kInitialDynamic);
    CHECK_FALSE(s.update(false));
    CHECK_FALSE(s.update(false));
    CHECK(s.scale() == LossScaler::kInitialDynamic);
    CHECK_FALSE(s.update(false));  // third clean step: doubled
    CHECK(s.scale() == 2 * LossScaler::kInitialDynamic);
    CHECK(s.clean_steps() == 0);
    CHECK_FALSE(s.update(false));
    CHECK(s.update(true));  // overflow: skip, halve, clean count restarts
    CHECK(s.scale() == LossScaler::kInitialDynamic);
    CHECK(s.clean_steps() == 0);
    CHECK(s.update(true));
    CHECK(s.scale() == LossScaler::kInitialDynamic / 2);
    CHECK(s.skipped() == 2);
    CHECK(s.overflows() == 2);
    CHECK_FALSE(s.update(false));
    CHECK_FALSE(s.update(false));
    CHECK(s.scale() == LossScaler::kInitialDynamic / 2);  // the window counts from the last change
    CHECK_FALSE(s.update(false));
    CHECK(s.scale() == LossScaler::kInitialDynamic);
    LossScaler copy = LossScaler::from_setting(LossScaleKind::dynamic, 1, false, 3);
    copy.update(false);
    copy.restore(s.state());
    CHECK(copy.state() == s.state());
  }
  SECTION("static") {
    LossScaler s = LossScaler::from_setting(LossScaleKind::fixed, 128, false, 2);
    CHECK_FALSE(s.dynamic());
    for (int i = 0; i < 5; ++i) CHECK_FALSE(s.update(false));
    CHECK(s.update(true));  // still skipped: the gradients are unusable
    CHECK(s.scale() == 128.0);
    CHECK(s.skipped() == 1);
  }
}

TEST_CASE("unscale-then-clip equals clipping the unscaled gradients", "[precision]") {
  ModelConfig m = architecture("dense");
  ParamLayout layout(m);
  const int64_t P = layout.total();
  Buffer<float> grads("g", P), scaled("gs", P);
  auto h = xx::host_staging(grads);
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 0.3f);
  for (int64_t i = 0; i < P; ++i) h(i) = normal(rng);
  Kokkos::deep_copy(grads, h);
  OptimizerConfig opt;
  opt.clip = 1.0;  // the gradients' norm is well above it: clipping is active
  auto clipped_step = [&](const Buffer<float>& g) {
    Buffer<float> params("p", P);
    Kokkos::deep_copy(params, 0.5f);
    AdamW<float> adam(layout);
    const double norm = std::sqrt(k::sum_squares<float>(Vec<const float>(g.data(), P)));
    adam.step(params, g, opt, 1e-2, clip_factor(norm, opt.clip));
    return std::make_pair(norm, xx::host_copy(params));
  };
  const auto [norm32, params32] = clipped_step(grads);
  REQUIRE(norm32 > 10 * opt.clip);
  for (double S : {65536.0, 1000.0}) {
    CAPTURE(S);
    Kokkos::deep_copy(scaled, grads);
    k::scale_inplace<float>(Vec<float>(scaled.data(), P), float(S));         // what the scaled backward gives
    k::scale_inplace<float>(Vec<float>(scaled.data(), P), float(1.0 / S));   // the trainer's unscale
    const auto [norm, params] = clipped_step(scaled);
    if (S == 65536.0) {  // a power of two: exact
      CHECK(norm == norm32);
      for (int64_t i = 0; i < P; ++i) REQUIRE(params(i) == params32(i));
    } else {  // two roundings per entry: within a few float ulps
      CHECK(norm == Approx(norm32).epsilon(1e-6));
      for (int64_t i = 0; i < P; ++i) REQUIRE(params(i) == Approx(params32(i)).epsilon(1e-5).margin(1e-7));
    }
  }
}

TEST_CASE("a power-of-two loss scale multiplies every gradient exactly (main, MTP and aux seeds)", "[precision]") {
  for (const std::string arch : {"moe-softmax-aux", "deepseek-mtp"}) {
    CAPTURE(arch);
    const ModelConfig cfg = architecture(arch);
    const int B = 2;
    Transformer<float> model(cfg, B);
    model.init(7);
    const int64_t N = int64_t(B) * cfg.seq;
    const auto in = test::pattern_tokens(N, cfg.vocab, 5, 1);
    const auto tgt = test::pattern_tokens(N, cfg.vocab, 3, 2);
    auto grads_at = [&](double scale) {
      model.set_loss_scale(scale);
      model.zero_grads();
      model.forward(in, tgt);
      model.backward(in, tgt);
      auto copy = xx::host_mirror(model.grads());  // a copy, even on the host
      Kokkos::deep_copy(copy, model.grads());
      return copy;
    };
    const auto g1 = grads_at(1.0), g1024 = grads_at(1024.0);
    int64_t nonzero = 0;
    for (size_t i = 0; i < g1.extent(0); ++i) {
      REQUIRE(g1024(i) == 1024.0f * g1(i));
      nonzero += g1(i) != 0;
    }
    CHECK(nonzero > int64_t(g1.extent(0)) / 2);
  }
}

TEST_CASE("16-bit GEMM operands move the loss by about the type's precision", "[precision]") {
  const ModelConfig cfg = architecture("dense");
  const int B = 2;
  const int64_t N = int64_t(B) * cfg.seq;
  const auto in = test::pattern_tokens(N, cfg.vocab, 5, 1);
  const auto tgt = test::pattern_tokens(N, cfg.vocab, 3, 2);
  Transformer<float> ref(cfg, B);
  ref.init(7);
  const double loss32 = ref.forward(in, tgt).main;
  for (auto p : {k::Precision::bf16, k::Precision::fp16}) {
    Transformer<float> model(cfg, B, p);
    model.init(7);
    CHECK(model.gemm_type() == p);
    const double loss = model.forward(in, tgt).main;
    // bf16 keeps 8 significant bits (relative error 2^-9 per rounding), fp16 11.
    CHECK(loss != loss32);
    CHECK(std::fabs(loss - loss32) < (p == k::Precision::bf16 ? 2e-2 : 3e-3) * loss32);
  }
}

TEST_CASE("deck: precision parses its kinds and keywords and rejects bad scales", "[precision][deck]") {
  const xx::test::TempDir t;
  const std::string base = "model dense vocab 256 dim 16 layers 1 heads 2 ffn 32 seq 8\ndata bytes corpus.txt\n";
  auto build = [&](const std::string& line) {
    return build_program(read_deck(t.write("p.deck", base + line + "run 1\n"), {}), false).phases.front().config;
  };
  auto error_of = [&](const std::string& line) -> std::string {
    try {
      build(line);
    } catch (const InputError& e) {
      return e.what();
    }
    return "";
  };
  CHECK(build("").precision.kind == Precision::fp32);
  CHECK(build("").precision.loss_scale == "auto");
  const auto c = build("precision fp16 loss_scale 1024 scale_window 50\n").precision;
  CHECK(c.kind == "fp16");
  CHECK(c.loss_scale == "1024");
  CHECK(c.scale_window == 50);
  CHECK(build("precision bf16 loss_scale dynamic\n").precision.loss_scale == "dynamic");
  CHECK_THAT(error_of("precision fp16 loss_scale dynamc\n"), Catch::Contains("p.deck:3") &&
                                                                  Catch::Contains("did you mean 'dynamic'"));
  CHECK_THAT(error_of("precision fp16 loss_scale 0\n"), Catch::Contains("expected dynamic or a number > 0"));
  CHECK_THAT(error_of("precision fp16 loss_scale -4\n"), Catch::Contains("expected dynamic or a number > 0"));
  CHECK_THAT(error_of("precision fp16 scale_window 0\n"), Catch::Contains("scale_window"));
  CHECK_THAT(error_of("precision fp32 loss_scale 8\n"), Catch::Contains("unknown keyword 'loss_scale'"));
  CHECK_THAT(error_of("precision fp8\n"), Catch::Contains("unknown kind 'fp8'"));
  // products: fp32 native (strict) or tf32; 16-bit native or widened
  CHECK(build("").precision.products == Products::native);
  CHECK(build("precision fp32 products tf32\n").precision.products == Products::tf32);
  CHECK(build("precision bf16 products widened\n").precision.products == Products::widened);
  CHECK_THAT(error_of("precision bf16 products tf32\n"), Catch::Contains("p.deck:3") && Catch::Contains("tf32"));
  CHECK_THAT(error_of("precision fp32 products widened\n"), Catch::Contains("p.deck:3") && Catch::Contains("widened"));
}

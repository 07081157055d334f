// kernels/loss_weights.h: rank weights for every kind, and the uncertainty
// objective's closed-form gradient against a finite difference.
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>
#include "mode_words.h"
#include "core/device_memory.h"
#include "core/error.h"
#include "deck/deck.h"
#include "kernels/loss_weights.h"
#include "model/transformer.h"
#include "model_fixture.h"
#include "temp_dir.h"

using namespace xx;
namespace k = xx::kernels;


namespace {

template <class T>
Buffer<T> device(const std::vector<double>& v) {
  Buffer<T> out("test::lossagg", v.size());
  auto h = xx::host_staging(out);
  for (size_t i = 0; i < v.size(); ++i) h(i) = T(v[i]);
  Kokkos::deep_copy(out, h);
  return out;
}

template <class T>
std::vector<double> host(const Buffer<T>& b) {
  auto h = xx::host_copy(b);
  return std::vector<double>(h.data(), h.data() + h.extent(0));
}

struct Weights {
  std::vector<double> weights, multipliers;
};

// losses: R rows of K values, row-major.
template <class T>
Weights weigh(const std::vector<double>& losses, const std::vector<double>& tokens, k::RankWeightingParams p,
              int64_t K = 3) {
  const int64_t R = int64_t(tokens.size());
  auto l = device<T>(losses);
  auto n = device<T>(tokens);
  Buffer<T> w("test::w", R), m("test::m", R);
  k::rank_weights<T>(w, m, Mat<const T>(l.data(), R, K), n, p);
  return {host(w), host(m)};
}

double total(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s;
}

k::RankWeightingParams params(k::RankWeighting kind, double trim = 0.25, double temperature = 1.0) {
  k::RankWeightingParams p;
  p.kind = kind, p.trim = trim, p.temperature = temperature;
  return p;
}

// Five ranks: main, mtp, aux per row; rank 3's main loss is far off.
const std::vector<double> kLosses = {3.00, 0.9, 0.01, 3.10, 1.0, 0.02, 2.95, 0.8, 0.01,
                                     7.50, 2.0, 0.03, 3.05, 0.9, 0.01};
const std::vector<double> kTokens = {128, 96, 128, 128, 64};

}  // namespace

TEMPLATE_TEST_CASE("lossagg: rank weights sum to one for every kind", "[lossagg]", float, double) {
  for (auto kind : {k::RankWeighting::mean, k::RankWeighting::robust, k::RankWeighting::softmax}) {
    const auto w = weigh<TestType>(kLosses, kTokens, params(kind, 0.25, 0.5));
    CHECK(total(w.weights) == Approx(1.0).epsilon(1e-6));
    CHECK(total(w.multipliers) == Approx(5.0).epsilon(1e-6));
    for (double x : w.weights) CHECK(x >= 0);
  }
}

TEST_CASE("lossagg mean: token weights, and equal tokens give multipliers of exactly 1", "[lossagg]") {
  const auto w = weigh<double>(kLosses, kTokens, params(k::RankWeighting::mean));
  for (size_t r = 0; r < kTokens.size(); ++r) CHECK(w.weights[r] == Approx(kTokens[r] / total(kTokens)));
  for (int R : {1, 2, 3, 7, 49}) {
    std::vector<double> losses(3 * R), tokens(R, 512);
    for (int r = 0; r < R; ++r) losses[3 * r] = 1.0 + 0.1 * r;
    for (auto kind : {k::RankWeighting::mean, k::RankWeighting::robust}) {
      const auto eq = weigh<float>(losses, tokens, params(kind, 0.0));
      for (double m : eq.multipliers) CHECK(m == 1.0);  // exact: the plain average is left alone
    }
  }
}

TEST_CASE("lossagg robust: an outlier rank is trimmed, the rest keep their token weights", "[lossagg]") {
  const auto w = weigh<double>(kLosses, kTokens, params(k::RankWeighting::robust, 0.25));
  CHECK(w.weights[3] == 0.0);
  const double kept = total(kTokens) - kTokens[3];
  for (int r : {0, 1, 2, 4}) CHECK(w.weights[r] == Approx(kTokens[r] / kept));

  SECTION("trim 0 trims nobody") {
    const auto none = weigh<double>(kLosses, kTokens, params(k::RankWeighting::robust, 0.0));
    for (size_t r = 0; r < kTokens.size(); ++r) CHECK(none.weights[r] == Approx(kTokens[r] / total(kTokens)));
  }
  SECTION("ranks within the spread are not outliers") {
    std::vector<double> calm = kLosses;
    calm[9] = 3.08;
    const auto w2 = weigh<double>(calm, kTokens, params(k::RankWeighting::robust, 0.4));
    for (double x : w2.weights) CHECK(x > 0);
  }
  SECTION("at most floor(trim * R) ranks go, the farthest first; a NaN loss counts as farthest") {
    std::vector<double> two = kLosses;
    two[3] = std::nan("");  // rank 1: NaN
    const auto w2 = weigh<double>(two, kTokens, params(k::RankWeighting::robust, 0.25));  // floor(1.25) = 1
    CHECK(w2.weights[1] == 0.0);
    CHECK(w2.weights[3] > 0.0);
    const auto w3 = weigh<double>(two, kTokens, params(k::RankWeighting::robust, 0.45));  // floor(2.25) = 2
    CHECK(w3.weights[1] == 0.0);
    CHECK(w3.weights[3] == 0.0);
    CHECK(total(w3.weights) == Approx(1.0));
  }
  SECTION("equal losses flag nobody") {
    std::vector<double> flat(15, 2.0);
    const auto w4 = weigh<double>(flat, kTokens, params(k::RankWeighting::robust, 0.45));
    for (double m : w4.weights) CHECK(m > 0);
  }
}

TEMPLATE_TEST_CASE("lossagg softmax: matches tokens * exp(L / T), normalised", "[lossagg]", float, double) {
  for (double T : {0.25, 1.0, 4.0}) {
    const auto w = weigh<TestType>(kLosses, kTokens, params(k::RankWeighting::softmax, 0.25, T));
    std::vector<double> direct(kTokens.size());
    for (size_t r = 0; r < kTokens.size(); ++r) direct[r] = kTokens[r] * std::exp(kLosses[3 * r] / T);
    const double sum = total(direct);
    const double tol = std::is_same_v<TestType, float> ? 1e-5 : 1e-12;
    for (size_t r = 0; r < kTokens.size(); ++r) CHECK(w.weights[r] == Approx(direct[r] / sum).margin(tol));
    CHECK(w.weights[3] > w.weights[0]);  // the higher loss weighs more
  }
  SECTION("large losses do not overflow") {
    std::vector<double> big = kLosses;
    for (size_t r = 0; r < kTokens.size(); ++r) big[3 * r] += 1000;
    const auto w = weigh<TestType>(big, kTokens, params(k::RankWeighting::softmax, 0.25, 0.5));
    CHECK(total(w.weights) == Approx(1.0).epsilon(1e-5));
  }
}

TEST_CASE("lossagg uncertainty: the log-variance gradient matches a finite difference", "[lossagg]") {
  const int64_t R = 5, K = 3;
  auto losses = device<double>(kLosses);
  Mat<const double> L(losses.data(), R, K);
  const auto w = weigh<double>(kLosses, kTokens, params(k::RankWeighting::mean));
  auto rank_w = device<double>(w.weights);
  const std::vector<double> s0 = {0.3, -0.7, 1.2};
  for (const std::vector<double>& active : {std::vector<double>{1, 1, 1}, std::vector<double>{1, 0, 1}}) {
    auto act = device<double>(active);
    auto objective = [&](const std::vector<double>& s) {
      auto sd = device<double>(s);
      Buffer<double> lw("test::lw", K);
      return k::uncertainty_forward<double>(lw, L, rank_w, sd, act);
    };
    Buffer<double> grad("test::grad", K);
    auto sd = device<double>(s0);
    k::uncertainty_backward<double>(grad, L, rank_w, sd, act);
    const auto g = host(grad);
    for (int i = 0; i < K; ++i) {
      const double h = 1e-6;
      auto plus = s0, minus = s0;
      plus[i] += h, minus[i] -= h;
      const double fd = (objective(plus) - objective(minus)) / (2 * h);
      CHECK(g[i] == Approx(fd).margin(1e-8));
      if (active[i] == 0) CHECK(g[i] == 0.0);
    }
    // the weights are exp(-s) for active kinds, 1 otherwise
    Buffer<double> lw("test::lw", K);
    k::uncertainty_forward<double>(lw, L, rank_w, sd, act);
    const auto weights = host(lw);
    for (int i = 0; i < K; ++i) CHECK(weights[i] == Approx(active[i] != 0 ? std::exp(-s0[i]) : 1.0));
  }
}

TEST_CASE("LossWeights scale each loss's seed apart: main, MTP and aux", "[lossagg]") {
  ModelConfig cfg = architecture("deepseek-mtp");
  cfg.moe.balance = Balance::aux;  // all three losses
  const int B = 2;
  Transformer<float> model(cfg, B);
  model.init(11);
  const int64_t N = int64_t(B) * cfg.seq;
  const auto in = test::pattern_tokens(N, cfg.vocab, 7, 3);
  const auto tgt = test::pattern_tokens(N, cfg.vocab, 5, 1);
  auto grads_with = [&](const LossWeights* w) {
    if (w) model.set_loss_weights(*w);
    model.zero_grads();
    const LossParts parts = model.forward(in, tgt);
    REQUIRE(parts.aux > 0);
    REQUIRE(parts.mtp > 0);
    model.backward(in, tgt);
    auto copy = xx::host_mirror(model.grads());
    Kokkos::deep_copy(copy, model.grads());
    return copy;
  };
  const auto plain = grads_with(nullptr);
  const LossWeights ones, twos{2, 2, 2}, main{1, 0, 0}, mtp{0, 1, 0}, aux{0, 0, 1};
  const auto g1 = grads_with(&ones), g2 = grads_with(&twos);
  const auto gm = grads_with(&main), gt = grads_with(&mtp), ga = grads_with(&aux);
  const int64_t P = model.layout().total();
  double aux_only = 0;
  for (int64_t i = 0; i < P; ++i) {
    REQUIRE(g1(i) == plain(i));         // weights of 1 change no bit
    REQUIRE(g2(i) == 2.0f * g1(i));     // a power of two scales exactly
    REQUIRE(double(gm(i)) + gt(i) + ga(i) == Approx(g1(i)).margin(1e-6));  // the parts add up
    aux_only += std::fabs(ga(i));
  }
  CHECK(aux_only > 0);  // the balance loss alone reaches the routers
}

TEST_CASE("deck: lossagg kinds, their values and their ranges", "[lossagg][deck]") {
  xx::test::TempDir t;
  const std::string head =
      "model dense vocab 256 dim 16 layers 1 heads 2 ffn 32 seq 8\n"
      "data bytes corpus.txt\n";
  auto build = [&](const std::string& line) {
    return build_program(read_deck(t.write("test.deck", head + line + "run 2\nlossagg off\nrun 1\n"), {}), false);
  };
  CHECK(build("").phases[0].config.lossagg.kind == LossAggKind::off);
  const auto softmax = build("lossagg softmax 0.5\n");
  CHECK(softmax.phases[0].config.lossagg.kind == LossAggKind::softmax);
  CHECK(softmax.phases[0].config.lossagg.temperature == 0.5);
  CHECK(softmax.phases[1].config.lossagg.kind == LossAggKind::off);  // a later phase may switch it
  CHECK(build("lossagg robust trim 0.4\n").phases[0].config.lossagg.trim == 0.4);
  CHECK(build("lossagg robust\n").phases[0].config.lossagg.trim == 0.25);
  CHECK(build("lossagg uncertainty\n").phases[0].config.lossagg.kind == LossAggKind::uncertainty);
  auto error_of = [&](const std::string& line) -> std::string {
    try {
      build(line);
    } catch (const InputError& e) {
      return e.what();
    }
    return "";
  };
  CHECK_THAT(error_of("lossagg softmax\n"), Catch::Contains("test.deck:3: 'lossagg softmax' needs a value"));
  CHECK_THAT(error_of("lossagg softmax 0\n"), Catch::Contains("out of range"));
  CHECK_THAT(error_of("lossagg robust trim 0.5\n"), Catch::Contains("out of range"));
  CHECK_THAT(error_of("lossagg robustly\n"), Catch::Contains("unknown kind 'robustly' for 'lossagg'"));
}

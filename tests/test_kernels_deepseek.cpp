// The DeepSeek kernel families, each on its own, in double: every backward
// against central finite differences of L = sum(out * R) (as in
// test_kernels.cpp), plus the exact properties each forward promises
// (shared rope key, top-k ties and bias, routing positions, ignored targets).
// The whole-model check lives in test_model.cpp.
#include <algorithm>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
// random_buffer, check_gradient, dot, get/set, M/V
#include "core/device_memory.h"
#include "fd.h"
// attention_forward/backward with Dv != D, CausalBlocks
#include "kernels/attention_packed.h"
// cross_entropy_forward/backward with negative (ignored) targets
#include "kernels/cross_entropy.h"
// concat_columns_forward/backward
#include "kernels/elementwise.h"
// shift_tokens
#include "kernels/embedding.h"
#include "kernels/math.h"
// mla_split_heads_forward/backward, MlaDims
#include "kernels/mla.h"
// router scores/top-k/backward, route_positions, dispatch, combine
#include "kernels/moe.h"
// rope_tables
#include "kernels/rope.h"

using namespace xx;
using namespace xx::test;
namespace k = xx::kernels;

namespace {

// ---------------------------------------------------------------------------
// host <-> device helpers

template <class View, class T>
void fill_from(const View& v, const std::vector<T>& values) {
  REQUIRE(values.size() == v.size());
  auto h = xx::host_staging(v);
  std::copy(values.begin(), values.end(), h.data());
  Kokkos::deep_copy(v, h);
}

k::Index2 index2_of(const std::vector<int32_t>& values, int64_t rows, int64_t cols) {
  k::Index2 v("test::index2", rows, cols);
  fill_from(v, values);
  return v;
}

Buffer<double> buffer_of(const std::vector<double>& values) {
  Buffer<double> b("test::buffer", int64_t(values.size()));
  fill_from(b, values);
  return b;
}

Buffer<float> float_buffer_of(const std::vector<float>& values) {
  Buffer<float> b("test::bias", int64_t(values.size()));
  fill_from(b, values);
  return b;
}

// k distinct experts per token, drawn from `allowed`, in random order.
std::vector<int32_t> random_routing(int64_t N, int64_t K, const std::vector<int32_t>& allowed, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::vector<int32_t> idx;
  for (int64_t t = 0; t < N; ++t) {
    auto pool = allowed;
    std::shuffle(pool.begin(), pool.end(), gen);
    idx.insert(idx.end(), pool.begin(), pool.begin() + K);
  }
  return idx;
}


}  // namespace

// ---------------------------------------------------------------------------
// MLA head split

TEST_CASE("mla split heads: backward matches finite differences, rope key shared", "[kernels]") {
  const int64_t B = 2, T = 3;
  const k::MlaDims m{/*heads*/ 3, /*nope*/ 2, /*rope*/ 4, /*v*/ 3};
  const int64_t H = m.heads, QK = m.qk(), KV = m.nope + m.v, R = m.rope, NOPE = m.nope, VD = m.v;
  const double theta = 10000.0;
  Buffer<double> cs("cos", T * R / 2), sn("sin", T * R / 2);
  k::rope_tables<double>(M(cs, T, R / 2), M(sn, T, R / 2), {k::rope_inverse_frequencies(theta, R)});
  auto q = random_buffer(B * T * H * QK, 101), kv = random_buffer(B * T * H * KV, 102);
  auto kr = random_buffer(B * T * R, 103);  // (B*T, rope)
  auto rq = random_buffer(B * H * T * QK, 104), rk = random_buffer(B * H * T * QK, 105);
  auto rv = random_buffer(B * H * T * VD, 106);
  Buffer<double> qh("qh", B * H * T * QK), kh("kh", B * H * T * QK), vh("vh", B * H * T * VD);
  Buffer<double> dq("dq", B * T * H * QK), dkv("dkv", B * T * H * KV), dkr("dk_rope", B * T * R);
  auto loss = [&] {
    k::mla_split_heads_forward<double>(M(qh, B * H * T, QK), M(kh, B * H * T, QK), M(vh, B * H * T, VD),
                                       M(q, B * T, H * QK), M(kv, B * T, H * KV), M(kr, B * T, R), M(cs, T, R / 2),
                                       M(sn, T, R / 2), B, T, m);
    return dot(qh, rq) + dot(kh, rk) + dot(vh, rv);
  };
  loss();
  // Activation gradients are written: start from garbage.
  Kokkos::deep_copy(dq, 7.0), Kokkos::deep_copy(dkv, 7.0), Kokkos::deep_copy(dkr, 7.0);
  k::mla_split_heads_backward<double>(M(dq, B * T, H * QK), M(dkv, B * T, H * KV), M(dkr, B * T, R),
                                      M(rq, B * H * T, QK), M(rk, B * H * T, QK), M(rv, B * H * T, VD),
                                      M(cs, T, R / 2), M(sn, T, R / 2), B, T, m);
  check_gradient("mla dq", q, dq, loss, 1000);
  check_gradient("mla dkv", kv, dkv, loss, 1000);
  check_gradient("mla dk_rope", kr, dkr, loss, 1000);

  // Structure of the forward (exact where it is a copy).
  loss();
  const auto hq = host(q), hkv = host(kv), hkr = host(kr), hqh = host(qh), hkh = host(kh), hvh = host(vh);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t) {
        CAPTURE(b, h, t);
        const int64_t row = (b * H + h) * T + t, row0 = (b * H + 0) * T + t, src = b * T + t;
        for (int64_t d = 0; d < NOPE; ++d) {  // nope parts: copied, not rotated
          REQUIRE(hqh[row * QK + d] == hq[src * H * QK + h * QK + d]);
          REQUIRE(hkh[row * QK + d] == hkv[src * H * KV + h * KV + d]);
        }
        for (int64_t d = 0; d < VD; ++d) REQUIRE(hvh[row * VD + d] == hkv[src * H * KV + h * KV + NOPE + d]);
        for (int64_t d = NOPE; d < QK; ++d) REQUIRE(hkh[row * QK + d] == hkh[row0 * QK + d]);  // one shared rope key
        // Rope part: interleaved pairs rotated by t * theta^(-2i/rope), recomputed here.
        for (int64_t i = 0; i < R / 2; ++i) {
          const double a = double(t) * std::pow(theta, -double(2 * i) / double(R)), c = std::cos(a), s = std::sin(a);
          const double k0 = hkr[src * R + 2 * i], k1 = hkr[src * R + 2 * i + 1];
          const double q0 = hq[src * H * QK + h * QK + NOPE + 2 * i], q1 = hq[src * H * QK + h * QK + NOPE + 2 * i + 1];
          REQUIRE(hkh[row * QK + NOPE + 2 * i] == Approx(k0 * c - k1 * s).epsilon(1e-12).margin(1e-14));
          REQUIRE(hkh[row * QK + NOPE + 2 * i + 1] == Approx(k0 * s + k1 * c).epsilon(1e-12).margin(1e-14));
          REQUIRE(hqh[row * QK + NOPE + 2 * i] == Approx(q0 * c - q1 * s).epsilon(1e-12).margin(1e-14));
          REQUIRE(hqh[row * QK + NOPE + 2 * i + 1] == Approx(q0 * s + q1 * c).epsilon(1e-12).margin(1e-14));
        }
      }
}

// ---------------------------------------------------------------------------
// MoE router

TEST_CASE("router scores: softmax rows sum to one, sigmoid lies in (0, 1)", "[kernels]") {
  const int64_t N = 6, E = 5;
  auto logits = random_buffer(N * E, 111, 3.0);
  // One row whose exp overflows a double (> 709.8): the softmax must subtract
  // the row maximum.
  const std::vector<double> wide = {760.0, 700.0, 759.0, 740.0, 745.0};
  for (int64_t e = 0; e < E; ++e) set(logits, (N - 1) * E + e, wide[e]);
  Buffer<double> scores("scores", N * E);
  const auto hl = host(logits);

  k::router_scores_forward<double>(M(scores, N, E), M(logits, N, E), k::GateKind{false, false, 1.0});
  auto hs = host(scores);
  for (int64_t t = 0; t < N; ++t) {
    CAPTURE(t);
    double m = -1e300, z = 0, sum = 0;
    for (int64_t e = 0; e < E; ++e) m = std::max(m, hl[t * E + e]);
    for (int64_t e = 0; e < E; ++e) z += std::exp(hl[t * E + e] - m);
    for (int64_t e = 0; e < E; ++e) {
      REQUIRE(std::isfinite(hs[t * E + e]));
      REQUIRE(hs[t * E + e] > 0.0);
      REQUIRE(hs[t * E + e] == Approx(std::exp(hl[t * E + e] - m) / z).epsilon(1e-12).margin(1e-300));
      sum += hs[t * E + e];
    }
    REQUIRE(sum == Approx(1.0).epsilon(1e-14));
  }

  // Sigmoid: every score strictly inside (0, 1) for moderate logits (|x| < ~36).
  Kokkos::deep_copy(logits, random_buffer(N * E, 112, 3.0));
  const auto hl2 = host(logits);
  k::router_scores_forward<double>(M(scores, N, E), M(logits, N, E), k::GateKind{true, true, 2.5});
  hs = host(scores);
  for (int64_t i = 0; i < N * E; ++i) {
    CAPTURE(i, hl2[i]);
    REQUIRE(hs[i] > 0.0);
    REQUIRE(hs[i] < 1.0);
    REQUIRE(hs[i] == Approx(1.0 / (1.0 + std::exp(-hl2[i]))).epsilon(1e-14));
  }
}

TEST_CASE("router top-k: largest score + bias, ties to the lower index, bias never in the weights", "[kernels]") {
  const int64_t N = 4, E = 6, K = 3;
  // Multiples of 1/16: sums with the bias below are exact, so ties are real ties.
  std::vector<double> s16 = {2, 11, 5, 11, 3, 8,     // tie between experts 1 and 3
                             15, 14, 13, 12, 11, 10,  //
                             4, 4, 4, 4, 4, 4,        // all tied
                             1, 7, 5, 3, 6, 2};
  for (auto& v : s16) v /= 16.0;
  auto scores = buffer_of(s16);
  const std::vector<float> no_bias(E, 0.0f), bias = {0.0f, -0.5f, 0.0f, 0.25f, 0.0f, 0.5f};
  // Expected selections, in descending order of score + bias, worked out by hand.
  const std::vector<int32_t> want_plain = {1, 3, 5, 0, 1, 2, 0, 1, 2, 1, 4, 2};
  // with bias, in 1/16: {2,3,5,15,3,16}, {15,6,13,16,11,18}, {4,-4,4,8,4,12}, {1,-1,5,7,6,10}
  const std::vector<int32_t> want_bias = {5, 3, 2, 5, 3, 0, 5, 3, 0, 5, 3, 4};

  const auto [sigmoid, normalize, scale] =
      GENERATE(std::tuple<bool, bool, double>{false, false, 1.0}, std::tuple<bool, bool, double>{true, true, 2.5},
               std::tuple<bool, bool, double>{false, false, 1.5});
  CAPTURE(sigmoid, normalize, scale);
  const k::GateKind g{sigmoid, normalize, scale};
  for (const bool biased : {false, true}) {
    CAPTURE(biased);
    auto b = float_buffer_of(biased ? bias : no_bias);
    k::Index2 idx("idx", N, K);
    Kokkos::deep_copy(idx, -7);
    Buffer<double> w("w", N * K);
    k::router_topk<double>(idx, M(w, N, K), M(scores, N, E), Vec<const float>(b.data(), E), g);
    const auto hidx = host(idx);
    const auto hw = host(w);
    const auto& want = biased ? want_bias : want_plain;
    for (int64_t t = 0; t < N; ++t) {
      CAPTURE(t);
      double sum = 0;
      for (int64_t j = 0; j < K; ++j) sum += s16[t * E + want[t * K + j]];
      double wsum = 0;
      for (int64_t j = 0; j < K; ++j) {
        CAPTURE(j);
        REQUIRE(hidx[t * K + j] == want[t * K + j]);
        // The weight is the selected expert's bare score (never score + bias).
        const double s = s16[t * E + want[t * K + j]];
        REQUIRE(hw[t * K + j] == Approx(normalize ? s / sum * scale : s * scale).epsilon(1e-14));
        wsum += hw[t * K + j];
      }
      if (normalize) REQUIRE(wsum == Approx(scale).epsilon(1e-14));
    }
  }
}

TEST_CASE("router top-k: k = E ranks every expert once; inf first, NaN as -inf", "[kernels]") {
  // Row 0: 70 experts (more than a warp) with ties, each picked once, in
  // (value descending, index ascending) order. Row 1: non-finite scores.
  const int64_t E = 70, N = 2;
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> s(N * E, 0.25);
  for (int64_t e = 0; e < E; ++e) s[e] = double((e * 37) % 11) / 16.0;
  s[E + 3] = nan, s[E + 5] = -inf, s[E + 9] = inf, s[E + 60] = 0.5, s[E + 0] = nan;
  for (const int64_t K : {int64_t(1), int64_t(7), E}) {
    CAPTURE(K);
    auto scores = buffer_of(s);
    auto b = float_buffer_of(std::vector<float>(E, 0.0f));
    k::Index2 idx("idx", N, K);
    Buffer<double> w("w", N * K);
    k::router_topk<double>(idx, M(w, N, K), M(scores, N, E), Vec<const float>(b.data(), E), k::GateKind{});
    const auto hidx = host(idx);
    for (int64_t t = 0; t < N; ++t) {
      std::vector<int32_t> order(E);
      std::iota(order.begin(), order.end(), 0);
      const auto rank_value = [&](int32_t e) { return std::isnan(s[t * E + e]) ? -inf : s[t * E + e]; };
      std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t c) { return rank_value(a) > rank_value(c); });
      for (int64_t j = 0; j < K; ++j) {
        CAPTURE(t, j);
        REQUIRE(hidx[t * K + j] == order[size_t(j)]);
      }
    }
    if (K == E) {  // row 1: inf, 0.5, then the 0.25s, then -inf and the NaNs by index
      REQUIRE(hidx[K + 0] == 9);
      REQUIRE(hidx[K + 1] == 60);
      REQUIRE(hidx[K + E - 3] == 0);
      REQUIRE(hidx[K + E - 2] == 3);
      REQUIRE(hidx[K + E - 1] == 5);
    }
  }
}

// Group-limited top-k written out from its definition, for one row of scores
// s (E) and bias (E): the experts are G groups of E/G in index order; a key is
// score + bias (NaN as -inf); a group's value is its largest key (softmax) or
// the sum of its two largest (sigmoid; a NaN sum as -inf); the g groups of the
// largest values stay (ties: the lower group), and the k experts of the
// largest keys among theirs are picked (ties: the lower expert).
std::vector<int32_t> grouped_topk_reference(const double* s, const float* bias, int64_t E, int64_t K, int64_t G,
                                            int64_t g, bool sigmoid) {
  const double inf = std::numeric_limits<double>::infinity();
  const auto not_nan = [&](double v) { return std::isnan(v) ? -inf : v; };
  std::vector<double> key(size_t(E), 0.0);
  for (int64_t e = 0; e < E; ++e) key[size_t(e)] = not_nan(s[e] + double(bias[e]));
  const int64_t P = E / G;
  std::vector<double> group_value(static_cast<size_t>(G));
  for (int64_t q = 0; q < G; ++q) {
    std::vector<double> v(key.begin() + q * P, key.begin() + (q + 1) * P);
    std::sort(v.begin(), v.end(), std::greater<double>());
    group_value[size_t(q)] = not_nan(sigmoid ? v[0] + v[1] : v[0]);
  }
  std::vector<int32_t> groups(static_cast<size_t>(G));
  std::iota(groups.begin(), groups.end(), 0);
  std::stable_sort(groups.begin(), groups.end(),
                   [&](int32_t a, int32_t b) { return group_value[size_t(a)] > group_value[size_t(b)]; });
  std::vector<int32_t> candidates;  // the kept groups' experts, in index order
  for (int64_t e = 0; e < E; ++e)
    if (std::find(groups.begin(), groups.begin() + g, int32_t(e / P)) != groups.begin() + g)
      candidates.push_back(int32_t(e));
  std::stable_sort(candidates.begin(), candidates.end(),
                   [&](int32_t a, int32_t b) { return key[size_t(a)] > key[size_t(b)]; });
  return {candidates.begin(), candidates.begin() + K};
}

TEST_CASE("router top-k with groups: only the best groups' experts, against the definition", "[kernels]") {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  struct Shape {
    int64_t E, G, g, K;
  };
  // G up to 64 (the last bit of the router's mask); E = 72 spans more than a warp
  const auto [E, G, g, K] = GENERATE(Shape{24, 2, 1, 3}, Shape{24, 4, 2, 3}, Shape{24, 6, 3, 5}, Shape{24, 8, 4, 2},
                                     Shape{24, 12, 5, 6}, Shape{24, 4, 4, 4}, Shape{72, 8, 3, 8},
                                     Shape{128, 64, 10, 6});
  const auto [sigmoid, normalize, scale] =
      GENERATE(std::tuple<bool, bool, double>{false, false, 1.0}, std::tuple<bool, bool, double>{true, true, 2.5});
  CAPTURE(E, G, g, K, sigmoid);
  const int64_t N = 40;
  // Multiples of 1/16 (and biases of 1/16): sums are exact, so ties are real
  // ties, of experts and of groups. Row 0: every score equal; row 1: a NaN, an
  // inf and a -inf; row 2: +inf beside a NaN in group 0 (sigmoid: inf + -inf).
  std::mt19937_64 gen(uint64_t(E * 1000 + G * 10 + g));
  std::uniform_int_distribution<int> sixteenths(0, 15), bias16(-4, 4);
  std::vector<double> s(static_cast<size_t>(N * E));
  for (auto& v : s) v = sixteenths(gen) / 16.0;
  for (int64_t e = 0; e < E; ++e) s[size_t(e)] = 0.5;
  s[size_t(E + 1)] = nan, s[size_t(E + E / 2)] = inf, s[size_t(E + E - 1)] = -inf;
  s[size_t(2 * E + 0)] = inf, s[size_t(2 * E + 1)] = nan;
  auto scores = buffer_of(s);
  std::vector<float> some_bias(static_cast<size_t>(E));
  for (auto& b : some_bias) b = float(bias16(gen) / 16.0);
  int changed_by_groups = 0;
  for (const bool biased : {false, true}) {
    CAPTURE(biased);
    const std::vector<float> hb = biased ? some_bias : std::vector<float>(size_t(E), 0.0f);
    auto b = float_buffer_of(hb);
    k::Index2 idx("idx", N, K), plain_idx("plain_idx", N, K);
    Kokkos::deep_copy(idx, -7);
    Buffer<double> w("w", N * K), plain_w("plain_w", N * K);
    k::router_topk<double>(idx, M(w, N, K), M(scores, N, E), Vec<const float>(b.data(), E),
                           k::GateKind{sigmoid, normalize, scale, int(G), int(g)});
    k::router_topk<double>(plain_idx, M(plain_w, N, K), M(scores, N, E), Vec<const float>(b.data(), E),
                           k::GateKind{sigmoid, normalize, scale});
    const auto hidx = host(idx), hplain = host(plain_idx);
    const auto hw = host(w);
    for (int64_t t = 0; t < N; ++t) {
      CAPTURE(t);
      const auto want = grouped_topk_reference(&s[size_t(t * E)], hb.data(), E, K, G, g, sigmoid);
      double sum = 0;
      for (int64_t j = 0; j < K; ++j) sum += s[size_t(t * E + want[size_t(j)])];
      for (int64_t j = 0; j < K; ++j) {
        CAPTURE(j);
        REQUIRE(hidx[t * K + j] == want[size_t(j)]);
        const double sj = s[size_t(t * E + want[size_t(j)])];
        if (std::isfinite(sum)) REQUIRE(hw[t * K + j] == Approx(normalize ? sj / sum * scale : sj * scale).epsilon(1e-14));
      }
      bool same = true;
      for (int64_t j = 0; j < K; ++j) same = same && hidx[t * K + j] == hplain[t * K + j];
      changed_by_groups += !same;
      if (g == G) REQUIRE(same);  // every group kept: the plain top-k
    }
  }
  // The groups changed selections, where they can: ranked by their largest
  // key (softmax), the best g groups hold the plain top-k whenever k <= g
  // (each of those experts leads its group, ahead of every group behind).
  if (!sigmoid && K <= g) CHECK(changed_by_groups == 0);
  else if (g < G) CHECK(changed_by_groups > 0);
}

TEST_CASE("route positions: counts, exclusive offsets, inverse maps, token order, empty experts", "[kernels]") {
  const int64_t E = 6;
  auto check = [&](const std::vector<int32_t>& hidx, int64_t N, int64_t K) {
    auto idx = index2_of(hidx, N, K);
    k::Index1 counts("counts", E), offsets("offsets", E + 1), token_of("token_of", N * K);
    k::Index2 pos("pos", N, K);
    Kokkos::deep_copy(counts, -1), Kokkos::deep_copy(offsets, -1), Kokkos::deep_copy(token_of, -1);
    Kokkos::deep_copy(pos, -1);
    k::route_positions(counts, offsets, pos, token_of, idx);
    const auto hc = host(counts), ho = host(offsets), hp = host(pos), htok = host(token_of);
    REQUIRE(ho[0] == 0);
    for (int64_t e = 0; e < E; ++e) {
      CAPTURE(e);
      int32_t c = 0;
      for (auto x : hidx) c += x == e;
      REQUIRE(hc[e] == c);
      REQUIRE(ho[e + 1] == ho[e] + hc[e]);  // exclusive prefix sum; empty expert: empty range
    }
    REQUIRE(ho[E] == N * K);
    std::vector<int> seen(N * K, 0);
    for (int64_t t = 0; t < N; ++t)
      for (int64_t j = 0; j < K; ++j) {
        CAPTURE(t, j);
        const int32_t p = hp[t * K + j], e = hidx[t * K + j];
        REQUIRE(p >= ho[e]);  // inside its expert's range
        REQUIRE(p < ho[e + 1]);
        REQUIRE(htok[p] == t);  // token_of inverts pos
        ++seen[p];
      }
    for (int64_t p = 0; p < N * K; ++p) REQUIRE(seen[p] == 1);  // pos is a bijection onto [0, N*K)
    for (int64_t e = 0; e < E; ++e)
      for (int32_t p = ho[e] + 1; p < ho[e + 1]; ++p) REQUIRE(htok[p - 1] < htok[p]);  // token order
    return std::make_tuple(hc, ho, hp, htok);
  };

  SECTION("a small example worked out by hand; experts 2 and 5 get no token") {
    const std::vector<int32_t> idx = {1, 4, 4, 0, 1, 3, 0, 4, 3, 1};  // (5, 2)
    auto [c, o, p, tok] = check(idx, 5, 2);
    REQUIRE(c == std::vector<int32_t>{2, 3, 0, 2, 3, 0});
    REQUIRE(o == std::vector<int32_t>{0, 2, 5, 5, 7, 10, 10});
    REQUIRE(p == std::vector<int32_t>{2, 7, 8, 0, 3, 5, 1, 9, 6, 4});
    REQUIRE(tok == std::vector<int32_t>{1, 3, 0, 2, 4, 2, 4, 0, 1, 3});
  }
  SECTION("random routing of 37 tokens to 3 of experts {1, 2, 3, 4, 5} (expert 0 empty)") {
    check(random_routing(37, 3, {1, 2, 3, 4, 5}, 113), 37, 3);
  }
  SECTION("random routing of 23 tokens to 2 of experts {0, 1, 3, 4} (experts 2 and 5 empty)") {
    check(random_routing(23, 2, {0, 1, 3, 4}, 114), 23, 2);
  }
}

TEST_CASE("dispatch and combine: backward through the composed map matches finite differences", "[kernels]") {
  const int64_t N = 6, K = 2, E = 4, C = 5, P = N * K;
  const bool nonlinear = GENERATE(false, true);
  CAPTURE(nonlinear);
  auto idx = index2_of(random_routing(N, K, {0, 1, 2, 3}, 121), N, K);
  k::Index1 counts("counts", E), offsets("offsets", E + 1), token_of("token_of", P);
  k::Index2 pos("pos", N, K);
  k::route_positions(counts, offsets, pos, token_of, idx);

  auto x = random_buffer(N * C, 122), w = random_buffer(N * K, 123), r = random_buffer(N * C, 124);
  auto amp = random_buffer(P * C, 125);  // f(xe)(p, c) = amp(p, c) * sin(xe(p, c)): differs per expert slot
  Buffer<double> xe("xe", P * C), ye("ye", P * C), out("out", N * C);
  Buffer<double> dye("dye", P * C), dxe("dxe", P * C), dx("dx", N * C), dw("dw", N * K);
  auto f = [&] {
    Kokkos::parallel_for(
        "test::f", Kokkos::RangePolicy<ExecSpace>(0, P * C),
        KOKKOS_LAMBDA(int64_t i) { ye(i) = nonlinear ? amp(i) * k::kmath::sin(xe(i)) : xe(i); });
  };
  auto loss = [&] {
    k::dispatch_forward<double>(M(xe, P, C), M(x, N, C), token_of);
    f();
    Kokkos::deep_copy(out, 0.25);  // combine adds into out
    k::combine_forward<double>(M(out, N, C), M(ye, P, C), M(w, N, K), pos);
    return dot(out, r);
  };
  loss();

  // Forward against the composed map written out on the host.
  {
    const auto hx = host(x), hw = host(w), ha = host(amp), hout = host(out);
    const auto hp = host(pos);
    for (int64_t t = 0; t < N; ++t)
      for (int64_t c = 0; c < C; ++c) {
        double want = 0.25;
        for (int64_t j = 0; j < K; ++j) {
          const int64_t p = hp[t * K + j];
          want += hw[t * K + j] * (nonlinear ? ha[p * C + c] * std::sin(hx[t * C + c]) : hx[t * C + c]);
        }
        CAPTURE(t, c);
        REQUIRE(hout[t * C + c] == Approx(want).epsilon(1e-13).margin(1e-15));
      }
  }

  Kokkos::deep_copy(dye, 9.0), Kokkos::deep_copy(dx, 9.0), Kokkos::deep_copy(dw, 9.0);  // all written (=)
  k::combine_backward<double>(M(dye, P, C), M(dw, N, K), M(r, N, C), M(ye, P, C), M(w, N, K), pos);
  Kokkos::parallel_for(
      "test::f_backward", Kokkos::RangePolicy<ExecSpace>(0, P * C),
      KOKKOS_LAMBDA(int64_t i) { dxe(i) = nonlinear ? dye(i) * amp(i) * k::kmath::cos(xe(i)) : dye(i); });
  k::dispatch_backward<double>(M(dx, N, C), M(dxe, P, C), pos);
  check_gradient("moe dx", x, dx, loss, 1000);
  check_gradient("moe dweights", w, dw, loss, 1000);
}

TEST_CASE("router backward matches finite differences with the selection held fixed", "[kernels]") {
  const int64_t N = 5, E = 6, K = 2;
  const auto [sigmoid, normalize, scale] =
      GENERATE(std::tuple<bool, bool, double>{false, false, 1.0}, std::tuple<bool, bool, double>{false, true, 1.5},
               std::tuple<bool, bool, double>{true, true, 2.5}, std::tuple<bool, bool, double>{true, false, 2.0});
  CAPTURE(sigmoid, normalize, scale);
  const k::GateKind g{sigmoid, normalize, scale};
  // Logits 0.6 apart in a random order per token (plus a little noise), so a
  // perturbation of 1e-5 cannot change the top-k; the bias promotes expert 5.
  std::vector<double> hl(N * E);
  std::mt19937_64 gen(131);
  std::uniform_real_distribution<double> noise(-0.05, 0.05);
  for (int64_t t = 0; t < N; ++t) {
    std::vector<int> rank(E);
    std::iota(rank.begin(), rank.end(), 0);
    std::shuffle(rank.begin(), rank.end(), gen);
    for (int64_t e = 0; e < E; ++e) hl[t * E + e] = 0.6 * rank[e] - 1.5 + noise(gen);
  }
  auto logits = buffer_of(hl);
  auto bias = float_buffer_of({0.0f, 0.0f, -0.125f, 0.0f, 0.0f, 0.75f});
  auto r = random_buffer(N * K, 132), sg = random_buffer(E, 133);
  Buffer<double> scores("scores", N * E), w("w", N * K), dlogits("dlogits", N * E);
  k::Index2 idx("idx", N, K);
  std::vector<int32_t> idx0;
  int selection_changed = 0;
  auto loss = [&] {
    k::router_scores_forward<double>(M(scores, N, E), M(logits, N, E), g);
    k::router_topk<double>(idx, M(w, N, K), M(scores, N, E), Vec<const float>(bias.data(), E), g);
    if (!idx0.empty() && host(idx) != idx0) ++selection_changed;
    const auto hs = host(scores), hg = host(sg);
    double balance = 0;
    for (int64_t t = 0; t < N; ++t)
      for (int64_t e = 0; e < E; ++e) balance += hg[e] * hs[t * E + e];
    return dot(w, r) + balance;
  };
  loss();
  idx0 = host(idx);
  // The bias does change the selection: expert 5 is picked for every token.
  for (int64_t t = 0; t < N; ++t) REQUIRE((idx0[t * K] == 5 || idx0[t * K + 1] == 5));
  Kokkos::deep_copy(dlogits, 9.0);
  k::router_backward<double>(M(dlogits, N, E), M(r, N, K), M(scores, N, E), idx, V(sg), g);
  check_gradient("router dlogits", logits, dlogits, loss, 1000);
  REQUIRE(selection_changed == 0);
}

TEST_CASE("sequence balance loss: counts and means as defined, the backward matches finite differences",
          "[kernels]") {
  // B sequences of S tokens; the loss is written here from its definition on
  // the host (DeepSeek-V2 seq_aux, DeepSeek-V3's complementary loss), the
  // kernels' counts and means are checked against it, and their backward
  // through router_backward against its finite differences.
  const int64_t B = 3, S = 5, N = B * S, E = 6, K = 2;
  const double alpha = 0.7;
  const bool sigmoid = GENERATE(false, true);
  CAPTURE(sigmoid);
  const k::GateKind g{sigmoid, sigmoid, 1.5};
  std::vector<double> hl(N * E);
  std::mt19937_64 gen(161);
  std::uniform_real_distribution<double> noise(-0.05, 0.05);
  for (int64_t t = 0; t < N; ++t) {  // ranks 0.6 apart: a perturbation of 1e-5 keeps the top-k
    std::vector<int> rank(E);
    std::iota(rank.begin(), rank.end(), 0);
    std::shuffle(rank.begin(), rank.end(), gen);
    for (int64_t e = 0; e < E; ++e) hl[t * E + e] = 0.6 * rank[e] - 1.5 + noise(gen);
  }
  auto logits = buffer_of(hl);
  auto bias = float_buffer_of(std::vector<float>(E, 0.0f));
  Buffer<double> scores("scores", N * E), w("w", N * K), dlogits("dlogits", N * E), dscores("dscores", N * E);
  Buffer<double> mean("mean", B * E), sums("sums", N), coef("coef", B * E);
  k::Index2 idx("idx", N, K), counts("counts", B, E);
  std::vector<int32_t> idx0;
  int selection_changed = 0;
  double rscale = 0;
  const auto r = random_buffer(N * K, 162);
  std::vector<double> want_counts(B * E), want_mean(B * E);
  // L = alpha / B sum_b sum_e f(b, e) P(b, e), from the host's scores and choices
  auto balance = [&](const std::vector<double>& hs, const std::vector<int32_t>& hi) {
    double L = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t e = 0; e < E; ++e) {
        double chosen = 0, p = 0;
        for (int64_t t = b * S; t < (b + 1) * S; ++t) {
          double row = 0;
          for (int64_t j = 0; j < E; ++j) row += hs[t * E + j];
          p += sigmoid ? hs[t * E + e] / row : hs[t * E + e];
          for (int64_t j = 0; j < K; ++j) chosen += hi[t * K + j] == e;
        }
        want_counts[b * E + e] = chosen, want_mean[b * E + e] = p / double(S);
        L += alpha / double(B) * (double(E) / double(K * S) * chosen) * (p / double(S));
      }
    return L;
  };
  auto loss = [&] {
    k::router_scores_forward<double>(M(scores, N, E), M(logits, N, E), g);
    k::router_topk<double>(idx, M(w, N, K), M(scores, N, E), Vec<const float>(bias.data(), E), g);
    if (!idx0.empty() && host(idx) != idx0) ++selection_changed;
    double wr = 0;
    const auto hw = host(w), hr = host(r);
    for (int64_t i = 0; i < N * K; ++i) wr += hw[i] * hr[i];
    return rscale * wr + balance(host(scores), host(idx));
  };
  const double L0 = loss();
  idx0 = host(idx);
  REQUIRE(L0 > 0);

  // forward: the kernels' counts and means are the definition's
  k::sequence_expert_counts(counts, idx);
  k::sequence_score_means<double>(M(mean, B, E), V(sums), M(scores, N, E), sigmoid);
  const auto hc = host(counts);
  const auto hm = host(mean);
  for (int64_t i = 0; i < B * E; ++i) {
    CAPTURE(i);
    REQUIRE(hc[i] == want_counts[i]);
    REQUIRE(hm[i] == Approx(want_mean[i]).epsilon(1e-14));
  }
  // every sequence's counts add up to its S tokens x k, and the three differ
  for (int64_t b = 0; b < B; ++b) REQUIRE(std::accumulate(hc.begin() + b * E, hc.begin() + (b + 1) * E, 0) == S * K);
  REQUIRE((!std::equal(hc.begin(), hc.begin() + E, hc.begin() + E) ||
           !std::equal(hc.begin() + E, hc.begin() + 2 * E, hc.begin() + 2 * E)));

  // backward: coef = alpha f / B per (sequence, expert), into every token's scores, to the logits
  std::vector<double> hcoef(B * E);
  for (int64_t i = 0; i < B * E; ++i) hcoef[i] = alpha * double(E) / double(K * S) * hc[i] / double(B);
  fill_from(coef, hcoef);
  for (double scale_r : {0.0, 1.0}) {  // the balance loss alone, then with the combine weights' gradient
    CAPTURE(scale_r);
    rscale = scale_r;
    loss();  // the scores and choices at the unperturbed logits again (check_gradient left the last perturbed)
    Buffer<double> dw("dw", N * K);
    Kokkos::deep_copy(dw, r);
    k::scale_inplace<double>(V(dw), scale_r);
    Kokkos::deep_copy(dscores, 9.0), Kokkos::deep_copy(dlogits, 9.0);  // all written (=)
    k::sequence_balance_backward<double>(M(dscores, N, E), M(coef, B, E), M(scores, N, E), sigmoid);
    k::router_backward<double>(M(dlogits, N, E), M(dw, N, K), M(scores, N, E), idx, Mat<const double>(M(dscores, N, E)),
                               g);
    check_gradient("sequence balance dlogits", logits, dlogits, loss, 1000);
  }
  REQUIRE(selection_changed == 0);

  // router_backward's per-token gradient is its per-expert one where every token's row is the same
  auto sg = random_buffer(E, 163);
  Buffer<double> rows("rows", N * E), d_vec("d_vec", N * E), d_mat("d_mat", N * E);
  std::vector<double> hsg = host(sg), hrows(N * E);
  for (int64_t t = 0; t < N; ++t)
    for (int64_t e = 0; e < E; ++e) hrows[t * E + e] = hsg[e];
  fill_from(rows, hrows);
  k::router_backward<double>(M(d_vec, N, E), M(r, N, K), M(scores, N, E), idx, V(sg), g);
  k::router_backward<double>(M(d_mat, N, E), M(r, N, K), M(scores, N, E), idx, Mat<const double>(M(rows, N, E)), g);
  REQUIRE(host(d_vec) == host(d_mat));
}

// ---------------------------------------------------------------------------
// concat_columns, cross entropy with ignored targets, shift_tokens

TEST_CASE("concat columns: forward places both inputs, backward matches finite differences", "[kernels]") {
  const int64_t N = 4, A = 3, Bc = 5;
  auto a = random_buffer(N * A, 141), b = random_buffer(N * Bc, 142), r = random_buffer(N * (A + Bc), 143);
  Buffer<double> out("out", N * (A + Bc)), da("da", N * A), db("db", N * Bc);
  auto loss = [&] {
    k::concat_columns_forward<double>(M(out, N, A + Bc), M(a, N, A), M(b, N, Bc));
    return dot(out, r);
  };
  loss();
  const auto ha = host(a), hb = host(b), ho = host(out);
  for (int64_t i = 0; i < N; ++i) {
    for (int64_t j = 0; j < A; ++j) REQUIRE(ho[i * (A + Bc) + j] == ha[i * A + j]);
    for (int64_t j = 0; j < Bc; ++j) REQUIRE(ho[i * (A + Bc) + A + j] == hb[i * Bc + j]);
  }
  Kokkos::deep_copy(da, 9.0), Kokkos::deep_copy(db, 9.0);
  k::concat_columns_backward<double>(M(da, N, A), M(db, N, Bc), M(r, N, A + Bc));
  check_gradient("concat da", a, da, loss, 1000);
  check_gradient("concat db", b, db, loss, 1000);
}

TEST_CASE("cross entropy: ignored targets (-1) give exactly zero loss and gradient", "[kernels]") {
  const int64_t N = 6, Vn = 7;
  const std::vector<int32_t> targets = {3, -1, 0, -1, 6, -1};
  Kokkos::View<int32_t*, MemSpace> tgt("tgt", N);
  fill_from(tgt, targets);
  auto logits = random_buffer(N * Vn, 151, 3.0);
  for (int64_t j = 0; j < Vn; ++j) set(logits, 3 * Vn + j, 500.0 + j);  // an ignored row far from zero
  const double dloss = 0.7;
  Buffer<double> losses("losses", N), dlogits("dlogits", N * Vn);
  auto loss = [&] {
    k::cross_entropy_forward<double>(V(losses), M(logits, N, Vn), Tokens(tgt.data(), N));
    return dloss * k::sum<double>(Vec<const double>(losses.data(), N));  // one scalar dloss for the batch
  };
  loss();
  const auto hl = host(logits), hloss = host(losses);
  for (int64_t i = 0; i < N; ++i) {
    CAPTURE(i);
    if (targets[i] < 0) {
      REQUIRE(hloss[i] == 0.0);
      continue;
    }
    double m = -1e300, z = 0;
    for (int64_t j = 0; j < Vn; ++j) m = std::max(m, hl[i * Vn + j]);
    for (int64_t j = 0; j < Vn; ++j) z += std::exp(hl[i * Vn + j] - m);
    REQUIRE(hloss[i] == Approx(m + std::log(z) - hl[i * Vn + targets[i]]).epsilon(1e-13));
  }
  Kokkos::deep_copy(dlogits, 9.0);
  k::cross_entropy_backward<double>(M(dlogits, N, Vn), M(logits, N, Vn), Tokens(tgt.data(), N), dloss);
  const auto hd = host(dlogits);
  for (int64_t i = 0; i < N; ++i) {
    CAPTURE(i);
    double row = 0;
    for (int64_t j = 0; j < Vn; ++j) {
      if (targets[i] < 0) REQUIRE(hd[i * Vn + j] == 0.0);
      row += hd[i * Vn + j];
    }
    REQUIRE(row == Approx(0.0).margin(1e-14));  // softmax minus one-hot sums to zero
  }
  check_gradient("cross entropy dlogits (ignored targets)", logits, dlogits, loss, 1000);

  SECTION("in place: dlogits aliasing logits gives the same gradient") {
    Buffer<double> inplace("inplace", N * Vn);
    Kokkos::deep_copy(inplace, logits);
    k::cross_entropy_backward<double>(M(inplace, N, Vn), M(inplace, N, Vn), Tokens(tgt.data(), N), dloss);
    const auto hi = host(inplace);
    for (int64_t i = 0; i < N * Vn; ++i) REQUIRE(hi[i] == Approx(hd[i]).epsilon(1e-14).margin(1e-16));
  }
}

TEST_CASE("shift tokens: each row shifted left, fill past the row end", "[kernels]") {
  const int64_t B = 2, T = 5;
  const std::vector<int32_t> in = {10, 11, 12, 13, 14, 20, 21, 22, 23, 24};
  Kokkos::View<int32_t*, MemSpace> tok("tok", B * T), out("out", B * T);
  fill_from(tok, in);
  auto shifted = [&](int64_t shift, int32_t fill) {
    Kokkos::deep_copy(out, -99);
    k::shift_tokens(out, Tokens(tok.data(), B * T), T, shift, fill);
    return host(out);
  };
  REQUIRE(shifted(0, -1) == in);
  REQUIRE(shifted(1, -1) == std::vector<int32_t>{11, 12, 13, 14, -1, 21, 22, 23, 24, -1});
  REQUIRE(shifted(2, 7) == std::vector<int32_t>{12, 13, 14, 7, 7, 22, 23, 24, 7, 7});
  REQUIRE(shifted(4, -1) == std::vector<int32_t>{14, -1, -1, -1, -1, 24, -1, -1, -1, -1});
  REQUIRE(shifted(T, -1) == std::vector<int32_t>(B * T, -1));
}

// ---------------------------------------------------------------------------
// attention with a value width different from the query/key width

TEST_CASE("blocked causal attention (Dv == D and Dv != D) matches a naive reference and finite differences",
          "[kernels]") {
  const int64_t BH = 2;
  auto [D, Dv] = GENERATE(std::pair<int64_t, int64_t>{4, 4}, std::pair<int64_t, int64_t>{6, 3},
                          std::pair<int64_t, int64_t>{3, 5});
  auto [T, block] = GENERATE(std::pair<int64_t, int64_t>{7, 3}, std::pair<int64_t, int64_t>{8, 4},
                             std::pair<int64_t, int64_t>{5, 8});
  CAPTURE(D, Dv, T, block);
  k::CausalBlocks blocks(T, block);
  auto q = random_buffer(BH * T * D, 161), kk = random_buffer(BH * T * D, 162), v = random_buffer(BH * T * Dv, 163);
  auto r = random_buffer(BH * T * Dv, 164);
  Buffer<double> out("out", BH * T * Dv), att("att", BH * blocks.per_head());
  Buffer<double> dq("dq", BH * T * D), dk("dk", BH * T * D), dv("dv", BH * T * Dv), scratch("scratch", block * T);
  auto loss = [&] {
    k::attention_forward<double>(M(out, BH * T, Dv), {att.data()}, M(q, BH * T, D), M(kk, BH * T, D),
                                 M(v, BH * T, Dv), V(scratch), blocks, BH, 1 / std::sqrt(double(D)));
    return dot(out, r);
  };
  loss();
  const auto ref = naive_attention(host(q), host(kk), host(v), BH, T, D, Dv);
  const auto got = host(out);
  REQUIRE(got.size() == ref.size());
  for (size_t i = 0; i < ref.size(); ++i) REQUIRE(got[i] == Approx(ref[i]).epsilon(1e-12).margin(1e-14));

  Kokkos::deep_copy(dq, 9.0), Kokkos::deep_copy(dk, 9.0), Kokkos::deep_copy(dv, 9.0);  // written (=)
  k::attention_backward<double>(M(dq, BH * T, D), M(dk, BH * T, D), M(dv, BH * T, Dv), V(scratch),
                                M(r, BH * T, Dv), {att.data()}, M(q, BH * T, D), M(kk, BH * T, D),
                                M(v, BH * T, Dv), blocks, BH, 1 / std::sqrt(double(D)));
  check_gradient("attention dq", q, dq, loss, 1000);
  check_gradient("attention dk", kk, dk, loss, 1000);
  check_gradient("attention dv", v, dv, loss, 1000);
}

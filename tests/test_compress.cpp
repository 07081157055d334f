// Gradient compression kernels (kernels/compress.h) against host references:
// top-k against std::sort, payload sizes against the formula and hand counts,
// RATIO 1 without quantization against the plain sum bit for bit, error
// feedback conservation per element, the quantization bound and rounding,
// determinism, indices across several 65536-entry segments (empty and full
// ones, the 65535 / 65536 boundary), and rejection of corrupted payloads.
#include <catch2/catch.hpp>
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>
#include "core/device_memory.h"
#include "core/views.h"
#include "kernels/compress.h"

using namespace xx;
namespace c = xx::kernels::compress;
using c::Quant;

namespace {

template <class T>
Buffer<T> on_device(const std::vector<T>& h, const char* label = "test::buffer") {
  Buffer<T> b(std::string(label), int64_t(h.size()));
  auto m = xx::host_staging(b);
  for (size_t i = 0; i < h.size(); ++i) m(i) = h[i];
  Kokkos::deep_copy(b, m);
  return b;
}

template <class V>
auto on_host(const V& v) {
  using T = std::remove_const_t<typename V::value_type>;
  Kokkos::View<T*, Kokkos::HostSpace> m("host::test::mirror", v.extent(0));
  Kokkos::deep_copy(m, v);
  return std::vector<T>(m.data(), m.data() + m.extent(0));
}

template <class T> Vec<T> V(const Buffer<T>& b) { return Vec<T>(b.data(), b.extent(0)); }
template <class T> Vec<const T> CV(const Buffer<T>& b) { return Vec<const T>(b.data(), b.extent(0)); }

uint32_t bits(float x) { return std::bit_cast<uint32_t>(x); }

// v quantized to int8 in blocks of `block` and decoded: the scales and the values.
struct RoundTrip {
  std::vector<float> scales, values;
};
RoundTrip int8_round_trip(const std::vector<float>& v, int64_t block) {
  auto val = on_device(v);
  const int64_t k = v.size();
  Buffer<float> scale("test::scale", c::ceil_div(k, block)), back("test::back", k);
  Buffer<uint8_t> codes("test::codes", k);
  c::quantize(V(scale), V(codes), CV(val), Quant::int8, block);
  c::dequantize(V(back), CV(scale), CV(codes), Quant::int8, block);
  return {on_host(scale), on_host(back)};
}

// Kinds of gradient: normal; few distinct magnitudes (ties everywhere);
// magnitudes spread log-uniformly over 1e-38..1e3 with zeros and subnormals.
enum class Data { normal, ties, wide };

std::vector<float> make_grad(int64_t n, uint64_t seed, Data kind) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> level(0, 3), coin(0, 1);
  std::uniform_real_distribution<double> expo(-38.0, 3.0);
  std::vector<float> g(n);
  for (int64_t i = 0; i < n; ++i) {
    const float sign = coin(gen) ? 1.0f : -1.0f;
    switch (kind) {
      case Data::normal: g[i] = normal(gen); break;
      case Data::ties: g[i] = sign * std::array<float, 4>{0.0f, 0.5f, 1.0f, 2.0f}[level(gen)]; break;
      case Data::wide: {
        const int r = level(gen);
        g[i] = r == 0 ? 0.0f : sign * float(std::pow(10.0, expo(gen)));
        if (i % 97 == 5) g[i] = sign * std::numeric_limits<float>::denorm_min() * float(1 + i % 13);
        break;
      }
    }
  }
  return g;
}

// The k largest |a|, ties to the lower index, in increasing index order.
std::vector<uint32_t> reference_topk(const std::vector<float>& a, int64_t k) {
  std::vector<uint32_t> order(a.size());
  std::iota(order.begin(), order.end(), 0u);
  std::sort(order.begin(), order.end(), [&](uint32_t i, uint32_t j) {
    const float x = std::fabs(a[i]), y = std::fabs(a[j]);
    return x != y ? x > y : i < j;
  });
  order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

// What the error-feedback kernel computes (a zero residual keeps grad's bits).
float feedback_of(float r, float g) { return r == 0 ? g : r + g; }

// A whole compressed bucket: payload plus the sender's residual.
struct Sent {
  Buffer<uint8_t> payload;
  int64_t bytes = 0;
};

Sent compress_once(Buffer<float>& residual, const Buffer<float>& grad, const c::Settings& s, uint8_t fill = 0xab) {
  const int64_t n = grad.extent(0), k = c::topk_count(n, s.ratio);
  c::Workspace ws(n, k);
  Sent out;
  out.payload = Buffer<uint8_t>("test::payload", c::payload_bytes(n, k, s.quant, s.block));
  Kokkos::deep_copy(out.payload, fill);  // garbage that must not leak into the payload
  out.bytes = c::compress(V(out.payload), V(residual), CV(grad), s, ws);
  return out;
}

// The payload decoded to a dense vector of what was sent (0 where nothing was).
std::vector<float> dense_sent(const Buffer<uint8_t>& payload, int64_t n, std::vector<uint32_t>* idx_out = nullptr) {
  const auto h = c::read_header(CV(payload));
  Buffer<uint32_t> idx("test::idx", h.k);
  Buffer<float> val("test::val", h.k);
  c::decode(V(idx), V(val), CV(payload));
  const auto hi = on_host(idx);
  const auto hv = on_host(val);
  std::vector<float> d(n, 0.0f);
  for (size_t j = 0; j < hi.size(); ++j) d[hi[j]] = hv[j];
  if (idx_out) *idx_out = hi;
  return d;
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("compress: top-k picks the k largest magnitudes, ties to the lower index, in index order",
          "[kernels][compress]") {
  struct Case {
    int64_t n;
    double ratio;
    Data kind;
  };
  const std::vector<Case> cases = {
      {1, 0.01, Data::normal},   {7, 0.3, Data::normal},    {2048, 0.01, Data::normal},
      {2049, 0.05, Data::ties},  {10000, 0.1, Data::ties},  {5000, 0.013, Data::wide},
      {3000, 0.9, Data::ties},   {4097, 0.5, Data::wide},   {1 << 20, 0.001, Data::normal},
      {(1 << 20) + 3, 0.1, Data::ties},
  };
  for (const auto& cs : cases) {
    const int64_t k = c::topk_count(cs.n, cs.ratio);
    CAPTURE(cs.n, cs.ratio, int(cs.kind), k);
    const auto a = make_grad(cs.n, 100 + cs.n, cs.kind);
    auto acc = on_device(a);
    Buffer<uint32_t> idx("test::idx", k);
    Buffer<float> val("test::val", k);
    c::Workspace ws(cs.n, k);
    c::topk_select(V(idx), V(val), CV(acc), ws);
    const auto got = on_host(idx);
    const auto got_val = on_host(val);
    REQUIRE(got == reference_topk(a, k));
    int64_t wrong = 0;
    for (int64_t j = 0; j < k; ++j) wrong += bits(got_val[j]) != bits(a[got[j]]);
    REQUIRE(wrong == 0);
  }
}

TEST_CASE("compress: top-k of equal magnitudes takes the lowest indices", "[kernels][compress]") {
  std::vector<float> a(5000);
  for (size_t i = 0; i < a.size(); ++i) a[i] = i % 2 ? -1.5f : 1.5f;
  auto acc = on_device(a);
  const int64_t k = 65;
  Buffer<uint32_t> idx("test::idx", k);
  Buffer<float> val("test::val", k);
  c::Workspace ws(5000, k);
  c::topk_select(V(idx), V(val), CV(acc), ws);
  std::vector<uint32_t> expect(k);
  std::iota(expect.begin(), expect.end(), 0u);
  REQUIRE(on_host(idx) == expect);
}

TEST_CASE("compress: top-k at ratio 1 (and above) gives every entry", "[kernels][compress]") {
  const auto a = make_grad(3001, 7, Data::normal);
  auto acc = on_device(a);
  for (double ratio : {1.0, 4.0}) {
    const int64_t k = c::topk_count(3001, ratio);
    REQUIRE(k == 3001);
    Buffer<uint32_t> idx("test::idx", k);
    Buffer<float> val("test::val", k);
    c::Workspace ws(3001, k);
    c::topk_select(V(idx), V(val), CV(acc), ws);
    std::vector<uint32_t> expect(k);
    std::iota(expect.begin(), expect.end(), 0u);
    REQUIRE(on_host(idx) == expect);
    REQUIRE(on_host(val) == a);
  }
}

TEST_CASE("compress: topk_count and payload_bytes by hand", "[kernels][compress]") {
  CHECK(c::topk_count(1000, 0.01) == 10);
  CHECK(c::topk_count(100, 0.07) == 7);  // 0.07 * 100 is 7.000000000000001 in double
  CHECK(c::topk_count(1001, 0.01) == 11);
  CHECK(c::topk_count(10, 0.001) == 1);
  CHECK(c::topk_count(3, 0.5) == 2);
  CHECK(c::topk_count(1 << 20, 0.001) == 1049);
  CHECK(c::topk_count(1000, 1.0) == 1000);
  CHECK(c::topk_count(1000, 2.5) == 1000);
  CHECK_THROWS_AS(c::topk_count(1000, 0.0), std::invalid_argument);
  // header 20 | unless k == n: counts 4 ceil(n / 65536) + low halves 2k padded to 4
  //           | scales 4 ceil(k/B) | values | pad to 4
  CHECK(c::payload_bytes(1000, 10, Quant::none, 64) == 20 + (4 + 20) + 40);
  CHECK(c::payload_bytes(1000, 10, Quant::int8, 64) == 60);     // 20 + (4 + 20) + 4 + 10 = 58
  CHECK(c::payload_bytes(1000, 10, Quant::int4, 64) == 56);     // 20 + (4 + 20) + 4 + 5 = 53
  CHECK(c::payload_bytes(1000, 1000, Quant::none, 64) == 4020);
  CHECK(c::payload_bytes(1000, 1000, Quant::int4, 64) == 584);  // 20 + 64 + 500
  CHECK(c::payload_bytes(1000, 129, Quant::int8, 64) == 428);   // 20 + (4 + 260) + 12 + 129 = 425
  CHECK(c::payload_bytes(1000, 129, Quant::int4, 64) == 364);   // 20 + (4 + 260) + 12 + 65 = 361
  CHECK(c::payload_bytes(10, 3, Quant::int4, 2) == 44);         // 20 + (4 + 8) + 8 + 2 = 42
  // bf16: 2 bytes a value, no scales, whatever the block
  CHECK(c::payload_bytes(1000, 10, Quant::bf16, 64) == 64);      // 20 + (4 + 20) + 20
  CHECK(c::payload_bytes(1000, 10, Quant::bf16, 1) == 64);
  CHECK(c::payload_bytes(1000, 129, Quant::bf16, 64) == 544);    // 20 + (4 + 260) + 258 = 542
  CHECK(c::payload_bytes(1000, 1000, Quant::bf16, 64) == 2020);  // 20 + 2000: half of none's 4020, less the header
  CHECK(c::payload_bytes(1001, 1001, Quant::bf16, 64) == 2024);  // 20 + 2002 = 2022
  CHECK(c::payload_bytes(1 << 20, 1 << 20, Quant::bf16, 64) == 20 + 2 * (1 << 20));
  // one more segment at 65537
  CHECK(c::payload_bytes(65536, 10, Quant::none, 64) == 84);  // 20 + (4 + 20) + 40
  CHECK(c::payload_bytes(65537, 10, Quant::none, 64) == 88);  // 20 + (8 + 20) + 40
  CHECK(c::payload_bytes(65537, 65537, Quant::int8, 64) == 20 + 4 * 1025 + 65540);  // dense: no index section
  // a 1 MiB bucket at ratio 0.01, int8: 4 segments; 1,048,576 / 8,068 = 130x fewer bytes than dense fp32
  CHECK(c::topk_count(262144, 0.01) == 2622);
  CHECK(c::payload_bytes(262144, 2622, Quant::int8, 64) == 8068);  // 20 + (16 + 5244) + 164 + 2622 = 8066
  CHECK(c::payload_bytes(1 << 20, 10486, Quant::int8, 64) == 32200);  // 20 + (64 + 20972) + 656 + 10486 = 32198
}

TEST_CASE("compress: the payload handed over is payload_bytes long", "[kernels][compress]") {
  int64_t cases = 0;
  for (int64_t n : {1, 2, 100, 1000, 4097})
    for (double ratio : {0.001, 0.013, 0.1, 0.5, 1.0})
      for (Quant q : {Quant::none, Quant::int8, Quant::int4, Quant::bf16})
        for (int64_t block : {1, 3, 64, 1000}) {
          const int64_t k = c::topk_count(n, ratio);
          CAPTURE(n, ratio, xx::mode_name(q), block, k);
          auto grad = on_device(make_grad(n, uint64_t(n * 31 + block), Data::normal));
          Buffer<float> residual("test::residual", n);
          const auto sent = compress_once(residual, grad, c::Settings{ratio, q, block, true});
          // Bytes on the wire: what compress wrote is the whole buffer, and the formula.
          CHECK(sent.bytes == c::payload_bytes(n, k, q, block));
          CHECK(int64_t(sent.payload.extent(0)) == sent.bytes);
          CHECK(sent.bytes % 4 == 0);
          const auto h = c::read_header(CV(sent.payload));
          CHECK((h.n == n && h.k == k && h.quant == q && h.block == (c::has_scales(q) ? block : 0)));
          ++cases;
        }
  REQUIRE(cases == 400);
}

TEST_CASE("compress: RATIO 1 without quantization sums ranks bit for bit", "[kernels][compress]") {
  // Order of the sum: rank 0's values, then + rank 1, + rank 2, ... left to
  // right, per element; the host does the same with plain float adds.
  const int64_t n = 5003;
  for (int R : {1, 2, 3, 4})
    for (bool feedback : {true, false}) {
      CAPTURE(R, feedback);
      std::vector<std::vector<float>> g(R);
      for (int r = 0; r < R; ++r) {
        g[r] = make_grad(n, 1000 + r, r % 2 ? Data::wide : Data::normal);
        g[r][17] = -0.0f;  // every rank -0: the sum must stay -0
        g[r][18] = r == 0 ? -0.0f : 0.0f;
      }
      const int64_t bytes = c::payload_bytes(n, n, Quant::none, 64);
      // One receive buffer holding every rank's payload, as an all-gather leaves it.
      Buffer<uint8_t> gathered("test::gathered", R * bytes);
      std::vector<Vec<const uint8_t>> payloads;
      for (int r = 0; r < R; ++r) {
        auto grad = on_device(g[r]);
        Buffer<float> residual("test::residual", n);
        const auto sent = compress_once(residual, grad, c::Settings{1.0, Quant::none, 64, feedback});
        REQUIRE(sent.bytes == bytes);
        Kokkos::deep_copy(Kokkos::subview(gathered, Kokkos::make_pair(r * bytes, (r + 1) * bytes)), sent.payload);
        payloads.emplace_back(gathered.data() + r * bytes, bytes);
        const auto res = on_host(residual);
        REQUIRE(std::all_of(res.begin(), res.end(), [](float x) { return bits(x) == 0; }));
      }
      Buffer<float> out("test::out", n);
      c::decode_sum(V(out), payloads);
      const auto got = on_host(out);
      int64_t differ = 0;
      for (int64_t i = 0; i < n; ++i) {
        float s = g[0][i];
        for (int r = 1; r < R; ++r) s = s + g[r][i];
        differ += bits(got[i]) != bits(s);
      }
      REQUIRE(differ == 0);
      REQUIRE(bits(got[17]) == bits(-0.0f));
    }
}

TEST_CASE("compress: error feedback conserves every element", "[kernels][compress]") {
  // sent_i + residual_new_i == acc_i exactly (as floats) for every element,
  // with sent_i the value decode() returns (0 where nothing was sent) and
  // acc_i = residual_old_i + grad_i; unselected entries keep acc's bits.
  const int64_t n = 6007;
  for (Quant q : {Quant::none, Quant::int8, Quant::int4, Quant::bf16})
    for (double ratio : {0.01, 0.1, 0.5, 1.0})
      for (int64_t block : {7, 64}) {
        CAPTURE(xx::mode_name(q), ratio, block);
        const c::Settings s{ratio, q, block, true};
        Buffer<float> residual = on_device(make_grad(n, 5, Data::wide));  // leftovers of earlier steps
        for (int step = 0; step < 3; ++step) {
          CAPTURE(step);
          const auto g = make_grad(n, 10 + step, step == 1 ? Data::ties : Data::wide);
          const auto r_old = on_host(residual);
          auto grad = on_device(g);
          const auto sent = compress_once(residual, grad, s);
          std::vector<uint32_t> idx;
          const auto d = dense_sent(sent.payload, n, &idx);
          const auto r_new = on_host(residual);
          std::vector<char> chosen(n, 0);
          for (auto i : idx) chosen[i] = 1;
          int64_t bad = 0, first_bad = -1;
          for (int64_t i = 0; i < n; ++i) {
            const float acc = feedback_of(r_old[i], g[i]);
            const float back = d[i] + r_new[i];
            const bool ok = chosen[i] ? back == acc : bits(r_new[i]) == bits(acc);
            if (!ok && first_bad < 0) first_bad = i;
            bad += !ok;
          }
          INFO("first bad element " << first_bad);
          REQUIRE(bad == 0);
        }
      }
}

TEST_CASE("compress: with feedback off the residual is neither read nor kept", "[kernels][compress]") {
  const int64_t n = 6007;
  for (Quant q : {Quant::none, Quant::int8}) {
    const auto g = make_grad(n, 77, Data::normal);
    auto grad = on_device(g);
    Buffer<float> residual = on_device(make_grad(n, 78, Data::normal));  // ignored
    const auto sent = compress_once(residual, grad, c::Settings{0.05, q, 64, false});
    const auto res = on_host(residual);
    REQUIRE(std::all_of(res.begin(), res.end(), [](float x) { return bits(x) == 0; }));
    Buffer<float> zero("test::zero", n);
    const auto clean = compress_once(zero, grad, c::Settings{0.05, q, 64, true});
    REQUIRE(on_host(sent.payload) == on_host(clean.payload));  // selected from grad alone
  }
}

TEST_CASE("compress: quantization error is within half a scale, ties to even, int4 packs", "[kernels][compress]") {
  SECTION("random blocks: |decoded - v| <= scale / 2 exactly") {
    for (Quant q : {Quant::int8, Quant::int4})
      for (int64_t block : {1, 5, 64})
        for (Data kind : {Data::normal, Data::wide, Data::ties}) {
          CAPTURE(xx::mode_name(q), block, int(kind));
          const int64_t k = 3001, nb = c::ceil_div(k, block);
          const auto v = make_grad(k, uint64_t(block) * 7 + int(kind), kind);
          auto val = on_device(v);
          Buffer<float> scale("test::scale", nb), back("test::back", k);
          Buffer<uint8_t> codes("test::codes", q == Quant::int8 ? k : c::ceil_div(k, 2));
          c::quantize(V(scale), V(codes), CV(val), q, block);
          c::dequantize(V(back), CV(scale), CV(codes), q, block);
          const auto s = on_host(scale);
          const auto d = on_host(back);
          int64_t over = 0, bad_scale = 0;
          double worst = 0;
          for (int64_t j = 0; j < k; ++j) {
            const double err = std::fabs(double(d[j]) - double(v[j])), half = double(s[j / block]) / 2;
            over += err > half;
            if (half > 0) worst = std::max(worst, err / half);
          }
          for (int64_t b = 0; b < nb; ++b) {
            double m = 0;
            for (int64_t j = b * block; j < std::min(k, (b + 1) * block); ++j) m = std::max(m, std::fabs(double(v[j])));
            // at least max|v| / qmax, and 17 significant bits (so code * scale is exact)
            bad_scale += double(s[b]) < m / c::quant_max(q) || (bits(s[b]) & 0x7f) != 0;
          }
          CAPTURE(worst);
          REQUIRE(over == 0);
          REQUIRE(bad_scale == 0);
        }
  }

  SECTION("int8: round half to even of v / scale") {
    // max 127 gives scale 1, so the codes are the rounded values themselves.
    const std::vector<float> v = {127.0f, 0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 126.5f,
                                  std::nextafter(0.5f, 1.0f), std::nextafter(2.5f, 0.0f), -127.0f, 0.49f};
    const std::vector<float> expect = {127, 0, 2, 2, 0, -2, -2, 126, 1, 2, -127, 0};
    const auto [scales, back] = int8_round_trip(v, 64);
    REQUIRE(scales == std::vector<float>{1.0f});
    REQUIRE(back == expect);
  }

  SECTION("int4: codes -7..7 pack two per byte and round-trip, odd count") {
    std::vector<float> v;
    for (int q = -7; q <= 7; ++q) v.push_back(float(q));  // 15 values, max 7: scale 1
    v.push_back(3.5f);                                      // -> 4 (even)
    v.push_back(-0.5f);                                     // -> 0, 17 values in all
    auto val = on_device(v);
    const int64_t k = v.size();
    Buffer<float> scale("test::scale", 1), back("test::back", k);
    Buffer<uint8_t> codes("test::codes", c::ceil_div(k, 2));
    c::quantize(V(scale), V(codes), CV(val), Quant::int4, 64);
    c::dequantize(V(back), CV(scale), CV(codes), Quant::int4, 64);
    std::vector<float> expect(v.begin(), v.begin() + 15);
    expect.push_back(4.0f);
    expect.push_back(0.0f);
    REQUIRE(on_host(back) == expect);
    const auto b = on_host(codes);
    REQUIRE(b.size() == 9);
    REQUIRE(b[0] == uint8_t((-7 & 0xf) | ((-6 & 0xf) << 4)));  // entries 0 and 1
    REQUIRE(b[7] == uint8_t((7 & 0xf) | (4 << 4)));            // entries 14 and 15
    REQUIRE(b[8] == 0);                                        // entry 16 (code 0), empty high nibble
    // and through a whole payload, indices included
    const int64_t n = 40;
    std::vector<uint32_t> ix(k);
    for (int64_t j = 0; j < k; ++j) ix[j] = uint32_t(2 * j + 1);
    auto idx = on_device(ix);
    Buffer<uint8_t> payload("test::payload", c::payload_bytes(n, k, Quant::int4, 64));
    c::encode(V(payload), CV(idx), CV(val), n, Quant::int4, 64);
    Buffer<uint32_t> idx2("test::idx2", k);
    Buffer<float> val2("test::val2", k);
    c::decode(V(idx2), V(val2), CV(payload));
    REQUIRE(on_host(idx2) == ix);
    REQUIRE(on_host(val2) == expect);
  }

  SECTION("a NaN or inf makes its block's scale non-finite, and only that block's") {
    // blocks of 4: a NaN after larger values, an inf, two NaNs (the first, as
    // |NaN|, is the scale's source), and a finite block
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    const float nan2 = std::bit_cast<float>(0xffc01234u);  // a negative NaN with a payload
    const std::vector<float> v = {5, -9, nan, 1, 2, -inf, 3, 4, 1, nan2, nan, 2, 7, -3, 1, 0.5f};
    const auto [s, d] = int8_round_trip(v, 4);
    REQUIRE(std::isnan(s[0]));
    REQUIRE(std::isinf(s[1]));
    REQUIRE(std::isnan(s[2]));
    REQUIRE(bits(s[2]) == bits(c::block_scale(std::fabs(nan2), 127)));  // from the block's first NaN, not the second
    REQUIRE(s[3] == c::block_scale(7.0f, 127));
    for (int64_t j = 0; j < 12; ++j) REQUIRE(!std::isfinite(d[j]));  // 0 * non-finite scale
    for (int64_t j = 12; j < 16; ++j) REQUIRE(std::fabs(d[j] - v[j]) <= s[3] / 2);
  }
}

TEST_CASE("compress: the same input gives the same bytes", "[kernels][compress]") {
  const int64_t n = 70001;
  const auto g = make_grad(n, 3, Data::ties);
  const auto r0 = make_grad(n, 4, Data::wide);
  for (Quant q : {Quant::none, Quant::int8, Quant::int4}) {
    CAPTURE(xx::mode_name(q));
    const c::Settings s{0.0123, q, 63, true};  // k = 862, 14 blocks, int4 values end mid-word
    auto grad = on_device(g);
    auto res_a = on_device(r0), res_b = on_device(r0);
    const auto a = compress_once(res_a, grad, s, 0xab);
    const auto b = compress_once(res_b, grad, s, 0x5c);  // different garbage underneath
    REQUIRE(a.bytes == b.bytes);
    REQUIRE(on_host(a.payload) == on_host(b.payload));
    const auto ra = on_host(res_a), rb = on_host(res_b);
    REQUIRE(std::equal(ra.begin(), ra.end(), rb.begin(), [](float x, float y) { return bits(x) == bits(y); }));
  }
}

TEST_CASE("compress: decode_sum of sparse payloads adds ranks in order", "[kernels][compress]") {
  const int64_t n = 9000, R = 3;
  std::vector<Sent> sent;
  std::vector<Vec<const uint8_t>> payloads;
  std::vector<float> expect(n, 0.0f), added(n, 0.0f);
  for (int r = 0; r < R; ++r) {
    auto grad = on_device(make_grad(n, 50 + r, Data::normal));
    Buffer<float> residual("test::residual", n);
    sent.push_back(compress_once(residual, grad, c::Settings{0.05, Quant::int8, 64, true}));
    payloads.push_back(CV(sent.back().payload));
    std::vector<uint32_t> idx;
    const auto d = dense_sent(sent.back().payload, n, &idx);
    for (auto i : idx) expect[i] = r == 0 ? d[i] : expect[i] + d[i];
  }
  Buffer<float> out("test::out", n), out2("test::out2", n);
  Kokkos::deep_copy(out, 42.0f);  // overwritten
  c::decode_sum(V(out), payloads);
  const auto got = on_host(out);
  REQUIRE(std::equal(got.begin(), got.end(), expect.begin(), [](float x, float y) { return bits(x) == bits(y); }));
  for (const auto& p : payloads) c::decode_add(V(out2), p);
  REQUIRE(on_host(out2) == expect);
}

TEST_CASE("compress: mass carried over steps", "[kernels][compress]") {
  // sum over steps of what was sent, plus the last residual, is the sum of the
  // gradients up to the rounding of acc = residual + grad alone.
  const int64_t n = 4000, T = 20;
  const auto g = make_grad(n, 9, Data::normal);
  auto grad = on_device(g);
  Buffer<float> residual("test::residual", n);
  std::vector<double> total(n, 0.0);
  std::vector<char> ever(n, 0);
  for (int64_t t = 0; t < T; ++t) {
    const auto sent = compress_once(residual, grad, c::Settings{0.1, Quant::int4, 32, true});
    std::vector<uint32_t> idx;
    const auto d = dense_sent(sent.payload, n, &idx);
    for (int64_t i = 0; i < n; ++i) total[i] += d[i];
    for (auto i : idx) ever[i] = 1;
  }
  const auto r = on_host(residual);
  double worst = 0, gmax = 0;
  for (int64_t i = 0; i < n; ++i) worst = std::max(worst, std::fabs(total[i] + r[i] - double(T) * g[i]));
  for (float x : g) gmax = std::max(gmax, double(std::fabs(x)));
  CAPTURE(worst, gmax);
  REQUIRE(worst <= double(T) * double(T) * gmax * 0x1p-24);  // T steps, |acc| <= T max|g|, half an ulp each
  // top-k with feedback reaches everything that matters: the delayed ones get sent.
  REQUIRE(std::count(ever.begin(), ever.end(), 1) > n / 2);
}

TEST_CASE("compress: corrupted or truncated payloads are rejected", "[kernels][compress]") {
  const int64_t n = 1000;
  auto grad = on_device(make_grad(n, 11, Data::normal));
  Buffer<float> residual("test::residual", n);
  const auto good = compress_once(residual, grad, c::Settings{0.05, Quant::int8, 16, true});  // k = 50
  const auto bytes = on_host(good.payload);
  auto decode_bytes = [&](std::vector<uint8_t> b) {
    auto p = on_device(b);
    Buffer<uint32_t> idx("test::idx", 50);
    Buffer<float> val("test::val", 50);
    c::decode(V(idx), V(val), CV(p));
  };
  auto with_word = [&](int word, uint32_t value) {
    auto b = bytes;
    std::memcpy(b.data() + 4 * word, &value, 4);
    return b;
  };
  // Layout (n = 1000: one segment): header words 0-4 | count word 5 | low halves
  // at bytes 24 + 2j | 4 scales at 124 | 50 codes at 140 | 2 bytes pad: 192.
  REQUIRE(bytes.size() == 192);
  constexpr int kLow = 24;
  auto with_low = [&](int j, uint16_t value) {
    auto b = bytes;
    std::memcpy(b.data() + kLow + 2 * j, &value, 2);
    return b;
  };
  SECTION("decode names what is wrong") {
    REQUIRE(error_of([&] { decode_bytes(bytes); }) == "(no error)");
    CHECK_THAT(error_of([&] { decode_bytes({}); }), Catch::Contains("truncated"));
    CHECK_THAT(error_of([&] { decode_bytes(std::vector<uint8_t>(bytes.begin(), bytes.begin() + 19)); }),
               Catch::Contains("truncated"));
    CHECK_THAT(error_of([&] { decode_bytes(std::vector<uint8_t>(bytes.begin(), bytes.end() - 4)); }),
               Catch::Contains("truncated"));
    auto longer = bytes;
    longer.resize(bytes.size() + 4);
    CHECK_THAT(error_of([&] { decode_bytes(longer); }), Catch::Contains("trailing"));
    CHECK_THAT(error_of([&] { decode_bytes(with_word(0, 0xdeadbeef)); }), Catch::Contains("magic"));
    CHECK_THAT(error_of([&] { decode_bytes(with_word(3, 7)); }), Catch::Contains("unknown quant"));
    CHECK_THAT(error_of([&] { decode_bytes(with_word(2, 0)); }), Catch::Contains("need 1 <= k <= n"));
    CHECK_THAT(error_of([&] { decode_bytes(with_word(2, 2000)); }), Catch::Contains("need 1 <= k <= n"));
    CHECK_THAT(error_of([&] { decode_bytes(with_word(1, 0)); }), Catch::Contains("need 1 <= k <= n"));
    CHECK_THAT(error_of([&] { decode_bytes(with_word(4, 0)); }), Catch::Contains("block 0"));
    CHECK_THAT(error_of([&] { decode_bytes(with_word(2, 51)); }), Catch::Contains("truncated"));  // size no longer fits
    CHECK_THAT(error_of([&] { decode_bytes(with_word(4, 1)); }), Catch::Contains("truncated"));   // 50 scales, not 4
    CHECK_THAT(error_of([&] { decode_bytes(with_word(3, 0)); }), Catch::Contains("block 16 with quant none"));
    CHECK_THAT(error_of([&] { decode_bytes(with_word(3, 3)); }), Catch::Contains("block 16 with quant bf16"));
    CHECK_THAT(error_of([&] { decode_bytes(with_low(10, 5000)); }),
               Catch::Contains("indices are out of order or not below n = 1000"));
    auto swapped = bytes;  // indices 3 and 4 swapped
    std::swap_ranges(swapped.begin() + kLow + 6, swapped.begin() + kLow + 8, swapped.begin() + kLow + 8);
    CHECK_THAT(error_of([&] { decode_bytes(swapped); }), Catch::Contains("indices are out of order"));
    CHECK_THAT(error_of([&] { decode_bytes(with_word(5, 49)); }),
               Catch::Contains("segment counts sum to 49, the header says k = 50"));
    CHECK_THAT(error_of([&] { decode_bytes(with_word(5, 0xffffffffu)); }),
               Catch::Contains("segment counts sum to 4294967295"));
    auto magic1 = with_word(0, 0x01435858u);  // a version-1 payload
    CHECK_THAT(error_of([&] { decode_bytes(magic1); }), Catch::Contains("\"XXC\" version 2"));
  }

  SECTION("decode_sum checks every payload before touching the output") {
    auto bad = on_device(with_word(0, 0));
    Buffer<float> out("test::out", n);
    Kokkos::deep_copy(out, 42.0f);
    const std::vector<Vec<const uint8_t>> payloads = {CV(good.payload), CV(bad)};
    CHECK_THAT(error_of([&] { c::decode_sum(V(out), payloads); }),
               Catch::StartsWith("rank 1: ") && Catch::Contains("magic"));
    const auto o = on_host(out);
    CHECK(std::all_of(o.begin(), o.end(), [](float x) { return x == 42.0f; }));
    Buffer<float> shorter("test::shorter", n - 1);
    CHECK_THAT(error_of([&] { c::decode_add(V(shorter), CV(good.payload)); }), Catch::Contains("this bucket has 999"));
  }
}

namespace {

// Indices over n = 400000, seven segments of 65536 (the last 6784 long): a
// few at both ends of segments 0 and 1 (65535, 65536 and 131071 included),
// segment 2 empty, segment 3 full, one at the start of 4, 5 empty, the first
// and last index of 6. Counts {3, 3, 0, 65536, 1, 0, 2}, k = 65545.
constexpr int64_t kSpanN = 400000;
std::vector<uint32_t> spanning_indices() {
  std::vector<uint32_t> ix = {0, 5, 65535, 65536, 65537, 131071};
  for (uint32_t i = 196608; i < 262144; ++i) ix.push_back(i);
  for (uint32_t i : {262144u, 393216u, 399999u}) ix.push_back(i);
  return ix;
}

struct Decoded {
  std::vector<uint32_t> idx;
  std::vector<float> val;
};

Decoded decode_host(const std::vector<uint8_t>& bytes) {
  auto p = on_device(bytes);
  const auto h = c::read_header(CV(p));
  Buffer<uint32_t> idx("test::idx", h.k);
  Buffer<float> val("test::val", h.k);
  c::decode(V(idx), V(val), CV(p));
  return {on_host(idx), on_host(val)};
}

uint32_t word_at(const std::vector<uint8_t>& b, int64_t word) {
  uint32_t w;
  std::memcpy(&w, b.data() + 4 * word, 4);
  return w;
}

}  // namespace

TEST_CASE("compress: indices spanning several segments round-trip exactly", "[kernels][compress]") {
  SECTION("empty and full segments, 65535 / 65536 boundaries, every quant") {
    const auto ix = spanning_indices();
    const int64_t n = kSpanN, k = ix.size();
    REQUIRE(k == 65545);
    REQUIRE(c::segments(n) == 7);
    std::vector<float> v(k);
    for (int64_t j = 0; j < k; ++j) v[j] = float(int(j % 255) - 127) * 0.375f + float(j % 7) * 0x1p-10f;
    auto idx = on_device(ix);
    auto val = on_device(v);
    for (Quant q : {Quant::none, Quant::int8, Quant::int4}) {
      CAPTURE(xx::mode_name(q));
      const int64_t bytes = c::payload_bytes(n, k, q, 64);
      // 20 + (7 counts + 65545 halves and one of padding) + scales + values
      const int64_t values = q == Quant::none ? 4 * k : q == Quant::int8 ? k : c::ceil_div(k, 2);
      CHECK(bytes == (20 + (28 + 131092) + (q == Quant::none ? 0 : 4 * 1025) + values + 3) / 4 * 4);
      Buffer<uint8_t> payload("test::payload", bytes);
      Kokkos::deep_copy(payload, uint8_t(0xab));
      REQUIRE(c::encode(V(payload), CV(idx), CV(val), n, q, 64) == bytes);
      const auto b = on_host(payload);
      CHECK(word_at(b, 0) == 0x02435858u);  // "XXC" 2
      const std::vector<uint32_t> counts = {word_at(b, 5),  word_at(b, 6),  word_at(b, 7), word_at(b, 8),
                                            word_at(b, 9),  word_at(b, 10), word_at(b, 11)};
      CHECK(counts == std::vector<uint32_t>{3, 3, 0, 65536, 1, 0, 2});
      uint16_t h[6];
      std::memcpy(h, b.data() + 48, sizeof(h));
      CHECK(std::vector<uint16_t>(h, h + 6) == std::vector<uint16_t>{0, 5, 65535, 0, 1, 65535});
      CHECK(b[48 + 2 * k] == 0);  // the odd k's padding half
      CHECK(b[48 + 2 * k + 1] == 0);
      const auto d = decode_host(b);
      REQUIRE(d.idx == ix);
      // the values as the sender computes them
      std::vector<float> expect = v;
      if (q != Quant::none) {
        Buffer<float> scale("test::scale", c::ceil_div(k, 64)), back("test::back", k);
        Buffer<uint8_t> codes("test::codes", values);
        c::quantize(V(scale), V(codes), CV(val), q, 64);
        c::dequantize(V(back), CV(scale), CV(codes), q, 64);
        expect = on_host(back);
      }
      REQUIRE(d.val == expect);
      // decode_add puts each value at its index and nothing elsewhere
      Buffer<float> out("test::out", n);
      c::decode_add(V(out), CV(payload));
      const auto o = on_host(out);
      std::vector<float> dense(n, 0.0f);
      for (int64_t j = 0; j < k; ++j) dense[ix[j]] = expect[j];
      REQUIRE(o == dense);
    }
  }

  SECTION("random index sets with densities from empty to full per segment") {
    std::mt19937_64 gen(2024);
    for (int64_t n : {65536, 65537, 200003, 300007}) {
      const int64_t nseg = c::segments(n);
      for (int trial = 0; trial < 3; ++trial) {
        CAPTURE(n, trial);
        std::vector<uint32_t> ix;
        std::uniform_real_distribution<double> u(0.0, 1.0);
        for (int64_t s = 0; s < nseg; ++s) {
          const double p = std::array<double, 5>{0.0, 1.0, 0.001, 0.3, 0.97}[(s + trial) % 5];
          for (int64_t i = s * 65536; i < std::min(n, (s + 1) * 65536); ++i)
            if (u(gen) < p) ix.push_back(uint32_t(i));
        }
        if (ix.empty() || int64_t(ix.size()) == n) ix = {uint32_t(n - 1)};
        const int64_t k = ix.size();
        std::vector<float> v(k);
        for (int64_t j = 0; j < k; ++j) v[j] = float(j) * 0.5f - 3.0f;
        auto idx = on_device(ix);
        auto val = on_device(v);
        Buffer<uint8_t> payload("test::payload", c::payload_bytes(n, k, Quant::none, 64));
        REQUIRE(c::encode(V(payload), CV(idx), CV(val), n, Quant::none, 64) == int64_t(payload.extent(0)));
        const auto d = decode_host(on_host(payload));
        REQUIRE(d.idx == ix);
        REQUIRE(d.val == v);
      }
    }
  }

  SECTION("through compress: top-k of buckets over one segment") {
    for (int64_t n : {65537, 200003})
      for (double ratio : {0.01, 0.3})
        for (Quant q : {Quant::none, Quant::int8, Quant::int4}) {
          const int64_t k = c::topk_count(n, ratio);
          CAPTURE(n, ratio, xx::mode_name(q), k);
          const auto g = make_grad(n, uint64_t(n) + 5, Data::ties);
          auto grad = on_device(g);
          Buffer<float> residual("test::residual", n);
          const auto sent = compress_once(residual, grad, c::Settings{ratio, q, 64, true});
          CHECK(sent.bytes == c::payload_bytes(n, k, q, 64));
          std::vector<uint32_t> idx;
          dense_sent(sent.payload, n, &idx);
          REQUIRE(idx == reference_topk(g, k));
        }
  }
}

TEST_CASE("compress: segment counts are validated", "[kernels][compress]") {
  const auto ix = spanning_indices();
  const int64_t n = kSpanN, k = ix.size();
  std::vector<float> v(k, 1.0f);
  auto idx = on_device(ix);
  auto val = on_device(v);
  Buffer<uint8_t> payload("test::payload", c::payload_bytes(n, k, Quant::int8, 64));
  c::encode(V(payload), CV(idx), CV(val), n, Quant::int8, 64);
  const auto bytes = on_host(payload);
  auto with_counts = [&](std::vector<uint32_t> counts) {  // words 5..11
    auto b = bytes;
    std::memcpy(b.data() + 20, counts.data(), 4 * counts.size());
    return b;
  };
  auto decode_bytes = [&](const std::vector<uint8_t>& b) { decode_host(b); };
  REQUIRE(error_of([&] { decode_bytes(bytes); }) == "(no error)");
  // not summing to k
  CHECK_THAT(error_of([&] { decode_bytes(with_counts({3, 3, 1, 65536, 1, 0, 2})); }),
             Catch::Contains("the 7 index segment counts sum to 65546, the header says k = 65545"));
  CHECK_THAT(error_of([&] { decode_bytes(with_counts({3, 3, 0, 0, 1, 0, 2})); }),
             Catch::Contains("sum to 9, the header says k = 65545"));
  CHECK_THAT(error_of([&] { decode_bytes(with_counts({0xffffffffu, 3, 0, 65536, 1, 0, 2})); }),
             Catch::Contains("sum to 4295032837"));
  // summing to k but misplaced: 65535 then 0 in one segment; 65537 entries in one segment
  CHECK_THAT(error_of([&] { decode_bytes(with_counts({2, 4, 0, 65536, 1, 0, 2})); }),
             Catch::Contains("indices are out of order"));
  CHECK_THAT(error_of([&] { decode_bytes(with_counts({3, 3, 0, 65537, 0, 0, 2})); }),
             Catch::Contains("indices are out of order"));
  // the last segment is 6784 long: low half 6784 there is index 400000 = n
  auto past_n = bytes;
  const uint16_t h = 6784;
  std::memcpy(past_n.data() + 48 + 2 * (k - 1), &h, 2);
  CHECK_THAT(error_of([&] { decode_bytes(past_n); }), Catch::Contains("not below n = 400000"));
  // decode_sum names the rank and leaves the output alone
  auto bad = on_device(with_counts({3, 3, 0, 65536, 1, 1, 2}));
  Buffer<float> out("test::out", n);
  Kokkos::deep_copy(out, 42.0f);
  CHECK_THAT(error_of([&] { c::decode_sum(V(out), {CV(payload), CV(bad)}); }),
             Catch::StartsWith("rank 1: ") && Catch::Contains("sum to 65546"));
  const auto o = on_host(out);
  CHECK(std::all_of(o.begin(), o.end(), [](float x) { return x == 42.0f; }));
}

TEST_CASE("compress: the pieces of a selection carry exactly its entries, and conserve every element",
          "[kernels][compress]") {
  // select_pieces / encode_piece / finish_pieces (the partitioned exchange's
  // sender): the same top-k as compress(), cut at n j / R; each piece's
  // payload decodes (relative indices) to exactly the selected entries in it;
  // sent + residual == acc per element. Quant none: the same values and
  // residual bits as compress() itself.
  const int64_t n = 70001;  // two index segments, and pieces that do not divide it
  for (Quant q : {Quant::none, Quant::int8, Quant::bf16})
    for (int64_t R : {1, 3, 8})
      for (double ratio : {0.001, 0.05, 1.0}) {
        CAPTURE(xx::mode_name(q), R, ratio);
        const c::Settings s{ratio, q, 64, true};
        const auto g = make_grad(n, 40 + R, Data::wide);
        const auto r0 = make_grad(n, 41, Data::wide);
        Buffer<float> residual = on_device(r0), whole_residual = on_device(r0);
        auto grad = on_device(g);
        const Sent whole = compress_once(whole_residual, grad, s);
        const auto whole_sent = dense_sent(whole.payload, n);
        c::Workspace ws(n, c::topk_count(n, ratio));
        const c::Selection sel = c::select_pieces(V(residual), CV(grad), s, R, ws);
        REQUIRE(sel.k == c::topk_count(n, ratio));
        REQUIRE(sel.bounds.front() == 0);
        REQUIRE(sel.bounds.back() == sel.k);
        std::vector<float> sent(n, 0.0f);
        std::vector<char> chosen(n, 0);
        for (int64_t j = 0; j < R; ++j) {
          const int64_t bytes = c::piece_payload_bytes(sel, j, s);
          if (sel.entries(j) == 0) {
            REQUIRE(bytes == 0);
            continue;
          }
          Buffer<uint8_t> payload("test::piece", bytes);
          REQUIRE(c::encode_piece(V(payload), sel, j, s, ws) == bytes);
          std::vector<uint32_t> idx;
          const auto d = dense_sent(payload, sel.length(j), &idx);  // checks the header says the piece's length
          REQUIRE(int64_t(idx.size()) == sel.entries(j));
          for (auto i : idx) chosen[sel.begin(j) + i] = 1, sent[sel.begin(j) + i] = d[i];
        }
        c::finish_pieces(V(residual), sel, s, ws);
        const auto r1 = on_host(residual);
        int64_t bad = 0, count = 0;
        for (int64_t i = 0; i < n; ++i) {
          count += chosen[i];
          const float acc = feedback_of(r0[i], g[i]);
          bad += chosen[i] ? sent[i] + r1[i] != acc : bits(r1[i]) != bits(acc);
          bad += (whole_sent[i] != 0) && !chosen[i];  // the same selection as compress()
        }
        REQUIRE(count == sel.k);
        REQUIRE(bad == 0);
        if (q == Quant::none) REQUIRE(on_host(whole_residual) == r1);  // compare as floats: -0 == +0 is fine
      }
}

TEST_CASE("compress: many buckets selected into one sorted list and cut into range payloads; the owner's "
          "top-k per segment", "[kernels][compress]") {
  // The partitioned exchange (src/comm/compressed_sync.h) with many buckets:
  // select_into writes each bucket's top-k at its place with packed indices,
  // so the concatenation is sorted; cut_selection cuts it at S j / R; piece
  // j's payload holds exactly the selected entries in [S j / R, S (j+1) / R).
  // compress_segments: the top-k of each segment (the same entries as
  // compress() of that segment alone), one payload over the range; sent +
  // residual == acc in the segments, the rest of the residual untouched.
  const std::vector<int64_t> sizes = {5, 3000, 1, 70001, 257, 40000};  // buckets, in packed order
  std::vector<int64_t> starts = {0};
  for (int64_t n : sizes) starts.push_back(starts.back() + n);
  const int64_t S = starts.back();
  for (Quant q : {Quant::none, Quant::int8, Quant::bf16})
    for (double ratio : {0.01, 1.0})
      for (bool feedback : {true, false}) {
        CAPTURE(xx::mode_name(q), ratio, feedback);
        const c::Settings s{ratio, q, 64, feedback};
        const auto g = make_grad(S, 77, Data::wide);
        const auto r0 = make_grad(S, 78, Data::normal);
        Buffer<float> residual = on_device(feedback ? r0 : std::vector<float>(S, 0.0f));
        auto grad = on_device(g);
        int64_t K = 0;
        for (int64_t n : sizes) K += c::topk_count(n, ratio);
        c::Workspace ws(70001, 70001);
        Buffer<uint32_t> idx("test::idx", K), rel("test::rel", K);
        Buffer<float> val("test::val", K), sent_k("test::sent", K);
        std::vector<uint32_t> want;  // each bucket's reference top-k, in packed positions
        for (int64_t b = 0, at = 0; b < int64_t(sizes.size()); ++b) {
          const int64_t n = sizes[b], k = c::topk_count(n, ratio);
          std::vector<float> acc(n);
          for (int64_t i = 0; i < n; ++i)
            acc[i] = feedback ? feedback_of(r0[starts[b] + i], g[starts[b] + i]) : g[starts[b] + i];
          for (uint32_t i : reference_topk(acc, k)) want.push_back(uint32_t(starts[b] + i));
          REQUIRE(c::select_into(Vec<uint32_t>(idx.data() + at, k), Vec<float>(val.data() + at, k),
                                 Vec<float>(residual.data() + starts[b], n),
                                 Vec<const float>(grad.data() + starts[b], n), starts[b], s, ws) == k);
          at += k;
        }
        REQUIRE(on_host(idx) == want);
        for (int64_t R : {1, 3, 8}) {
          Buffer<int64_t> scratch;
          const c::Selection sel = c::cut_selection(CV(idx), CV(val), V(sent_k), V(rel), S, R, scratch);
          REQUIRE(sel.bounds.back() == K);
          std::vector<uint32_t> got;
          for (int64_t j = 0; j < R; ++j) {
            if (sel.entries(j) == 0) continue;
            Buffer<uint8_t> payload("test::range", c::piece_payload_bytes(sel, j, s));
            REQUIRE(c::encode_piece(V(payload), sel, j, s, ws) == int64_t(payload.extent(0)));
            std::vector<uint32_t> ix;
            dense_sent(payload, sel.length(j), &ix);
            for (auto i : ix) got.push_back(uint32_t(sel.begin(j) + i));
          }
          REQUIRE(got == want);
        }
        // The owner's side over a range of m values with three segments (two adjacent).
        const int64_t m = 80000;
        const std::vector<c::Segment> segs = {{3, 2000}, {2000, 50000}, {60001, 80000}};
        const auto sum_h = make_grad(m, 79, Data::wide), held_h = make_grad(m, 80, Data::normal);
        Buffer<float> sum = on_device(sum_h), held = on_device(held_h);
        const int64_t kk = c::segments_count(segs, ratio);
        Buffer<uint32_t> oi("test::oi", kk);
        Buffer<float> ov("test::ov", kk), os("test::os", kk);
        Buffer<uint8_t> payload("test::owned", c::payload_bytes(m, kk, q, 64));
        REQUIRE(c::compress_segments(V(payload), V(held), CV(sum), segs, s, ws, V(oi), V(ov), V(os)) ==
                int64_t(payload.extent(0)));
        std::vector<uint32_t> ix;
        const auto d = dense_sent(payload, m, &ix);
        std::vector<uint32_t> expect;
        std::vector<char> inside(m, 0);
        for (const auto& sg : segs) {
          std::vector<float> acc(sg.end - sg.begin);
          for (int64_t i = sg.begin; i < sg.end; ++i) {
            acc[i - sg.begin] = feedback ? feedback_of(held_h[i], sum_h[i]) : sum_h[i];
            inside[i] = 1;
          }
          for (uint32_t i : reference_topk(acc, c::topk_count(sg.end - sg.begin, ratio)))
            expect.push_back(uint32_t(sg.begin + i));
        }
        REQUIRE(ix == expect);
        const auto h1 = on_host(held);
        int64_t bad = 0;
        for (int64_t i = 0; i < m; ++i) {
          if (!inside[i]) bad += bits(h1[i]) != bits(held_h[i]);
          else if (!feedback) bad += h1[i] != 0.0f;
          else bad += d[i] + h1[i] != feedback_of(held_h[i], sum_h[i]);
        }
        REQUIRE(bad == 0);
      }
}

namespace {

// x rounded to bfloat16, as bits, computed independently of kernels/compress.h:
// the two bf16 neighbours of |x| (its top 16 bits, and one bf16 ulp above;
// the one above the largest finite bf16 counts as 2^128, i.e. inf), the nearer
// in double arithmetic (exact for these magnitudes), a tie to the one with an
// even last bit. NaN gives any NaN (checked as such by the caller).
uint16_t reference_bf16(float x) {
  const uint32_t b = bits(x), sign = b & 0x80000000u, mag = b & 0x7fffffffu;
  if (mag >= 0x7f800000u) return uint16_t(b >> 16);  // inf (NaN handled by the caller)
  const uint32_t down = mag & 0xffff0000u, up = down + 0x10000u;
  const double ax = std::fabs(double(x));
  const double vdown = double(std::bit_cast<float>(down));
  const double vup = up == 0x7f800000u ? std::ldexp(1.0, 128) : double(std::bit_cast<float>(up));
  const double ddown = ax - vdown, dup = vup - ax;
  const bool take_up = dup < ddown || (dup == ddown && (down & 0x10000u) != 0);
  return uint16_t((sign | (take_up ? up : down)) >> 16);
}

}  // namespace

TEST_CASE("compress: bf16 rounds to nearest even and decodes exactly", "[kernels][compress]") {
  // Every entry (ratio 1, k == n: no index section), so the values section is
  // the whole tail of the payload: k uint16, then padding.
  std::vector<float> v = {0.0f, -0.0f, 1.0f, -1.0f, 3.14159265f, -2.71828182f, 1e-3f, 65504.0f,
                          std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::denorm_min(), -std::numeric_limits<float>::min()};
  for (uint32_t top : {0x3f80u, 0x3f81u, 0x0000u, 0x0001u, 0x7f7eu, 0x7f7fu, 0xbf80u, 0xbf81u, 0x0080u})
    for (uint32_t low : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu})  // ties with both parities
      v.push_back(std::bit_cast<float>(top << 16 | low));
  std::mt19937_64 gen(2024);
  for (int i = 0; i < 20000; ++i) {  // any bit pattern but NaN
    const uint32_t b = uint32_t(gen());
    if ((b & 0x7fffffffu) > 0x7f800000u) continue;
    v.push_back(std::bit_cast<float>(b));
  }
  const auto normal = make_grad(3001, 9, Data::wide);
  v.insert(v.end(), normal.begin(), normal.end());
  v.push_back(std::numeric_limits<float>::quiet_NaN());
  const int64_t n = int64_t(v.size()), nan_at = n - 1;
  CAPTURE(n);

  std::vector<uint32_t> all(n);
  std::iota(all.begin(), all.end(), 0u);
  auto idx = on_device(all);
  auto val = on_device(v);
  Buffer<uint8_t> payload("test::payload", c::payload_bytes(n, n, Quant::bf16, 64));
  REQUIRE(c::encode(V(payload), CV(idx), CV(val), n, Quant::bf16, 64) == 20 + (2 * n + 3) / 4 * 4);
  const auto bytes = on_host(payload);
  const auto h = c::read_header(CV(payload));
  REQUIRE((h.n == n && h.k == n && h.quant == Quant::bf16 && h.block == 0));
  Buffer<uint32_t> back_idx("test::back_idx", n);
  Buffer<float> back("test::back", n);
  c::decode(V(back_idx), V(back), CV(payload));
  const auto got = on_host(back);

  int64_t wrong_bits = 0, wrong_decode = 0, first = -1;
  for (int64_t j = 0; j < n; ++j) {
    uint16_t code;
    std::memcpy(&code, bytes.data() + 20 + 2 * j, 2);
    if (j == nan_at) {
      REQUIRE(std::isnan(got[j]));
      continue;
    }
    const uint16_t want = reference_bf16(v[j]);
    const bool bad = code != want;
    wrong_bits += bad;
    wrong_decode += bits(got[j]) != uint32_t(want) << 16;  // widening is exact: the code's bits, then 16 zeros
    if (bad && first < 0) first = j;
  }
  INFO("first wrong " << first << (first >= 0 ? fmt::format(" (0x{:08x})", bits(v[first])) : std::string()));
  CHECK(wrong_bits == 0);
  CHECK(wrong_decode == 0);

  SECTION("bf16 values round-trip bit for bit") {
    std::vector<float> exact;
    for (float x : v)
      if (!std::isnan(x)) exact.push_back(std::bit_cast<float>(bits(x) & 0xffff0000u));
    const int64_t m = int64_t(exact.size());
    std::vector<uint32_t> hi(m);
    std::iota(hi.begin(), hi.end(), 0u);
    auto i2 = on_device(hi);
    auto v2 = on_device(exact);
    Buffer<uint8_t> p2("test::payload2", c::payload_bytes(m, m, Quant::bf16, 64));
    c::encode(V(p2), CV(i2), CV(v2), m, Quant::bf16, 64);
    Buffer<uint32_t> bi("test::bi", m);
    Buffer<float> bv("test::bv", m);
    c::decode(V(bi), V(bv), CV(p2));
    const auto out = on_host(bv);
    int64_t differ = 0;
    for (int64_t j = 0; j < m; ++j) differ += bits(out[j]) != bits(exact[j]);
    REQUIRE(differ == 0);
  }
  SECTION("feedback keeps the rounding error: sent + residual == acc, and the residual is below half a bf16 ulp") {
    const int64_t m = 3001;
    const c::Settings s{1.0, Quant::bf16, 64, true};
    Buffer<float> residual("test::residual", m);
    auto grad = on_device(normal);
    const auto sent = compress_once(residual, grad, s);
    const auto d = dense_sent(sent.payload, m);
    const auto r = on_host(residual);
    int64_t bad = 0;
    for (int64_t i = 0; i < m; ++i) {
      const float g = normal[i];
      bad += d[i] + r[i] != g;
      bad += bits(d[i]) != uint32_t(reference_bf16(g)) << 16;
      // |g - bf16(g)| <= half a bf16 ulp at g's exponent: 2^-8 of the power of two at or below |g|,
      // and 2^-134 (half the subnormal spacing 2^-133) at the least
      const float ulp_half = g == 0 ? 0.0f : std::ldexp(1.0f, std::max(std::ilogb(g), -126) - 8);
      bad += std::fabs(r[i]) > ulp_half;
    }
    REQUIRE(bad == 0);
  }
}

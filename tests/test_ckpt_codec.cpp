// Checkpoint diff codecs (kernels/ckpt_codec.h) against host references:
// lossless bit-exact over random bit patterns and special values; int8's
// per-element bound over blocks of very different magnitudes, lengths that
// are not a multiple of the block, blocks of equal values, and its refusal
// of non-finite differences; topk against a host sort (count, ties,
// determinism, the error bound as an equality); encoded_bytes against the
// arrays the encoders accept.
#include <catch2/catch.hpp>
#include <algorithm>
#include <array>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>
#include "core/device_memory.h"
#include "core/views.h"
#include "core/crc32c.h"
#include "kernels/ckpt_codec.h"

using namespace xx;
namespace cc = xx::kernels::ckpt_codec;
using cc::Codec;
using cc::CodecSetting;

namespace {

template <class T>
Buffer<T> to_device(const std::vector<T>& host) {
  Buffer<T> b("test::ckpt_codec", int64_t(host.size()));
  auto m = xx::host_staging(b);
  for (size_t i = 0; i < host.size(); ++i) m(i) = host[i];
  Kokkos::deep_copy(b, m);
  return b;
}

template <class T>
std::vector<T> to_host(const Buffer<T>& b) {
  auto m = xx::host_copy(b);
  return std::vector<T>(m.data(), m.data() + m.extent(0));
}

template <class T> Vec<T> out(const Buffer<T>& b) { return Vec<T>(b.data(), b.extent(0)); }
template <class T> Vec<const T> in(const Buffer<T>& b) { return Vec<const T>(b.data(), b.extent(0)); }

uint32_t bits(float x) { return std::bit_cast<uint32_t>(x); }
float from_bits(uint32_t u) { return std::bit_cast<float>(u); }

// Gap from |x| to the next float up (for FLT_MAX, the gap below it doubled: 2^104).
long double ulp(float x) {
  const float a = std::fabs(x);
  if (a >= FLT_MAX) return std::ldexp(1.0L, 104);
  return (long double)std::nextafter(a, std::numeric_limits<float>::infinity()) - (long double)a;
}

// NaNs with payloads and both signs, signed zeros, infinities, subnormals, extremes.
std::vector<float> special_values() {
  return {from_bits(0x7fc00000u), from_bits(0xffc00000u), from_bits(0x7f800001u), from_bits(0x7fbfffffu),
          from_bits(0xff812345u), from_bits(0x7fc0beefu), 0.0f, -0.0f,
          std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
          std::numeric_limits<float>::denorm_min(), -std::numeric_limits<float>::denorm_min(),
          from_bits(0x007fffffu), from_bits(0x80400000u), FLT_MIN, -FLT_MIN, FLT_MAX, -FLT_MAX, 1.0f, -1.0f,
          3.14159265f, 1e-30f};
}

std::vector<float> lossless_round_trip(const std::vector<float>& value, const std::vector<float>& base,
                                       std::vector<uint32_t>* diff_out = nullptr) {
  auto v = to_device(value), b = to_device(base);
  Buffer<uint32_t> diff("test::diff", int64_t(value.size()));
  cc::lossless_encode<float>(out(diff), in(v), in(b));
  Buffer<float> restored("test::restored", int64_t(value.size()));
  cc::lossless_decode<float>(out(restored), in(diff), in(b));
  if (diff_out) *diff_out = to_host(diff);
  return to_host(restored);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (bits(a[i]) != bits(b[i])) return false;
  return true;
}

struct Int8Encoded {
  std::vector<int8_t> codes;
  std::vector<float> scales, restored;
  cc::Int8Result result;
};

Int8Encoded int8_round_trip(const std::vector<float>& value, const std::vector<float>& base, int64_t block) {
  const int64_t n = int64_t(value.size());
  auto v = to_device(value), b = to_device(base);
  Buffer<int8_t> codes("test::codes", n);
  Buffer<float> scales("test::scales", cc::scale_count(n, block)), restored("test::restored", n);
  Int8Encoded e;
  e.result = cc::int8_encode(out(codes), out(scales), in(v), in(b), block);
  if (e.result.ok()) cc::int8_decode(out(restored), in(codes), in(scales), in(b), block);
  e.codes = to_host(codes);
  e.scales = to_host(scales);
  e.restored = to_host(restored);
  return e;
}

// Checks the int8 bound element by element; returns the largest error / (scale / 2) seen.
double check_int8_bound(const std::vector<float>& value, const std::vector<float>& base, const Int8Encoded& e,
                        int64_t block) {
  double worst = 0;
  for (size_t i = 0; i < value.size(); ++i) {
    const float s = e.scales[i / block], d = value[i] - base[i], got = e.restored[i];
    const long double err = std::fabs((long double)got - (long double)value[i]);
    const long double bound = (long double)s / 2 + ulp(d) / 2 + ulp(got) / 2;
    INFO("i = " << i << ", value " << value[i] << ", base " << base[i] << ", scale " << s << ", code "
                << int(e.codes[i]) << ", restored " << got);
    REQUIRE(std::isfinite(got));
    REQUIRE(err <= bound);
    REQUIRE(e.codes[i] >= -127);
    if (s > 0) worst = std::max(worst, double(err / ((long double)s / 2)));
  }
  return worst;
}

// The k entries with the largest |d|, ties to the lower index, in index order (by sorting everything).
std::vector<uint32_t> reference_topk(const std::vector<float>& d, int64_t k) {
  std::vector<uint32_t> order(d.size());
  std::iota(order.begin(), order.end(), 0u);
  auto key = [&](uint32_t i) { return bits(d[i]) & 0x7fffffffu; };  // NaN above inf, as the kernel ranks
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return key(a) > key(b); });
  order.resize(size_t(k));
  std::sort(order.begin(), order.end());
  return order;
}

struct TopkEncoded {
  std::vector<uint32_t> index;
  std::vector<float> kept, restored;
  cc::TopkResult result;
};

TopkEncoded topk_round_trip(const std::vector<float>& value, const std::vector<float>& base, double ratio) {
  const int64_t n = int64_t(value.size()), k = cc::kept_count(n, ratio);
  auto v = to_device(value), b = to_device(base);
  Buffer<uint32_t> index("test::index", k);
  Buffer<float> kept("test::kept", k), restored("test::restored", n);
  cc::TopkWorkspace ws(n, k);
  TopkEncoded e;
  e.result = cc::topk_encode(out(index), out(kept), in(v), in(b), ws);
  cc::topk_decode(out(restored), in(index), in(kept), in(b));
  e.index = to_host(index);
  e.kept = to_host(kept);
  e.restored = to_host(restored);
  return e;
}

}  // namespace

// ----------------------------------------------------------------------------
// lossless

TEST_CASE("ckpt_codec: lossless round trip is bit-exact for any float bits", "[kernels][ckpt_codec]") {
  std::mt19937_64 gen(6);
  std::uniform_int_distribution<uint32_t> any_bits;
  for (int64_t n : {1, 7, 2048, 2049, 10000}) {
    std::vector<float> value(n), base(n);
    for (int64_t i = 0; i < n; ++i) value[i] = from_bits(any_bits(gen)), base[i] = from_bits(any_bits(gen));
    INFO("n = " << n);
    CHECK(same_bits(lossless_round_trip(value, base), value));
  }
  // special values against special values (every pair), and against random bases
  const auto special = special_values();
  std::vector<float> value, base;
  for (float a : special)
    for (float b : special) value.push_back(a), base.push_back(b);
  CHECK(same_bits(lossless_round_trip(value, base), value));
  std::vector<float> random_base(value.size());
  for (auto& b : random_base) b = from_bits(any_bits(gen));
  CHECK(same_bits(lossless_round_trip(value, random_base), value));
}

TEST_CASE("ckpt_codec: lossless of a tensor against itself is all zero bits", "[kernels][ckpt_codec]") {
  std::vector<float> value = special_values();
  std::mt19937_64 gen(7);
  std::normal_distribution<float> normal;
  for (int i = 0; i < 5000; ++i) value.push_back(normal(gen));
  std::vector<uint32_t> diff;
  CHECK(same_bits(lossless_round_trip(value, value, &diff), value));
  CHECK(std::all_of(diff.begin(), diff.end(), [](uint32_t x) { return x == 0; }));
  // and no information in any byte plane
  auto d = to_device(diff);
  for (double h : cc::byte_plane_entropy(in(d))) CHECK(h == 0.0);
}

TEST_CASE("ckpt_codec: lossless in double is bit-exact too", "[kernels][ckpt_codec]") {
  std::mt19937_64 gen(8);
  std::vector<double> value(3000), base(3000);
  for (size_t i = 0; i < value.size(); ++i) value[i] = std::bit_cast<double>(gen()), base[i] = std::bit_cast<double>(gen());
  value[0] = -0.0, value[1] = std::bit_cast<double>(0x7ff0000000000abcull), base[2] = value[2];
  auto v = to_device(value), b = to_device(base);
  Buffer<uint64_t> diff("test::diff", 3000);
  Buffer<double> restored("test::restored", 3000);
  cc::lossless_encode<double>(out(diff), in(v), in(b));
  cc::lossless_decode<double>(out(restored), in(diff), in(b));
  const auto r = to_host(restored);
  for (size_t i = 0; i < value.size(); ++i) REQUIRE(std::bit_cast<uint64_t>(r[i]) == std::bit_cast<uint64_t>(value[i]));
  CHECK(to_host(diff)[2] == 0);
}

TEST_CASE("ckpt_codec: byte-plane entropy sees where a small change lives", "[kernels][ckpt_codec]") {
  // value = base + a tiny change: sign, exponent and high mantissa agree, so
  // the top byte plane of the XOR is (almost) all zero, the low one is busy.
  std::mt19937_64 gen(9);
  std::normal_distribution<float> normal;
  const int64_t n = 100000;
  std::vector<float> base(n), value(n);
  for (int64_t i = 0; i < n; ++i) {
    base[i] = normal(gen);
    value[i] = base[i] * (1 + 1e-5f * normal(gen));
  }
  std::vector<uint32_t> diff;
  lossless_round_trip(value, base, &diff);
  auto d = to_device(diff);
  const auto h = cc::byte_plane_entropy(in(d));
  CHECK(h[3] < 0.1);
  CHECK(h[0] > 7.5);
  // uniformly random bits: 8 bits per byte in every plane
  for (auto& x : diff) x = uint32_t(gen());
  auto r = to_device(diff);
  for (double e : cc::byte_plane_entropy(in(r))) CHECK(e > 7.99);
}

// ----------------------------------------------------------------------------
// int8

TEST_CASE("ckpt_codec: int8 codes and scales by hand", "[kernels][ckpt_codec]") {
  // base 0, max |d| 127: scale 1, codes round half to even (-63.5 -> -64, 2.5 -> 2)
  const std::vector<float> value{127.0f, -63.5f, 2.5f, 0.25f, -0.0f}, base(5, 0.0f);
  const auto e = int8_round_trip(value, base, 64);
  REQUIRE(e.result.ok());
  CHECK(e.scales == std::vector<float>{1.0f});
  CHECK(e.codes == std::vector<int8_t>{127, -64, 2, 0, 0});
  CHECK(e.restored == std::vector<float>{127.0f, -64.0f, 2.0f, 0.0f, 0.0f});
  // a block whose difference is zero has scale 0 and keeps base's bits, -0 included
  const std::vector<float> same{-0.0f, 1.5f, -2.0f};
  const auto z = int8_round_trip(same, same, 2);
  REQUIRE(z.result.ok());
  CHECK(z.scales == std::vector<float>{0.0f, 0.0f});
  CHECK(same_bits(z.restored, same));
}

TEST_CASE("ckpt_codec: int8 error bound holds over blocks of very different magnitudes", "[kernels][ckpt_codec]") {
  // Per block, the difference's magnitude is drawn from 1e-30 .. 1e30 and the
  // base's from 1e-3 .. 1e3 (sometimes 0); every fifth block is unchanged
  // (value == base), and one block in seven mixes one large and many tiny
  // differences. Lengths are not multiples of the block.
  std::mt19937_64 gen(10);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<double> diff_exp(-30, 30), base_exp(-3, 3);
  double worst = 0;
  int64_t tensors = 0;
  for (int64_t block : {64, 1, 7, 256})
    for (int64_t n : {1, 63, 64, 65, 1000, 4097}) {
      std::vector<float> value(n), base(n);
      const int64_t nb = cc::scale_count(n, block);
      for (int64_t b = 0; b < nb; ++b) {
        const float dscale = float(std::pow(10.0, diff_exp(gen))), bscale = float(std::pow(10.0, base_exp(gen)));
        const bool unchanged = b % 5 == 4, spiky = b % 7 == 3, zero_base = b % 3 == 1;
        for (int64_t i = b * block; i < std::min(n, (b + 1) * block); ++i) {
          base[i] = zero_base ? 0.0f : bscale * normal(gen);
          const float d = spiky && i != b * block ? dscale * 1e-6f * normal(gen) : dscale * normal(gen);
          value[i] = unchanged ? base[i] : base[i] + d;
        }
      }
      const auto e = int8_round_trip(value, base, block);
      INFO("block " << block << ", n = " << n);
      REQUIRE(e.result.ok());
      worst = std::max(worst, check_int8_bound(value, base, e, block));
      for (int64_t b = 0; b < nb; ++b) {
        // scale = max |d| / 127, rounded up by less than 2^-15 relative
        float m = 0;
        for (int64_t i = b * block; i < std::min(n, (b + 1) * block); ++i) m = std::max(m, std::fabs(value[i] - base[i]));
        const double s = e.scales[b], want = double(m) / 127;
        REQUIRE(s >= want);
        REQUIRE(s <= want * (1 + std::ldexp(1.0, -15)));
        if (m == 0)
          for (int64_t i = b * block; i < std::min(n, (b + 1) * block); ++i) REQUIRE(bits(e.restored[i]) == bits(base[i]));
      }
      ++tensors;
    }
  CHECK(tensors == 24);
  // the bound is not vacuous: some element gets within 10% of half a step
  CHECK(worst > 0.9);
}

TEST_CASE("ckpt_codec: int8 refuses non-finite differences and overflowing restores", "[kernels][ckpt_codec]") {
  const float inf = std::numeric_limits<float>::infinity(), nan = from_bits(0x7fc01234u);
  const int64_t block = 4;
  // block 0 fine; block 1 an inf in the tensor; block 2 NaN in the base and
  // inf - inf; block 3 a finite difference that overflows (FLT_MAX - -FLT_MAX);
  // block 4 fine, and short
  std::vector<float> value{1, 2, 3, 4, 1, inf, 3, 4, 1, 2, inf, 4, FLT_MAX, 0, 0, 0, 5, 6};
  std::vector<float> base{0, 0, 0, 0, 0, 0, 0, 0, 0, nan, inf, 0, -FLT_MAX, 0, 0, 0, 5.5f, 6};
  const auto e = int8_round_trip(value, base, block);
  CHECK_FALSE(e.result.ok());
  CHECK(e.result.refused == 4);  // one in block 1, two in block 2, one in block 3
  CHECK(std::isnan(e.scales[1]));
  CHECK(std::isnan(e.scales[2]));
  CHECK(std::isnan(e.scales[3]));
  CHECK(std::isfinite(e.scales[0]));
  CHECK(std::isfinite(e.scales[4]));
  for (int64_t i = 4; i < 16; ++i) CHECK(e.codes[i] == 0);
  // decode will not restore from a refused encoding
  auto b = to_device(base);
  auto codes = to_device(e.codes);
  auto scales = to_device(e.scales);
  Buffer<float> restored("test::restored", int64_t(value.size()));
  CHECK_THROWS_WITH(cc::int8_decode(out(restored), in(codes), in(scales), in(b), block),
                    Catch::Contains("3 of 5 block scales are NaN"));
  // a finite difference of nearly FLT_MAX: refused exactly when 127 * scale would overflow
  const std::vector<float> big{FLT_MAX, -FLT_MAX / 2}, zero(2, 0.0f);
  const auto g = int8_round_trip(big, zero, 64);
  const float s = kernels::compress::block_scale(FLT_MAX, 127);
  const bool overflows = !std::isfinite(127.0f * s);
  CHECK(overflows);  // scale rounds up past FLT_MAX / 127, and d / scale still rounds to 127
  CHECK(g.result.refused == 1);
  CHECK(std::isnan(g.scales[0]));
}

TEST_CASE("ckpt_codec: int8 decode rejects corrupt scales", "[kernels][ckpt_codec]") {
  const std::vector<float> value{1, 2, 3}, base{0, 0, 0};
  auto b = to_device(base);
  Buffer<int8_t> codes("test::codes", 3);
  Buffer<float> restored("test::restored", 3);
  for (float bad : {-1.0f, std::numeric_limits<float>::infinity(), from_bits(0x7fc00000u)}) {
    auto scales = to_device(std::vector<float>{bad});
    CHECK_THROWS_WITH(cc::int8_decode(out(restored), in(codes), in(scales), in(b), 64),
                      Catch::Contains("1 of 1 block scales"));
  }
}

// ----------------------------------------------------------------------------
// topk

TEST_CASE("ckpt_codec: kept_count by hand", "[kernels][ckpt_codec]") {
  CHECK(cc::kept_count(100, 0.07) == 7);  // 7.000000000000001 counts as 7
  CHECK(cc::kept_count(10, 0.25) == 3);   // ceil(2.5)
  CHECK(cc::kept_count(10, 0.01) == 1);   // at least one
  CHECK(cc::kept_count(5, 1.0) == 5);
  CHECK(cc::kept_count(0, 0.5) == 0);
  CHECK(cc::kept_count(1000, 0.01) == 10);
}

TEST_CASE("ckpt_codec: topk keeps exactly the k largest differences, and the error is the largest dropped one",
          "[kernels][ckpt_codec]") {
  // normal differences; few distinct magnitudes (ties everywhere); unchanged stretches
  std::mt19937_64 gen(11);
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> level(0, 3), coin(0, 1);
  for (int kind = 0; kind < 3; ++kind)
    for (int64_t n : {1, 5, 100, 2049, 70000})
      for (double ratio : {0.001, 0.01, 0.07, 0.5, 1.0}) {
        std::vector<float> value(n), base(n);
        for (int64_t i = 0; i < n; ++i) {
          base[i] = normal(gen);
          const float sign = coin(gen) ? 1.0f : -1.0f;
          const float d = kind == 0 ? normal(gen)
                          : kind == 1 ? sign * std::array<float, 4>{0.0f, 0.25f, 0.5f, 1.0f}[level(gen)]
                                      : (i / 64) % 2 ? 0.0f : normal(gen);
          value[i] = base[i] + d;
        }
        const int64_t k = cc::kept_count(n, ratio);
        const auto e = topk_round_trip(value, base, ratio);
        INFO("kind " << kind << ", n = " << n << ", ratio " << ratio << ", k = " << k);
        REQUIRE(int64_t(e.index.size()) == k);
        std::vector<float> d(n);
        for (int64_t i = 0; i < n; ++i) d[i] = value[i] - base[i];
        REQUIRE(e.index == reference_topk(d, k));
        std::vector<bool> is_kept(n, false);
        for (int64_t j = 0; j < k; ++j) {
          is_kept[e.index[j]] = true;
          REQUIRE(bits(e.kept[j]) == bits(value[e.index[j]]));
        }
        float min_kept = std::numeric_limits<float>::infinity(), max_dropped = 0, max_error = 0;
        for (int64_t i = 0; i < n; ++i) {
          const float err = std::fabs(value[i] - e.restored[i]);
          max_error = std::max(max_error, err);
          if (is_kept[i]) {
            REQUIRE(bits(e.restored[i]) == bits(value[i]));
            min_kept = std::min(min_kept, std::fabs(d[i]));
          } else {
            REQUIRE(bits(e.restored[i]) == bits(base[i]));
            max_dropped = std::max(max_dropped, std::fabs(d[i]));
          }
        }
        CHECK(max_dropped <= min_kept);
        CHECK(e.result.min_kept == min_kept);
        CHECK(e.result.max_dropped == max_dropped);
        CHECK(max_error == max_dropped);
        // the same input gives the same bits
        const auto again = topk_round_trip(value, base, ratio);
        CHECK(again.index == e.index);
        CHECK(same_bits(again.restored, e.restored));
      }
}

TEST_CASE("ckpt_codec: topk of equal differences keeps the lowest indices", "[kernels][ckpt_codec]") {
  const int64_t n = 5000;
  std::vector<float> base(n, 1.0f), value(n);
  for (int64_t i = 0; i < n; ++i) value[i] = i % 2 ? 1.5f : 0.5f;  // |d| = 0.5 everywhere, both signs
  const auto e = topk_round_trip(value, base, 0.01);
  std::vector<uint32_t> first(50);
  std::iota(first.begin(), first.end(), 0u);
  CHECK(e.index == first);
  CHECK(e.result.max_dropped == 0.5f);
  CHECK(e.result.min_kept == 0.5f);
}

TEST_CASE("ckpt_codec: topk keeps non-finite differences first and restores them exactly", "[kernels][ckpt_codec]") {
  const float inf = std::numeric_limits<float>::infinity(), nan = from_bits(0x7fc0abcdu);
  std::vector<float> value(200, 1.0f), base(200, 1.0f);
  value[150] = nan, value[3] = -inf, base[77] = inf, value[10] = 100.0f;
  const auto e = topk_round_trip(value, base, 0.02);  // k = 4
  CHECK(e.index == std::vector<uint32_t>{3, 10, 77, 150});
  CHECK(same_bits(e.restored, value));
  CHECK(e.result.max_dropped == 0.0f);
  // with k = 2 the NaN (ranked above inf) and the first infinity are kept; the largest dropped is inf
  const auto two = topk_round_trip(value, base, 0.01);
  CHECK(two.index == std::vector<uint32_t>{3, 150});
  CHECK(two.result.max_dropped == inf);
}

TEST_CASE("ckpt_codec: topk decode rejects bad indices", "[kernels][ckpt_codec]") {
  auto base = to_device(std::vector<float>(10, 0.0f));
  auto kept = to_device(std::vector<float>{1, 2, 3});
  Buffer<float> restored("test::restored", 10);
  for (const auto& bad : {std::vector<uint32_t>{1, 1, 2}, std::vector<uint32_t>{3, 2, 5}, std::vector<uint32_t>{1, 2, 10}}) {
    auto index = to_device(bad);
    CHECK_THROWS_WITH(cc::topk_decode(out(restored), in(index), in(kept), in(base)),
                      Catch::Contains("out of order or not below n = 10"));
  }
}

// ----------------------------------------------------------------------------
// sizes and settings

TEST_CASE("ckpt_codec: encoded_bytes is the size of the arrays the encoders fill", "[kernels][ckpt_codec]") {
  CHECK(cc::encoded_bytes({Codec::lossless}, 10) == 40);
  CHECK(cc::encoded_bytes({Codec::int8, 64}, 65) == 65 + 2 * 4);
  CHECK(cc::encoded_bytes({Codec::int8, 64}, 0) == 0);
  CHECK(cc::encoded_bytes({Codec::topk, 64, 0.01}, 1000) == 80);
  std::mt19937_64 gen(12);
  std::normal_distribution<float> normal;
  for (int64_t n : {1, 63, 64, 65, 3000})
    for (int64_t block : {1, 32, 64, 100}) {
      std::vector<float> value(n), base(n);
      for (int64_t i = 0; i < n; ++i) value[i] = normal(gen), base[i] = normal(gen);
      auto v = to_device(value), b = to_device(base);
      INFO("n = " << n << ", block " << block);
      // lossless
      Buffer<uint32_t> diff("test::diff", n);
      cc::lossless_encode<float>(out(diff), in(v), in(b));
      CHECK(cc::encoded_bytes({Codec::lossless}, n) == int64_t(diff.extent(0) * sizeof(uint32_t)));
      // int8: the encoder takes exactly n codes and scale_count scales, and rejects other sizes
      Buffer<int8_t> codes("test::codes", n);
      Buffer<float> scales("test::scales", cc::scale_count(n, block));
      REQUIRE(cc::int8_encode(out(codes), out(scales), in(v), in(b), block).ok());
      CHECK(cc::encoded_bytes({Codec::int8, block}, n) ==
            int64_t(codes.extent(0) * sizeof(int8_t) + scales.extent(0) * sizeof(float)));
      Buffer<float> wrong("test::wrong", cc::scale_count(n, block) + 1);
      CHECK_THROWS_AS((void)cc::int8_encode(out(codes), out(wrong), in(v), in(b), block), std::invalid_argument);
      // topk
      for (double ratio : {0.01, 0.3, 1.0}) {
        const auto e = topk_round_trip(value, base, ratio);
        CHECK(cc::encoded_bytes({Codec::topk, block, ratio}, n) ==
              int64_t(e.index.size() * sizeof(uint32_t) + e.kept.size() * sizeof(float)));
      }
    }
}

TEST_CASE("ckpt_codec: codec names and settings", "[kernels][ckpt_codec]") {
  for (Codec c : {Codec::lossless, Codec::int8, Codec::topk}) CHECK(mode_from_name<Codec>(mode_name(c)) == c);
  CHECK_FALSE(mode_from_name<Codec>("int4").has_value());
  CHECK(CodecSetting{} == CodecSetting{Codec::lossless, 64, 0.01});
  CHECK_NOTHROW(cc::check_setting({Codec::topk, 64, 1.0}));
  CHECK_THROWS_WITH(cc::check_setting({Codec::topk, 64, 0.0}), Catch::Contains("ratio must be in (0, 1]"));
  CHECK_THROWS_WITH(cc::check_setting({Codec::topk, 64, 1.5}), Catch::Contains("ratio must be in (0, 1]"));
  CHECK_THROWS_WITH(cc::check_setting({Codec::int8, 0}), Catch::Contains("block must be"));
  CHECK_NOTHROW(cc::check_setting({Codec::lossless, 0, 0.0}));  // fields of other codecs are not looked at
}

TEST_CASE("crc32c gives the Castagnoli check values", "[ckpt_codec]") {
  // The standard check value of CRC-32C, and the iSCSI test vectors (RFC 3720, B.4).
  REQUIRE(xx::crc32c("123456789", 9) == 0xE3069283u);
  std::vector<unsigned char> zeros(32, 0), ones(32, 0xFF), up(32);
  for (int i = 0; i < 32; ++i) up[i] = static_cast<unsigned char>(i);
  REQUIRE(xx::crc32c(zeros.data(), 32) == 0x8A9136AAu);
  REQUIRE(xx::crc32c(ones.data(), 32) == 0x62A8AB43u);
  REQUIRE(xx::crc32c(up.data(), 32) == 0x46DD794Eu);
  // Continuing a checksum equals one pass over the whole.
  REQUIRE(xx::crc32c(up.data() + 10, 22, xx::crc32c(up.data(), 10)) == 0x46DD794Eu);
}

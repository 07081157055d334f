// The team primitives of kernels/team.h against plain references: every row
// and column visited once, sums and maxima right for lengths that are not a
// multiple of any vector width (0, 1, 31, 33, ...), and on the host the same
// bits as the `omp simd` loops the kernels had before teams.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <random>
#include <vector>
#include "core/device_memory.h"
#include "kernels/team.h"

using namespace xx;
namespace k = xx::kernels;

namespace {

// (rows, cols) floats in [-1, 1), a fixed draw.
Buffer<float> random_floats(int64_t n, uint64_t seed) {
  Buffer<float> b("test::team_floats", n);
  auto h = xx::host_staging(b);
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (int64_t i = 0; i < n; ++i) h(i) = dist(gen);
  Kokkos::deep_copy(b, h);
  return b;
}

template <class V>
auto host(const V& v) {
  return xx::host_copy(v);
}

}  // namespace

TEST_CASE("team rows: every row once, sums and maxima of any length", "[kernels][team]") {
  for (const int64_t n : {0, 1, 2, 7, 31, 32, 33, 100, 1031}) {
    CAPTURE(n);
    const int64_t rows = 9;  // not a multiple of the device's rows per team
    const int64_t width = n > 0 ? n : 1;
    auto x = random_floats(rows * width, 40 + uint64_t(n));
    Buffer<float> sums("test::sums", rows), maxes("test::maxes", rows), plain("test::plain", rows);
    Buffer<int32_t> visits("test::visits", rows), singles("test::singles", rows);
    Buffer<float> doubled("test::doubled", rows * width);
    Kokkos::parallel_for(
        "test::team_rows", k::row_policy(rows), KOKKOS_LAMBDA(const k::TeamMember& m) {
          float* const pplain = plain.data();  // captured here: nvcc refuses a first capture inside if constexpr
          k::for_rows(m, rows, [&](int64_t i) {
            const float* r = &x(i * width);
            const float s = k::row_sum(m, n, [&](int64_t j) { return r[j]; });
            const float mx = n > 0 ? k::row_max(m, n, [&](int64_t j) { return r[j]; }) : 0.0f;
            k::row_for(m, n, [&](int64_t j) { doubled(i * width + j) = 2 * r[j]; });
            k::row_single(m, [&] {
              sums(i) = s;
              maxes(i) = mx;
              visits(i) += 1;
              singles(i) += 1;
            });
            if constexpr (k::host_member<k::TeamMember>) {  // the loop row_sum replaced, verbatim
              float p = 0;
#pragma omp simd reduction(+ : p)
              for (int64_t j = 0; j < n; ++j) p += r[j];
              pplain[i] = p;
            }
          });
        });
    auto hx = host(x), hs = host(sums), hm = host(maxes), hp = host(plain), hd = host(doubled);
    auto hv = host(visits), h1 = host(singles);
    for (int64_t i = 0; i < rows; ++i) {
      double ref = 0;
      float mx = n > 0 ? hx(i * width) : 0.0f;
      for (int64_t j = 0; j < n; ++j) ref += hx(i * width + j), mx = std::max(mx, hx(i * width + j));
      REQUIRE(hv(i) == 1);
      REQUIRE(h1(i) == 1);
      REQUIRE(std::abs(hs(i) - ref) <= 1e-6 * double(n + 1));
      REQUIRE(hm(i) == mx);
      for (int64_t j = 0; j < n; ++j) REQUIRE(hd(i * width + j) == 2 * hx(i * width + j));
      if constexpr (k::host_space<ExecSpace>) REQUIRE(hs(i) == hp(i));
    }
  }
}

TEST_CASE("team rows: the maximum wherever it sits, and a row of -inf", "[kernels][team]") {
  const int64_t n = 45;
  Buffer<float> x("test::x", 3 * n), maxes("test::maxes", 3);
  auto hx = xx::host_staging(x);
  for (int64_t j = 0; j < n; ++j) {
    hx(j) = -float(j);     // row 0: largest first
    hx(n + j) = float(j);  // row 1: largest last
    hx(2 * n + j) = -std::numeric_limits<float>::infinity();  // row 2: all -inf
  }
  Kokkos::deep_copy(x, hx);
  Kokkos::parallel_for(
      "test::team_max", k::row_policy(3), KOKKOS_LAMBDA(const k::TeamMember& m) {
        k::for_rows(m, 3, [&](int64_t i) {
          const float mx = k::row_max(m, n, [&](int64_t j) { return x(i * n + j); });
          k::row_single(m, [&] { maxes(i) = mx; });
        });
      });
  auto hm = host(maxes);
  REQUIRE(hm(0) == 0.0f);
  REQUIRE(hm(1) == float(n - 1));
  REQUIRE(std::isinf(hm(2)));
  REQUIRE(hm(2) < 0);
}

TEST_CASE("team flat: every element of a flat array once", "[kernels][team]") {
  for (const int64_t n : {0, 1, 2047, 2048, 2049, 5000}) {
    CAPTURE(n);
    Buffer<int32_t> hits("test::hits", n + 1);
    Kokkos::parallel_for(
        "test::team_flat", k::flat_policy(n),
        KOKKOS_LAMBDA(const k::TeamMember& m) { k::for_flat(m, n, [&](int64_t i) { hits(i) += int32_t(i % 7) + 1; }); });
    auto h = host(hits);
    for (int64_t i = 0; i < n; ++i) REQUIRE(h(i) == int32_t(i % 7) + 1);
    REQUIRE(h(n) == 0);
  }
}

TEST_CASE("team columns: column sums in row order, scatter in row order", "[kernels][team]") {
  for (const int64_t cols : {1, 31, 32, 33, 70}) {
    for (const int64_t rows : {0, 1, 5, 19}) {
      CAPTURE(cols, rows);
      auto x = random_floats(rows * cols + 1, 7 * uint64_t(cols) + uint64_t(rows));
      Buffer<float> sums("test::col_sums", cols);
      Kokkos::deep_copy(sums, 0.5f);  // store adds: parameter gradients accumulate
      Kokkos::parallel_for(
          "test::team_column_sums", k::column_sum_policy<float>(cols), KOKKOS_LAMBDA(const k::TeamMember& m) {
            k::column_sums(
                m, rows, cols, [&](int64_t i, int64_t c) { return x(i * cols + c); },
                [&](int64_t c, float s) { sums(c) += s; });
          });
      // A scatter into 3 targets whose rows repeat: each target column is
      // written as a running sequence, so the order is visible in the result.
      Buffer<float> seq("test::seq", 3 * cols);
      Kokkos::parallel_for(
          "test::team_column_rows", k::column_policy(cols), KOKKOS_LAMBDA(const k::TeamMember& m) {
            k::column_rows(m, rows, cols, [&](int64_t i, int64_t c) {
              float& s = seq((i % 3) * cols + c);
              s = s * 0.5f + float(i + 1);
            });
          });
      auto hx = host(x), hs = host(sums), hq = host(seq);
      for (int64_t c = 0; c < cols; ++c) {
        float ref = 0;
        for (int64_t i = 0; i < rows; ++i) ref += hx(i * cols + c);
        if constexpr (k::host_space<ExecSpace>) REQUIRE(hs(c) == 0.5f + ref);  // rows in order: exact
        else REQUIRE(std::abs(hs(c) - (0.5f + ref)) <= 1e-5f);
        for (int64_t t = 0; t < 3; ++t) {
          float s = 0;
          for (int64_t i = t; i < rows; i += 3) s = s * 0.5f + float(i + 1);
          REQUIRE(hq(t * cols + c) == s);
        }
      }
    }
  }
}

TEST_CASE("team rows: the first index where a predicate holds, or the length", "[kernels][team]") {
  for (const int64_t n : {0, 1, 31, 33, 100}) {
    CAPTURE(n);
    const int64_t rows = 9;
    const int64_t width = n > 0 ? n : 1;
    // row i marks the entries j with (j * 7 + i) % 13 == 0 from column i * 3 on: none in some rows
    Buffer<int32_t> firsts("test::firsts", rows);
    Kokkos::parallel_for(
        "test::team_first", k::row_policy(rows), KOKKOS_LAMBDA(const k::TeamMember& m) {
          k::for_rows(m, rows, [&](int64_t i) {
            const int64_t f = k::row_first(m, n, [&](int64_t j) { return j >= i * 3 && (j * 7 + i) % 13 == 0; });
            k::row_single(m, [&] { firsts(i) = int32_t(f); });
          });
        });
    auto hf = host(firsts);
    for (int64_t i = 0; i < rows; ++i) {
      int64_t ref = n;
      for (int64_t j = 0; j < n; ++j)
        if (j >= i * 3 && (j * 7 + i) % 13 == 0) {
          ref = j;
          break;
        }
      CAPTURE(i, width);
      REQUIRE(hf(i) == ref);
    }
  }
}

TEST_CASE("team histograms: every item counted in its bin, skipped ones not", "[kernels][team]") {
  const int64_t bins = 256;
  for (const int64_t n : {0, 1, 255, 2048, 5000}) {
    CAPTURE(n);
    const int64_t rows = 5;
    const int64_t width = n > 0 ? n : 1;
    auto x = random_floats(rows * width, 70 + uint64_t(n));
    Buffer<int32_t> hist("test::hist", rows * bins);
    Kokkos::deep_copy(hist, -7);  // every bin must be written, the empty ones with 0
    Kokkos::parallel_for(
        "test::team_histogram", k::histogram_policy(rows, bins), KOKKOS_LAMBDA(const k::TeamMember& m) {
          const int64_t i = m.league_rank();
          k::row_histogram(
              m, n, bins,
              [&](int64_t j) {  // negatives skipped; the rest in 256 bins by value
                const float v = x(i * width + j);
                return v < -0.5f ? int64_t(-1) : int64_t((v + 1.0f) * 0.5f * float(bins)) % bins;
              },
              &hist(i * bins));
        });
    auto hx = host(x);
    auto hh = host(hist);
    for (int64_t i = 0; i < rows; ++i) {
      std::vector<int32_t> ref(bins, 0);
      for (int64_t j = 0; j < n; ++j) {
        const float v = hx(i * width + j);
        if (v >= -0.5f) ++ref[size_t(int64_t((v + 1.0f) * 0.5f * float(bins)) % bins)];
      }
      int64_t total = 0;
      for (int64_t b = 0; b < bins; ++b) {
        REQUIRE(hh(i * bins + b) == ref[size_t(b)]);
        total += hh(i * bins + b);
      }
      if (n > 100) REQUIRE(total > n / 2);  // the draw leaves about three quarters counted
    }
  }
}

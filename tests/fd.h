// Finite-difference helpers for the kernel tests: every backward is checked
// against central differences of a scalar loss L = sum(out * R), in double.
#pragma once
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>
#include "core/device_memory.h"
#include "core/views.h"

namespace xx::test {

// A view's values on the host, whatever its memory space.
template <class View>
std::vector<typename View::non_const_value_type> host(const View& v) {
  auto h = xx::host_copy(v);
  return std::vector<typename View::non_const_value_type>(h.data(), h.data() + h.size());
}

// A host vector's values in kernel memory: what kernels and the GEMM seam take.
template <class T>
Buffer<T> in_kernel(const std::vector<T>& v) {
  Buffer<T> b(Kokkos::view_alloc(Kokkos::WithoutInitializing, "test::values"), v.size());
  Kokkos::deep_copy(b, Kokkos::View<const T*, Kokkos::HostSpace, Unmanaged>(v.data(), v.size()));
  return b;
}

inline Buffer<double> random_buffer(int64_t n, uint64_t seed, double scale = 1.0) {
  Buffer<double> b("test::random", n);
  auto h = xx::host_staging(b);
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> dist(0.0, scale);
  for (int64_t i = 0; i < n; ++i) h(i) = dist(gen);
  Kokkos::deep_copy(b, h);
  return b;
}

inline double get(const Buffer<double>& b, int64_t i) {
  double v;
  Kokkos::deep_copy(v, Kokkos::subview(b, i));
  return v;
}
inline void set(const Buffer<double>& b, int64_t i, double v) { Kokkos::deep_copy(Kokkos::subview(b, i), v); }

inline double dot(const Buffer<double>& a, const Buffer<double>& b) {
  auto ha = xx::host_copy(a);
  auto hb = xx::host_copy(b);
  double s = 0;
  for (size_t i = 0; i < ha.extent(0); ++i) s += ha(i) * hb(i);
  return s;
}

// Compares the analytic gradient of `loss` with respect to x against central
// differences at up to `samples` entries (all of them when x is small).
inline void check_gradient(const char* what, const Buffer<double>& x, const Buffer<double>& analytic,
                           const std::function<double()>& loss, int samples = 64, double h = 1e-5,
                           double rtol = 1e-6, double atol = 1e-9) {
  const int64_t n = x.extent(0);
  const int64_t stride = std::max<int64_t>(1, n / samples);
  double worst = 0;
  for (int64_t i = 0; i < n; i += stride) {
    const double x0 = get(x, i);
    set(x, i, x0 + h);
    const double lp = loss();
    set(x, i, x0 - h);
    const double lm = loss();
    set(x, i, x0);
    const double fd = (lp - lm) / (2 * h), an = get(analytic, i);
    const double err = std::abs(fd - an) / (std::abs(fd) + std::abs(an) + atol / rtol);
    worst = std::max(worst, err);
    INFO(what << "[" << i << "]: finite difference " << fd << ", analytic " << an);
    REQUIRE(std::abs(fd - an) <= rtol * (std::abs(fd) + std::abs(an)) + atol);
  }
  CAPTURE(what, worst);
}

// Plain O(T^2) causal attention on the host, as an independent reference:
// q, k (BH*T, D), v (BH*T, Dv); scores scaled by 1/sqrt(D).
inline std::vector<double> naive_attention(const std::vector<double>& q, const std::vector<double>& k,
                                           const std::vector<double>& v, int64_t BH, int64_t T, int64_t D,
                                           int64_t Dv) {
  std::vector<double> out(BH * T * Dv, 0.0);
  for (int64_t bh = 0; bh < BH; ++bh)
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> s(t + 1);
      double m = -1e300, z = 0;
      for (int64_t u = 0; u <= t; ++u) {
        double d = 0;
        for (int64_t c = 0; c < D; ++c) d += q[(bh * T + t) * D + c] * k[(bh * T + u) * D + c];
        s[u] = d / std::sqrt(double(D));
        m = std::max(m, s[u]);
      }
      for (auto& x : s) z += (x = std::exp(x - m));
      for (int64_t u = 0; u <= t; ++u)
        for (int64_t c = 0; c < Dv; ++c) out[(bh * T + t) * Dv + c] += s[u] / z * v[(bh * T + u) * Dv + c];
    }
  return out;
}

inline Mat<double> M(const Buffer<double>& b, int64_t rows, int64_t cols) { return mat(b, rows, cols); }
inline Vec<double> V(const Buffer<double>& b) { return Vec<double>(b.data(), b.extent(0)); }

}  // namespace xx::test

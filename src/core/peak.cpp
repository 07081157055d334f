#include "core/peak.h"
#include <algorithm>
#include <chrono>
#include <vector>
#include "core/views.h"
#include "kernels/linear.h"

namespace xx {

double measure_sgemm_gflops(const ModelConfig& m, int batch, double seconds) {
  const int64_t N = int64_t(batch) * m.seq, C = m.dim, F = m.ffn;
  struct Shape { int64_t out, in; };
  const std::vector<Shape> shapes = {{3 * C, C}, {C, C}, {2 * F, C}, {C, F}};
  Buffer<float> x("peak::x", N * std::max(C, F)), w("peak::w", 2 * F * std::max(C, F) + 3 * C * C),
      dx("peak::dx", N * std::max(C, F)), y("peak::y", N * std::max(3 * C, 2 * F)), dw("peak::dw", 2 * F * std::max(C, F) + 3 * C * C);
  Kokkos::deep_copy(x, 0.01f);
  Kokkos::deep_copy(w, 0.01f);
  Kokkos::deep_copy(y, 0.01f);
  double flops = 0;
  auto pass = [&] {
    for (auto s : shapes) {  // forward, input gradient, weight gradient of each linear layer
      kernels::linear_forward<float>(mat(y, N, s.out), mat(x, N, s.in), mat(w, s.out, s.in));
      kernels::linear_backward<float>(mat(dx, N, s.in), mat(dw, s.out, s.in), mat(y, N, s.out), mat(x, N, s.in),
                                      mat(w, s.out, s.in));
      flops += 3.0 * 2.0 * double(N) * double(s.out) * double(s.in);
    }
    ExecSpace().fence();
  };
  pass();  // warm up
  // The best of several short trials: on a shared machine a slow trial
  // measures the neighbours, not the core.
  constexpr int kTrials = 5;
  double best = 0;
  for (int trial = 0; trial < kTrials; ++trial) {
    flops = 0;
    const auto t0 = std::chrono::steady_clock::now();
    double elapsed = 0;
    while (elapsed < seconds / kTrials) {
      pass();
      elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    best = std::max(best, flops / elapsed / 1e9);
  }
  return best;
}

}  // namespace xx

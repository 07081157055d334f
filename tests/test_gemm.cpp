// The GEMM seam (kernels/gemm.h) against a plain double-precision reference:
// every backend this binary has, every transpose, alpha and beta, fixed and
// varying shapes, fp32 and 16-bit operands (native or widened).
#include <catch2/catch.hpp>
#include <algorithm>
#include <bit>
#include <cmath>
#include <random>
#include <string>
#include <vector>
#include "fd.h"
#include "kernels/gemm.h"

using namespace xx;
using test::host;
using test::in_kernel;
namespace k = xx::kernels;

namespace {

// Restores "auto" when a test chose another backend.
struct BackendChoice {
  explicit BackendChoice(const std::string& name) { k::select_gemm_backend(*mode_from_name<GemmChoice>(name)); }
  ~BackendChoice() { k::select_gemm_backend(GemmChoice::automatic); }
};

std::vector<float> random_values(int64_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

// c = alpha op(a) op(b) + beta c in double, a (ar, ac) and b (br, bc) row-major.
std::vector<double> reference(const std::vector<float>& a, int64_t ar, int64_t ac, bool ta, const std::vector<float>& b,
                              int64_t br, int64_t bc, bool tb, double alpha, double beta, const std::vector<float>& c0) {
  const int64_t M = ta ? ac : ar, K = ta ? ar : ac, N = tb ? br : bc;
  std::vector<double> c(M * N);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t p = 0; p < K; ++p)
        s += double(ta ? a[p * ac + i] : a[i * ac + p]) * double(tb ? b[j * bc + p] : b[p * bc + j]);
      c[i * N + j] = alpha * s + beta * c0[i * N + j];
    }
  return c;
}

std::vector<std::string> backends() {
  std::vector<std::string> out;
  for (const char* name : {"onednn", "cublas", "blas"}) {
    try {
      k::select_gemm_backend(*mode_from_name<GemmChoice>(name));
      out.push_back(name);
    } catch (const std::runtime_error&) {
    }
  }
  k::select_gemm_backend(GemmChoice::automatic);
  return out;
}

}  // namespace

TEST_CASE("gemm: every backend, transpose, alpha and beta matches a double reference", "[gemm]") {
  const auto names = backends();
  REQUIRE_FALSE(names.empty());
#ifdef XX_HAVE_DNNL
  REQUIRE(names.front() == "onednn");  // built with oneDNN: it must be able to run
#endif
  for (const auto& name : names) {
    BackendChoice choice(name);
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (bool varying : {false, true})
          for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{37, 19, 53}, {64, 48, 16}, {1, 7, 3}}) {
            CAPTURE(name, ta, tb, varying, M, N, K);
            const int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
            const auto a = random_values(ar * ac, 1), b = random_values(br * bc, 2), c0 = random_values(M * N, 3);
            const auto ka = in_kernel(a), kb = in_kernel(b);
            for (auto [alpha, beta] : {std::pair<float, float>{1, 0}, {0.5f, 1}, {2, -0.25f}}) {
              auto kc = in_kernel(c0);
              k::GemmOperand A{ka.data(), ar, ac, k::Precision::fp32, ta, varying};
              k::GemmOperand B{kb.data(), br, bc, k::Precision::fp32, tb, false};
              k::gemm(A, B, alpha, beta, mat(kc, M, N));
              const auto c = host(kc);
              const auto want = reference(a, ar, ac, ta, b, br, bc, tb, alpha, beta, c0);
              for (int64_t i = 0; i < M * N; ++i) REQUIRE(c[i] == Approx(want[i]).epsilon(1e-5).margin(1e-5));
            }
          }
  }
}

TEST_CASE("gemm: 16-bit operands multiply exactly their 16-bit values, accumulating in fp32", "[gemm]") {
  for (const auto& name : backends()) {
    BackendChoice choice(name);
    for (auto [widened, type] : {std::pair{false, k::Precision::bf16}, std::pair{false, k::Precision::fp16},
                                 std::pair{true, k::Precision::bf16}, std::pair{true, k::Precision::fp16}}) {
      k::set_widened_products(widened);
      CAPTURE(name, widened, int(type), k::gemm_backend().native(type));
      const int64_t M = 33, N = 21, K = 70;
      auto a = random_values(M * K, 4), b = random_values(N * K, 5);
      Buffer<uint16_t> ka16("test::a16", a.size()), kb16("test::b16", b.size());
      k::pack_half(ka16.data(), in_kernel(a).data(), int64_t(a.size()), type);
      k::pack_half(kb16.data(), in_kernel(b).data(), int64_t(b.size()), type);
      const auto a16 = host(ka16), b16 = host(kb16);
      for (size_t i = 0; i < a.size(); ++i) a[i] = k::half_bits_to_float(a16[i], type);  // the values multiplied
      for (size_t i = 0; i < b.size(); ++i) b[i] = k::half_bits_to_float(b16[i], type);
      Buffer<float> kc("test::c", M * N), kc_again("test::c_again", M * N);
      k::GemmOperand A{ka16.data(), M, K, type, false}, B{kb16.data(), N, K, type, true};  // c = a b^T, as linear
      k::gemm(A, B, 1.0f, 0.0f, mat(kc, M, N));
      k::gemm(A, B, 1.0f, 0.0f, mat(kc_again, M, N));
      const auto c = host(kc), c_again = host(kc_again);
      const auto want = reference(a, M, K, false, b, N, K, true, 1, 0, std::vector<float>(M * N, 0.0f));
      for (int64_t i = 0; i < M * N; ++i) {
        REQUIRE(c[i] == Approx(want[i]).epsilon(1e-5).margin(1e-5));  // fp32 accumulation, not 16-bit
        REQUIRE(std::bit_cast<uint32_t>(c[i]) == std::bit_cast<uint32_t>(c_again[i]));  // the same bits again
      }
      k::set_widened_products(false);
    }
  }
}

// precision fp32 products tf32: on a backend with TF32 (cuBLAS) the fp32
// GEMMs round their operands to TF32 (10 significant bits), elsewhere they
// stay strict fp32, bit for bit, and the start-up line says which.
TEST_CASE("gemm: products tf32 runs fp32 as TF32 where the backend has it, and says so where not", "[gemm]") {
  for (const auto& name : backends()) {
    BackendChoice choice(name);
    CAPTURE(name);
    const int64_t M = 29, N = 17, K = 90;
    const auto a = random_values(M * K, 6), b = random_values(N * K, 7);
    const auto ka = in_kernel(a), kb = in_kernel(b);
    const k::GemmOperand A{ka.data(), M, K, k::Precision::fp32, false}, B{kb.data(), N, K, k::Precision::fp32, true};
    auto product = [&] {
      auto kc = in_kernel(std::vector<float>(M * N, 0.0f));
      k::gemm(A, B, 1.0f, 0.0f, mat(kc, M, N));
      return host(kc);
    };
    const auto strict = product();
    CHECK(k::gemm_report(k::Precision::fp32).find("tf32") == std::string::npos);
    k::set_tf32_products(true);
    const bool tf32 = k::gemm_backend().tf32();
    CHECK(k::tf32_products() == tf32);
    const auto asked = product();
    const std::string report = k::gemm_report(k::Precision::fp32);
    k::set_tf32_products(false);
    if (!tf32) {
      CHECK(report.find("products tf32 asked, but " + name + " has no TF32") != std::string::npos);
      for (int64_t i = 0; i < M * N; ++i)
        REQUIRE(std::bit_cast<uint32_t>(asked[i]) == std::bit_cast<uint32_t>(strict[i]));
      continue;
    }
    CHECK(report.find("fp32 products as TF32") != std::string::npos);
    const auto want = reference(a, M, K, false, b, N, K, true, 1, 0, std::vector<float>(M * N, 0.0f));
    double gap = 0, top = 0;
    for (int64_t i = 0; i < M * N; ++i) {
      gap = std::max(gap, std::fabs(double(asked[i]) - want[i]));
      top = std::max(top, std::fabs(want[i]));
    }
    CHECK(gap / top < 1e-2);  // 10 significant bits per operand
    CHECK(asked != strict);   // the rounding is really there
  }
}

TEST_CASE("gemm: an empty sum scales c by beta; mismatched shapes are refused", "[gemm]") {
  auto c = in_kernel(std::vector<float>{1, 2, 3, 4});
  const Buffer<float> a("test::a", 1), b("test::b", 1);
  k::gemm({a.data(), 2, 0, k::Precision::fp32, false}, {b.data(), 0, 2, k::Precision::fp32, false}, 1.0f, 0.5f,
          mat(c, 2, 2));
  CHECK(host(c) == std::vector<float>{0.5f, 1, 1.5f, 2});
  CHECK_THROWS_AS(k::gemm({a.data(), 2, 3, k::Precision::fp32, false}, {b.data(), 2, 2, k::Precision::fp32, false},
                          1.0f, 0.0f, mat(c, 2, 2)),
                  std::logic_error);
#ifdef KOKKOS_ENABLE_CUDA
  const char* absent = "blas";  // KokkosKernels is not part of a CUDA build
#else
  const char* absent = "cublas";  // nor cuBLAS of a host one
#endif
  CHECK_THROWS_WITH(k::select_gemm_backend(*mode_from_name<GemmChoice>(absent)), Catch::Contains("not built into this binary"));
}

TEST_CASE("gemm: the start-up line names the backend and says how 16-bit products run", "[gemm]") {
  const std::string fp32 = k::gemm_report(k::Precision::fp32), bf16 = k::gemm_report(k::Precision::bf16);
  CHECK(fp32.rfind(k::gemm_backend().name() + ": ", 0) == 0);
  const bool native = k::gemm_backend().native(k::Precision::bf16);
  CHECK(bf16.find(native ? "bf16 products run natively" : "bf16 is EMULATED") != std::string::npos);
  if (native) {  // asked to widen: says so, and the kernel is the fp32 one
    k::set_widened_products(true);
    CHECK(k::gemm_report(k::Precision::bf16).find("bf16 products widened to fp32") != std::string::npos);
    CHECK(k::gemm_kernel(k::Precision::bf16) == k::gemm_backend().kernel(k::Precision::fp32) + " (16-bit widened to fp32)");
    k::set_widened_products(false);
  }
  CHECK(k::gemm_kernel(k::Precision::bf16) == k::gemm_backend().kernel(k::Precision::bf16));
  const auto names = backends();
  if (std::find(names.begin(), names.end(), "blas") == names.end()) return;  // a CUDA build has no blas
  BackendChoice blas("blas");
  CHECK(k::gemm_report(k::Precision::bf16).find("bf16 is EMULATED") != std::string::npos);
  CHECK_FALSE(k::gemm_backend().native(k::Precision::bf16));
}

// A batch at strides with gaps (as attention's heads lie T rows apart): each
// product equals the single GEMM on the same operands within fp32 rounding
// (oneDNN's batched kernel may block differently; the loop of blas is the
// single GEMM, bit for bit), the gaps of c stay untouched, and a rerun gives
// the same bits.
TEST_CASE("gemm_batched: every backend, transpose and type matches the single GEMM per product", "[gemm]") {
  const int64_t count = 5;
  for (const auto& name : backends()) {
    BackendChoice choice(name);
    for (k::Precision type : {k::Precision::fp32, k::Precision::bf16, k::Precision::fp16})
      for (bool widened : {false, true})
        for (bool ta : {false, true})
          for (bool tb : {false, true})
            for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{37, 19, 53}, {64, 48, 16}, {64, 64, 24}}) {
              if (type == k::Precision::fp32 && widened) continue;
              k::set_widened_products(widened);
              CAPTURE(name, int(type), widened, ta, tb, M, N, K);
              const int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
              const k::GemmBatch batch{count, ar * ac + 13, br * bc + 3 * bc, M * N + 7};
              const auto a = random_values(count * batch.a, 6), b = random_values(count * batch.b, 7);
              const auto c0 = random_values(count * batch.c, 8);
              const auto ka = in_kernel(a), kb = in_kernel(b);
              Buffer<uint16_t> ka16("test::a16", a.size()), kb16("test::b16", b.size());
              if (type != k::Precision::fp32) {
                k::pack_half(ka16.data(), ka.data(), int64_t(a.size()), type);
                k::pack_half(kb16.data(), kb.data(), int64_t(b.size()), type);
              }
              const void* pa = type == k::Precision::fp32 ? static_cast<const void*>(ka.data()) : ka16.data();
              const void* pb = type == k::Precision::fp32 ? static_cast<const void*>(kb.data()) : kb16.data();
              const k::GemmOperand A{pa, ar, ac, type, ta}, B{pb, br, bc, type, tb};
              for (auto [alpha, beta] : {std::pair<float, float>{1, 0}, {0.5f, 1}}) {
                auto kc = in_kernel(c0), kagain = in_kernel(c0), ksingle = in_kernel(c0);
                k::gemm_batched(A, B, alpha, beta, mat(kc, M, N), batch);
                k::gemm_batched(A, B, alpha, beta, mat(kagain, M, N), batch);
                const int64_t size = type == k::Precision::fp32 ? 4 : 2;
                for (int64_t n = 0; n < count; ++n) {
                  k::GemmOperand An = A, Bn = B;
                  An.data = static_cast<const char*>(pa) + n * batch.a * size;
                  Bn.data = static_cast<const char*>(pb) + n * batch.b * size;
                  k::gemm(An, Bn, alpha, beta, Mat<float>(ksingle.data() + n * batch.c, M, N));
                }
                const auto c = host(kc), again = host(kagain), single = host(ksingle);
                REQUIRE(c == again);
                for (size_t i = 0; i < c.size(); ++i) {
                  const bool gap = int64_t(i) % batch.c >= M * N;
                  if (gap) REQUIRE(std::bit_cast<uint32_t>(c[i]) == std::bit_cast<uint32_t>(c0[i]));
                  else if (name == "blas") REQUIRE(std::bit_cast<uint32_t>(c[i]) == std::bit_cast<uint32_t>(single[i]));
                  else REQUIRE(c[i] == Approx(single[i]).epsilon(1e-5).margin(1e-5));
                }
              }
              k::set_widened_products(false);
            }
  }
}

TEST_CASE("gemm_batched: double loops on gemm_f64; a batch of one is the single GEMM", "[gemm]") {
  const int64_t M = 5, N = 4, K = 3, count = 3;
  std::vector<double> a(count * M * K), b(count * K * N), c(count * M * N, 0.0);
  for (size_t i = 0; i < a.size(); ++i) a[i] = double(i % 7) - 3;
  for (size_t i = 0; i < b.size(); ++i) b[i] = double(i % 5) - 2;
  {
    const auto ka = in_kernel(a), kb = in_kernel(b);
    auto kc = in_kernel(c);
    k::gemm_batched<double>("N", k::GemmIn<double>(Mat<const double>(ka.data(), M, K)), "N",
                            k::GemmIn<double>(Mat<const double>(kb.data(), K, N)), 1.0, 0.0,
                            Mat<double>(kc.data(), M, N), {count, M * K, K * N, M * N});
    c = host(kc);
  }
  for (int64_t n = 0; n < count; ++n)
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double s = 0;
        for (int64_t p = 0; p < K; ++p) s += a[n * M * K + i * K + p] * b[n * K * N + p * N + j];
        REQUIRE(c[n * M * N + i * N + j] == s);  // small integers: exact
      }
  const auto fa = in_kernel(random_values(M * K, 9)), fb = in_kernel(random_values(K * N, 10));
  Buffer<float> one("test::one", M * N), single("test::single", M * N);
  const k::GemmOperand A{fa.data(), M, K}, B{fb.data(), K, N};
  k::gemm_batched(A, B, 1.0f, 0.0f, mat(one, M, N), {1, 0, 0, 0});
  k::gemm(A, B, 1.0f, 0.0f, mat(single, M, N));
  CHECK(host(one) == host(single));
}

// The fallback GEMM of host builds: KokkosBlas::gemm, i.e. the BLAS
// KokkosKernels was built on (Debian: OpenBLAS). fp32 only: 16-bit operands
// reach it widened (kernels/gemm.cpp). Also the double GEMMs (gemm_f64) of the
// gradient checks. A build against a CUDA Kokkos has no KokkosKernels: there
// gemm_cublas.cpp serves both, and this file builds nothing.
#include "kernels/gemm.h"

#ifdef KOKKOS_ENABLE_CUDA

namespace xx::kernels {
std::unique_ptr<GemmBackend> make_blas_gemm() { return nullptr; }
}  // namespace xx::kernels

#else

#include <KokkosBlas3_gemm.hpp>
#include <dlfcn.h>
#include <fmt/format.h>

namespace xx::kernels {
namespace {

// A C function of the BLAS library, looked up at run time: present when the
// process links OpenBLAS (directly or as Debian's libblas alternative).
std::string blas_string(const char* symbol) {
  using Fn = char* (*)();
  auto fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, symbol));
  std::string s = fn ? fn() : "";
  s.erase(0, s.find_first_not_of(" \t\n"));
  s.erase(s.find_last_not_of(" \t\n") + 1);
  return s;
}

class BlasGemm : public GemmBackend {
 public:
  std::string name() const override { return "blas"; }
  std::string describe() const override {
    return fmt::format("blas: KokkosBlas::gemm -> {}", std::is_same_v<ExecSpace, Kokkos::DefaultHostExecutionSpace>
                                                            ? "BLAS (host)"
                                                            : "cuBLAS");
  }
  bool available() const override { return true; }
  std::string unavailable_reason() const override { return ""; }
  bool native(Precision type) const override { return type == Precision::fp32; }
  // OpenBLAS's build and the core it chose (OPENBLAS_CORETYPE changes it).
  std::string kernel(Precision) const override {
    if (!std::is_same_v<ExecSpace, Kokkos::DefaultHostExecutionSpace>) return "cuBLAS";
    const std::string config = blas_string("openblas_get_config"), core = blas_string("openblas_get_corename");
    return config.empty() ? "BLAS (not OpenBLAS, unidentified)" : config + (core.empty() ? "" : ", core " + core);
  }
  void run(const GemmOperand& a, const GemmOperand& b, float alpha, float beta, float* c) override {
    Mat<const float> A(static_cast<const float*>(a.data), a.rows, a.cols);
    Mat<const float> B(static_cast<const float*>(b.data), b.rows, b.cols);
    Mat<float> C(c, a.op_rows(), b.op_cols());
    KokkosBlas::gemm(a.transposed ? "T" : "N", b.transposed ? "T" : "N", alpha, A, B, beta, C);
  }
};

}  // namespace

std::unique_ptr<GemmBackend> make_blas_gemm() { return std::make_unique<BlasGemm>(); }

void gemm_f64(const GemmOperand& a, const GemmOperand& b, double alpha, double beta, Mat<double> c) {
  KokkosBlas::gemm(a.transposed ? "T" : "N", b.transposed ? "T" : "N", alpha,
                   Mat<const double>(static_cast<const double*>(a.data), a.rows, a.cols),
                   Mat<const double>(static_cast<const double*>(b.data), b.rows, b.cols), beta, c);
}

}  // namespace xx::kernels

#endif  // KOKKOS_ENABLE_CUDA

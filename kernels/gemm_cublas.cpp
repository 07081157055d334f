// The device GEMM: cuBLAS, for builds whose Kokkos runs on CUDA (the cuda
// preset); a host build gets no backend from this file.
//
//   fp32          cublasSgemm under CUBLAS_DEFAULT_MATH: fp32 products and
//                 sums, never TF32 (math mode pinned, whatever the defaults);
//                 with precision fp32 products tf32, cublasGemmEx under
//                 CUBLAS_COMPUTE_32F_FAST_TF32: operands rounded to TF32 on
//                 the tensor cores, fp32 sums
//   bf16, fp16    cublasGemmEx, both operands of the type, C fp32,
//                 CUBLAS_COMPUTE_32F: the tensor cores multiply the 16-bit
//                 values and accumulate in fp32, as onednn does on the host
//   double        cublasDgemm (gemm_f64: the gradient checks)
//   batched       cublasSgemmStridedBatched, cublasGemmStridedBatchedEx: the
//                 same types and modes, one call for the whole batch
//
// Row-major to column-major: cuBLAS reads a row-major (r, c) matrix as its
// column-major (c, r) transpose, so row-major C = op(A) op(B) is computed as
// column-major C^T = op(B)^T op(A)^T: the operands swap places, M and N swap,
// each keeps its own transpose flag, and every leading dimension is the row
// length (cols) of the row-major matrix.
//
// One handle, created on first use, on the stream of Kokkos' default execution
// space instance: GEMMs and kernels run in issue order, as on the host, and a
// host read still waits for Kokkos::fence(). cuBLAS gives the same bits for the
// same call on the same GPU model and library (its documented reproducibility;
// one stream, its default workspace), which is what bit-identical reruns need.
#include "kernels/gemm.h"

#ifndef KOKKOS_ENABLE_CUDA

namespace xx::kernels {
std::unique_ptr<GemmBackend> make_cublas_gemm() { return nullptr; }
}  // namespace xx::kernels

#else

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <limits>
#include <stdexcept>
#include <utility>

namespace xx::kernels {
namespace {

void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(fmt::format("cuBLAS: {} failed: {} ({})", what, cublasGetStatusString(status),
                                         int(status)));
}

// cuBLAS' sizes are int; ours are int64_t and a model's never come near 2^31.
int as_int(int64_t n, const char* what) {
  if (n < 0 || n > std::numeric_limits<int>::max())
    throw std::runtime_error(fmt::format("cuBLAS GEMM: {} = {} does not fit cuBLAS' int sizes", what, n));
  return int(n);
}

cublasOperation_t op_of(const GemmOperand& m) { return m.transposed ? CUBLAS_OP_T : CUBLAS_OP_N; }

// cublasGemmEx's operand type and compute type: 16-bit products with fp32
// sums, or fp32 operands as TF32 (products tf32).
std::pair<cudaDataType, cublasComputeType_t> types_of(Precision type) {
  switch (type) {
    case Precision::bf16: return {CUDA_R_16BF, CUBLAS_COMPUTE_32F};
    case Precision::fp16: return {CUDA_R_16F, CUBLAS_COMPUTE_32F};
    default: return {CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32};
  }
}

// The handle: created on first use (after Kokkos::initialize chose the
// device), destroyed at Kokkos::finalize, before the CUDA context goes.
class Handle {
 public:
  cublasHandle_t get() {
    if (!handle_) {
      check(cublasCreate(&handle_), "cublasCreate");
      check(cublasSetStream(handle_, ExecSpace().cuda_stream()), "cublasSetStream");
      // fp32 stays fp32: no TF32 (CUBLAS_TF32_TENSOR_OP_MATH) even where a
      // library default or NVIDIA_TF32_OVERRIDE would allow it.
      check(cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
      Kokkos::push_finalize_hook([this] { release(); });
    }
    return handle_;
  }
  ~Handle() = default;  // at exit the context may be gone: release() ran at finalize

 private:
  void release() {
    if (handle_) cublasDestroy(handle_);
    handle_ = nullptr;
  }
  cublasHandle_t handle_ = nullptr;
};

Handle& handle() {
  static Handle h;
  return h;
}

std::string library_version() {
  int major = 0, minor = 0, patch = 0;
  cublasGetProperty(MAJOR_VERSION, &major);
  cublasGetProperty(MINOR_VERSION, &minor);
  cublasGetProperty(PATCH_LEVEL, &patch);
  return fmt::format("cuBLAS {}.{}.{}", major, minor, patch);
}

std::string device_name() {
  int device = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&device) != cudaSuccess || cudaGetDeviceProperties(&prop, device) != cudaSuccess) return "GPU ?";
  return fmt::format("{} (sm_{}{})", prop.name, prop.major, prop.minor);
}

class CublasGemm : public GemmBackend {
 public:
  std::string name() const override { return "cublas"; }
  std::string describe() const override {
    return fmt::format("cublas: {} on {}, fp32 {}; bf16, fp16 on tensor cores with fp32 accumulation",
                       library_version(), device_name(), tf32_products() ? "as TF32" : "without TF32");
  }
  bool available() const override {
    if (!checked_) {
      checked_ = true;
      try {
        handle().get();
        available_ = true;
      } catch (const std::exception& e) {
        reason_ = e.what();
      }
    }
    return available_;
  }
  std::string unavailable_reason() const override { return reason_; }
  bool native(Precision type) const override { return true; }
  bool tf32() const override { return true; }
  std::string kernel(Precision type) const override {
    const std::string v = library_version();
    switch (type) {
      case Precision::bf16: return v + " cublasGemmEx bf16 x bf16 -> fp32 (COMPUTE_32F)";
      case Precision::fp16: return v + " cublasGemmEx fp16 x fp16 -> fp32 (COMPUTE_32F)";
      default:
        return v + (tf32_products() ? " cublasGemmEx fp32 as TF32 (COMPUTE_32F_FAST_TF32)" : " cublasSgemm fp32");
    }
  }
  void run(const GemmOperand& a, const GemmOperand& b, float alpha, float beta, float* c) override {
    // Column-major C^T (N, M) = op(B)^T (N, K) op(A)^T (K, M); see the top of the file.
    const int m = as_int(b.op_cols(), "N"), n = as_int(a.op_rows(), "M"), k = as_int(a.op_cols(), "K");
    const int lda = as_int(a.cols, "lda"), ldb = as_int(b.cols, "ldb"), ldc = m;
    cublasHandle_t h = handle().get();
    if (a.type == Precision::fp32 && !tf32_products()) {
      check(cublasSgemm(h, op_of(b), op_of(a), m, n, k, &alpha, static_cast<const float*>(b.data), ldb,
                        static_cast<const float*>(a.data), lda, &beta, c, ldc),
            "cublasSgemm");
      return;
    }
    const auto [type, compute] = types_of(a.type);
    check(cublasGemmEx(h, op_of(b), op_of(a), m, n, k, &alpha, b.data, type, ldb, a.data, type, lda, &beta, c,
                       CUDA_R_32F, ldc, compute, CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx");
  }
  // The batch as run() does one product (swapped operands, transposed
  // result), each operand stepping by its own stride.
  void run_batched(const GemmOperand& a, const GemmOperand& b, float alpha, float beta, float* c,
                   const GemmBatch& batch) override {
    const int m = as_int(b.op_cols(), "N"), n = as_int(a.op_rows(), "M"), k = as_int(a.op_cols(), "K");
    const int lda = as_int(a.cols, "lda"), ldb = as_int(b.cols, "ldb"), ldc = m, count = as_int(batch.count, "count");
    const long long sa = batch.a, sb = batch.b, sc = batch.c;
    cublasHandle_t h = handle().get();
    if (a.type == Precision::fp32 && !tf32_products()) {
      check(cublasSgemmStridedBatched(h, op_of(b), op_of(a), m, n, k, &alpha, static_cast<const float*>(b.data), ldb,
                                      sb, static_cast<const float*>(a.data), lda, sa, &beta, c, ldc, sc, count),
            "cublasSgemmStridedBatched");
      return;
    }
    const auto [type, compute] = types_of(a.type);
    check(cublasGemmStridedBatchedEx(h, op_of(b), op_of(a), m, n, k, &alpha, b.data, type, ldb, sb, a.data, type,
                                     lda, sa, &beta, c, CUDA_R_32F, ldc, sc, count, compute, CUBLAS_GEMM_DEFAULT),
          "cublasGemmStridedBatchedEx");
  }

 private:
  mutable bool checked_ = false, available_ = false;
  mutable std::string reason_;
};

}  // namespace

std::unique_ptr<GemmBackend> make_cublas_gemm() { return std::make_unique<CublasGemm>(); }

void gemm_f64(const GemmOperand& a, const GemmOperand& b, double alpha, double beta, Mat<double> c) {
  if (a.op_cols() != b.op_rows() || int64_t(c.extent(0)) != a.op_rows() || int64_t(c.extent(1)) != b.op_cols())
    throw std::logic_error(fmt::format("gemm: shapes ({}x{}) . ({}x{}) -> ({}x{}) do not match", a.op_rows(),
                                       a.op_cols(), b.op_rows(), b.op_cols(), c.extent(0), c.extent(1)));
  if (c.extent(0) == 0 || c.extent(1) == 0) return;
  // k = 0 is legal for cuBLAS (c = beta c), but a zero leading dimension is
  // not: a (M, 0) operand gets ld 1, never read.
  const int m = as_int(b.op_cols(), "N"), n = as_int(a.op_rows(), "M"), k = as_int(a.op_cols(), "K");
  const int lda = a.cols > 0 ? as_int(a.cols, "lda") : 1, ldb = b.cols > 0 ? as_int(b.cols, "ldb") : 1, ldc = m;
  check(cublasDgemm(handle().get(), op_of(b), op_of(a), m, n, k, &alpha, static_cast<const double*>(b.data), ldb,
                    static_cast<const double*>(a.data), lda, &beta, c.data(), ldc),
        "cublasDgemm");
}

}  // namespace xx::kernels

#endif  // KOKKOS_ENABLE_CUDA

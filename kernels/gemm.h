// The one GEMM seam. Every matrix product of the model goes through gemm()
// below, which hands it to one backend chosen at start-up (deck: gemm):
//
//   onednn   oneDNN matmul (host): fp32, and bf16 x bf16 -> fp32 natively
//            where the CPU has AVX512_BF16 or AMX (brgemm); one primitive per
//            shape, created on first use and cached
//   cublas   cuBLAS (the kernels run on CUDA: the cuda preset): fp32 exact
//            (no TF32), bf16 and fp16 x itself -> fp32 on the tensor cores
//   blas     KokkosBlas::gemm: the BLAS KokkosKernels was built on (host
//            builds); fp32 only
//
// Which exist depends on the Kokkos the binary was built against: a host
// Kokkos has onednn and blas, a CUDA Kokkos has cublas (and no KokkosKernels).
// Only gemm_*.cpp know; the kernels call gemm() below, or gemm_batched() for
// a batch of equal products at fixed strides (one call for a block of every
// head: oneDNN's batched matmul, cuBLAS' strided-batched GEMM, or a loop).
//
// Operands are stored fp32, or in 16 bits (bf16, fp16) under mixed precision;
// products accumulate in fp32 into an fp32 result. A 16-bit type the backend
// cannot multiply natively is widened to fp32 first (the same products: a
// 16-bit times 16-bit product is exact in fp32) and start-up says it is
// emulated. double (the gradient checks) always runs on gemm_f64: KokkosBlas
// on the host, cublasDgemm on CUDA.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>
#include "core/device_memory.h"
#include "core/views.h"
#include "kernels/precision.h"
#include "kernels/team.h"

namespace xx::kernels {

// A row-major (rows, cols) matrix as a GEMM reads it; op(X) is X^T when transposed.
struct GemmOperand {
  const void* data = nullptr;
  int64_t rows = 0, cols = 0;
  Precision type = Precision::fp32;  // fp32: float elements; bf16/fp16: their 16-bit patterns
  bool transposed = false;
  // Its token count changes from call to call (a routed expert's rows): the
  // backend keeps one kernel for every count instead of one per count.
  bool varying = false;
  int64_t op_rows() const { return transposed ? cols : rows; }
  int64_t op_cols() const { return transposed ? rows : cols; }
};

// A batch of equal products: operand and result n start n strides (in
// elements) after operand and result 0. The heads of a (B*H*T, D) matrix
// lie T*D apart.
struct GemmBatch {
  int64_t count = 1;
  int64_t a = 0, b = 0, c = 0;  // strides of a, b and c
};

// c (M, N), float, row-major = alpha op(a) op(b) + beta c; a and b of one type.
class GemmBackend {
 public:
  virtual ~GemmBackend() = default;
  virtual std::string name() const = 0;
  // What it runs, for the start-up table: library, version, the kernel it dispatched.
  virtual std::string describe() const = 0;
  virtual bool available() const = 0;
  virtual std::string unavailable_reason() const = 0;
  // True when products of `type` run without widening to fp32 first.
  virtual bool native(Precision type) const = 0;
  // The library and kernel that multiply `type` (fp32, or a type native()
  // holds), e.g. "oneDNN 2.6.3 brg:avx512_core_bf16"; gemm_kernel() below
  // names what runs any type: what a GEMM peak is measured on (io/peak_file.h).
  virtual std::string kernel(Precision type) const = 0;
  // True when it can multiply fp32 operands as TF32 on tensor cores
  // (precision fp32 products tf32): 10-bit mantissas, fp32 sums.
  virtual bool tf32() const { return false; }
  virtual void run(const GemmOperand& a, const GemmOperand& b, float alpha, float beta, float* c) = 0;
  // c_n = alpha op(a_n) op(b_n) + beta c_n for n < batch.count, each c_n
  // (M, N) row-major. This one runs them one by one through run().
  virtual void run_batched(const GemmOperand& a, const GemmOperand& b, float alpha, float beta, float* c,
                           const GemmBatch& batch);
};

std::unique_ptr<GemmBackend> make_onednn_gemm();  // gemm_onednn.cpp (null when built without oneDNN)
std::unique_ptr<GemmBackend> make_cublas_gemm();  // gemm_cublas.cpp (null unless Kokkos runs on CUDA)
std::unique_ptr<GemmBackend> make_blas_gemm();    // gemm_blas.cpp (null when Kokkos runs on CUDA)

// c (M, N), double, row-major = alpha op(a) op(b) + beta c, a and b of double
// elements (their `type` is not read): the gradient checks' GEMMs, on
// KokkosBlas (gemm_blas.cpp) or cublasDgemm (gemm_cublas.cpp), whichever the
// build has, whatever backend the float GEMMs run on.
void gemm_f64(const GemmOperand& a, const GemmOperand& b, double alpha, double beta, Mat<double> c);

// The registry: "auto" takes the first available of onednn, cublas, blas; a
// name takes that one or throws std::runtime_error saying why it cannot run.
void select_gemm_backend(GemmChoice choice);
GemmBackend& gemm_backend();  // selects "auto" when nothing was selected
// Under mixed precision: multiply 16-bit operands on the backend's fp32
// kernel, widened first, even where it has a 16-bit one (deck: precision ...
// products widened). The same products; faster where the 16-bit kernel is slow.
void set_widened_products(bool widened);
// precision fp32 products tf32: fp32 GEMMs as TF32 where the backend has it
// (cuBLAS), strict fp32 where it has not (gemm_report says which).
void set_tf32_products(bool tf32);
bool tf32_products();  // asked, and the chosen backend has it
// The library and kernel that multiply `type` here (GemmBackend::kernel, or
// the fp32 one when widened): what a peak is measured on.
std::string gemm_kernel(Precision type);
// One line for the start-up table: the backend and, under mixed precision,
// whether products of `type` run natively or are emulated (and slower).
std::string gemm_report(Precision type);

// The float entry: widens 16-bit operands the backend cannot run natively.
void gemm(const GemmOperand& a, const GemmOperand& b, float alpha, float beta, Mat<float> c);
// The same for a batch: c is product 0's result, a and b its operands.
void gemm_batched(const GemmOperand& a, const GemmOperand& b, float alpha, float beta, Mat<float> c,
                  const GemmBatch& batch);

// ---------------------------------------------------------------------------
// 16-bit copies of float values (round to nearest even), and back

// dst[i] = the 16-bit pattern of src[i] in `type` (bf16 or fp16). (T is
// float; double only compiles, for the gradient checks that never pack.)
template <class T>
void pack_half(uint16_t* dst, const T* src, int64_t n, Precision type) {
  Kokkos::parallel_for(
      "pack_half", flat_policy(n), KOKKOS_LAMBDA(const TeamMember& m) {
        if (type == Precision::bf16) for_flat(m, n, [&](int64_t i) { dst[i] = float_to_bf16_bits(float(src[i])); });
        else for_flat(m, n, [&](int64_t i) { dst[i] = float_to_fp16_bits(float(src[i])); });
      });
}

// dst[i] = the float value of the 16-bit pattern src[i] (T: as pack_half).
template <class T>
void unpack_half(T* dst, const uint16_t* src, int64_t n, Precision type) {
  Kokkos::parallel_for(
      "unpack_half", flat_policy(n), KOKKOS_LAMBDA(const TeamMember& m) {
        if (type == Precision::bf16) for_flat(m, n, [&](int64_t i) { dst[i] = T(bf16_bits_to_float(src[i])); });
        else for_flat(m, n, [&](int64_t i) { dst[i] = T(fp16_bits_to_float(src[i])); });
      });
}

// A scratch of n 16-bit values for one GEMM's converted operand; `slot`
// keeps the ones that are alive at once apart. Grows, never shrinks.
uint16_t* half_scratch(int slot, int64_t n);

// ---------------------------------------------------------------------------
// What the model passes: a GEMM input of T values, or of their 16-bit copy.

template <class T>
struct GemmIn {
  const T* values = nullptr;     // T elements, when there is no 16-bit copy
  const uint16_t* half = nullptr;  // the 16-bit copy (mixed precision)
  Precision type = Precision::fp32;
  int64_t rows = 0, cols = 0;
  bool varying = false;  // its row count changes between calls (GemmOperand::varying)

  GemmIn() = default;
  GemmIn(Mat<const T> m) : values(m.data()), rows(m.extent(0)), cols(m.extent(1)) {}
  GemmIn(Mat<T> m) : GemmIn(Mat<const T>(m)) {}
  static GemmIn of_half(const uint16_t* h, int64_t rows, int64_t cols, Precision type) {
    GemmIn in;
    in.half = h, in.type = type, in.rows = rows, in.cols = cols;
    return in;
  }
  bool is_half() const { return half != nullptr; }
  // Rows [r0, r0 + n) of this matrix.
  GemmIn rows_from(int64_t r0, int64_t n) const {
    GemmIn in = *this;
    if (half) in.half = half + r0 * cols;
    else in.values = values + r0 * cols;
    in.rows = n;
    return in;
  }
  // The same shape, `elements` further along the storage (a batch's next product).
  GemmIn shifted(int64_t elements) const {
    GemmIn in = *this;
    if (half) in.half = half + elements;
    else in.values = values + elements;
    return in;
  }
  GemmIn varying_rows() const {
    GemmIn in = *this;
    in.varying = true;
    return in;
  }
  GemmOperand op(bool transposed) const {
    return {half ? static_cast<const void*>(half) : static_cast<const void*>(values), rows, cols, type, transposed,
            varying};
  }
};

// c = alpha op(a) op(b) + beta c, with op given as "N" or "T" per operand.
template <class T>
void gemm(const char* ta, GemmIn<T> a, const char* tb, GemmIn<T> b, T alpha, T beta, Mat<T> c) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "gemm: float or double");
  if constexpr (std::is_same_v<T, float>) {
    gemm(a.op(ta[0] == 'T'), b.op(tb[0] == 'T'), alpha, beta, c);
  } else {
    DeviceWork device;  // the library reads and writes kernel memory
    gemm_f64(a.op(ta[0] == 'T'), b.op(tb[0] == 'T'), alpha, beta, c);
  }
}

// c_n = alpha op(a_n) op(b_n) + beta c_n, n < batch.count: a, b and c are
// product 0's, the others `batch`'s strides further. double loops on gemm_f64.
template <class T>
void gemm_batched(const char* ta, GemmIn<T> a, const char* tb, GemmIn<T> b, T alpha, T beta, Mat<T> c,
                  const GemmBatch& batch) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "gemm_batched: float or double");
  if constexpr (std::is_same_v<T, float>) {
    gemm_batched(a.op(ta[0] == 'T'), b.op(tb[0] == 'T'), alpha, beta, c, batch);
  } else {
    for (int64_t n = 0; n < batch.count; ++n)
      gemm<T>(ta, a.shifted(n * batch.a), tb, b.shifted(n * batch.b), alpha, beta,
              Mat<T>(c.data() + n * batch.c, c.extent(0), c.extent(1)));
  }
}

// The 16-bit copy of a float matrix that another GEMM input is stored in, in
// `slot`'s scratch; a float matrix (or a double one) when `like` is not 16-bit.
// It varies in rows as `like` does.
template <class T>
GemmIn<T> as_gemm_input_like(Mat<const T> m, const GemmIn<T>& like, int slot) {
  GemmIn<T> in(m);
  if constexpr (std::is_same_v<T, float>) {
    if (like.is_half()) {
      const int64_t n = int64_t(m.extent(0)) * m.extent(1);
      uint16_t* h = half_scratch(slot, n);
      pack_half(h, m.data(), n, like.type);
      in = GemmIn<T>::of_half(h, m.extent(0), m.extent(1), like.type);
    }
  }
  in.varying = like.varying;
  return in;
}

}  // namespace xx::kernels

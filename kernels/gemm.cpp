// The GEMM registry, the widening of 16-bit operands a backend cannot
// multiply natively, and the scratch their copies live in.
#include "kernels/gemm.h"
#include <fmt/format.h>
#include <stdexcept>

namespace xx::kernels {
namespace {

struct Registry {
  std::vector<std::unique_ptr<GemmBackend>> order;  // auto's order of preference
  GemmBackend* chosen = nullptr;
  bool widened = false;  // 16-bit products on the fp32 kernel (set_widened_products)
  bool tf32 = false;     // fp32 products as TF32 where the backend has it (set_tf32_products)
  Registry() {
    for (auto make : {make_onednn_gemm, make_cublas_gemm, make_blas_gemm})
      if (auto backend = make()) order.push_back(std::move(backend));
  }
};

Registry& registry() {
  static Registry r;
  return r;
}

// Scratch lives until Kokkos::finalize, which must not outlive it.
struct Scratch {
  Buffer<uint16_t> half[4];
  Buffer<float> widened[2];
  Scratch() {
    Kokkos::push_finalize_hook([this] {
      for (auto& b : half) b = {};
      for (auto& b : widened) b = {};
    });
  }
};

Scratch& scratch() {
  static Scratch s;
  return s;
}

Buffer<uint16_t>& half_buffer(int slot) {
  if (slot < 0 || slot >= 4) throw std::logic_error("half_scratch: no slot " + std::to_string(slot));
  return scratch().half[slot];
}

Buffer<float>& widened_buffer(int slot) { return scratch().widened[slot]; }

// The float values of a 16-bit operand, in `slot`'s scratch; of a batch's
// operands, the whole span from the first to the last.
GemmOperand widened(const GemmOperand& m, int slot, int64_t count = 1, int64_t stride = 0) {
  if (m.type == Precision::fp32) return m;
  const int64_t n = (count - 1) * stride + m.rows * m.cols;
  auto& b = widened_buffer(slot);
  if (int64_t(b.extent(0)) < n) b = Buffer<float>("gemm::widened", n);
  unpack_half(b.data(), static_cast<const uint16_t*>(m.data), n, m.type);
  GemmOperand w = m;
  w.data = b.data();
  w.type = Precision::fp32;
  return w;
}

// Product n's operand of a batch: `elements` further along the storage.
GemmOperand shifted(const GemmOperand& m, int64_t elements) {
  GemmOperand s = m;
  s.data = static_cast<const char*>(m.data) + elements * (m.type == Precision::fp32 ? 4 : 2);
  return s;
}

}  // namespace

void select_gemm_backend(GemmChoice choice) {
  auto& r = registry();
  const bool any = choice == GemmChoice::automatic;
  const std::string wanted(mode_name(choice));  // the registry's name of the backend asked for
  for (auto& b : r.order) {
    if (!any && b->name() != wanted) continue;
    if (b->available()) {
      r.chosen = b.get();
      return;
    }
    if (!any) throw std::runtime_error("gemm " + wanted + " cannot run here: " + b->unavailable_reason());
  }
  if (!any)
    throw std::runtime_error("gemm " + wanted + " is not built into this binary (xuanxue was built without it)");
  throw std::runtime_error("no GEMM backend can run here");
}

GemmBackend& gemm_backend() {
  if (!registry().chosen) select_gemm_backend(GemmChoice::automatic);
  return *registry().chosen;
}

void set_widened_products(bool widened) { registry().widened = widened; }
void set_tf32_products(bool tf32) { registry().tf32 = tf32; }
bool tf32_products() { return registry().tf32 && gemm_backend().tf32(); }

// Whether `type` runs on the backend's own 16-bit kernel.
static bool runs_natively(GemmBackend& b, Precision type) {
  return type == Precision::fp32 || (b.native(type) && !registry().widened);
}

std::string gemm_kernel(Precision type) {
  auto& b = gemm_backend();
  if (runs_natively(b, type)) return b.kernel(type);
  return b.kernel(Precision::fp32) + " (16-bit widened to fp32)";
}

std::string gemm_report(Precision type) {
  auto& b = gemm_backend();
  std::string line = b.describe();
  std::string passed;
  for (auto& other : registry().order) {
    if (other.get() == &b) break;
    passed += fmt::format("{}{} ({})", passed.empty() ? "" : ", ", other->name(),
                          other->available() ? "not chosen" : other->unavailable_reason());
  }
  if (!passed.empty()) line += "; passed over: " + passed;
  if (registry().tf32)
    line += b.tf32() ? "; fp32 products as TF32 on the tensor cores, as the deck asks (products tf32)"
                     : fmt::format("; products tf32 asked, but {} has no TF32: fp32 products stay fp32", b.name());
  if (type != Precision::fp32) {
    const char* t = type == Precision::bf16 ? "bf16" : "fp16";
    line += runs_natively(b, type) ? fmt::format("; {} products run natively", t)
            : b.native(type)
                ? fmt::format("; {} products widened to fp32 before each GEMM, as the deck asks (products widened)", t)
                : fmt::format("; {} is EMULATED: operands are widened to fp32 before each GEMM, slower than fp32", t);
  }
  return line;
}

// A device library reads and writes kernel memory only: checked under the
// device emulation (core/device_memory.h), where a host array is a test's
// or a caller's mistake that a GPU would turn into a crash.
static void require_kernel_memory(const GemmOperand& a, const GemmOperand& b, const float* c, int64_t c_count,
                                  const GemmBatch& batch) {
  auto operand = [&](const GemmOperand& m, int64_t stride, const char* name) {
    const int64_t elements = (batch.count - 1) * stride + m.rows * m.cols;
    if (!is_kernel_memory(m.data, elements * (m.type == Precision::fp32 ? 4 : 2)))
      throw std::logic_error(fmt::format("gemm: operand {} ({}x{}) is not in kernel memory (a host array?); a "
                                         "device's GEMM library cannot read it", name, m.rows, m.cols));
  };
  operand(a, batch.a, "a");
  operand(b, batch.b, "b");
  if (!is_kernel_memory(c, ((batch.count - 1) * batch.c + c_count) * int64_t(sizeof(float))))
    throw std::logic_error("gemm: the result is not in kernel memory (a host array?); a device's GEMM library "
                           "cannot write it");
}

void gemm(const GemmOperand& a, const GemmOperand& b, float alpha, float beta, Mat<float> c) {
  if (a.op_cols() != b.op_rows() || int64_t(c.extent(0)) != a.op_rows() || int64_t(c.extent(1)) != b.op_cols())
    throw std::logic_error(fmt::format("gemm: shapes ({}x{}) . ({}x{}) -> ({}x{}) do not match", a.op_rows(),
                                       a.op_cols(), b.op_rows(), b.op_cols(), c.extent(0), c.extent(1)));
  if (c.extent(0) == 0 || c.extent(1) == 0) return;
  if (a.op_cols() == 0) {  // an empty sum: c = beta c
    if (beta == 0.0f) Kokkos::deep_copy(c, 0.0f);
    else if (beta != 1.0f) Kokkos::parallel_for("gemm::scale", c.extent(0) * c.extent(1), KOKKOS_LAMBDA(int64_t i) {
        c.data()[i] *= beta;
      });
    return;
  }
  require_kernel_memory(a, b, c.data(), int64_t(c.extent(0) * c.extent(1)), {});
  auto& backend = gemm_backend();
  DeviceWork device;  // the library reads and writes kernel memory
  if (a.type == b.type && runs_natively(backend, a.type)) {
    backend.run(a, b, alpha, beta, c.data());
    return;
  }
  backend.run(widened(a, 0), widened(b, 1), alpha, beta, c.data());
}

void GemmBackend::run_batched(const GemmOperand& a, const GemmOperand& b, float alpha, float beta, float* c,
                              const GemmBatch& batch) {
  for (int64_t n = 0; n < batch.count; ++n)
    run(shifted(a, n * batch.a), shifted(b, n * batch.b), alpha, beta, c + n * batch.c);
}

void gemm_batched(const GemmOperand& a, const GemmOperand& b, float alpha, float beta, Mat<float> c,
                  const GemmBatch& batch) {
  if (a.op_cols() != b.op_rows() || int64_t(c.extent(0)) != a.op_rows() || int64_t(c.extent(1)) != b.op_cols())
    throw std::logic_error(fmt::format("gemm_batched: shapes ({}x{}) . ({}x{}) -> ({}x{}) do not match",
                                       a.op_rows(), a.op_cols(), b.op_rows(), b.op_cols(), c.extent(0), c.extent(1)));
  if (batch.count <= 0 || c.extent(0) == 0 || c.extent(1) == 0) return;
  if (batch.count == 1 || a.op_cols() == 0) {  // one product, or empty sums: the single GEMM's rules
    for (int64_t n = 0; n < batch.count; ++n)
      gemm(shifted(a, n * batch.a), shifted(b, n * batch.b), alpha, beta,
           Mat<float>(c.data() + n * batch.c, c.extent(0), c.extent(1)));
    return;
  }
  require_kernel_memory(a, b, c.data(), int64_t(c.extent(0) * c.extent(1)), batch);
  auto& backend = gemm_backend();
  DeviceWork device;
  if (a.type == b.type && runs_natively(backend, a.type)) {
    backend.run_batched(a, b, alpha, beta, c.data(), batch);
    return;
  }
  // Widened operands are dense copies of the same spans: the strides stay.
  backend.run_batched(widened(a, 0, batch.count, batch.a), widened(b, 1, batch.count, batch.b), alpha, beta,
                      c.data(), batch);
}

uint16_t* half_scratch(int slot, int64_t n) {
  auto& b = half_buffer(slot);
  if (int64_t(b.extent(0)) < n) b = Buffer<uint16_t>("gemm::half_scratch", n);
  return b.data();
}

}  // namespace xx::kernels

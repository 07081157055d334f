// AdamW's moments (deck: optimizer adamw ... moments fp32|bf16): one owner of
// where they live. fp32 keeps a float each; bf16 keeps its 16-bit pattern
// (kernels/precision.h), half the bytes. The storage type is chosen once, at
// construction: the update (kernels/adamw.h) is compiled for each and picked
// per step, never per element. Arithmetic is fp32 either way: a bf16 moment
// widens to fp32 exactly on every read and is rounded to nearest, ties to even,
// on every write (from the update, from a checkpoint, from an average).
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>
#include <vector>
#include "core/modes.h"  // Precision
#include "core/views.h"
#include "kernels/precision.h"
#include "kernels/team.h"

namespace xx::kernels {

// How a moment of storage type S is read to fp32 and written back from it.
template <class S>
struct MomentStore;
template <>
struct MomentStore<float> {  // as it is
  KOKKOS_INLINE_FUNCTION static float load(float x) { return x; }
  KOKKOS_INLINE_FUNCTION static float store(float x) { return x; }
};
template <>
struct MomentStore<uint16_t> {  // a bf16 bit pattern
  KOKKOS_INLINE_FUNCTION static float load(uint16_t b) { return bf16_bits_to_float(b); }
  KOKKOS_INLINE_FUNCTION static uint16_t store(float x) { return float_to_bf16_bits(x); }
};

// bf16 patterns (n) widened into floats (n), and floats rounded into bf16 patterns.
// Functors, not KOKKOS_LAMBDAs, for the reason NonfiniteCount gives (kernels/precision.h).
struct Bf16Widen {
  float* out;
  const uint16_t* in;
  int64_t n;
  KOKKOS_INLINE_FUNCTION void operator()(const TeamMember& m) const {
    float* o = out;
    const uint16_t* x = in;
    for_flat(m, n, [&](int64_t i) { o[i] = bf16_bits_to_float(x[i]); });
  }
};
struct Bf16Round {
  uint16_t* out;
  const float* in;
  int64_t n;
  KOKKOS_INLINE_FUNCTION void operator()(const TeamMember& m) const {
    uint16_t* o = out;
    const float* x = in;
    for_flat(m, n, [&](int64_t i) { o[i] = float_to_bf16_bits(x[i]); });
  }
};

class Moments {
 public:
  using Storage = std::variant<Buffer<float>, Buffer<uint16_t>>;  // fp32 | bf16 patterns

  Moments() = default;
  // n moments of type fp32 or bf16, zero.
  Moments(const std::string& label, int64_t n, Precision type) {
    if (type == Precision::fp32) store_ = Buffer<float>(label, n);
    else if (type == Precision::bf16) store_ = Buffer<uint16_t>(label + " (bf16)", n);
    else throw std::invalid_argument("Moments: type " + std::string(mode_name(type)) + " (expected fp32 or bf16)");
  }
  // Another set of moments of the same type and size, zero (a copy to keep).
  Moments like(const std::string& label) const { return Moments(label, size(), type()); }

  Precision type() const { return store_.index() == 0 ? Precision::fp32 : Precision::bf16; }
  int64_t size() const {
    return std::visit([](const auto& b) { return int64_t(b.extent(0)); }, store_);
  }
  static int64_t bytes_per_value(Precision type) { return type == Precision::bf16 ? 2 : 4; }

  // The storage of two sets of the same type (AdamW's m and v), for the
  // update: f(Buffer<S>& a, Buffer<S>& b), S float or uint16_t.
  template <class F>
  friend void visit_pair(Moments& a, Moments& b, F&& f) {
    std::visit(
        [&](auto& sa) {
          using B = std::remove_cvref_t<decltype(sa)>;
          f(sa, std::get<B>(b.store_));
        },
        a.store_);
  }

  // Host copy in fp32: exact (a bf16 value widens without loss).
  std::vector<float> to_host() const {
    std::vector<float> out(static_cast<size_t>(size()));
    if (const auto* f = std::get_if<Buffer<float>>(&store_)) {
      Kokkos::deep_copy(Kokkos::View<float*, Kokkos::HostSpace, Unmanaged>(out.data(), out.size()), *f);
    } else {
      std::vector<uint16_t> bits(out.size());
      Kokkos::deep_copy(Kokkos::View<uint16_t*, Kokkos::HostSpace, Unmanaged>(bits.data(), bits.size()),
                        std::get<Buffer<uint16_t>>(store_));
      for (size_t i = 0; i < out.size(); ++i) out[i] = bf16_bits_to_float(bits[i]);
    }
    return out;
  }
  // From fp32 values (size() of them): kept as they are, or rounded to bf16
  // (nearest, ties to even); a value that is already bf16 stays exact.
  void from_host(const std::vector<float>& values) {
    if (int64_t(values.size()) != size())
      throw std::invalid_argument("Moments::from_host: " + std::to_string(values.size()) + " values for " +
                                  std::to_string(size()));
    if (auto* f = std::get_if<Buffer<float>>(&store_)) {
      Kokkos::deep_copy(*f, Kokkos::View<const float*, Kokkos::HostSpace, Unmanaged>(values.data(), values.size()));
    } else {
      std::vector<uint16_t> bits(values.size());
      for (size_t i = 0; i < values.size(); ++i) bits[i] = float_to_bf16_bits(values[i]);
      Kokkos::deep_copy(std::get<Buffer<uint16_t>>(store_),
                        Kokkos::View<const uint16_t*, Kokkos::HostSpace, Unmanaged>(bits.data(), bits.size()));
    }
  }
  // Bit for bit from moments of the same type and size.
  void copy_from(const Moments& other) {
    std::visit(
        [&](auto& mine) {
          using B = std::remove_cvref_t<decltype(mine)>;
          Kokkos::deep_copy(mine, std::get<B>(other.store_));
        },
        store_);
  }
  // f(Buffer<float>&) changes the values in fp32: in place under fp32; under
  // bf16 on a widened copy (size() floats, for the call), rounded back after.
  template <class F>
  void in_fp32(F&& f) {
    if (auto* b = std::get_if<Buffer<float>>(&store_)) return (void)f(*b);
    auto& bits = std::get<Buffer<uint16_t>>(store_);
    const int64_t n = size();
    Buffer<float> wide("Moments::widened", n);
    Kokkos::parallel_for("moments::widen", flat_policy(n), Bf16Widen{wide.data(), bits.data(), n});
    ExecSpace().fence();  // f may hand the buffer to MPI
    f(wide);
    ExecSpace().fence();
    Kokkos::parallel_for("moments::round", flat_policy(n), Bf16Round{bits.data(), wide.data(), n});
  }

 private:
  Storage store_;
};

}  // namespace xx::kernels

// View types used everywhere. Kernels take unmanaged views so that a tensor
// carved out of the flat parameter buffer and a freshly allocated activation
// look the same to them. Shapes are written (rows, cols) with the legend
// B batch, T sequence, C channels, V vocab, H heads, D head dim, F ffn width.
#pragma once
#include <Kokkos_Core.hpp>
#include <cstdint>

namespace xx {

using ExecSpace = Kokkos::DefaultExecutionSpace;
using MemSpace = ExecSpace::memory_space;
using Unmanaged = Kokkos::MemoryTraits<Kokkos::Unmanaged>;

// Owning buffers (allocate with a "Module::what" label).
template <class T> using Buffer = Kokkos::View<T*, Kokkos::LayoutRight, MemSpace>;

// Non-owning, row-major windows into buffers; what kernels take.
template <class T> using Vec = Kokkos::View<T*, Kokkos::LayoutRight, MemSpace, Unmanaged>;
template <class T> using Mat = Kokkos::View<T**, Kokkos::LayoutRight, MemSpace, Unmanaged>;

// Token ids on the device: (B*T).
using Tokens = Kokkos::View<const int32_t*, Kokkos::LayoutRight, MemSpace, Unmanaged>;

template <class T> Vec<T> vec(T* p, int64_t n) { return Vec<T>(p, n); }
template <class T> Mat<T> mat(T* p, int64_t rows, int64_t cols) { return Mat<T>(p, rows, cols); }
template <class T> Mat<T> mat(const Buffer<T>& b, int64_t rows, int64_t cols) {
  return Mat<T>(b.data(), rows, cols);
}

}  // namespace xx

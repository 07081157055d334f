// Where kernel memory lives, for the host code that must know. On a GPU
// build every Buffer, Vec and Mat is device memory: host code reaches it only
// through deep_copy (or hands it to a device library: cuBLAS, NCCL). On the
// host build it is host memory, which host code may read in place, and some
// paths do, on purpose (the gradients' pages handed back to the kernel, a
// mirror that is the buffer itself).
//
// The host build can also play a device (XX_EMULATE_DEVICE=1): then
// kernel_memory_on_host() is false, every path takes its device branch, and
// any host read or write of kernel memory outside a kernel, a deep_copy or a
// DeviceWork scope stops the process, naming the buffer and the call stack
// (device_memory.cpp); XX_EMULATE_DEVICE=report says each such touch and goes
// on. That is how the GPU build's host/device traffic is checked without a
// GPU. Host-side Views (HostSpace) are labelled "host::".
#pragma once
#include <string>
#include <type_traits>
#include "core/views.h"

namespace xx {

// Whether host code may read and write kernel memory in place: a host build
// that is not emulating a device.
bool kernel_memory_on_host();

// Under XX_EMULATE_DEVICE=1 on a host build: starts the emulation (after
// Kokkos::initialize, before any kernel memory is allocated) and returns
// true. A GPU build with it set exits 2, saying so. Called again, it takes
// back the SIGSEGV handler it needs (a test framework installs its own for
// each test case).
bool start_device_emulation_if_asked();
bool device_emulated();
// What the start-up report says of it; empty when off.
std::string device_emulation_report();

// The GPUs this process can see: CUDA's device count on a GPU build; under
// the emulation XX_EMULATE_GPUS (default 1), so that the choices that depend
// on it (one GPU per rank for NCCL) can be tested on a host; 0 otherwise.
int visible_gpus();

// Host code handing kernel memory to a library that reads it as the device
// would (a GEMM library, a device-aware transport): while one lives, the
// emulation lets it through. Nests.
class DeviceWork {
 public:
  DeviceWork();
  ~DeviceWork();
  DeviceWork(const DeviceWork&) = delete;
  DeviceWork& operator=(const DeviceWork&) = delete;
};

// Under the emulation: whether [p, p + bytes) lies in one kernel allocation
// (what a device library such as cuBLAS may be handed); true otherwise.
bool is_kernel_memory(const void* p, int64_t bytes);

inline constexpr const char* kHostLabel = "host::";

// A host View with v's shape, uninitialised (its values to be written).
template <class V>
auto host_mirror(const V& v) {
  using Host = Kokkos::View<typename V::non_const_data_type, typename V::array_layout, Kokkos::HostSpace>;
  return Host(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(kHostLabel) + v.label()), v.layout());
}

namespace detail {
template <class V>
auto host_view(const V& v, bool copy) {
  using Host = Kokkos::View<typename V::data_type, typename V::array_layout, Kokkos::HostSpace>;
  if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename V::memory_space>::accessible)
    if (kernel_memory_on_host()) return Host(v);
  auto h = host_mirror(v);
  if (copy) Kokkos::deep_copy(h, v);
  return Host(h);
}
}  // namespace detail

// A host View holding v's values: v itself where kernel memory is on the
// host (no copy), else a copy.
template <class V>
auto host_copy(const V& v) {
  return detail::host_view(v, true);
}

// Where host code writes values for v: v itself where kernel memory is on
// the host, else an uninitialised host View of its shape, to be copied in
// with deep_copy(v, h) (which does nothing when h is v).
template <class V>
auto host_staging(const V& v) {
  return detail::host_view(v, false);
}

// A host array as kernels see it: the array itself where kernel memory is
// the host's, else a copy in kernel memory (of the array's values when
// `in`). copy_back() returns what a kernel wrote to the array.
template <class T>
class KernelCopy {
 public:
  KernelCopy(T* host, int64_t n, bool in = true) : host_(host), n_(n), data_(host) {
    if (kernel_memory_on_host()) return;
    copy_ = Buffer<std::remove_const_t<T>>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "KernelCopy"), n);
    if (in) Kokkos::deep_copy(copy_, Kokkos::View<const std::remove_const_t<T>*, Kokkos::HostSpace, Unmanaged>(host, n));
    data_ = copy_.data();
  }
  Vec<T> vec() const { return Vec<T>(data_, n_); }
  void copy_back() const {
    static_assert(!std::is_const_v<T>, "copy_back: an input");
    if (copy_.data()) Kokkos::deep_copy(Kokkos::View<T*, Kokkos::HostSpace, Unmanaged>(host_, n_), copy_);
  }

 private:
  T* host_;
  int64_t n_;
  T* data_;
  Buffer<std::remove_const_t<T>> copy_;
};

}  // namespace xx

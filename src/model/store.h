// How model pieces reach their weights and scratch memory.
// Param: a tensor's window into the flat parameter and gradient buffers (and,
// under mixed precision, into the 16-bit copy of the parameters that GEMMs
// read), resolved by name once at construction. Workspace: scratch buffers
// shared by all blocks, allocated at first use and reused every step.
// KeptActivation: an activation kept for the backward, in 16 bits under mixed precision.
#pragma once
#include <map>
#include <string>
#include "core/host_memory.h"
#include "core/views.h"
#include "kernels/gemm.h"
#include "model/params.h"

namespace xx {

template <class T>
struct Param {
  T* w = nullptr;                // parameters
  T* g = nullptr;                // gradients
  const uint16_t* h = nullptr;   // the parameters' 16-bit copy (mixed precision), else null
  kernels::Precision type = kernels::Precision::fp32;
  Mat<const T> mat(int64_t rows, int64_t cols) const { return Mat<const T>(w, rows, cols); }
  // As a GEMM reads rows [row0, row0 + rows) of it: the 16-bit copy when there is one.
  kernels::GemmIn<T> in(int64_t rows, int64_t cols, int64_t row0 = 0) const {
    if (h) return kernels::GemmIn<T>::of_half(h + row0 * cols, rows, cols, type);
    return kernels::GemmIn<T>(Mat<const T>(w + row0 * cols, rows, cols));
  }
  Mat<T> dmat(int64_t rows, int64_t cols) const { return Mat<T>(g, rows, cols); }
  Vec<const T> vec(int64_t n) const { return Vec<const T>(w, n); }
  Vec<T> dvec(int64_t n) const { return Vec<T>(g, n); }
};

template <class T>
struct ParamStore {
  const ParamLayout* layout;
  T* params;
  T* grads;
  const uint16_t* half = nullptr;                      // 16-bit copy of params, or null
  kernels::Precision type = kernels::Precision::fp32;  // what GEMM inputs are stored as
  Param<T> operator()(const std::string& name) const {
    const auto& t = layout->at(name);
    return {params + t.offset, grads + t.offset, half ? half + t.offset : nullptr, type};
  }
};

// (Re)allocates `b` with n elements, its contents not kept. A larger size
// than it had frees the old buffer first, so the two are never resident at
// once, and hands the freed heap back (core/host_memory.h): under ep the
// rows an expert owner runs grow the buffers it keeps them in, step after step.
template <class U>
void regrow(Buffer<U>& b, const std::string& label, int64_t n) {
  const bool had = b.extent(0) > 0;
  b = Buffer<U>();
  b = Buffer<U>(label, n);
  if (had) return_free_heap();
}

template <class T>
class Workspace {
 public:
  // A (rows, cols) scratch matrix named `what`; its contents are not kept
  // between users with the same name.
  Mat<T> mat(const std::string& what, int64_t rows, int64_t cols) {
    auto& b = buffers_[what];
    if (int64_t(b.extent(0)) < rows * cols) regrow(b, "Workspace::" + what, rows * cols);
    return Mat<T>(b.data(), rows, cols);
  }
  Vec<T> vec(const std::string& what, int64_t n) { return Vec<T>(mat(what, 1, n).data(), n); }

 private:
  std::map<std::string, Buffer<T>> buffers_;
};

// An activation kept for the backward that GEMMs read (a normed input, the
// attention heads, SwiGLU's output, ...), or that feeds only SwiGLU (the
// fused gate/up output). Under fp32 it is a T buffer. Under bf16/fp16 only
// its 16-bit copy is kept, which halves its memory: the producing kernel
// writes T values into target(), and keep() packs them.
// Every KeptActivation shares one scratch per `slot` for its target, as each is
// packed right after it is written; a kernel that writes several at once
// (q, k and v) gives each its own slot.
template <class T>
class KeptActivation {
 public:
  KeptActivation() = default;
  KeptActivation(const std::string& what, int64_t rows, int64_t cols, kernels::Precision type, Workspace<T>& ws,
            int slot = 0)
      : what_("kept:slot" + std::to_string(slot)), name_(what), rows_(rows), cols_(cols), type_(type), ws_(&ws) {
    allocate(rows);
  }
  // Rows in use from now on; more than it holds grows it (the rows an expert
  // owner receives vary from step to step).
  void use_rows(int64_t rows) {
    if (rows > capacity_) allocate(rows);
    rows_ = rows;
  }
  bool is_half() const { return type_ != kernels::Precision::fp32; }
  // Where the producer writes T values (valid, under 16 bits, until the next
  // activation of this slot is written).
  Mat<T> target() { return is_half() ? ws_->mat(what_, rows_, cols_) : Mat<T>(values_.data(), rows_, cols_); }
  void keep() {
    if (is_half()) kernels::pack_half(half_.data(), target().data(), rows_ * cols_, type_);
  }
  uint16_t* half() const { return half_.data(); }  // the kept 16 bits, to be written directly
  // Its values as T for a kernel that is not a GEMM (SwiGLU's backward): the
  // buffer itself, or the 16-bit copy unpacked into target().
  Mat<const T> values() {
    if (is_half()) kernels::unpack_half(target().data(), half_.data(), rows_ * cols_, type_);
    return target();
  }
  kernels::GemmIn<T> in() const {
    if (is_half()) return kernels::GemmIn<T>::of_half(half_.data(), rows_, cols_, type_);
    return kernels::GemmIn<T>(Mat<const T>(values_.data(), rows_, cols_));
  }

 private:
  void allocate(int64_t rows) {
    capacity_ = rows;
    if (type_ == kernels::Precision::fp32) regrow(values_, "Activation::" + name_, rows * cols_);
    else regrow(half_, "Activation::" + name_ + "(16-bit)", rows * cols_);
  }
  std::string what_, name_;
  int64_t rows_ = 0, cols_ = 0, capacity_ = 0;
  kernels::Precision type_ = kernels::Precision::fp32;
  Workspace<T>* ws_ = nullptr;
  Buffer<T> values_;
  Buffer<uint16_t> half_;
};

// A (rows, cols) activation kept for the backward pass.
template <class T>
Buffer<T> activation(const std::string& what, int64_t rows, int64_t cols = 1) {
  return Buffer<T>("Activation::" + what, rows * cols);
}

}  // namespace xx

// How model pieces reach their weights and scratch memory.
// Param: a tensor's window into the flat parameter and gradient buffers (and,
// under mixed precision, into the 16-bit copy of the parameters that GEMMs
// read), resolved by name once at construction. Workspace: scratch buffers
// shared by all blocks, allocated at first use and reused every step.
// KeptActivation: an activation kept for the backward, in 16 bits under mixed precision.
// Workspace::activation and KeptActivation also place a block's kept
// activations: its own (recompute off), or, for what the recompute mode
// recomputes, one set shared by every block (Workspace::share_kept).
#pragma once
#include <map>
#include <memory>
#include <set>
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

  // Where the blocks built from now on keep their activations (recompute,
  // model/transformer.cpp): the activations named in `names` (all, with
  // everything) are one set shared by all blocks, the n-th of a name and a
  // size in one block being the n-th in every other; the rest each block's own.
  void share_kept(std::set<std::string> names, bool everything = false) {
    shared_names_ = std::move(names), share_everything_ = everything;
  }
  // A new block starts asking (the n-th of a name counts from here).
  void begin_owner() { ordinal_.clear(); }
  // A (rows, cols) activation kept for the backward: the block's own, or the shared one.
  Buffer<T> activation(const std::string& what, int64_t rows, int64_t cols = 1) {
    if (!shares(what)) return Buffer<T>("Activation::" + what, rows * cols);
    auto& b = shared_[key(what, rows * cols)];
    if (b.extent(0) == 0) b = Buffer<T>("Activation::" + what + "(shared)", rows * cols);
    return b;
  }
  // The same for activations kept in 16 bits only (packed attention probabilities).
  Buffer<uint16_t> half_activation(const std::string& what, int64_t n) {
    if (!shares(what)) return Buffer<uint16_t>("Activation::" + what + "(16-bit)", n);
    auto& b = shared_half_[key(what, n)];
    if (b.extent(0) == 0) b = Buffer<uint16_t>("Activation::" + what + "(16-bit, shared)", n);
    return b;
  }
  // The storage of KeptActivation `what`: new, or the shared one (null until first made).
  template <class S>
  std::shared_ptr<S> kept_storage(const std::string& what, int64_t elements) {
    if (!shares(what)) return std::make_shared<S>();
    auto& s = shared_kept_[key(what, elements)];
    if (!s) s = std::make_shared<S>();
    return std::static_pointer_cast<S>(s);
  }

 private:
  bool shares(const std::string& what) const { return share_everything_ || shared_names_.count(what) > 0; }
  std::string key(const std::string& what, int64_t elements) {
    return what + "#" + std::to_string(ordinal_[what]++) + ":" + std::to_string(elements);
  }
  std::map<std::string, Buffer<T>> buffers_;
  std::set<std::string> shared_names_;
  bool share_everything_ = false;
  std::map<std::string, int> ordinal_;
  std::map<std::string, Buffer<T>> shared_;
  std::map<std::string, Buffer<uint16_t>> shared_half_;
  std::map<std::string, std::shared_ptr<void>> shared_kept_;
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
      : what_("kept:slot" + std::to_string(slot)), name_(what), rows_(rows), cols_(cols), type_(type), ws_(&ws),
        s_(ws.template kept_storage<Storage>(what, rows * cols)) {
    if (s_->capacity < rows) allocate(rows);
  }
  // Rows in use from now on; more than it holds grows it (the rows an expert
  // owner receives vary from step to step; a shared one grows for all blocks).
  void use_rows(int64_t rows) {
    if (rows > s_->capacity) allocate(rows);
    rows_ = rows;
  }
  bool is_half() const { return type_ != kernels::Precision::fp32; }
  // Where the producer writes T values (valid, under 16 bits, until the next
  // activation of this slot is written).
  Mat<T> target() { return is_half() ? ws_->mat(what_, rows_, cols_) : Mat<T>(s_->values.data(), rows_, cols_); }
  void keep() {
    if (is_half()) kernels::pack_half(s_->half.data(), target().data(), rows_ * cols_, type_);
  }
  uint16_t* half() const { return s_->half.data(); }  // the kept 16 bits, to be written directly
  // Its values as T for a kernel that is not a GEMM (SwiGLU's backward): the
  // buffer itself, or the 16-bit copy unpacked into target().
  Mat<const T> values() {
    if (is_half()) kernels::unpack_half(target().data(), s_->half.data(), rows_ * cols_, type_);
    return target();
  }
  kernels::GemmIn<T> in() const {
    if (is_half()) return kernels::GemmIn<T>::of_half(s_->half.data(), rows_, cols_, type_);
    return kernels::GemmIn<T>(Mat<const T>(s_->values.data(), rows_, cols_));
  }

 private:
  // The memory, one block's or shared by all (Workspace::kept_storage).
  struct Storage {
    Buffer<T> values;
    Buffer<uint16_t> half;
    int64_t capacity = 0;  // rows
  };
  void allocate(int64_t rows) {
    s_->capacity = rows;
    if (type_ == kernels::Precision::fp32) regrow(s_->values, "Activation::" + name_, rows * cols_);
    else regrow(s_->half, "Activation::" + name_ + "(16-bit)", rows * cols_);
  }
  std::string what_, name_;
  int64_t rows_ = 0, cols_ = 0;
  kernels::Precision type_ = kernels::Precision::fp32;
  Workspace<T>* ws_ = nullptr;
  std::shared_ptr<Storage> s_ = std::make_shared<Storage>();
};

// A (rows, cols) activation kept for the backward pass.
template <class T>
Buffer<T> activation(const std::string& what, int64_t rows, int64_t cols = 1) {
  return Buffer<T>("Activation::" + what, rows * cols);
}

}  // namespace xx

// How model pieces reach their weights and scratch memory.
// Param: a tensor's window into the flat parameter and gradient buffers,
// resolved by name once at construction. Workspace: scratch buffers shared by
// all blocks, allocated at first use and reused every step.
#pragma once
#include <map>
#include <string>
#include "core/views.h"
#include "model/params.h"

namespace xx {

template <class T>
struct Param {
  T* w = nullptr;  // parameters
  T* g = nullptr;  // gradients
  Mat<const T> mat(int64_t rows, int64_t cols) const { return Mat<const T>(w, rows, cols); }
  Mat<T> dmat(int64_t rows, int64_t cols) const { return Mat<T>(g, rows, cols); }
  Vec<const T> vec(int64_t n) const { return Vec<const T>(w, n); }
  Vec<T> dvec(int64_t n) const { return Vec<T>(g, n); }
};

template <class T>
struct ParamStore {
  const ParamLayout* layout;
  T* params;
  T* grads;
  Param<T> operator()(const std::string& name) const {
    const auto& t = layout->at(name);
    return {params + t.offset, grads + t.offset};
  }
};

template <class T>
class Workspace {
 public:
  // A (rows, cols) scratch matrix named `what`; its contents are not kept
  // between users with the same name.
  Mat<T> mat(const std::string& what, int64_t rows, int64_t cols) {
    auto& b = buffers_[what];
    if (int64_t(b.extent(0)) < rows * cols) b = Buffer<T>("Workspace::" + what, rows * cols);
    return Mat<T>(b.data(), rows, cols);
  }
  Vec<T> vec(const std::string& what, int64_t n) { return Vec<T>(mat(what, 1, n).data(), n); }

 private:
  std::map<std::string, Buffer<T>> buffers_;
};

// A (rows, cols) activation kept for the backward pass.
template <class T>
Buffer<T> activation(const std::string& what, int64_t rows, int64_t cols = 1) {
  return Buffer<T>("Activation::" + what, rows * cols);
}

}  // namespace xx

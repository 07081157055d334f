// Small element-wise and reduction kernels shared by the model and the optimizer.
#pragma once
#include "core/views.h"

namespace xx::kernels {

// y += x
template <class T>
void add_inplace(Vec<T> y, Vec<const T> x) {
  Kokkos::parallel_for(
      "add_inplace", Kokkos::RangePolicy<ExecSpace>(0, y.extent(0)), KOKKOS_LAMBDA(int64_t i) { y(i) += x(i); });
}

// x *= a
template <class T>
void scale_inplace(Vec<T> x, T a) {
  Kokkos::parallel_for(
      "scale_inplace", Kokkos::RangePolicy<ExecSpace>(0, x.extent(0)), KOKKOS_LAMBDA(int64_t i) { x(i) *= a; });
}

// sum of x, accumulated in double (a fixed reduction tree: deterministic).
template <class T>
double sum(Vec<const T> x) {
  double s = 0;
  Kokkos::parallel_reduce(
      "sum", Kokkos::RangePolicy<ExecSpace>(0, x.extent(0)),
      KOKKOS_LAMBDA(int64_t i, double& acc) { acc += double(x(i)); }, s);
  return s;
}

// sum of x^2, accumulated in double.
template <class T>
double sum_squares(Vec<const T> x) {
  double s = 0;
  Kokkos::parallel_reduce(
      "sum_squares", Kokkos::RangePolicy<ExecSpace>(0, x.extent(0)),
      KOKKOS_LAMBDA(int64_t i, double& acc) { acc += double(x(i)) * double(x(i)); }, s);
  return s;
}

// number of entries that are not finite
template <class T>
int64_t count_nonfinite(Vec<const T> x) {
  int64_t n = 0;
  Kokkos::parallel_reduce(
      "count_nonfinite", Kokkos::RangePolicy<ExecSpace>(0, x.extent(0)),
      KOKKOS_LAMBDA(int64_t i, int64_t& acc) { acc += Kokkos::Experimental::isfinite(x(i)) ? 0 : 1; }, n);
  return n;
}

}  // namespace xx::kernels

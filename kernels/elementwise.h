// Small element-wise and reduction kernels shared by the model and the optimizer.
#pragma once
#include "core/views.h"
#include "kernels/math.h"
#include "kernels/team.h"

namespace xx::kernels {

// y += x
template <class T>
void add_inplace(Vec<T> y, Vec<const T> x) {
  const int64_t n = y.extent(0);
  T* py = y.data();
  const T* px = x.data();
  Kokkos::parallel_for(
      "elementwise::add_inplace", flat_policy(n),
      KOKKOS_LAMBDA(const TeamMember& m) { for_flat(m, n, [&](int64_t i) { py[i] += px[i]; }); });
}

// x *= a
template <class T>
void scale_inplace(Vec<T> x, T a) {
  const int64_t n = x.extent(0);
  T* px = x.data();
  Kokkos::parallel_for(
      "elementwise::scale_inplace", flat_policy(n),
      KOKKOS_LAMBDA(const TeamMember& m) { for_flat(m, n, [&](int64_t i) { px[i] *= a; }); });
}

// sum of x, accumulated in double: each chunk's vector sum, the chunks
// added in chunk order (fixed chunks, fixed order: deterministic; on a
// device the team reduction's fixed tree over the chunks).
template <class T>
double sum(Vec<const T> x) {
  const int64_t n = x.extent(0);
  const T* px = x.data();
  double s = 0;
  Kokkos::parallel_reduce(
      "elementwise::sum", flat_policy(n),
      KOKKOS_LAMBDA(const TeamMember& m, double& acc) {
        flat_sum(m, n, [&](int64_t i) { return double(px[i]); }, acc);
      },
      s);
  return s;
}

// sum of x^2, accumulated in double, as sum.
template <class T>
double sum_squares(Vec<const T> x) {
  const int64_t n = x.extent(0);
  const T* px = x.data();
  double s = 0;
  Kokkos::parallel_reduce(
      "elementwise::sum_squares", flat_policy(n),
      KOKKOS_LAMBDA(const TeamMember& m, double& acc) {
        flat_sum(m, n, [&](int64_t i) { return double(px[i]) * double(px[i]); }, acc);
      },
      s);
  return s;
}

// out (N, C): row i = table(index(i), :). The embedding lookup and the MoE
// dispatch are both this gather; index is any integer view.
template <class T, class Index>
void gather_rows(const char* label, Mat<T> out, Mat<const T> table, Index index) {
  const int64_t N = out.extent(0), C = out.extent(1);
  Kokkos::parallel_for(
      label, row_policy(N), KOKKOS_LAMBDA(const TeamMember& m) {
        for_rows(m, N, [&](int64_t i) {
          const T* src = &table(index(i), 0);
          T* dst = &out(i, 0);
          row_for(m, C, [&](int64_t c) { dst[c] = src[c]; });
        });
      });
}

// number of entries that are not finite
template <class T>
int64_t count_nonfinite(Vec<const T> x) {
  int64_t n = 0;
  Kokkos::parallel_reduce(
      "count_nonfinite", Kokkos::RangePolicy<ExecSpace>(0, x.extent(0)),
      KOKKOS_LAMBDA(int64_t i, int64_t& acc) { acc += kmath::isfinite(x(i)) ? 0 : 1; }, n);
  return n;
}

// out (N, A+B) = [a | b]
template <class T>
void concat_columns_forward(Mat<T> out, Mat<const T> a, Mat<const T> b) {
  const int64_t A = a.extent(1), W = out.extent(1);
  Kokkos::parallel_for(
      "concat_columns", Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>>({0, 0}, {int64_t(out.extent(0)), W}),
      KOKKOS_LAMBDA(int64_t i, int64_t j) { out(i, j) = j < A ? a(i, j) : b(i, j - A); });
}

// da (N, A), db (N, B) from dout (N, A+B)
template <class T>
void concat_columns_backward(Mat<T> da, Mat<T> db, Mat<const T> dout) {
  const int64_t A = da.extent(1), W = dout.extent(1);
  Kokkos::parallel_for(
      "concat_columns_backward", Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>>({0, 0}, {int64_t(dout.extent(0)), W}),
      KOKKOS_LAMBDA(int64_t i, int64_t j) {
        if (j < A) da(i, j) = dout(i, j);
        else db(i, j - A) = dout(i, j);
      });
}

}  // namespace xx::kernels

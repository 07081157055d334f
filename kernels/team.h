// The shape of a kernel's parallelism: the one place that knows whether
// kernels run on the host or on a device (docs/GPU.md, "Team-shaped kernels").
//
// A row kernel is a TeamPolicy whose work items are rows. Each row belongs to
// one thread of a team, and the row's elements to that thread's vector lanes:
//   host:   a team of one thread per row; a row primitive is the `omp simd`
//           loop the kernels had before teams, so the same vector code and the
//           same bits (a simd reduction sums in the order GCC vectorises it,
//           which a plain sequential loop would not).
//   device: teams of kRowsPerTeam threads (one row each) of kVector lanes:
//           ThreadVectorRange loops and reductions within a warp (shuffles,
//           no shared memory), the result broadcast to every lane.
// Column sums (parameter gradients over the rows) keep each column's rows in
// one fixed order: no atomics, deterministic on every backend, and on the host
// the same loop as before (a column block per team, rows in order, the block's
// columns in a vector loop).
//
// The choice is `if constexpr` on the member's execution space, so each
// primitive is a template on the member: the other backend's branch is never
// instantiated. Kernels call only what is here, never TeamThreadRange or
// `omp simd` themselves.
#pragma once
#include <type_traits>
#include "core/views.h"
#include "kernels/math.h"

namespace xx::kernels {

using TeamPolicy = Kokkos::TeamPolicy<ExecSpace>;
using TeamMember = TeamPolicy::member_type;

// Whether an execution space is the host's: it reaches host memory.
template <class Space>
inline constexpr bool host_space = Kokkos::SpaceAccessibility<Space, Kokkos::HostSpace>::accessible;
template <class Member>
inline constexpr bool host_member = host_space<typename Member::execution_space>;

// Device team shape. A warp per row (kVector = 32 lanes: CUDA's warp, a
// power of two HIP's 64-wide wavefronts also accept) and four rows per team:
// 128 threads, launchable whatever the kernel's register count (128 x 255
// registers fit an SM's 64 K), no team scratch.
constexpr int kVector = 32;
constexpr int kRowsPerTeam = 4;

// ----------------------------------------------------------------------------
// rows

// The policy of a kernel over `rows` rows; its body calls for_rows.
inline TeamPolicy row_policy(int64_t rows) {
  if constexpr (host_space<ExecSpace>) return TeamPolicy(int(rows), 1, 1);
  else return TeamPolicy(int((rows + kRowsPerTeam - 1) / kRowsPerTeam), kRowsPerTeam, kVector);
}

// f(i) for each row i of the member's team (i < rows).
template <class Member, class F>
KOKKOS_FORCEINLINE_FUNCTION void for_rows(const Member& m, int64_t rows, const F& f) {
  if constexpr (host_member<Member>) {
    f(int64_t(m.league_rank()));
  } else {
    const int64_t i0 = int64_t(m.league_rank()) * kRowsPerTeam;
    const int64_t i1 = i0 + kRowsPerTeam < rows ? i0 + kRowsPerTeam : rows;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(m, i0, i1), f);
  }
}

// f(j) for j in [0, n), the lanes of the row's thread.
template <class Member, class F>
KOKKOS_FORCEINLINE_FUNCTION void row_for(const Member& m, int64_t n, const F& f) {
  if constexpr (host_member<Member>) {
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) f(j);
  } else {
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(m, n), f);
  }
}

// The device's sum over a row: the warp's lanes, a shuffle tree.
template <class T, class Member, class F>
KOKKOS_FORCEINLINE_FUNCTION T lanes_sum(const Member& m, int64_t n, const F& f) {
  T s = 0;
  Kokkos::parallel_reduce(
      Kokkos::ThreadVectorRange(m, n), [&](int64_t j, T& acc) { acc += f(j); }, s);
  return s;
}

// sum of f(j) over j in [0, n), in the type f returns; every lane gets it.
template <class Member, class F>
KOKKOS_FORCEINLINE_FUNCTION auto row_sum(const Member& m, int64_t n, const F& f) {
  using T = std::remove_cv_t<decltype(f(int64_t(0)))>;
  if constexpr (!host_member<Member>) {
    return lanes_sum<T>(m, n, f);
  } else {
    T s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < n; ++j) s += f(j);
    return s;
  }
}

// row_sum, but on the host strictly in index order (no simd): for the loops
// that summed sequentially before teams, whose bits a vector sum would change.
template <class Member, class F>
KOKKOS_FORCEINLINE_FUNCTION auto row_sum_ordered(const Member& m, int64_t n, const F& f) {
  using T = std::remove_cv_t<decltype(f(int64_t(0)))>;
  if constexpr (!host_member<Member>) {
    return lanes_sum<T>(m, n, f);
  } else {
    T s = 0;
    for (int64_t j = 0; j < n; ++j) s += f(j);
    return s;
  }
}

// max of f(j) over j in [0, n), n >= 1 (a row of -inf gives -inf); every
// lane gets it. The host seeds it with f(0), as the kernels did.
template <class Member, class F>
KOKKOS_FORCEINLINE_FUNCTION auto row_max(const Member& m, int64_t n, const F& f) {
  using T = std::remove_cv_t<decltype(f(int64_t(0)))>;
  T mx = f(0);
  if constexpr (host_member<Member>) {
#pragma omp simd reduction(max : mx)
    for (int64_t j = 1; j < n; ++j) {
      const T v = f(j);
      mx = v > mx ? v : mx;
    }
  } else {
    Kokkos::parallel_reduce(
        Kokkos::ThreadVectorRange(m, n),
        [&](int64_t j, T& acc) {
          const T v = f(j);
          acc = v > acc ? v : acc;
        },
        Kokkos::Max<T>(mx));
    // Kokkos' identity for max is the lowest finite value, not -inf: a row
    // of -inf reduces to it. Only then (warp-uniform, rare) count the
    // values above -inf to tell the two apart.
    if (mx == Kokkos::reduction_identity<T>::max() &&
        row_sum(m, n, [&](int64_t j) { return int32_t(f(j) > -kmath::infinity<T>()); }) == 0)
      mx = -kmath::infinity<T>();
  }
  return mx;
}

// f() once for the row (one lane), after the row's earlier lane loops.
template <class Member, class F>
KOKKOS_FORCEINLINE_FUNCTION void row_single(const Member& m, const F& f) {
  if constexpr (host_member<Member>) f();
  else Kokkos::single(Kokkos::PerThread(m), f);
}

// Exclusive scan over j in [0, n) of integer counts: f(j, acc, final) adds
// j's count to acc, and where final is true acc holds the counts of [0, j)
// (a device calls f twice per j: keep side effects under final). Integers
// only, so every order gives the same values. Host: one pass in index order.
template <class T, class Member, class F>
KOKKOS_FORCEINLINE_FUNCTION void row_scan(const Member& m, int64_t n, const F& f) {
  static_assert(std::is_integral_v<T>, "row_scan: integer counts only (a float scan's bits would depend on the backend)");
  if constexpr (host_member<Member>) {
    T acc = 0;
    for (int64_t j = 0; j < n; ++j) f(j, acc, true);
  } else {
    Kokkos::parallel_scan(Kokkos::ThreadVectorRange(m, n), [&](int64_t j, T& acc, bool final) { f(j, acc, final); });
  }
}

// The first j in [0, n) with pred(j), or n if none; every lane gets it.
// Host: a loop in index order that stops there. Device: a min over the lanes.
template <class Member, class Pred>
KOKKOS_FORCEINLINE_FUNCTION int64_t row_first(const Member& m, int64_t n, const Pred& pred) {
  if constexpr (host_member<Member>) {
    for (int64_t j = 0; j < n; ++j)
      if (pred(j)) return j;
    return n;
  } else {
    int64_t first = n;
    Kokkos::parallel_reduce(
        Kokkos::ThreadVectorRange(m, n), [&](int64_t j, int64_t& acc) { acc = pred(j) && j < acc ? j : acc; },
        Kokkos::Min<int64_t>(first));
    return first < n ? first : n;
  }
}

// ----------------------------------------------------------------------------
// histograms: a team per row of items

// Team shape of a device histogram: kHistogramThreads threads x kVector lanes
// share the row's items, counting into `bins` int32 of team scratch.
constexpr int kHistogramThreads = 8;

inline TeamPolicy histogram_policy(int64_t rows, int64_t bins) {
  if constexpr (host_space<ExecSpace>) return TeamPolicy(int(rows), 1, 1);
  else
    return TeamPolicy(int(rows), kHistogramThreads, kVector)
        .set_scratch_size(0, Kokkos::PerTeam(sizeof(int32_t) * bins));
}

// out[0 .. bins) = how many items j in [0, n) have bin_of(j) == b (an item
// whose bin_of is negative is not counted), for the member's row. Host: one
// pass in item order. Device: the team's lanes count into team scratch with
// integer atomics (counts are the same in any order), then copy it out.
template <class Member, class Bin>
KOKKOS_FORCEINLINE_FUNCTION void row_histogram(const Member& m, int64_t n, int64_t bins, const Bin& bin_of,
                                               int32_t* out) {
  if constexpr (host_member<Member>) {
    for (int64_t b = 0; b < bins; ++b) out[b] = 0;
    for (int64_t j = 0; j < n; ++j) {
      const int64_t b = bin_of(j);
      if (b >= 0) ++out[b];
    }
  } else {
    int32_t* h = static_cast<int32_t*>(m.team_scratch(0).get_shmem(sizeof(int32_t) * bins));
    Kokkos::parallel_for(Kokkos::TeamVectorRange(m, bins), [&](int64_t b) { h[b] = 0; });
    m.team_barrier();
    Kokkos::parallel_for(Kokkos::TeamVectorRange(m, n), [&](int64_t j) {
      const int64_t b = bin_of(j);
      if (b >= 0) Kokkos::atomic_add(&h[b], int32_t(1));
    });
    m.team_barrier();
    Kokkos::parallel_for(Kokkos::TeamVectorRange(m, bins), [&](int64_t b) { out[b] = h[b]; });
  }
}

// ----------------------------------------------------------------------------
// flat arrays, in chunks of rows

// A flat loop over n elements runs as rows of kFlatChunk (one chunk per host
// work item keeps the vector loop inside it, as before teams).
constexpr int64_t kFlatChunk = 2048;
KOKKOS_INLINE_FUNCTION constexpr int64_t flat_chunks(int64_t n) { return (n + kFlatChunk - 1) / kFlatChunk; }
inline TeamPolicy flat_policy(int64_t n) { return row_policy(flat_chunks(n)); }

// f(i) for the member's elements i of [0, n), each chunk a vector loop.
template <class Member, class F>
KOKKOS_FORCEINLINE_FUNCTION void for_flat(const Member& m, int64_t n, const F& f) {
  for_rows(m, flat_chunks(n), [&](int64_t c) {
    const int64_t i0 = c * kFlatChunk, len = n - i0 < kFlatChunk ? n - i0 : kFlatChunk;
    row_for(m, len, [&](int64_t k) { f(i0 + k); });
  });
}

// acc += the sum of f(i) over the member's chunks of [0, n): each chunk's
// row_sum, then the chunks added (the body of a parallel_reduce over
// flat_policy(n); the reduction adds the teams' parts in its fixed order).
template <class Member, class F, class Acc>
KOKKOS_FORCEINLINE_FUNCTION void flat_sum(const Member& m, int64_t n, const F& f, Acc& acc) {
  for_rows(m, flat_chunks(n), [&](int64_t c) {
    const int64_t i0 = c * kFlatChunk, len = n - i0 < kFlatChunk ? n - i0 : kFlatChunk;
    const auto part = row_sum(m, len, [&](int64_t k) { return f(i0 + k); });
    row_single(m, [&] { acc += part; });
  });
}

// ----------------------------------------------------------------------------
// columns

// Columns are taken kColumnBlock at a time, one block per team. On a device
// a column's rows are split into kColumnSlices fixed strided slices (slice s
// holds rows s, s + kColumnSlices, ...), each summed in row order by one
// thread, then the slices summed in slice order: a fixed order whatever the
// hardware. Team: kColumnSlices threads of kColumnBlock lanes (256), and
// kColumnSlices * kColumnBlock values of team scratch (8 KiB in double).
constexpr int64_t kColumnBlock = 32;
constexpr int kColumnSlices = 8;
inline int64_t column_blocks(int64_t cols) { return (cols + kColumnBlock - 1) / kColumnBlock; }

// For column_sums over values of type T.
template <class T>
TeamPolicy column_sum_policy(int64_t cols) {
  if constexpr (host_space<ExecSpace>) {
    return TeamPolicy(int(column_blocks(cols)), 1, 1);
  } else {
    return TeamPolicy(int(column_blocks(cols)), kColumnSlices, int(kColumnBlock))
        .set_scratch_size(0, Kokkos::PerTeam(sizeof(T) * kColumnSlices * kColumnBlock));
  }
}

// store(c, sum over rows i of f(i, c)) for the columns c of the member's
// block (c < cols). On the host the rows are summed in order, the block's
// columns in a vector loop; on a device as the slices above.
template <class Member, class F, class Store>
KOKKOS_FORCEINLINE_FUNCTION void column_sums(const Member& m, int64_t rows, int64_t cols, const F& f,
                                             const Store& store) {
  using T = std::remove_cv_t<decltype(f(int64_t(0), int64_t(0)))>;
  const int64_t c0 = int64_t(m.league_rank()) * kColumnBlock;
  const int64_t n = cols - c0 < kColumnBlock ? cols - c0 : kColumnBlock;
  if constexpr (host_member<Member>) {
    T acc[kColumnBlock] = {};
    for (int64_t i = 0; i < rows; ++i) {
#pragma omp simd
      for (int64_t c = 0; c < n; ++c) acc[c] += f(i, c0 + c);
    }
    for (int64_t c = 0; c < n; ++c) store(c0 + c, acc[c]);
  } else {
    T* part = static_cast<T*>(m.team_scratch(0).get_shmem(sizeof(T) * kColumnSlices * kColumnBlock));
    Kokkos::parallel_for(Kokkos::TeamThreadRange(m, kColumnSlices), [&](int s) {
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(m, n), [&](int64_t c) {
        T acc = 0;
        for (int64_t i = s; i < rows; i += kColumnSlices) acc += f(i, c0 + c);
        part[s * kColumnBlock + c] = acc;
      });
    });
    m.team_barrier();
    Kokkos::parallel_for(Kokkos::TeamVectorRange(m, n), [&](int64_t c) {
      T acc = part[c];
      for (int s = 1; s < kColumnSlices; ++s) acc += part[s * kColumnBlock + c];
      store(c0 + c, acc);
    });
  }
}

// For column_rows: one team of kColumnBlock lanes per column block.
inline TeamPolicy column_policy(int64_t cols) {
  if constexpr (host_space<ExecSpace>) return TeamPolicy(int(column_blocks(cols)), 1, 1);
  else return TeamPolicy(int(column_blocks(cols)), 1, int(kColumnBlock));
}

// f(i, c) for every row i in order, for the columns c of the member's block:
// each column sees its rows in order (a scatter-add into rows that repeat
// stays deterministic). Host: rows outer, the block's columns a vector loop.
template <class Member, class F>
KOKKOS_FORCEINLINE_FUNCTION void column_rows(const Member& m, int64_t rows, int64_t cols, const F& f) {
  const int64_t c0 = int64_t(m.league_rank()) * kColumnBlock;
  const int64_t n = cols - c0 < kColumnBlock ? cols - c0 : kColumnBlock;
  if constexpr (host_member<Member>) {
    for (int64_t i = 0; i < rows; ++i) {
#pragma omp simd
      for (int64_t c = 0; c < n; ++c) f(i, c0 + c);
    }
  } else {
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(m, n), [&](int64_t c) {
      for (int64_t i = 0; i < rows; ++i) f(i, c0 + c);
    });
  }
}

}  // namespace xx::kernels

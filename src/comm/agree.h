// What every rank must see alike, agreed in one small collective each: the
// step's losses and its inf/NaN verdict, the loss scaler's overflow, the
// experts' global load, the stop signals, the evaluation's sums; and what
// rank 0 read (a checkpoint, a resume path), with its error, to every rank.
// train/ decides what to agree on; the collectives are issued here.
#pragma once
#include <mpi.h>
#include <algorithm>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <type_traits>
#include <vector>
#include "core/error.h"

namespace xx {

// Whether any rank's flag is set.
bool any_rank(bool mine, MPI_Comm comm);
// In place: each entry summed over the ranks (one MPI_Allreduce: the same bits on every rank).
void sum_over_ranks(std::span<double> values, MPI_Comm comm);
// In place: each entry the largest over the ranks.
void max_over_ranks(std::span<int> values, MPI_Comm comm);
// Every rank's row (`mine`, the same length on each), in rank order.
std::vector<double> rows_of_all_ranks(std::span<const double> mine, MPI_Comm comm);
// Returns once every rank has called it (output barrier on).
void every_rank_arrives(MPI_Comm comm);
// In place: each entry the mean over the ranks, summed on rank 0 and sent from there (every rank the same bits).
void mean_from_rank0(std::vector<float>& values, MPI_Comm comm);

// In place: every rank's named vectors joined (a name several ranks hold
// keeps this rank's values): pipeline stages' state buffers, each stage's own.
void union_over_ranks(std::map<std::string, std::vector<float>>& m, MPI_Comm comm);

// Rank 0's value to every rank: a plain value (its bytes), a string, a vector
// (its size first), a map of named vectors.
template <class T>
  requires std::is_trivially_copyable_v<T>
void from_rank0(T& value, MPI_Comm comm) {
  MPI_Bcast(&value, int(sizeof(T)), MPI_BYTE, 0, comm);
}
void from_rank0(std::string& s, MPI_Comm comm);
template <class T>
  requires std::is_trivially_copyable_v<T>
void from_rank0(std::vector<T>& v, MPI_Comm comm) {
  int64_t n = int64_t(v.size());
  MPI_Bcast(&n, 1, MPI_INT64_T, 0, comm);
  v.resize(size_t(n));
  // (in pieces below 2^31 bytes: MPI counts are ints)
  constexpr int64_t chunk = (int64_t(1) << 30) / int64_t(sizeof(T));
  for (int64_t at = 0; at < n; at += chunk)
    MPI_Bcast(v.data() + at, int(std::min(chunk, n - at) * int64_t(sizeof(T))), MPI_BYTE, 0, comm);
}
template <class T>
void from_rank0(std::map<std::string, std::vector<T>>& m, MPI_Comm comm) {
  std::vector<std::string> names;
  for (const auto& [name, v] : m) names.push_back(name);
  int64_t count = int64_t(names.size());
  from_rank0(count, comm);
  names.resize(size_t(count));
  for (auto& name : names) {
    from_rank0(name, comm);
    from_rank0(m[name], comm);
  }
}

// Rank 0 reads a file-based thing; every rank learns the outcome. An
// InputError on rank 0 becomes the same InputError on every rank.
template <class F>
void on_rank0_or_throw(MPI_Comm comm, int rank, F&& f) {
  std::string error;
  if (rank == 0) try {
      f();
    } catch (const InputError& e) {
      error = e.what();
    }
  from_rank0(error, comm);
  if (!error.empty()) throw InputError(error);
}

}  // namespace xx

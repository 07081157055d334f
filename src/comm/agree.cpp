#include "comm/agree.h"
#include <algorithm>

namespace xx {

bool any_rank(bool mine, MPI_Comm comm) {
  int flag = mine ? 1 : 0, any = 0;
  MPI_Allreduce(&flag, &any, 1, MPI_INT, MPI_MAX, comm);
  return any != 0;
}

void sum_over_ranks(std::span<double> values, MPI_Comm comm) {
  const std::vector<double> mine(values.begin(), values.end());
  MPI_Allreduce(mine.data(), values.data(), int(values.size()), MPI_DOUBLE, MPI_SUM, comm);
}

void max_over_ranks(std::span<int> values, MPI_Comm comm) {
  MPI_Allreduce(MPI_IN_PLACE, values.data(), int(values.size()), MPI_INT, MPI_MAX, comm);
}

std::vector<double> rows_of_all_ranks(std::span<const double> mine, MPI_Comm comm) {
  int ranks = 1;
  MPI_Comm_size(comm, &ranks);
  std::vector<double> all(mine.size() * size_t(ranks));
  MPI_Allgather(mine.data(), int(mine.size()), MPI_DOUBLE, all.data(), int(mine.size()), MPI_DOUBLE, comm);
  return all;
}

void mean_from_rank0(std::vector<float>& values, MPI_Comm comm) {
  int rank = 0, ranks = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &ranks);
  // (in pieces of 2^28 floats: MPI counts are ints)
  constexpr int64_t chunk = int64_t(1) << 28;
  const int64_t n = int64_t(values.size());
  for (int64_t at = 0; at < n; at += chunk) {
    float* part = values.data() + at;
    MPI_Reduce(rank == 0 ? MPI_IN_PLACE : part, part, int(std::min(chunk, n - at)), MPI_FLOAT, MPI_SUM, 0, comm);
  }
  if (rank == 0)
    for (auto& x : values) x /= float(ranks);
  from_rank0(values, comm);
}

void every_rank_arrives(MPI_Comm comm) { MPI_Barrier(comm); }

void from_rank0(std::string& s, MPI_Comm comm) {
  std::vector<char> chars(s.begin(), s.end());
  from_rank0(chars, comm);
  s.assign(chars.begin(), chars.end());
}

}  // namespace xx

#include "comm/agree.h"
#include <algorithm>
#include <cstring>
#include <limits>
#include <stdexcept>

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

void union_over_ranks(std::map<std::string, std::vector<float>>& m, MPI_Comm comm) {
  std::vector<char> mine;
  auto put = [&mine](const void* p, size_t n) {
    const char* c = static_cast<const char*>(p);
    mine.insert(mine.end(), c, c + n);
  };
  for (const auto& [name, v] : m) {
    const int64_t len = int64_t(name.size()), n = int64_t(v.size());
    put(&len, sizeof len), put(name.data(), name.size()), put(&n, sizeof n), put(v.data(), v.size() * sizeof(float));
  }
  int ranks = 1;
  MPI_Comm_size(comm, &ranks);
  if (mine.size() > size_t(std::numeric_limits<int>::max())) throw std::length_error("union_over_ranks: 2 GiB or more");
  const int size = int(mine.size());
  std::vector<int> sizes(static_cast<size_t>(ranks)), at(static_cast<size_t>(ranks), 0);
  MPI_Allgather(&size, 1, MPI_INT, sizes.data(), 1, MPI_INT, comm);
  for (int r = 1; r < ranks; ++r) at[size_t(r)] = at[size_t(r - 1)] + sizes[size_t(r - 1)];
  std::vector<char> all(size_t(at.back()) + size_t(sizes.back()));
  MPI_Allgatherv(mine.data(), size, MPI_BYTE, all.data(), sizes.data(), at.data(), MPI_BYTE, comm);
  for (size_t p = 0; p < all.size();) {
    int64_t len = 0, n = 0;
    std::memcpy(&len, &all[p], sizeof len), p += sizeof len;
    std::string name(&all[p], size_t(len));
    p += size_t(len);
    std::memcpy(&n, &all[p], sizeof n), p += sizeof n;
    std::vector<float> v(static_cast<size_t>(n));
    std::memcpy(v.data(), &all[p], size_t(n) * sizeof(float)), p += size_t(n) * sizeof(float);
    m.emplace(std::move(name), std::move(v));  // (a name this rank holds stays its own)
  }
}

}  // namespace xx

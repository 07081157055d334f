// What the trainer's two files share: host copies of device buffers, and
// broadcasts from rank 0 (the checkpoint reader is rank 0; every rank learns
// the result or the error).
#pragma once
#include <mpi.h>
#include <algorithm>
#include <map>
#include <string>
#include <vector>
#include "core/error.h"
#include "core/ownership.h"
#include "core/views.h"

namespace xx::transfer {

template <class T>
std::vector<T> to_host(const Buffer<T>& b) {
  std::vector<T> out(b.extent(0));
  Kokkos::deep_copy(Kokkos::View<T*, Kokkos::HostSpace, Unmanaged>(out.data(), out.size()), b);
  return out;
}

template <class T>
void from_host(Buffer<T>& b, const std::vector<T>& v) {
  Kokkos::deep_copy(b, Kokkos::View<const T*, Kokkos::HostSpace, Unmanaged>(v.data(), v.size()));
}

// A flat buffer's pieces owned by this rank, and the same pieces back to back
// in shard order (any two Views: kernel or host memory): from the flat
// buffer's places into the shard, and back. The rest of the flat buffer is
// not touched.
template <class Flat, class Shard>
void pieces_to_shard(const Flat& flat, const Shard& shard, const Ownership& owned) {
  for (const auto& p : owned.pieces())
    Kokkos::deep_copy(Kokkos::subview(shard, std::pair(p.at, p.at + p.size())),
                      Kokkos::subview(flat, std::pair(p.begin, p.end)));
}

template <class Shard, class Flat>
void shard_to_pieces(const Shard& shard, const Flat& flat, const Ownership& owned) {
  for (const auto& p : owned.pieces())
    Kokkos::deep_copy(Kokkos::subview(flat, std::pair(p.begin, p.end)),
                      Kokkos::subview(shard, std::pair(p.at, p.at + p.size())));
}

// This rank's pieces of a flat buffer in a host vector, in shard order; and back.
template <class T>
std::vector<T> take_pieces(const Buffer<T>& b, const Ownership& owned) {
  std::vector<T> out(owned.shard_size());
  pieces_to_shard(b, Kokkos::View<T*, Kokkos::HostSpace, Unmanaged>(out.data(), out.size()), owned);
  return out;
}

template <class T>
void put_pieces(Buffer<T>& b, const std::vector<T>& shard, const Ownership& owned) {
  shard_to_pieces(Kokkos::View<const T*, Kokkos::HostSpace, Unmanaged>(shard.data(), shard.size()), b, owned);
}

// Rank 0's string to every rank.
inline void bcast_string(std::string& s, MPI_Comm comm) {
  int n = int(s.size());
  MPI_Bcast(&n, 1, MPI_INT, 0, comm);
  s.resize(n);
  MPI_Bcast(s.data(), n, MPI_CHAR, 0, comm);
}

// Rank 0's vector to every rank (sizes first).
template <class T>
void bcast_vector(std::vector<T>& v, MPI_Datatype type, MPI_Comm comm) {
  int64_t n = int64_t(v.size());
  MPI_Bcast(&n, 1, MPI_INT64_T, 0, comm);
  v.resize(n);
  MPI_Bcast(v.data(), int(n), type, 0, comm);
}

// Rank 0's map of named vectors to every rank.
template <class T>
void bcast_map(std::map<std::string, std::vector<T>>& m, MPI_Datatype type, MPI_Comm comm) {
  std::vector<std::string> names;
  for (const auto& [name, v] : m) names.push_back(name);
  int64_t count = int64_t(names.size());
  MPI_Bcast(&count, 1, MPI_INT64_T, 0, comm);
  names.resize(count);
  for (auto& name : names) {
    std::vector<char> chars(name.begin(), name.end());
    bcast_vector(chars, MPI_CHAR, comm);
    name.assign(chars.begin(), chars.end());
    bcast_vector(m[name], type, comm);
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
  int n = int(error.size());
  MPI_Bcast(&n, 1, MPI_INT, 0, comm);
  error.resize(n);
  MPI_Bcast(error.data(), n, MPI_CHAR, 0, comm);
  if (!error.empty()) throw InputError(error);
}

}  // namespace xx::transfer

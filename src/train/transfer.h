// What the trainer's files share: host copies of device buffers, and this
// rank's pieces of them (its collectives are comm/agree.h's).
#pragma once
#include <algorithm>
#include <vector>
#include "core/ownership.h"
#include "core/views.h"

namespace xx::transfer {

// Host memory seen as a View (no copy): what a deep_copy to or from kernel memory takes.
template <class T>
Kokkos::View<T*, Kokkos::HostSpace, Unmanaged> host_view(T* p, size_t n) {
  return Kokkos::View<T*, Kokkos::HostSpace, Unmanaged>(p, n);
}
template <class T>
Kokkos::View<T*, Kokkos::HostSpace, Unmanaged> host_view(std::vector<T>& v) {
  return host_view(v.data(), v.size());
}

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

}  // namespace xx::transfer

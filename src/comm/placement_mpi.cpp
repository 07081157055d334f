#include "comm/placement_mpi.h"
#include <algorithm>
#include <stdexcept>
#include "kernels/elementwise.h"

static_assert(sizeof(float) == sizeof(int), "to_file_frame ORs a float's bits as an int's");

namespace xx {
namespace {

// In place: each float the bitwise OR of its bits over `comm`. Where one
// rank holds a value and the others zeros (or all the same bits), every
// rank gets that value exactly, -0 and NaN payloads included.
void or_bits(float* values, int64_t n, MPI_Comm comm) {
  constexpr int64_t chunk = int64_t(1) << 30;  // (MPI counts are ints)
  for (int64_t at = 0; at < n; at += chunk)
    MPI_Allreduce(MPI_IN_PLACE, values + at, int(std::min(chunk, n - at)), MPI_INT, MPI_BOR, comm);
}

}  // namespace

PlacementMpi::PlacementMpi(MPI_Comm world, MPI_Comm replicas, const Placement& placement)
    : world_(world), replicas_(replicas), placement_(placement) {
  if (const StageCut& s = placement.stage(); s.stages > 1) MPI_Comm_split(world, s.replica, s.stage, &chain_);
  const ExpertShare& e = placement.experts();
  if (e.ep == 1) return;
  MPI_Comm_split(replicas, e.holder, e.share, &ep_group_);
  MPI_Comm_split(replicas, e.share, e.holder, &holders_);
}

PlacementMpi::~PlacementMpi() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  for (MPI_Comm* c : {&ep_group_, &holders_, &chain_})
    if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
}

void PlacementMpi::gather_in_place(std::vector<float>& mine) const {
  const Ownership& owned = placement_.owned();
  if (owned.ranks() == 1) return;
  for (const auto& b : owned.buckets())
    if (b.counts.size() > 1)
      MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, mine.data() + b.begin, b.counts.data(), b.displs.data(),
                     MPI_FLOAT, b.expert ? holders_ : replicas_);
}

std::vector<float> PlacementMpi::gather_whole(const std::vector<float>& shard) const {
  const Ownership& owned = placement_.owned();
  if (owned.ranks() == 1) return shard;
  std::vector<float> mine(owned.total());
  for (const auto& p : owned.pieces()) std::copy_n(shard.begin() + p.at, p.size(), mine.begin() + p.begin);
  gather_in_place(mine);
  return mine;
}

std::vector<float> PlacementMpi::owned_part(const std::vector<float>& mine) const {
  const Ownership& owned = placement_.owned();
  if (owned.ranks() == 1) return mine;
  std::vector<float> out(owned.shard_size());
  for (const auto& p : owned.pieces()) std::copy_n(mine.begin() + p.begin, p.size(), out.begin() + p.at);
  return out;
}

std::vector<float> PlacementMpi::to_file_frame(const std::vector<float>& mine) const {
  if (chain_ != MPI_COMM_NULL) {  // every tensor has one holder here: OR of its bits and the others' zeros
    std::vector<float> whole(size_t(placement_.whole_total()), 0.0f);
    placement_.to_whole(mine.data(), whole.data());
    const auto [echo_begin, echo_end] = placement_.echo();
    if (echo_end > echo_begin)
      for (const FrameTensor& t : placement_.frame())
        if (t.local == echo_begin) std::fill_n(whole.begin() + t.offset, t.size, 0.0f);
    // Under ep the stage's expert-parallel group ORs in the other shares' experts: the tensors its ranks
    // all hold are the same bits, and x | x is x.
    for (MPI_Comm c : {chain_, ep_group_})
      if (c != MPI_COMM_NULL) or_bits(whole.data(), int64_t(whole.size()), c);
    return whole;
  }
  const ExpertShare& e = placement_.experts();
  if (e.ep == 1) return mine;
  std::vector<float> whole(placement_.whole_total());
  placement_.to_whole(mine.data(), whole.data());
  std::vector<float> held;
  for (const auto& [begin, end] : e.runs) held.insert(held.end(), &mine[begin], &mine[end]);
  std::vector<float> all(held.size() * e.ep);
  MPI_Allgather(held.data(), int(held.size()), MPI_FLOAT, all.data(), int(held.size()), MPI_FLOAT, ep_group_);
  // Share q's experts arrive in frame order, as its runs hold them.
  for (int q = 0; q < e.ep; ++q) {
    const float* from = all.data() + q * held.size();
    for (const auto& t : placement_.frame())
      if (t.share == q) std::copy_n(from, t.size, whole.begin() + t.offset), from += t.size;
  }
  return whole;
}

std::vector<float> PlacementMpi::gather_tensor(Vec<const float> shard, size_t tensor) const {
  const FrameTensor& t = placement_.frame().at(tensor);
  std::vector<float> whole(size_t(t.size), 0.0f);
  for (const FrameSlab& s : placement_.piece_slabs())
    if (s.tensor == tensor)
      Kokkos::deep_copy(Kokkos::View<float*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
                            whole.data() + s.begin, size_t(s.count)),
                        Vec<const float>(shard.data() + s.at, s.count));
  or_bits(whole.data(), t.size, replicas_);  // (each element has one owner among the replicas)
  return whole;
}

void PlacementMpi::put_tensor(const std::vector<float>& whole, Vec<float> shard, size_t tensor) const {
  for (const FrameSlab& s : placement_.piece_slabs())
    if (s.tensor == tensor)
      Kokkos::deep_copy(Vec<float>(shard.data() + s.at, s.count),
                        Kokkos::View<const float*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
                            whole.data() + s.begin, size_t(s.count)));
}

std::vector<float> PlacementMpi::from_file_frame(const std::vector<float>& whole) const {
  if (placement_.holds_all()) return whole;
  std::vector<float> mine(placement_.local_total());
  placement_.from_whole(whole.data(), mine.data());
  return mine;
}

double PlacementMpi::gradient_sum_squares(Vec<const float> values) const {
  const float* g = values.data();
  auto squares = [g](int64_t begin, int64_t end) {
    return kernels::sum_squares<float>(Vec<const float>(g + begin, end - begin));
  };
  const bool shard = placement_.gradients_sharded();
  if (placement_.experts().ep == 1 || shard) {  // (each piece of a shard, expert or not, has one owner among the replicas)
    double sum = squares(0, values.extent(0));
    if (shard) MPI_Allreduce(MPI_IN_PLACE, &sum, 1, MPI_DOUBLE, MPI_SUM, replicas_);
    return sum;
  }
  double rest = 0, experts = 0;
  int64_t at = 0;
  for (const auto& [begin, end] : placement_.experts().runs)
    rest += squares(at, begin), experts += squares(begin, end), at = end;
  rest += squares(at, values.extent(0));
  MPI_Allreduce(MPI_IN_PLACE, &experts, 1, MPI_DOUBLE, MPI_SUM, ep_group_);
  return rest + experts;
}

double PlacementMpi::tensor_sum_squares(Vec<const float> values, MPI_Comm chain) const {
  const Frame& frame = placement_.frame();
  const auto [echo_begin, echo_end] = placement_.echo();
  if (placement_.gradients_sharded()) {  // this rank's pieces: each element has one owner among the replicas
    std::vector<double> each(frame.size(), 0.0);
    for (const FrameSlab& s : placement_.piece_slabs())
      if (!(echo_end > echo_begin && frame[s.tensor].local == echo_begin))
        each[s.tensor] += kernels::sum_squares<float>(Vec<const float>(values.data() + s.at, s.count));
    for (MPI_Comm c : {replicas_, chain})
      MPI_Allreduce(MPI_IN_PLACE, each.data(), int(each.size()), MPI_DOUBLE, MPI_SUM, c);
    double sum = 0;
    for (double x : each) sum += x;
    return sum;
  }
  const int share = placement_.experts().share;
  // exact sums: one term per tensor is not zero (under ep a tensor every share holds counts on share 0's rank)
  std::vector<double> each(frame.size(), 0.0);
  for (size_t k = 0; k < frame.size(); ++k)
    if (frame[k].local >= 0 && !(echo_end > echo_begin && frame[k].local == echo_begin) &&
        (frame[k].share >= 0 || share == 0))
      each[k] = kernels::sum_squares<float>(Vec<const float>(values.data() + frame[k].local, frame[k].size));
  MPI_Allreduce(MPI_IN_PLACE, each.data(), int(each.size()), MPI_DOUBLE, MPI_SUM, chain);
  if (ep_group_ != MPI_COMM_NULL) MPI_Allreduce(MPI_IN_PLACE, each.data(), int(each.size()), MPI_DOUBLE, MPI_SUM, ep_group_);
  double sum = 0;
  for (double x : each) sum += x;
  return sum;
}

}  // namespace xx

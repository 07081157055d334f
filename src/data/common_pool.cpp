// The common pool in a node's shared memory; the protocol is in common_pool.h.
#include "data/common_pool.h"
#include <algorithm>
#include <climits>
#include <stdexcept>
#include <string>

namespace xx {

CommonPool::CommonPool(MPI_Comm comm, const Corpus& corpus, const std::vector<int64_t>& windows, int64_t seq)
    : windows_(int64_t(windows.size())), seq_(seq) {
  if (windows.empty() || seq < 1)
    throw std::invalid_argument("CommonPool: " + std::to_string(windows.size()) + " windows of seq " +
                                std::to_string(seq) + " (expected at least one window, seq >= 1)");
  // Checked on every rank before any collective (the list is the same everywhere).
  for (int64_t w : windows)
    if (w < 0 || w >= corpus.windows(seq))
      throw std::out_of_range("CommonPool: window " + std::to_string(w) + " of " + std::to_string(seq) +
                              "+1 tokens is past the " + std::to_string(corpus.windows(seq)) + " windows of " +
                              corpus.path());
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  // 1. The node: keyed by rank, so global rank 0 is its node's leader.
  MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node_);
  MPI_Comm_rank(node_, &node_rank_);
  MPI_Comm_size(node_, &node_size_);
  const bool leader = node_rank_ == 0;
  MPI_Comm_split(comm, leader ? 0 : MPI_UNDEFINED, rank, &leaders_);
  if (leader) MPI_Comm_size(leaders_, &nodes_);
  MPI_Bcast(&nodes_, 1, MPI_INT, 0, node_);

  // 2. One copy per node: the leader allocates it all, the others nothing.
  const MPI_Aint size = leader ? MPI_Aint(bytes()) : 0;
  void* mine = nullptr;
  MPI_Win_allocate_shared(size, int(sizeof(int32_t)), MPI_INFO_NULL, node_, &mine, &win_);
  MPI_Aint leader_size = 0;
  int unit = 0;
  void* shared = nullptr;
  MPI_Win_shared_query(win_, 0, &leader_size, &unit, &shared);
  base_ = static_cast<int32_t*>(shared);

  // 3. Global rank 0 fills its copy; the other leaders receive it.
  MPI_Win_fence(0, win_);
  if (rank == 0) {
    for (int64_t i = 0; i < windows_; ++i) corpus.read_window(windows[size_t(i)], seq, base_ + i * (seq + 1));
  }
  if (leader) {
    // MPI counts are int: send in chunks of at most INT_MAX/2 tokens.
    const int64_t total = windows_ * (seq + 1), chunk = INT_MAX / 2;
    for (int64_t at = 0; at < total; at += chunk)
      MPI_Bcast(base_ + at, int(std::min(chunk, total - at)), MPI_INT32_T, 0, leaders_);
  }
  // 4. The leader's writes are visible to the node after the fence.
  MPI_Win_fence(0, win_);
}

CommonPool::~CommonPool() {
  if (win_ != MPI_WIN_NULL) MPI_Win_free(&win_);
  if (leaders_ != MPI_COMM_NULL) MPI_Comm_free(&leaders_);
  if (node_ != MPI_COMM_NULL) MPI_Comm_free(&node_);
}

int64_t CommonPool::local_bytes() const {
  MPI_Aint size = 0;
  int unit = 0;
  void* base = nullptr;
  MPI_Win_shared_query(win_, node_rank_, &size, &unit, &base);
  return int64_t(size);
}

}  // namespace xx

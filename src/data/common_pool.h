// The common pool's tokens, held once per node in an MPI-3 shared-memory
// window (docs/DATA.md, "The common pool"):
//   1. the ranks of a node form a communicator (MPI_Comm_split_type SHARED);
//   2. the node leader (node rank 0) allocates the whole pool in the window,
//      every other rank allocates 0 bytes and finds the leader's memory with
//      MPI_Win_shared_query;
//   3. global rank 0 copies the pool windows out of its corpus and sends them
//      to the other node leaders (MPI_Bcast over a communicator of leaders):
//      one source of truth, whatever the other ranks loaded;
//   4. a fence on the window; from then on the ranks only read, in place.
#pragma once
#include <mpi.h>
#include <cstdint>
#include <vector>
#include "data/corpus.h"

namespace xx {

// Read-only view of pool windows: slot i is tokens[i*(seq+1), (i+1)*(seq+1)).
struct PoolTokens {
  const int32_t* tokens = nullptr;
  int64_t windows = 0;
  int64_t seq = 0;
  const int32_t* window(int64_t slot) const { return tokens + slot * (seq + 1); }
};

class CommonPool {
 public:
  // Collective over comm. `windows`: the corpus windows of the pool in slot
  // order (the same on every rank); each holds seq+1 tokens from window*seq.
  CommonPool(MPI_Comm comm, const Corpus& corpus, const std::vector<int64_t>& windows, int64_t seq);
  ~CommonPool();  // frees the window: destroy before MPI_Finalize
  CommonPool(const CommonPool&) = delete;
  CommonPool& operator=(const CommonPool&) = delete;

  PoolTokens tokens() const { return {base_, windows_, seq_}; }
  int64_t bytes() const { return windows_ * (seq_ + 1) * int64_t(sizeof(int32_t)); }  // the whole pool
  int64_t local_bytes() const;  // what this rank contributes to the window (MPI_Win_shared_query)
  int node_rank() const { return node_rank_; }
  int node_size() const { return node_size_; }
  int nodes() const { return nodes_; }  // node leaders in comm
  MPI_Comm node_comm() const { return node_; }

 private:
  MPI_Comm node_ = MPI_COMM_NULL, leaders_ = MPI_COMM_NULL;
  MPI_Win win_ = MPI_WIN_NULL;
  int32_t* base_ = nullptr;
  int64_t windows_ = 0, seq_ = 0;
  int node_rank_ = 0, node_size_ = 1, nodes_ = 1;
};

}  // namespace xx

// A flat gradient buffer summed over the ranks bucket by bucket, overlapped
// with the backward pass: the one reduction under sync dense and under every
// ZeRO level (comm/sync_sharded.cpp). Buckets count from the buffer's end,
// because the backward finishes the LM head first and the embedding last.
//
// Protocol, per step:
//   1. begin(group): nothing in flight; `group` sums this step.
//   2. ready(offset) from the backward: every gradient in [offset, end) is
//      final; each bucket lying inside that range starts its MPI_Iallreduce,
//      the ones in flight are poked with MPI_Test so they progress, and
//      beyond the bound on buckets in flight the oldest is waited for.
//   3. finish(): start what is left and wait for all. The buffer then holds
//      sums, not means: the caller divides (by the ranks and micro-batches).
// Each bucket's "reduced" hook runs once its sum is in place (ZeRO-2 keeps
// this rank's piece and hands the bucket's pages back there).
// On a device (a DenseAllreduce that queues: NCCL) step 2 queues each bucket's
// sum on the transport's stream behind an event of the backward's kernels,
// and step 3 makes the kernels that follow wait for the sums: the host never
// waits for the backward, and the sums overlap it. Over an MPI that cannot
// read kernel memory, each bucket's MPI_Iallreduce runs on a host copy
// (comm/kernel_memory_mpi.h), copied back when it completes: still in flight
// during the backward.
// Every rank gets the same bits: each bucket is reduced by one collective.
#pragma once
#include <mpi.h>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>
#include "comm/comm_stats.h"
#include "comm/kernel_memory_mpi.h"
#include "core/views.h"

namespace xx {
class DenseAllreduce;
}

namespace xx {

// moe ... ep N: the runs [begin, end) of the flat buffer that hold this
// rank's routed experts, and the ranks holding the same experts. Those runs
// are summed over these ranks alone, then divided by the world size like
// the rest: each owner's gradient already sums its expert-parallel group's tokens.
struct ExpertRuns {
  std::vector<std::pair<int64_t, int64_t>> runs;
  MPI_Comm holders = MPI_COMM_NULL;
};

struct ReduceBucket {
  int64_t begin = 0, end = 0;
  bool expert = false;  // inside an expert run: summed over its holders
};

// sync dense's cut: buckets of `elements` from the buffer's end, each cut
// again where it crosses an expert run's edge, so that each piece is summed
// over one group. (ZeRO cuts its own: core/ownership.h.)
std::vector<ReduceBucket> cut_from_end(int64_t total, int64_t elements,
                                       const std::vector<std::pair<int64_t, int64_t>>& expert_runs);

class BucketReducer {
 public:
  using Reduced = std::function<void(size_t bucket)>;
  // buckets[0] ends at the buffer's end. max_in_flight: 0 for no bound.
  BucketReducer(Buffer<float> grads, std::vector<ReduceBucket> buckets, MPI_Comm expert_holders,
                int max_in_flight = 0, Reduced reduced = {});
  // An all-reduce other than MPI's (NCCL on device memory); each bucket then
  // goes through it as soon as it is final. Its sums land on its stream, so no hook can follow them.
  void use_device_allreduce(DenseAllreduce& op);

  void begin(MPI_Comm group);
  void ready(int64_t offset);
  void finish();
  const CommStats& stats() const { return stats_; }  // since begin
  size_t size() const { return buckets_.size(); }
  int group_size() const { return group_size_; }  // begin's group
  bool staged() const { return mpi_.staged(); }

 private:
  struct Bucket : ReduceBucket {
    MPI_Request request = MPI_REQUEST_NULL;
    bool started = false;
  };
  void start(size_t b);
  void complete(size_t b);  // wait for bucket b's sum, then its hook
  MPI_Comm group_ = MPI_COMM_NULL, holders_ = MPI_COMM_NULL;
  int group_size_ = 1, holders_size_ = 1, max_in_flight_ = 0;
  Buffer<float> grads_;
  std::vector<Bucket> buckets_;
  Reduced reduced_;
  CommStats stats_;
  DenseAllreduce* device_op_ = nullptr;
  KernelMemoryMpi mpi_;  // after grads_: destroyed first, its copies back still land
};

}  // namespace xx

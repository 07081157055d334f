// Data-parallel gradient averaging over MPI, bucketed and overlapped with the
// backward pass. Buckets are cut from the end of the flat gradient buffer,
// because the backward finishes the LM head first and the embedding last.
//
// Protocol, per step:
//   1. begin(): nothing in flight.
//   2. ready(offset) from the backward: every gradient in [offset, end) is
//      final; each bucket lying inside that range starts an MPI_Iallreduce,
//      and the ones in flight are poked with MPI_Testall so they progress.
//   3. finish(K): start what is left, wait for all, divide by the world size
//      (and by K when the gradients summed K micro-steps).
// On a device (DenseAllreduce that queues: NCCL) step 2 queues each bucket's
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
#include <vector>
#include "comm/kernel_memory_mpi.h"
#include "core/views.h"

namespace xx {
class DenseAllreduce;
}

namespace xx {

// Traffic of one step. bytes_sent is what this rank handed to the transports
// (a collective's whole buffer, once); wire_bytes is what it puts on the wire
// under the bandwidth-optimal algorithm of each collective, for g ranks and a
// buffer of b bytes (integer arithmetic, rounded down):
//   all-reduce (ring: reduce-scatter, then all-gather)   2 (g-1) b / g
//   reduce-scatter, all-gather (b: the whole buffer)      (g-1) b / g
//   point-to-point, all-to-all, payload exchanges        what leaves this rank
struct CommStats {
  int64_t rounds = 0;      // collectives started this step
  int64_t bytes_sent = 0;  // bytes handed to MPI this step (payload)
  int64_t wire_bytes = 0;  // bytes this rank puts on the wire this step (above)
  double seconds = 0;      // wall time inside MPI calls this step
  CommStats& operator+=(const CommStats& s) {
    rounds += s.rounds, bytes_sent += s.bytes_sent, wire_bytes += s.wire_bytes, seconds += s.seconds;
    return *this;
  }
};

// The formulas above: bytes this rank puts on the wire in a collective of g ranks over a buffer of `bytes`.
inline int64_t allreduce_wire_bytes(int64_t bytes, int g) { return g > 1 ? 2 * int64_t(g - 1) * bytes / g : 0; }
inline int64_t gather_wire_bytes(int64_t bytes, int g) { return g > 1 ? int64_t(g - 1) * bytes / g : 0; }

// moe ... ep N: the runs [begin, end) of the flat buffer that hold this
// rank's routed experts, and the ranks holding the same experts. Those runs
// are summed over these ranks alone, then divided by the world size like
// the rest: each owner's gradient already sums its expert-parallel group's tokens.
struct ExpertRuns {
  std::vector<std::pair<int64_t, int64_t>> runs;
  MPI_Comm holders = MPI_COMM_NULL;
};

class GradientSync {
 public:
  GradientSync(MPI_Comm comm, Buffer<float> grads, double bucket_mb, const ExpertRuns& experts = {});
  // An all-reduce other than MPI's (NCCL on device memory); each bucket then
  // goes through it as soon as it is final.
  void use_device_allreduce(DenseAllreduce& op) { device_op_ = &op; }

  void begin(MPI_Comm comm);  // comm: the group that averages this step
  void ready(int64_t offset);
  void finish(int micro_steps = 1);
  const CommStats& stats() const { return stats_; }
  int buckets() const { return int(buckets_.size()); }

 private:
  struct Bucket {
    int64_t begin, end;
    MPI_Request request = MPI_REQUEST_NULL;
    bool started = false;
    bool expert = false;  // inside an expert run: reduced over its holders
  };
  void start(Bucket& b);
  MPI_Comm comm_, holders_ = MPI_COMM_NULL;
  int world_ = 1, holders_size_ = 1;
  Buffer<float> grads_;
  std::vector<Bucket> buckets_;  // buckets_[0] ends at the end of the buffer
  CommStats stats_;
  DenseAllreduce* device_op_ = nullptr;
  KernelMemoryMpi mpi_;  // after grads_: destroyed first, its copies back still land
};

}  // namespace xx

// Pipeline stages (deck: pipeline stages P): the messages between
// neighbouring stages. Built once per job over the world (core/placement.h,
// StageCut: rank r on stage r / dp): the communicator of each stage's
// data-parallel replicas (sync dense averages a stage's gradients over those
// alone) and the chain of one replica's P stages, on which micro-batch m's
// activation goes forward (chunk k to k + 1, on whichever stages hold them:
// with virtual stages a message may go back to stage 0, or to the sender
// itself) and its gradient back.
// Host memory: a caller on a device stages its activations through
// host_copy (core/device_memory.h); a CUDA build will send them by NCCL.
#pragma once
#include <mpi.h>
#include <cstdint>
#include <deque>
#include <vector>
#include "core/placement.h"

namespace xx {

class StageLink {
 public:
  // Collective over world.
  StageLink(MPI_Comm world, const StageCut& cut);
  ~StageLink();  // waits for the sends in flight (not while an exception unwinds)
  StageLink(const StageLink&) = delete;
  StageLink& operator=(const StageLink&) = delete;

  const StageCut& cut() const { return cut_; }
  MPI_Comm data_parallel() const { return replicas_; }  // the ranks of this stage
  MPI_Comm chain() const { return chain_; }             // this replica's stages, stage order

  // Micro-batch `micro`'s activation from chunk `chunk` (one this stage
  // runs) to the next chunk, its gradient to the previous one: copied, then
  // sent without waiting.
  void send_activation(int chunk, int micro, const float* x, int64_t n);
  void send_gradient(int chunk, int micro, const float* g, int64_t n);
  // ... and received by chunk `chunk` from the previous (activation) or next
  // (gradient) chunk; the time spent waiting for them is counted (waited()).
  void recv_activation(int chunk, int micro, float* x, int64_t n);
  void recv_gradient(int chunk, int micro, float* g, int64_t n);

  // The embedding, which the last stage's MTP modules read too (V3's
  // sharing): the gradients of their lookups of micro-batch `micro`, from
  // the last stage to the first, which adds them to its own; then the one
  // gradient, from the first stage to the last (both call it). A V-shape's
  // first stage is also its last: the lookups go to itself, and the
  // gradient is already there.
  void send_lookups(int micro, const float* g, int64_t n);
  void recv_lookups(int micro, float* g, int64_t n);
  void first_to_last(float* g, int64_t n);
  // A tied head: the last stage's gradient of its copy of the embedding (the
  // head's) and the first stage's (its lookups'), summed on both (both call it).
  void sum_first_last(float* g, int64_t n);

  // End of a step: every send has left; the seconds this step waited on
  // receives, and the counters start again.
  double finish_step();
  int64_t bytes_sent() const { return bytes_sent_; }

 private:
  int tag(int chunk, int micro, int kind) const;
  void send(int to, int tag, const float* data, int64_t n);
  void recv(int from, int tag, float* data, int64_t n);
  StageCut cut_;
  MPI_Comm replicas_ = MPI_COMM_NULL, chain_ = MPI_COMM_NULL, ends_ = MPI_COMM_NULL;
  std::deque<std::vector<float>> outgoing_;  // the copies in flight (a deque: they never move)
  std::vector<MPI_Request> requests_;
  double waited_ = 0;
  int64_t bytes_sent_ = 0;
};

}  // namespace xx

// Gradient averaging with top-k compression (deck: compress topk ...), the
// replacement for GradientSync's dense all-reduce when compression is on.
//
// Per step, after the backward (gradients summed over the micro-steps):
//   1. The tensors of at least min_size values are packed one after the other
//      (the "sparse part"), the smaller ones likewise (the "dense part").
//   2. The sparse part is cut into buckets of bucket_mb. A bucket is
//      compressed (kernels/compress.h: error feedback, top-k, quantization)
//      when its payload is smaller than its dense bytes, or when the deck asks
//      for ratio 1 (every entry through the sparse path, for testing); else it
//      joins the dense part, with its residual flushed into it.
//   3. One exchange per step: the payloads of all buckets, concatenated, go to
//      every member of the group (UCX or MPI, comm/ops.h); each rank decodes
//      and sums them in group order, so every member gets the same bits.
//   4. One all-reduce of the dense part.
//   5. Unpack, divide by group size times micro-steps.
//
// The ratio ramps down over `warmup` steps: r(s) = RATIO^((s + 1) / (warmup + 1))
// for steps s < warmup (counted from 0), RATIO after.
//
// Per-rank state: the residual (what was not sent yet) and, with momentum
// correction, the local momentum; both in packed order over the sparse part.
#pragma once
#include <mpi.h>
#include <cstdint>
#include <vector>
#include "comm/grad_sync.h"
#include "comm/ops.h"
#include "core/tensor_span.h"
#include "deck/config.h"
#include "kernels/compress.h"

namespace xx {

class CompressedSync {
 public:
  // `tensors`: every tensor of the flat gradient, in buffer order (the model's
  // ParamLayout::spans()); buckets never span two of them.
  CompressedSync(const std::vector<TensorSpan>& tensors, Buffer<float> grads, const CompressConfig& cfg,
                 double bucket_mb);

  // Averages the gradients over `members` (sorted world ranks, this rank
  // among them; `group` is their communicator). `step` counts optimizer steps
  // from 0 and tags the exchange round. Collective over the group.
  void reduce(const std::vector<int>& members, MPI_Comm group, int64_t step, int micro_steps, Communicator& comm,
              CommStats& stats);

  double ratio_at(int64_t step) const;  // the ramped ratio
  // Buckets compressed at `step` in a group of `group_size` ranks, out of buckets().
  int compressed_buckets(int64_t step, int group_size) const;
  int buckets() const { return int(buckets_.size()); }
  int64_t sparse_size() const { return sparse_n_; }  // values in the sparse part
  const Buffer<float>& residual() const { return residual_; }
  Buffer<float>& residual() { return residual_; }
  Buffer<float>& momentum() { return momentum_; }  // momentum correction's local momentum (empty when off)
  std::string describe() const;

 private:
  struct Bucket {
    int64_t begin, end;  // in the packed sparse part
  };
  bool compressed(const Bucket& b, double ratio, int group_size) const;

  CompressConfig cfg_;
  kernels::compress::Settings settings_;
  Buffer<float> grads_;
  std::vector<std::pair<int64_t, int64_t>> sparse_ranges_, dense_ranges_;  // (offset, size) in the flat gradient
  int64_t sparse_n_ = 0, dense_n_ = 0;
  std::vector<Bucket> buckets_;
  Buffer<float> packed_;         // (sparse_n_) the sparse part of the gradient, then its group sum
  Buffer<float> dense_;          // (dense_n_ + largest bucket) the dense part, then its group sum
  Buffer<float> residual_;       // (sparse_n_) error feedback
  Buffer<float> momentum_;       // (sparse_n_) momentum correction, when on
  kernels::compress::Workspace ws_;
  std::vector<std::byte> payload_;  // this rank's payloads, concatenated
  // Where kernel memory is not the host's, the payloads are encoded and
  // decoded there and copied to and from the host vectors the transports move.
  Buffer<uint8_t> payload_kernel_, received_kernel_;
};

}  // namespace xx

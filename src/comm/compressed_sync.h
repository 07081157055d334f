// Gradient averaging with top-k compression (deck: compress topk ...), the
// replacement for the dense bucketed all-reduce (comm/bucket_reducer.h) when compression is on.
//
// Per step, after the backward (gradients summed over the micro-steps):
//   1. The tensors of at least min_size values are packed one after the other
//      (the "sparse part"), the smaller ones likewise (the "dense part").
//   2. The sparse part is cut into buckets of bucket_mb. A bucket is
//      compressed (kernels/compress.h: error feedback, top-k, quantization)
//      when its payload is smaller than its dense bytes, or when the deck asks
//      for ratio 1 (every entry through the sparse path, for testing); else it
//      joins the dense part, with its residual flushed into it.
//   3. The exchange (deck: compress ... exchange allgather|partitioned):
//      allgather: one round per step, tag = step: the payloads of all
//        buckets, concatenated, go to every member of the group (UCX or MPI,
//        comm/ops.h); each rank decodes and sums them in group order, so every
//        member gets the same bits.
//      partitioned: a sparse reduce-scatter, then a sparse all-gather (as
//        Ok-Topk and SparCML do); below.
//   4. One all-reduce of the dense part.
//   5. Unpack, divide by group size times micro-steps.
//
// Partitioned, with R group members, this rank member `me`, S values in the
// sparse part (all buckets, compressed or not, in packed order):
//   a. Member j owns the range [S j / R, S (j+1) / R) of the sparse part, of
//      m_j values. Selection stays per bucket.
//   b. Error feedback and top-k per compressed bucket as in allgather (the same
//      k, momentum correction, residual); each bucket's sorted selection,
//      shifted to packed positions, is written after the previous bucket's, so
//      the whole selection is sorted; R + 1 binary searches cut it at the
//      range starts (kernels/compress.h cut_selection). The entries in range j
//      become ONE payload (n = m_j, indices relative to the range start,
//      quantization blocks over its entries; nothing when it has none). The
//      residual keeps acc - sent (decoded).
//   c. Round 2 step (personalized): to each owner j, the payload of its range.
//   d. The owner decodes the R payloads of its range (its own included), sums
//      them in group order into a dense range, adds its owner residual
//      (feedback on), and takes the top k'(g) = topk_count(|g|, ratio) of each
//      segment g, the intersections of its range with the compressed buckets
//      (per-tensor fairness, as in b); the selections of all segments make one
//      payload of the range (n = m_me, relative indices, k' = sum of k'(g)),
//      quantized; sum - sent is the new owner residual (feedback off: 0).
//   e. Round 2 step + 1 (broadcast): each owner's one payload to every member
//      (its size follows from the range and the buckets); every rank decodes
//      each into its range: the same bits on every member.
//   Bytes this rank sends (bytes_sent; UCX: h = 0, MPI: h = 16 per message),
//   with k(me -> j) this rank's selected entries in range j and
//   P(m, k) = payload_bytes(m, k) for k >= 1, 0 for k = 0 (nothing is sent,
//   but the message still goes, with its header):
//     round 1: sum over peers j != me of (h + P(m_j, k(me -> j)))
//     round 2: (R - 1) (h + P(m_me, k'_me))
//   One message and at most one payload header per peer and round, whatever
//   the number of buckets: bytes minus payload bytes = 2 (R - 1) h. For k
//   entries spread evenly, each round is about (R-1)/R of one payload of all
//   buckets: about 2 (R-1)/R payloads per rank, bounded in R, where allgather
//   sends (R - 1) payloads.
//
// The ratio ramps down over `warmup` steps: r(s) = RATIO^((s + 1) / (warmup + 1))
// for steps s < warmup (counted from 0), RATIO after.
//
// Per-rank state: the residual (what was not sent yet) and, with momentum
// correction, the local momentum; both in packed order over the sparse part.
// Partitioned: also the owner residual, what this rank held back of the sum
// over its range: exactly m_me values (0 where a bucket of the range went
// dense). The ranges tile [0, S), so the ranks' owner residuals together are
// one S-vector in packed order: checkpoints save that (owner_residual_whole)
// and every rank takes its range of it back at any world size.
#pragma once
#include <mpi.h>
#include <cstdint>
#include <vector>
#include "comm/comm_stats.h"
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
  Exchange exchange() const { return cfg_.exchange; }
  // Partitioned: lays the owner residual out for member `me` of a group of
  // `members` ranks (zeros); reduce() then refuses any other group shape.
  // reduce() does it on first use when nothing did before.
  void own_pieces(int members, int me);
  Buffer<float>& owner_residual() { return owner_residual_; }  // (m_me) empty for allgather
  int64_t range_begin(int64_t j) const;  // S j / R: where member j's range starts (own_pieces first)
  // The ranks' owner residuals as one vector (S) in packed order, on every
  // rank; collective over `world`, whose ranks must be the members in order
  // (topology full). Empty for allgather.
  std::vector<float> owner_residual_whole(MPI_Comm world) const;
  // This rank's range of such a vector, written by any world size; a vector
  // of another length (another model) sets it to zero and returns false.
  bool load_owner_residual_whole(const std::vector<float>& whole);
  std::string describe() const;

 private:
  struct Bucket {
    int64_t begin, end;  // in the packed sparse part
  };
  bool compressed(const Bucket& b, double ratio, int group_size) const;
  // Step 3, allgather and partitioned, for the compressed buckets; `send` is
  // what is compressed (the packed gradients, or the local momentum).
  void allgather(const std::vector<const Bucket*>& sparse, const kernels::compress::Settings& s,
                 const Buffer<float>& send, const std::vector<int>& members, int64_t step, Communicator& comm,
                 CommStats& stats);
  void partitioned(const std::vector<const Bucket*>& sparse, const kernels::compress::Settings& s,
                   const Buffer<float>& send, const std::vector<int>& members, int me, int64_t step,
                   Communicator& comm, CommStats& stats);
  // Messages where the kernels read them: the host's, or copies in received_kernel_.
  std::vector<const uint8_t*> in_kernel_memory(const std::vector<std::vector<std::byte>>& messages);
  // The intersections of [lo, hi) with `buckets` (sorted), relative to lo.
  static std::vector<kernels::compress::Segment> segments_of(const std::vector<const Bucket*>& buckets, int64_t lo,
                                                             int64_t hi);

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
  int owner_members_ = 0, owner_me_ = 0;          // the group shape owner_residual_ is laid out for (0: none yet)
  Buffer<float> owner_residual_;                  // (m_me) partitioned: the owner's error feedback over its range
  Buffer<float> owner_sum_;                       // (m_me) scratch: the range summed over the group
  kernels::compress::Workspace ws_;
  std::vector<std::byte> payload_;  // this rank's payloads, concatenated
  std::vector<std::byte> owned_;    // partitioned: this rank's payload of its range of the sum
  // partitioned scratch, grown on use: the selection of all compressed buckets
  // (K: packed indices, range-relative indices, values, values as sent), and
  // the owner's (k'); the encoded range payloads (piece_kernel_, owned_kernel_)
  Buffer<uint32_t> sel_idx_, sel_rel_, own_idx_;
  Buffer<float> sel_val_, sel_sent_, own_val_, own_sent_;
  Buffer<uint8_t> piece_kernel_, owned_kernel_;
  // Where kernel memory is not the host's, the payloads are encoded and
  // decoded there and copied to and from the host vectors the transports move.
  Buffer<uint8_t> payload_kernel_, received_kernel_;
};

}  // namespace xx

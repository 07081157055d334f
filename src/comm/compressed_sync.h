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
// Partitioned, with R group members, this rank member `me`:
//   a. Each compressed bucket [begin, end) of n values is cut into R pieces,
//      piece j = [begin + n j / R, begin + n (j+1) / R), owned by member j.
//   b. Error feedback and top-k over the whole bucket as in allgather (the
//      same k, momentum correction, residual); the selected entries are cut
//      at the piece starts (kernels/compress.h select_pieces: binary searches
//      in the sorted indices) and each piece with entries is encoded as a
//      payload of its own (indices relative to the piece, n = its length,
//      quantization per piece). The residual keeps acc - sent (decoded).
//   c. Round 2 step (personalized): to each owner j, a table of one uint32
//      per compressed bucket (the size of that bucket's piece-j payload; 0 for
//      a piece without entries), then those payloads in bucket order.
//   d. Owner j decodes its piece's R payloads, sums them in group order into a
//      dense piece, adds its owner residual (feedback on), takes the top k' =
//      topk_count(piece length, ratio) of that, quantizes and encodes it
//      (kernels/compress.h compress()), and keeps sum - sent as the new owner
//      residual.
//   e. Round 2 step + 1 (broadcast): each owner's piece payloads, all buckets
//      concatenated (their sizes follow from the piece lengths), to every
//      member; every rank decodes every piece into place: the same bits.
//   Bytes this rank sends (bytes_sent; UCX: h = 0, MPI: h = 16 per peer),
//   with s(b, j) this rank's piece-j payload of bucket b (0 without entries),
//   P(b, j) = payload_bytes(m, topk_count(m, ratio)) for piece j's length m
//   (0 for m = 0), and nb compressed buckets:
//     round 1: sum over peers j != me of (h + 4 nb + sum_b s(b, j))
//     round 2: (R - 1) (h + sum_b P(b, me))
//   For k entries spread evenly, round 1 is about (R-1)/R of one payload and
//   round 2 the same: about 2 (R-1)/R payloads per rank, bounded in R, where
//   allgather sends (R - 1) payloads.
//
// The ratio ramps down over `warmup` steps: r(s) = RATIO^((s + 1) / (warmup + 1))
// for steps s < warmup (counted from 0), RATIO after.
//
// Per-rank state: the residual (what was not sent yet) and, with momentum
// correction, the local momentum; both in packed order over the sparse part.
// Partitioned: also the owner residual, what this rank held back of the sums
// of its pieces: its pieces of every bucket, one after the other, each in
// ceil(n / R) places (so that every rank's is the same length).
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
  enum class Exchange { allgather, partitioned };  // the deck's compress ... exchange
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
  Exchange exchange() const { return exchange_; }
  // Partitioned: lays the owner residual out for member `me` of a group of
  // `members` ranks (zeros); reduce() then refuses any other group shape.
  // reduce() does it on first use when nothing did before.
  void own_pieces(int members, int me);
  Buffer<float>& owner_residual() { return owner_residual_; }  // (sum of this rank's pieces) empty for allgather
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
  // Where this rank's piece of bucket b starts in the bucket, its length, and its place in owner_residual_.
  struct OwnPiece {
    int64_t begin, length, at;
  };
  OwnPiece own_piece(size_t b) const;

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
  Exchange exchange_ = Exchange::allgather;
  int owner_members_ = 0, owner_me_ = 0;          // the group shape owner_residual_ is laid out for (0: none yet)
  Buffer<float> owner_residual_;                  // (this rank's pieces) partitioned: the owners' error feedback
  Buffer<float> owner_sum_;                       // (largest piece) scratch: a piece summed over the group
  std::vector<int64_t> owner_at_;                 // (buckets) where each bucket's piece starts in owner_residual_
  kernels::compress::Workspace ws_;
  std::vector<std::byte> payload_;  // this rank's payloads, concatenated
  std::vector<std::byte> owned_;    // partitioned: this rank's pieces of the sums, encoded, concatenated
  std::vector<std::byte> pieces_host_;  // partitioned, staged: the host copy of piece_kernel_
  Buffer<uint8_t> piece_kernel_, owned_kernel_;  // partitioned: the pieces as encoded, bucket after bucket
  // Where kernel memory is not the host's, the payloads are encoded and
  // decoded there and copied to and from the host vectors the transports move.
  Buffer<uint8_t> payload_kernel_, received_kernel_;
};

}  // namespace xx

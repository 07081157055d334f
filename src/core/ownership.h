// Who owns which part of a flat buffer when the training state is sharded
// over the data-parallel ranks (deck: shard optimizer|gradients|params; ZeRO 1/2/3).
//
// The buffer is cut into buckets from its end, as the gradient buckets are
// (the backward finishes the end of the buffer first), and each bucket into
// W near-equal pieces: piece r belongs to rank r. So every bucket's
// reduce-scatter and all-gather spreads its bytes evenly over the ranks, and
// every rank can compute every other's pieces without a message. A rank's
// shard is its pieces, concatenated in buffer order.
#pragma once
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace xx {

// Buckets reduced (or all-gathered) at once under shard (the strategy waits
// for the oldest beyond this); the memory plan counts them.
inline constexpr int kShardBucketsInFlight = 2;

// moe ... ep N: the runs [begin, end) of the flat buffer that hold this
// rank's routed experts, and its place among the ranks that hold the same
// experts (rank / ep of world / ep). Expert buckets are cut among those holders only.
struct ExpertHolders {
  std::vector<std::pair<int64_t, int64_t>> runs;
  int ranks = 1, rank = 0;
};

// [begin, end) cut at the edges of `runs`, in buffer order, each piece
// marked as inside a run or not: what ep reduces over the holders.
struct RunPiece {
  int64_t begin, end;
  bool inside;
};
std::vector<RunPiece> cut_at_runs(int64_t begin, int64_t end, const std::vector<std::pair<int64_t, int64_t>>& runs);

struct OwnedPiece {
  int64_t begin = 0, end = 0;  // in the flat buffer
  int64_t at = 0;              // where it starts in the owner's shard
  int64_t size() const { return end - begin; }
};

class Ownership {
 public:
  struct Bucket {
    int64_t begin = 0, end = 0;
    std::vector<int> counts, displs;  // rank r's piece: [begin + displs[r], + counts[r])
    bool expert = false;              // inside an expert run: r counts the holders, not the world
  };
  Ownership() = default;
  // One rank owns all of it (shard off): one bucket, one piece.
  static Ownership whole(int64_t total);
  // `bucket`: elements per bucket (the last one cut, at the start of the buffer, may be shorter).
  Ownership(int64_t total, int64_t bucket, int ranks, int rank) : Ownership({{0, total}}, bucket, ranks, rank) {}
  // Buckets cut from the end of each span [begin, end) (spans in buffer
  // order, together [0, total)), so no bucket crosses a span: shard params
  // passes the weight units, which it gathers one at a time.
  // Under ep the spans are cut at the expert runs' edges too.
  Ownership(const std::vector<std::pair<int64_t, int64_t>>& spans, int64_t bucket, int ranks, int rank,
            const ExpertHolders& experts = {});

  int64_t total() const { return total_; }      // the flat buffer's length
  int64_t shard_size() const { return shard_; }  // what this rank owns
  int ranks() const { return ranks_; }
  const std::vector<OwnedPiece>& pieces() const { return pieces_; }  // buffer order
  const std::vector<Bucket>& buckets() const { return buckets_; }    // buckets()[0] ends at the buffer's end
  // This rank's piece of bucket b.
  OwnedPiece piece_of(size_t b) const;
  // This rank's index among the ranks bucket b is cut over (its holders under ep).
  int index_in(const Bucket& b) const { return b.expert ? holder_ : rank_; }
  // Rank r's pieces (every rank can answer for every other; without ep).
  std::vector<OwnedPiece> pieces_of(int r) const { return pieces_for(r, r); }

 private:
  std::vector<OwnedPiece> pieces_for(int rank, int holder) const;
  int64_t total_ = 0, shard_ = 0;
  int ranks_ = 1, rank_ = 0, holder_ = 0;
  std::vector<Bucket> buckets_;
  std::vector<OwnedPiece> pieces_;
};

}  // namespace xx

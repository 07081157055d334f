#include "core/ownership.h"
#include <algorithm>

namespace xx {

Ownership Ownership::whole(int64_t total) { return Ownership(total, std::max<int64_t>(1, total), 1, 0); }

namespace {

std::vector<std::pair<int64_t, int64_t>> cut(int64_t total, int64_t bucket) {
  std::vector<std::pair<int64_t, int64_t>> out;
  bucket = std::max<int64_t>(1, bucket);
  for (int64_t end = total; end > 0; end -= bucket) out.emplace_back(std::max<int64_t>(0, end - bucket), end);
  return out;
}

}  // namespace

Ownership::Ownership(int64_t total, int64_t bucket, int ranks, int rank) : Ownership(cut(total, bucket), ranks, rank) {}

Ownership::Ownership(const std::vector<std::pair<int64_t, int64_t>>& buckets, int ranks, int rank)
    : ranks_(ranks), rank_(rank) {
  for (const auto& [begin, end] : buckets) {
    Bucket b{begin, end, std::vector<int>(ranks), std::vector<int>(ranks)};
    const int64_t n = b.end - b.begin;
    for (int r = 0; r < ranks; ++r) {
      b.displs[r] = int(n * r / ranks);
      b.counts[r] = int(n * (r + 1) / ranks - n * r / ranks);
    }
    total_ = std::max(total_, end);
    buckets_.push_back(std::move(b));
  }
  pieces_ = pieces_of(rank);
  for (const auto& p : pieces_) shard_ += p.size();
}

OwnedPiece Ownership::piece_of(size_t b) const {
  // pieces_ are in buffer order, buckets_ from the end
  return pieces_[pieces_.size() - 1 - b];
}

std::vector<OwnedPiece> Ownership::pieces_of(int r) const {
  std::vector<OwnedPiece> out;
  int64_t at = 0;
  for (auto b = buckets_.rbegin(); b != buckets_.rend(); ++b) {
    const int64_t begin = b->begin + b->displs[r];
    out.push_back({begin, begin + b->counts[r], at});
    at += b->counts[r];
  }
  return out;
}

}  // namespace xx

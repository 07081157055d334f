#include "core/ownership.h"
#include <algorithm>

namespace xx {

Ownership Ownership::whole(int64_t total) { return Ownership(total, std::max<int64_t>(1, total), 1, 0); }

Ownership::Ownership(const std::vector<std::pair<int64_t, int64_t>>& spans, int64_t bucket, int ranks, int rank)
    : ranks_(ranks) {
  bucket = std::max<int64_t>(1, bucket);
  for (auto span = spans.rbegin(); span != spans.rend(); ++span)  // buckets_ count from the buffer's end
    for (int64_t end = span->second; end > span->first; end -= bucket) {
      Bucket b{std::max(span->first, end - bucket), end, std::vector<int>(ranks), std::vector<int>(ranks)};
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

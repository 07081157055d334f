#include "core/ownership.h"
#include <algorithm>

namespace xx {

std::vector<RunPiece> cut_at_runs(int64_t begin, int64_t end, const std::vector<std::pair<int64_t, int64_t>>& runs) {
  std::vector<int64_t> edges{begin, end};
  for (const auto& [rb, re] : runs)
    for (int64_t e : {rb, re})
      if (e > begin && e < end) edges.push_back(e);
  std::sort(edges.begin(), edges.end());
  std::vector<RunPiece> out;
  for (size_t i = 0; i + 1 < edges.size(); ++i) {
    bool inside = false;
    for (const auto& [rb, re] : runs) inside |= edges[i] >= rb && edges[i + 1] <= re;
    out.push_back({edges[i], edges[i + 1], inside});
  }
  return out;
}

Ownership Ownership::whole(int64_t total) { return Ownership(total, std::max<int64_t>(1, total), 1, 0); }

Ownership::Ownership(const std::vector<std::pair<int64_t, int64_t>>& spans, int64_t bucket, int ranks, int rank,
                     const ExpertHolders& experts)
    : ranks_(ranks), rank_(rank), holder_(experts.rank) {
  bucket = std::max<int64_t>(1, bucket);
  std::vector<RunPiece> cuts;  // each span, cut at the expert runs' edges
  for (const auto& [begin, end] : spans)
    for (const auto& piece : cut_at_runs(begin, end, experts.runs)) cuts.push_back(piece);
  for (auto cut = cuts.rbegin(); cut != cuts.rend(); ++cut) {  // buckets_ count from the buffer's end
    const int n_ranks = cut->inside ? experts.ranks : ranks;
    for (int64_t end = cut->end; end > cut->begin; end -= bucket) {
      Bucket b{std::max(cut->begin, end - bucket), end, std::vector<int>(n_ranks), std::vector<int>(n_ranks),
               cut->inside};
      const int64_t n = b.end - b.begin;
      for (int r = 0; r < n_ranks; ++r) {
        b.displs[r] = int(n * r / n_ranks);
        b.counts[r] = int(n * (r + 1) / n_ranks - n * r / n_ranks);
      }
      total_ = std::max(total_, end);
      buckets_.push_back(std::move(b));
    }
  }
  pieces_ = pieces_for(rank, holder_);
  for (const auto& p : pieces_) shard_ += p.size();
}

OwnedPiece Ownership::piece_of(size_t b) const {
  // pieces_ are in buffer order, buckets_ from the end
  return pieces_[pieces_.size() - 1 - b];
}

std::vector<OwnedPiece> Ownership::pieces_for(int rank, int holder) const {
  std::vector<OwnedPiece> out;
  int64_t at = 0;
  for (auto b = buckets_.rbegin(); b != buckets_.rend(); ++b) {
    const int r = b->expert ? holder : rank;
    const int64_t begin = b->begin + b->displs[r];
    out.push_back({begin, begin + b->counts[r], at});
    at += b->counts[r];
  }
  return out;
}

}  // namespace xx

#include "core/placement.h"
#include <algorithm>
#include <array>
#include <stdexcept>
#include <fmt/format.h>

namespace xx {

int64_t frame_total(const Frame& frame) {
  int64_t total = 0;
  for (const auto& t : frame) total = std::max(total, t.offset + t.size);
  return total;
}

Placement::Placement(Frame frame, int64_t local_total, ExpertShare experts, ShardLevel level, Ownership owned,
                     std::vector<std::pair<int64_t, int64_t>> units, bool master_in_pieces, const StageCut& stage)
    : frame_(std::move(frame)), whole_total_(frame_total(frame_)), local_total_(local_total),
      experts_(std::move(experts)), stage_(stage), level_(level), owned_(std::move(owned)), units_(std::move(units)),
      master_in_pieces_(master_in_pieces) {
  for (size_t k = 0; k < frame_.size(); ++k)
    if (frame_[k].local >= 0) held_.push_back(k);
  std::sort(held_.begin(), held_.end(), [this](size_t a, size_t b) { return frame_[a].local < frame_[b].local; });
  if (stage_.stages > 1 && stage_.last() && !stage_.first())  // (V-shape: one rank holds both)
    for (const FrameTensor& t : frame_)
      if (t.name == "embed" && t.local >= 0) echo_ = {t.local, t.local + t.size};
  if (owned_.total() != local_total_) throw std::logic_error("placement: the pieces do not cover this rank's buffer");
}

void Placement::to_whole(const float* mine, float* whole) const {
  for (size_t k : held_) std::copy_n(mine + frame_[k].local, frame_[k].size, whole + frame_[k].offset);
}

void Placement::from_whole(const float* whole, float* mine) const {
  for (size_t k : held_) std::copy_n(whole + frame_[k].offset, frame_[k].size, mine + frame_[k].local);
}

std::vector<FrameSlab> Placement::piece_slabs() const {
  std::vector<FrameSlab> out;
  for (const auto& p : owned_.pieces()) {
    // the first held tensor that ends after the piece begins
    auto t = std::upper_bound(held_.begin(), held_.end(), p.begin, [this](int64_t at, size_t k) {
      return at < frame_[k].local + frame_[k].size;
    });
    for (; t != held_.end() && frame_[*t].local < p.end; ++t) {
      const FrameTensor& x = frame_[*t];
      const int64_t lo = std::max(p.begin, x.local), hi = std::min(p.end, x.local + x.size);
      if (hi > lo) out.push_back({*t, lo - x.local, hi - lo, p.at + (lo - p.begin)});
    }
  }
  return out;
}

std::vector<FrameSlab> Placement::whole_tensors() const {
  std::vector<FrameSlab> out;
  for (size_t k : held_) out.push_back({k, 0, frame_[k].size, frame_[k].local});
  return out;
}

std::vector<FrameSlab> Placement::written_slabs() const {
  std::vector<FrameSlab> out;
  if (!sharded() && experts_.holder != 0) return out;  // (the first replicas' copy; under ep its first group's)
  for (const FrameSlab& s : sharded() ? piece_slabs() : whole_tensors()) {
    const FrameTensor& t = frame_[s.tensor];
    const bool echo = echo_.second > echo_.first && t.local == echo_.first;
    const bool every_share_holds = !sharded() && t.share < 0 && experts_.share != 0;  // share 0 writes it
    if (!echo && !every_share_holds) out.push_back(s);
  }
  return out;
}

int chunk_of(int stages, int virtual_stages, bool v_shape, int stage, int run) {
  if (v_shape) return run % 2 == 0 ? run * stages + stage : (run + 1) * stages - 1 - stage;
  return run * stages + stage;
}

StageCut stage_cut(int world, int rank, int stages, int layers, const std::vector<int>& blocks, int virtual_stages,
                   bool v_shape) {
  auto bad = [&] {
    return std::invalid_argument(fmt::format("stage_cut: {} stages x {} chunks{} over {} ranks and {} layers (rank "
                                             "{}, cut {})", stages, virtual_stages, v_shape ? " (V-shape)" : "", world,
                                             layers, rank, fmt::join(blocks, ",")));
  };
  const int chunks = stages * virtual_stages;
  if (stages < 1 || virtual_stages < 1 || world % stages != 0 || rank < 0 || rank >= world ||
      (v_shape && virtual_stages != 2))
    throw bad();
  std::vector<int> cut = blocks;
  if (cut.empty()) {
    if (layers % chunks != 0) throw bad();
    cut.assign(size_t(chunks), layers / chunks);
  }
  int sum = 0;
  for (int n : cut) sum += n;
  if (int(cut.size()) != chunks || sum != layers || *std::min_element(cut.begin(), cut.end()) < 1) throw bad();
  StageCut c;
  c.stages = stages, c.replicas = world / stages, c.chunks = chunks;
  c.stage = rank / c.replicas, c.replica = rank % c.replicas;
  std::vector<int> begin(size_t(chunks) + 1, 0);
  for (int k = 0; k < chunks; ++k) begin[size_t(k) + 1] = begin[size_t(k)] + cut[size_t(k)];
  c.holders.assign(size_t(chunks), 0);
  for (int s = 0; s < stages; ++s)
    for (int v = 0; v < virtual_stages; ++v) c.holders[size_t(chunk_of(stages, virtual_stages, v_shape, s, v))] = s;
  for (int v = 0; v < virtual_stages; ++v) {
    const int k = chunk_of(stages, virtual_stages, v_shape, c.stage, v);
    c.runs.push_back({k, begin[size_t(k)], begin[size_t(k) + 1]});
  }
  return c;
}

}  // namespace xx

// Where every float lives: the one answer to "which rank holds element i of
// the model, and who else holds it". Built once per job (model/params.h,
// place_model) and read by the sync strategies, the optimizer, the
// checkpoints and the memory plan; its collectives are comm/placement_mpi.h.
//
// Three frames of the same floats:
//   the whole model   every tensor, in layout order: what a checkpoint file holds;
//   this rank         the tensors it holds (under ep: its share of the routed
//                     experts and every other tensor), packed in the same order;
//   its pieces        under shard (ZeRO 1/2/3): the parts of this rank's frame it
//                     updates (core/ownership.h), back to back.
// A new parallel dimension (pipeline stages) is one more cut of the whole
// frame: a stage holds the tensors of its layers, and everything below reads
// the rank's frame as it does now. Its first part is StageCut: which stage a
// rank is on and which runs of layers that stage holds (the frame's cut
// follows it).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>
#include "core/modes.h"  // ShardLevel
#include "core/ownership.h"

namespace xx {

// One tensor of the whole model, and where it lies in this rank's frame.
struct FrameTensor {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0;  // in the whole model's flat buffer
  int64_t size = 0;
  int64_t local = -1;  // in this rank's flat buffer; -1: another rank's expert
  int share = -1;      // a routed expert's: the expert share that holds it (ExpertShare); -1: every rank
};

// The whole model's tensors in layout order: what a checkpoint file holds
// (src/ckpt reads and writes in this frame; Placement::frame() is the job's).
using Frame = std::vector<FrameTensor>;
int64_t frame_total(const Frame& frame);  // elements in the whole model

// moe ... ep N: groups of N consecutive ranks share the routed experts out;
// rank r holds share r % N, as do the ranks r + kN (its holders).
struct ExpertShare {
  int ep = 1;           // N
  int share = 0;        // r % N: this rank's index in its expert-parallel group
  int holders = 1;      // world / N: the ranks holding the same experts
  int holder = 0;       // r / N: this rank's index among them
  std::vector<std::pair<int64_t, int64_t>> runs;  // this rank's routed-expert runs [begin, end), its frame
};

// pipeline stages P: world = P x dp ranks, rank r on stage r / dp as its
// data-parallel replica r % dp (a stage's replicas are consecutive ranks, as
// an expert-parallel group's are). The blocks split into P x V chunks
// (virtual stages, in model order: chunk 0 adds the embedding, the last the
// final norm and the head, and the MTP modules); a stage runs V of them, its
// runs of layers:
//   V 1          stage s runs chunk s;
//   interleaved  chunks s, s + P, ..., s + (V - 1) P (Megatron's);
//   V-shape      (dualpipev, V 2) chunks s and 2P - 1 - s: the first stage
//                holds both ends of the model, the last two adjacent chunks.
struct LayerRun {
  int chunk = 0;           // its virtual stage
  int begin = 0, end = 0;  // blocks [begin, end)
};
struct StageCut {
  int stages = 1, stage = 0;     // P, and this rank's
  int replicas = 1, replica = 0;  // dp: the ranks of each stage, and this rank's index among them
  int chunks = 1;                 // P x V
  std::vector<LayerRun> runs;     // this stage's chunks, in model order (empty in StageCut{}: whole)
  std::vector<int> holders;       // per chunk: the stage that runs it
  bool whole() const { return stages == 1; }  // no pipeline: every layer here
  bool first() const { return whole() || runs.front().chunk == 0; }          // the embedding's stage
  bool last() const { return whole() || runs.back().chunk == chunks - 1; }   // the head's
  bool holds_layer(int l) const {
    if (whole()) return true;
    for (const LayerRun& r : runs)
      if (l >= r.begin && l < r.end) return true;
    return false;
  }
  int rank_of(int stage_index, int replica_index) const { return stage_index * replicas + replica_index; }
};
// Which chunk stage `stage` runs as its `run`-th of V (in model order).
int chunk_of(int stages, int virtual_stages, bool v_shape, int stage, int run);
// `blocks`: each chunk's number of blocks (the deck's pipeline ... cut), or
// empty for L / (P V) each. Throws std::invalid_argument where P does not
// divide the world, or the cut does not give each of the P x V chunks a
// block and sum to the layers (without a cut: P x V does not divide them),
// or a V-shape has V other than 2.
StageCut stage_cut(int world, int rank, int stages, int layers, const std::vector<int>& blocks = {},
                   int virtual_stages = 1, bool v_shape = false);

// A run of one frame tensor's elements that this rank holds in some buffer:
// elements [begin, begin + count) of tensor `tensor` (an index into the
// whole frame), at `at` of that buffer.
struct FrameSlab {
  size_t tensor = 0;
  int64_t begin = 0, count = 0, at = 0;
};

class Placement {
 public:
  Placement() = default;
  // `frame`: the whole model's tensors with their place here; `local_total`:
  // this rank's buffer length; `owned`: its pieces of that buffer;
  // `units`: the model's weight units, in its frame (shard params gathers them);
  // `master_in_pieces`: the fp32 weights are only this rank's pieces
  // (shard params, or a lower level under 16-bit precision).
  // `stage`: this rank's pipeline stage (whole without stages).
  Placement(Frame frame, int64_t local_total, ExpertShare experts, ShardLevel level,
            Ownership owned, std::vector<std::pair<int64_t, int64_t>> units, bool master_in_pieces,
            const StageCut& stage = {});

  // frames
  const Frame& frame() const { return frame_; }
  int64_t whole_total() const { return whole_total_; }
  int64_t local_total() const { return local_total_; }
  bool holds_all() const { return whole_total_ == local_total_; }
  // Between this rank's buffer and the whole model's: the tensors it holds,
  // copied; the whole model's other experts are left as they are.
  void to_whole(const float* mine, float* whole) const;
  void from_whole(const float* whole, float* mine) const;

  // experts
  const ExpertShare& experts() const { return experts_; }

  // pipeline stages: this rank's, and the run of its buffer that another
  // stage holds too (the embedding on the last stage, read by the MTP modules
  // or a tied head: stage 0's tensor, its gradient summed with stage 0's and
  // counted there); empty where none.
  const StageCut& stage() const { return stage_; }
  std::pair<int64_t, int64_t> echo() const { return echo_; }

  // ZeRO
  ShardLevel level() const { return level_; }
  const Ownership& owned() const { return owned_; }
  const std::vector<std::pair<int64_t, int64_t>>& units() const { return units_; }
  bool sharded() const { return owned_.ranks() > 1; }  // the pieces are some of the buffer
  // Where the strategy leaves the averaged gradients: this rank's shard from
  // shard gradients up (its pieces back to back), else the whole buffer.
  bool gradients_sharded() const { return level_ >= ShardLevel::gradients; }
  bool master_sharded() const { return sharded() && master_in_pieces_; }  // the fp32 weights: only the pieces

  // What this rank writes and reads of a checkpoint file, as slabs of frame
  // tensors: its pieces cut at its tensors' edges (values in shard order, as
  // AdamW's moments lie), or every tensor it holds whole (values laid out as
  // its buffer).
  std::vector<FrameSlab> piece_slabs() const;
  std::vector<FrameSlab> whole_tensors() const;
  // What this rank writes of a checkpoint by slabs: under shard its pieces;
  // else under pipeline stages its stage's tensors whole on the stage's
  // first replica and none on the others, which hold the same bits (under
  // ep: the first expert-parallel group, share 0 writing the tensors every
  // share holds); never the echo (stage 0's). Together the ranks write
  // every tensor once.
  std::vector<FrameSlab> written_slabs() const;

 private:
  Frame frame_;
  std::vector<size_t> held_;  // the frame indices of this rank's tensors, in its buffer order
  int64_t whole_total_ = 0, local_total_ = 0;
  ExpertShare experts_;
  StageCut stage_;
  std::pair<int64_t, int64_t> echo_{0, 0};
  ShardLevel level_ = ShardLevel::off;
  Ownership owned_;
  std::vector<std::pair<int64_t, int64_t>> units_;
  bool master_in_pieces_ = false;
};

}  // namespace xx

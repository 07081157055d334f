// The placement's collectives (core/placement.h): the communicators its
// dimensions need, and every move of floats between its frames that takes
// more than one rank. The Trainer, the checkpoints and the tests ask here;
// nothing in train/ issues a collective on the placement's behalf.
#pragma once
#include <mpi.h>
#include <vector>
#include "comm/bucket_reducer.h"
#include "core/placement.h"
#include "core/views.h"

namespace xx {

class PlacementMpi {
 public:
  // Collective over world. `replicas`: the ranks holding this rank's
  // tensors (its stage's data-parallel ranks; the world without stages),
  // over which the pieces are cut; under ep, its expert-parallel groups (N
  // consecutive ranks of it) and the holders of each share (ranks r + kN).
  PlacementMpi(MPI_Comm world, MPI_Comm replicas, const Placement& placement);
  ~PlacementMpi();
  PlacementMpi(const PlacementMpi&) = delete;
  PlacementMpi& operator=(const PlacementMpi&) = delete;

  const Placement& placement() const { return placement_; }
  MPI_Comm world() const { return world_; }
  MPI_Comm expert_group() const { return ep_group_; }  // null without ep
  ExpertRuns expert_runs() const { return {placement_.experts().runs, holders_}; }

  // Between this rank's pieces and its whole frame. Collective when sharded.
  //   gather_in_place: every rank's pieces of `mine` (this rank's in place) to every rank;
  //   gather_whole:    the same from this rank's shard (its pieces back to back);
  //   owned_part:      this rank's pieces of a whole buffer, in shard order (no message).
  void gather_in_place(std::vector<float>& mine) const;
  std::vector<float> gather_whole(const std::vector<float>& shard) const;
  std::vector<float> owned_part(const std::vector<float>& mine) const;

  // Between this rank's frame and the whole model's (the checkpoint's).
  // Under pipeline stages to_file_frame is collective over the replica's
  // stages (and its stage's expert-parallel group): each tensor from the
  // stage holding it (the last stage's copy of the embedding left out), bit
  // for bit.
  // to_file_frame is collective over the expert-parallel group: every
  // share's experts in their place, the same bits on every rank of it.
  std::vector<float> to_file_frame(const std::vector<float>& mine) const;
  std::vector<float> from_file_frame(const std::vector<float>& whole) const;

  // One tensor of the frame (an index into it) whole, from the replicas'
  // pieces of it in `shard` (collective over the replicas); and this rank's
  // pieces of it from a whole one into `shard`.
  std::vector<float> gather_tensor(Vec<const float> shard, size_t tensor) const;
  void put_tensor(const std::vector<float>& whole, Vec<float> shard, size_t tensor) const;

  // Collective: the squared global norm of the averaged gradients `values`
  // (this rank's shard, summed over the replicas; or the whole buffer, whose
  // routed experts are summed over the expert-parallel group, the rest once).
  double gradient_sum_squares(Vec<const float> values) const;
  // Pipeline stages (and micro-batches at P = 1): the same, summed tensor by
  // tensor in the whole model's order over `chain` and the expert-parallel
  // group (each tensor from the stage and share holding it; the embedding's
  // echo left out), so that every P gives the same bits; under shard
  // gradients `values` is this rank's shard, each tensor's pieces summed
  // over the replicas first (the same within rounding: the pieces differ with P).
  double tensor_sum_squares(Vec<const float> values, MPI_Comm chain) const;

 private:
  MPI_Comm world_, replicas_;
  const Placement& placement_;
  MPI_Comm ep_group_ = MPI_COMM_NULL, holders_ = MPI_COMM_NULL;
  MPI_Comm chain_ = MPI_COMM_NULL;  // pipeline stages: this replica's stages (to_file_frame)
};

}  // namespace xx

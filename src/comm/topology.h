// Who averages with whom (deck: topology full | clusters N [redraw S] | ring).
//   full      every rank with every rank;
//   clusters  a random partition of the ranks into groups of N (the last one
//             smaller when N does not divide the world), drawn from the run
//             seed so every rank agrees without a message, redrawn every S
//             steps, built with MPI_Comm_split;
//   ring      each rank with its two neighbours (gossip): x_r <- (x_{r-1} +
//             x_r + x_{r+1}) / 3, in that order on every rank.
#pragma once
#include <mpi.h>
#include <cstdint>
#include <vector>
#include "comm/comm_stats.h"
#include "deck/config.h"

namespace xx {

class Topology {
 public:
  Topology(MPI_Comm world, uint64_t seed);
  ~Topology();
  Topology(const Topology&) = delete;
  Topology& operator=(const Topology&) = delete;

  // Before each step: draws the clusters of this step (phase_start: the step
  // the phase began at, so each phase draws afresh). Collective.
  void update(const TopologyConfig& cfg, int64_t step, int64_t phase_start);
  bool is_ring() const { return kind_ == TopologyKind::ring; }
  bool is_full() const { return kind_ == TopologyKind::full; }
  MPI_Comm group() const { return group_ != MPI_COMM_NULL ? group_ : world_; }  // full and clusters
  const std::vector<int>& members() const { return members_; }                  // world ranks of my group

  // In place: the mean of buf (kernel memory) over my group (or ring neighbourhood). Blocking.
  void average(float* buf, int64_t n, CommStats& stats);

  // Ranks of every group of the partition drawn for `draw` (for tests and logs).
  static std::vector<std::vector<int>> clusters(int world, int size, uint64_t seed, int64_t draw);

 private:
  MPI_Comm world_;
  int rank_ = 0, size_ = 1;
  uint64_t seed_;
  TopologyKind kind_ = TopologyKind::full;
  int64_t draw_ = -1;
  MPI_Comm group_ = MPI_COMM_NULL;
  std::vector<int> members_;
  std::vector<float> left_, right_, staged_;  // staged_: buf's host copy where kernel memory is not the host's
};

}  // namespace xx

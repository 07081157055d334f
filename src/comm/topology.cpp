#include "comm/topology.h"
#include <algorithm>
#include "core/device_memory.h"
#include "core/permutation.h"
#include "core/rng.h"
#include "kernels/elementwise.h"

namespace xx {

Topology::Topology(MPI_Comm world, uint64_t seed) : world_(world), seed_(seed) {
  MPI_Comm_rank(world, &rank_);
  MPI_Comm_size(world, &size_);
  members_.resize(size_);
  for (int r = 0; r < size_; ++r) members_[r] = r;
}

Topology::~Topology() {
  if (group_ != MPI_COMM_NULL) MPI_Comm_free(&group_);
}

std::vector<std::vector<int>> Topology::clusters(int world, int size, uint64_t seed, int64_t draw) {
  const auto order = permutation(world, mix_seed(seed, 0xc1a5, uint64_t(draw)));
  std::vector<std::vector<int>> groups((world + size - 1) / size);
  for (int i = 0; i < world; ++i) groups[i / size].push_back(int(order[i]));
  for (auto& g : groups) std::sort(g.begin(), g.end());
  return groups;
}

void Topology::update(const TopologyConfig& cfg, int64_t step, int64_t phase_start) {
  const TopologyKind previous = kind_;
  kind_ = cfg.kind;
  if (kind_ != TopologyKind::clusters) {
    if (group_ != MPI_COMM_NULL) MPI_Comm_free(&group_);
    draw_ = -1;
    members_.resize(size_);
    for (int r = 0; r < size_; ++r) members_[r] = r;
    return;
  }
  // Draw number: one per phase, or one per `redraw` steps within it.
  const int64_t since = step - phase_start;
  const int64_t draw = phase_start * 1000003 + (cfg.redraw > 0 ? since / cfg.redraw : 0);
  if (draw == draw_ && previous == TopologyKind::clusters) return;
  draw_ = draw;
  const auto groups = clusters(size_, cfg.size, seed_, draw);
  int color = 0;
  for (size_t g = 0; g < groups.size(); ++g)
    if (std::find(groups[g].begin(), groups[g].end(), rank_) != groups[g].end()) color = int(g), members_ = groups[g];
  if (group_ != MPI_COMM_NULL) MPI_Comm_free(&group_);
  MPI_Comm_split(world_, color, rank_, &group_);
}

void Topology::average(float* kernel_buf, int64_t n, CommStats& stats) {
  ExecSpace().fence();
  const double t0 = MPI_Wtime();
  // MPI and the ring's sums read the values on the host: a copy where kernel memory is not the host's.
  using HostVec = Kokkos::View<float*, Kokkos::HostSpace, Unmanaged>;
  const bool staged = !kernel_memory_on_host();
  float* buf = kernel_buf;
  if (staged) {
    staged_.resize(n);
    Kokkos::deep_copy(HostVec(staged_.data(), n), Vec<float>(kernel_buf, n));
    buf = staged_.data();
  }
  float scale = 1.0f;  // applied by a kernel, after
  if (!is_ring()) {
    int g = 1;
    MPI_Comm_size(group(), &g);
    if (g > 1) {
      MPI_Allreduce(MPI_IN_PLACE, buf, int(n), MPI_FLOAT, MPI_SUM, group());
      scale = 1.0f / float(g);
      stats.rounds += 1;
      stats.bytes_sent += n * int64_t(sizeof(float));
      stats.wire_bytes += allreduce_wire_bytes(n * int64_t(sizeof(float)), g);
    }
  } else if (size_ > 1) {
    // (left + self + right) / 3 from host copies of both neighbours' buffers;
    // with two ranks the neighbour is one rank and the pair sums in rank order.
    const int left = (rank_ - 1 + size_) % size_, right = (rank_ + 1) % size_;
    left_.resize(n);
    MPI_Sendrecv(buf, int(n), MPI_FLOAT, right, 17, left_.data(), int(n), MPI_FLOAT, left, 17, world_,
                 MPI_STATUS_IGNORE);
    if (left == right) {
      for (int64_t i = 0; i < n; ++i) buf[i] = (rank_ < left ? buf[i] + left_[i] : left_[i] + buf[i]) * 0.5f;
      stats.rounds += 1;
      stats.bytes_sent += n * int64_t(sizeof(float));
      stats.wire_bytes += n * int64_t(sizeof(float));  // point to point: what it sends
    } else {
      right_.resize(n);
      MPI_Sendrecv(buf, int(n), MPI_FLOAT, left, 18, right_.data(), int(n), MPI_FLOAT, right, 18, world_,
                   MPI_STATUS_IGNORE);
      for (int64_t i = 0; i < n; ++i) buf[i] = (left_[i] + buf[i] + right_[i]) * (1.0f / 3.0f);
      stats.rounds += 2;
      stats.bytes_sent += 2 * n * int64_t(sizeof(float));
      stats.wire_bytes += 2 * n * int64_t(sizeof(float));
    }
  }
  if (staged) Kokkos::deep_copy(Vec<float>(kernel_buf, n), HostVec(staged_.data(), n));
  if (scale != 1.0f) kernels::scale_inplace<float>(Vec<float>(kernel_buf, n), scale);
  stats.seconds += MPI_Wtime() - t0;
}

}  // namespace xx

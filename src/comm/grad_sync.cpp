#include "comm/grad_sync.h"
#include "core/ownership.h"
#include <algorithm>
#include "comm/ops.h"
#include "kernels/elementwise.h"

namespace xx {

GradientSync::GradientSync(MPI_Comm comm, Buffer<float> grads, double bucket_mb, const ExpertRuns& experts)
    : comm_(comm), holders_(experts.holders), grads_(grads) {
  MPI_Comm_size(comm, &world_);
  if (holders_ != MPI_COMM_NULL) MPI_Comm_size(holders_, &holders_size_);
  const int64_t total = grads.extent(0);
  const int64_t size = std::max<int64_t>(1, int64_t(bucket_mb * 1024 * 1024 / sizeof(float)));
  std::vector<Bucket> cut;
  for (int64_t end = total; end > 0; end -= size) cut.push_back({std::max<int64_t>(0, end - size), end});
  // ep: a bucket crossing an expert run's edge is cut there, so that each
  // piece is reduced over one group
  for (const auto& b : cut) {
    const auto pieces = cut_at_runs(b.begin, b.end, experts.runs);
    for (auto p = pieces.rbegin(); p != pieces.rend(); ++p)
      buckets_.push_back({p->begin, p->end, MPI_REQUEST_NULL, false, p->inside});
  }
}

void GradientSync::begin(MPI_Comm comm) {
  comm_ = comm;
  MPI_Comm_size(comm, &world_);
  stats_ = CommStats{};
  for (auto& b : buckets_) b.started = false, b.request = MPI_REQUEST_NULL;
}

void GradientSync::start(Bucket& b) {
  b.started = true;
  if (world_ == 1) return;
  if (b.expert && holders_size_ == 1) return;  // the only holder: its sum is the sum
  const MPI_Comm group = b.expert ? holders_ : comm_;
  if (device_op_ && device_op_->queues())
    return device_op_->start(grads_.data() + b.begin, b.end - b.begin, group, stats_);
  ExecSpace().fence();  // the gradients must be written before MPI reads them
  if (device_op_) return device_op_->execute(grads_.data() + b.begin, b.end - b.begin, group, stats_);
  const double t0 = MPI_Wtime();
  mpi_.iallreduce_sum(grads_.data() + b.begin, int(b.end - b.begin), group, &b.request);
  stats_.seconds += MPI_Wtime() - t0;
  stats_.rounds += 1;
  stats_.bytes_sent += (b.end - b.begin) * int64_t(sizeof(float));
  stats_.wire_bytes += allreduce_wire_bytes((b.end - b.begin) * int64_t(sizeof(float)), b.expert ? holders_size_ : world_);
}

void GradientSync::ready(int64_t offset) {
  for (auto& b : buckets_)
    if (!b.started && b.begin >= offset) start(b);
  if (world_ == 1) return;
  // Nudge the collectives in flight: Open MPI progresses them only inside MPI
  // calls. A completed one is freed (and, staged, copied back).
  const double t0 = MPI_Wtime();
  for (auto& b : buckets_)
    if (b.request != MPI_REQUEST_NULL) mpi_.test(&b.request);
  stats_.seconds += MPI_Wtime() - t0;
}

void GradientSync::finish(int micro_steps) {
  for (auto& b : buckets_)
    if (!b.started) start(b);
  const double t0 = MPI_Wtime();
  for (auto& b : buckets_) mpi_.wait(&b.request);
  stats_.seconds += MPI_Wtime() - t0;
  if (device_op_) device_op_->finish(stats_);  // the kernels below wait for the queued sums
  // A sum over ranks (and micro-steps) of mean gradients becomes their mean.
  if (world_ * micro_steps > 1)
    kernels::scale_inplace<float>(Vec<float>(grads_.data(), grads_.extent(0)), 1.0f / float(world_ * micro_steps));
}

}  // namespace xx

#include "comm/bucket_reducer.h"
#include <algorithm>
#include <stdexcept>
#include "comm/ops.h"
#include "core/ownership.h"

namespace xx {

std::vector<ReduceBucket> cut_from_end(int64_t total, int64_t elements,
                                       const std::vector<std::pair<int64_t, int64_t>>& expert_runs) {
  elements = std::max<int64_t>(1, elements);
  std::vector<ReduceBucket> buckets;
  for (int64_t end = total; end > 0; end -= elements) {
    const auto pieces = cut_at_runs(std::max<int64_t>(0, end - elements), end, expert_runs);
    for (auto p = pieces.rbegin(); p != pieces.rend(); ++p) buckets.push_back({p->begin, p->end, p->inside});
  }
  return buckets;
}

BucketReducer::BucketReducer(Buffer<float> grads, std::vector<ReduceBucket> buckets, MPI_Comm expert_holders,
                             int max_in_flight, Reduced reduced)
    : holders_(expert_holders), max_in_flight_(max_in_flight), grads_(grads), reduced_(std::move(reduced)) {
  if (holders_ != MPI_COMM_NULL) MPI_Comm_size(holders_, &holders_size_);
  for (const auto& b : buckets) buckets_.push_back({b});
}

void BucketReducer::use_device_allreduce(DenseAllreduce& op) {
  if (reduced_) throw std::logic_error("BucketReducer: a device all-reduce has no completions to hook");
  device_op_ = &op;
}

void BucketReducer::begin(MPI_Comm group) {
  group_ = group;
  MPI_Comm_size(group, &group_size_);
  stats_ = CommStats{};
  for (auto& b : buckets_) b.started = false, b.request = MPI_REQUEST_NULL;
}

void BucketReducer::start(size_t index) {
  Bucket& b = buckets_[index];
  b.started = true;
  const int ranks = b.expert ? holders_size_ : group_size_;
  if (ranks == 1) {  // one rank, or an expert's only holder: its sum is the sum
    if (reduced_) ExecSpace().fence(), reduced_(index);  // (the backward has written it)
    return;
  }
  const MPI_Comm group = b.expert ? holders_ : group_;
  const int64_t n = b.end - b.begin;
  if (device_op_ && device_op_->queues()) return device_op_->start(grads_.data() + b.begin, n, group, stats_);
  ExecSpace().fence();  // the gradients must be written before MPI reads them
  if (device_op_) return device_op_->execute(grads_.data() + b.begin, n, group, stats_);
  const double t0 = MPI_Wtime();
  mpi_.iallreduce_sum(grads_.data() + b.begin, int(n), group, &b.request);
  stats_.seconds += MPI_Wtime() - t0;
  stats_.rounds += 1;
  stats_.bytes_sent += n * int64_t(sizeof(float));
  stats_.wire_bytes += allreduce_wire_bytes(n * int64_t(sizeof(float)), ranks);
}

void BucketReducer::complete(size_t b) {
  mpi_.wait(&buckets_[b].request);
  if (reduced_) reduced_(b);
}

void BucketReducer::ready(int64_t offset) {
  for (size_t b = 0; b < buckets_.size(); ++b)
    if (!buckets_[b].started && buckets_[b].begin >= offset) start(b);
  // Nudge the collectives in flight: Open MPI progresses them only inside MPI
  // calls. A completed one is freed (and, staged, copied back).
  const double t0 = MPI_Wtime();
  size_t in_flight = 0;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (buckets_[b].request == MPI_REQUEST_NULL) continue;
    if (!mpi_.test(&buckets_[b].request)) ++in_flight;
    else if (reduced_) reduced_(b);
  }
  // Beyond the bound, the oldest first: without one every bucket of the
  // backward stays whole (and MPI's temporaries with it) until the last is waited for.
  for (size_t b = 0; max_in_flight_ > 0 && b < buckets_.size() && in_flight > size_t(max_in_flight_); ++b)
    if (buckets_[b].request != MPI_REQUEST_NULL) complete(b), --in_flight;
  stats_.seconds += MPI_Wtime() - t0;
}

void BucketReducer::finish() {
  for (size_t b = 0; b < buckets_.size(); ++b)
    if (!buckets_[b].started) start(b);
  const double t0 = MPI_Wtime();
  for (size_t b = 0; b < buckets_.size(); ++b)
    if (buckets_[b].request != MPI_REQUEST_NULL) complete(b);
  stats_.seconds += MPI_Wtime() - t0;
  if (device_op_) device_op_->finish(stats_);  // the kernels below wait for the queued sums
}

}  // namespace xx

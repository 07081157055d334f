#include "comm/pipeline_mpi.h"
#include <algorithm>
#include <exception>
#include <limits>
#include <stdexcept>
#include <fmt/format.h>

namespace xx {

namespace {
enum Kind { activation, gradient, lookups };
}  // namespace

// One tag per receiving chunk, micro-batch and kind; MPI keeps the order of
// messages with the same tag between two ranks, so steps need no tag of
// their own.
int StageLink::tag(int chunk, int micro, int kind) const {
  const int64_t t = (int64_t(micro) * cut_.chunks + chunk) * 3 + kind;
  if (t > 32767)  // the least MPI_TAG_UB the standard allows
    throw std::length_error(fmt::format("StageLink: micro-batch {} of chunk {} of {} needs tag {} (at most 32767)",
                                        micro, chunk, cut_.chunks, t));
  return int(t);
}

StageLink::StageLink(MPI_Comm world, const StageCut& cut) : cut_(cut) {
  MPI_Comm_split(world, cut.stage, cut.replica, &replicas_);
  MPI_Comm_split(world, cut.replica, cut.stage, &chain_);
  const bool end = cut.first() || cut.last();
  MPI_Comm_split(chain_, end ? 0 : MPI_UNDEFINED, cut.stage, &ends_);
}

StageLink::~StageLink() {
  if (std::uncaught_exceptions() == 0 && !requests_.empty())
    MPI_Waitall(int(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE);
  for (MPI_Comm* c : {&replicas_, &chain_, &ends_})
    if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
}

void StageLink::send(int to, int tag, const float* data, int64_t n) {
  if (n > std::numeric_limits<int>::max()) throw std::length_error(fmt::format("StageLink: {} floats in one message", n));
  outgoing_.emplace_back(data, data + n);
  requests_.emplace_back();
  MPI_Isend(outgoing_.back().data(), int(n), MPI_FLOAT, to, tag, chain_, &requests_.back());
  bytes_sent_ += n * int64_t(sizeof(float));
}

void StageLink::recv(int from, int tag, float* data, int64_t n) {
  if (n > std::numeric_limits<int>::max()) throw std::length_error(fmt::format("StageLink: {} floats in one message", n));
  const double t0 = MPI_Wtime();
  MPI_Recv(data, int(n), MPI_FLOAT, from, tag, chain_, MPI_STATUS_IGNORE);
  waited_ += MPI_Wtime() - t0;
}

void StageLink::send_activation(int chunk, int micro, const float* x, int64_t n) {
  if (chunk + 1 >= cut_.chunks) throw std::logic_error("StageLink: the last chunk sends no activation");
  send(cut_.holders[size_t(chunk + 1)], tag(chunk + 1, micro, activation), x, n);
}

void StageLink::send_gradient(int chunk, int micro, const float* g, int64_t n) {
  if (chunk <= 0) throw std::logic_error("StageLink: the first chunk sends no gradient");
  send(cut_.holders[size_t(chunk - 1)], tag(chunk - 1, micro, gradient), g, n);
}

void StageLink::recv_activation(int chunk, int micro, float* x, int64_t n) {
  if (chunk <= 0) throw std::logic_error("StageLink: the first chunk receives no activation");
  recv(cut_.holders[size_t(chunk - 1)], tag(chunk, micro, activation), x, n);
}

void StageLink::recv_gradient(int chunk, int micro, float* g, int64_t n) {
  if (chunk + 1 >= cut_.chunks) throw std::logic_error("StageLink: the last chunk receives no gradient");
  recv(cut_.holders[size_t(chunk + 1)], tag(chunk, micro, gradient), g, n);
}

void StageLink::send_lookups(int micro, const float* g, int64_t n) {
  if (!cut_.last() || cut_.whole()) throw std::logic_error("StageLink: the last stage of several sends the lookups");
  send(cut_.holders.front(), tag(0, micro, lookups), g, n);
}

void StageLink::recv_lookups(int micro, float* g, int64_t n) {
  if (!cut_.first() || cut_.whole()) throw std::logic_error("StageLink: the first stage of several receives the lookups");
  recv(cut_.holders.back(), tag(0, micro, lookups), g, n);
}

void StageLink::first_to_last(float* g, int64_t n) {
  if (ends_ == MPI_COMM_NULL) throw std::logic_error("StageLink: only the first and the last stage share a tensor");
  if (n > std::numeric_limits<int>::max()) throw std::length_error(fmt::format("StageLink: {} floats at once", n));
  MPI_Bcast(g, int(n), MPI_FLOAT, 0, ends_);
}

void StageLink::sum_first_last(float* g, int64_t n) {
  if (ends_ == MPI_COMM_NULL) throw std::logic_error("StageLink: only the first and the last stage share a tensor");
  constexpr int64_t chunk = int64_t(1) << 30;  // (MPI counts are ints)
  for (int64_t at = 0; at < n; at += chunk)
    MPI_Allreduce(MPI_IN_PLACE, g + at, int(std::min(chunk, n - at)), MPI_FLOAT, MPI_SUM, ends_);
}

double StageLink::finish_step() {
  const double t0 = MPI_Wtime();
  if (!requests_.empty()) MPI_Waitall(int(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE);
  requests_.clear(), outgoing_.clear();
  const double waited = waited_ + (MPI_Wtime() - t0);
  waited_ = 0;
  return waited;
}

}  // namespace xx

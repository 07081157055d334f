#include "train/lossagg.h"
#include "comm/agree.h"
#include <cmath>
#include "core/error.h"
#include "kernels/loss_weights.h"

namespace xx {
namespace {

// The kernels take device views; the gathered figures live on the host.
using HostVec = Kokkos::View<double*, Kokkos::HostSpace, Unmanaged>;

Buffer<double> to_device(const std::vector<double>& v, const char* label) {
  Buffer<double> out(std::string(label), v.size());
  Kokkos::deep_copy(out, Kokkos::View<const double*, Kokkos::HostSpace, Unmanaged>(v.data(), v.size()));
  return out;
}

void to_host(std::vector<double>& v, const Buffer<double>& b) {
  v.resize(b.extent(0));
  Kokkos::deep_copy(HostVec(v.data(), v.size()), b);
}

kernels::RankWeighting rank_weighting(LossAggKind kind) {
  if (kind == LossAggKind::robust) return kernels::RankWeighting::robust;
  if (kind == LossAggKind::softmax) return kernels::RankWeighting::softmax;
  return kernels::RankWeighting::mean;  // mean and uncertainty weigh ranks by their tokens
}

}  // namespace

LossAggregator::LossAggregator(MPI_Comm comm, std::array<bool, kKinds> active)
    : comm_(comm), active_(active), log_var_(kKinds, 0.0), dlog_var_sum_(kKinds, 0.0) {
  MPI_Comm_rank(comm, &rank_);
  MPI_Comm_size(comm, &world_);
}

LossWeights LossAggregator::weigh(const LossAggConfig& cfg, std::array<double, kKinds> parts, double tokens) {
  // One all-gather: each rank's losses and its token count, in rank order.
  constexpr int row = kKinds + 1;
  double mine[row] = {parts[0], parts[1], parts[2], tokens};
  const std::vector<double> all = rows_of_all_ranks(mine, comm_);
  losses_.resize(size_t(world_) * kKinds);
  tokens_.resize(world_);
  for (int r = 0; r < world_; ++r) {
    for (int i = 0; i < kKinds; ++i) losses_[r * kKinds + i] = all[r * row + i];
    tokens_[r] = all[r * row + kKinds];
  }

  const int64_t R = world_;
  auto losses = to_device(losses_, "LossAggregator::losses");
  auto tokens_d = to_device(tokens_, "LossAggregator::tokens");
  Buffer<double> weights("LossAggregator::weights", R), multipliers("LossAggregator::multipliers", R);
  kernels::RankWeightingParams params;
  params.kind = rank_weighting(cfg.kind);
  params.trim = cfg.trim;
  params.temperature = cfg.temperature;
  Mat<const double> loss_mat(losses.data(), R, kKinds);
  kernels::rank_weights<double>(weights, multipliers, loss_mat, tokens_d, params);
  to_host(weights_, weights);
  to_host(multipliers_, multipliers);

  LossWeights out;
  out.main = out.mtp = out.aux = multipliers_[rank_];
  if (cfg.kind == LossAggKind::uncertainty) {
    std::vector<double> active(kKinds);
    for (int i = 0; i < kKinds; ++i) active[i] = active_[i] ? 1.0 : 0.0;
    auto active_d = to_device(active, "LossAggregator::active");
    auto log_var = to_device(log_var_, "LossAggregator::log_var");
    Buffer<double> loss_weights("LossAggregator::loss_weights", kKinds), dlog_var("LossAggregator::dlog_var", kKinds);
    kernels::uncertainty_forward<double>(loss_weights, loss_mat, weights, log_var, active_d);
    kernels::uncertainty_backward<double>(dlog_var, loss_mat, weights, log_var, active_d);
    std::vector<double> w, g;
    to_host(w, loss_weights);
    to_host(g, dlog_var);
    out.main *= w[0], out.mtp *= w[1], out.aux *= w[2];
    for (int i = 0; i < kKinds; ++i) dlog_var_sum_[i] += g[i];
    ++pending_;
  }
  return out;
}

void LossAggregator::end_step(double lr) {
  if (pending_ == 0) return;
  for (int i = 0; i < kKinds; ++i) log_var_[i] -= lr * dlog_var_sum_[i] / double(pending_), dlog_var_sum_[i] = 0;
  pending_ = 0;
}

std::array<double, LossAggregator::kKinds> LossAggregator::loss_weights() const {
  std::array<double, kKinds> out;
  for (int i = 0; i < kKinds; ++i) out[i] = active_[i] ? std::exp(-log_var_[i]) : 1.0;
  return out;
}

void LossAggregator::set_log_var(const std::vector<double>& s) {
  if (s.size() != size_t(kKinds))
    input_error("checkpoint: /train/{} holds {} values (expected {}: main, mtp, aux)", kLogVarSeries, s.size(), kKinds);
  log_var_ = s;
}

}  // namespace xx

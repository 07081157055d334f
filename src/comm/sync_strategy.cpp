// The sync strategy registry and what the strategies share (sync_group.h).
#include "comm/sync_strategy.h"
#include <cmath>
#include <fmt/format.h>
#include "comm/sync_group.h"
#include "kernels/elementwise.h"
#include "kernels/sync.h"

namespace xx {
namespace sync_detail {

GroupSync::GroupSync(const SyncBuffers& buffers, const SyncSettings& settings)
    : SyncStrategy(settings), buffers_(buffers), topology_(buffers.world, buffers.seed) {
  MPI_Comm_rank(buffers.world, &rank_);
  MPI_Comm_size(buffers.world, &world_);
}

void GroupSync::begin_step(int64_t step) { topology_.update(settings_.topology, step, settings_.phase_start); }

void GroupSync::measure_mean(bool global, CommStats& stats) {
  auto& params = buffers_.params;
  const int64_t P = params.extent(0);
  if (mean_.extent(0) == 0) mean_ = Buffer<float>("Sync::mean", P);
  Kokkos::deep_copy(mean_, params);
  if (global && world_ > 1) {
    ExecSpace().fence();
    buffers_.ops->dense().execute(mean_.data(), P, buffers_.world, stats);
    kernels::scale_inplace<float>(Vec<float>(mean_.data(), P), 1.0f / float(world_));
  } else if (!global) {
    topology_.average(mean_.data(), P, stats);
  }
  double sq = kernels::squared_distance(Vec<const float>(params.data(), P), Vec<const float>(mean_.data(), P)), sum = 0;
  MPI_Allreduce(&sq, &sum, 1, MPI_DOUBLE, MPI_SUM, buffers_.world);
  consensus_ = std::sqrt(sum / (double(world_) * double(P)));
  if (world_ > 1)  // a scalar: on the wire, the 8 bytes it hands MPI
    stats.rounds += 1, stats.bytes_sent += int64_t(sizeof(double)), stats.wire_bytes += int64_t(sizeof(double));
}

void GroupSync::take_global_mean(CommStats&) { Kokkos::deep_copy(buffers_.params, mean_); }

void GroupSync::world_average(Buffer<float>& buffer, CommStats& stats) {
  const int64_t n = buffer.extent(0);
  if (world_ > 1) buffers_.ops->dense().execute(buffer.data(), n, buffers_.world, stats);
  kernels::scale_inplace<float>(Vec<float>(buffer.data(), n), 1.0f / float(world_));
}

void GroupSync::average_optimizer_state(CommStats& stats) {
  if (world_ == 1) return;
  ExecSpace().fence();
  for (auto& moments : buffers_.optimizer_state) moments.in_fp32([&](Buffer<float>& b) { world_average(b, stats); });
  ExecSpace().fence();
}

void GroupSync::end_phase(int64_t, CommStats& stats) {
  if (full()) return;
  measure_mean(true, stats);
  take_global_mean(stats);
  ExecSpace().fence();
  // Each rank stepped its group's AdamW: the moments are averaged too, or a
  // dense phase after this one would move equal weights apart.
  average_optimizer_state(stats);
}

}  // namespace sync_detail

namespace {

// One row per strategy, in priority order: the first whose `passes` is
// empty serves the phase; otherwise `passes` says why it was passed over.
struct StrategyRow {
  const char* name;
  std::function<std::string(const SyncSettings&)> passes;
  std::unique_ptr<SyncStrategy> (*make)(const SyncBuffers&, const SyncSettings&);
};

const std::vector<StrategyRow>& strategy_rows() {
  using namespace sync_detail;
  static const std::vector<StrategyRow> rows = {
      {"compressed-update",
       [](const SyncSettings& s) {
         return s.compress.kind != CompressKind::topk ? std::string("compress off")
                : s.compress.target != CompressTarget::update ? std::string("compress target gradient")
                                                : std::string();
       },
       make_compressed_update},
      {"compressed-gradient",
       [](const SyncSettings& s) { return s.compress.kind != CompressKind::topk ? std::string("compress off") : std::string(); },
       make_compressed_gradient},
      {"local", [](const SyncSettings& s) { return s.sync.kind != SyncKind::local ? fmt::format("sync {}", s.sync.kind) : std::string(); },
       make_local},
      {"gossip",
       [](const SyncSettings& s) {
         return s.topology.kind != TopologyKind::ring ? fmt::format("topology {}", s.topology.kind) : std::string();
       },
       make_gossip},
      {"sharded", [](const SyncSettings& s) { return s.shard == ShardLevel::off ? std::string("shard off") : std::string(); },
       make_sharded},
      {"dense", [](const SyncSettings&) { return std::string(); }, make_dense},
  };
  return rows;
}

}  // namespace

std::unique_ptr<SyncStrategy> choose_sync_strategy(const SyncBuffers& buffers, const SyncSettings& settings,
                                                   std::string* report) {
  std::vector<std::string> passed;
  for (const auto& row : strategy_rows()) {
    if (const std::string why = row.passes(settings); !why.empty()) {
      passed.push_back(fmt::format("{} ({})", row.name, why));
      continue;
    }
    auto strategy = row.make(buffers, settings);
    if (report)
      *report = fmt::format("{}: {}{}", row.name, strategy->describe(),
                            passed.empty() ? "" : fmt::format("; passed over: {}", fmt::join(passed, ", ")));
    return strategy;
  }
  return nullptr;  // unreachable: dense serves every setting
}

}  // namespace xx

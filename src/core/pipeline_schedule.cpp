#include "core/pipeline_schedule.h"
#include <algorithm>
#include <stdexcept>
#include <fmt/format.h>
#include "core/placement.h"

namespace xx {

namespace {

// Megatron's interleaved order: the i-th forward (or backward) of a stage
// takes micro-batches in groups of P, each group through the V runs in turn
// (backwards from the last run).
PipeOp interleaved_op(PipeOp::Kind kind, int i, int P, int V) {
  const int pass = (i / P) % V;
  return {kind, (i / (P * V)) * P + i % P, kind == PipeOp::forward ? pass : V - 1 - pass};
}

// DeepSeek's DualPipeV phases for stage s (run 0 goes down the V, run 1 back
// up), each pass of a run taking its next micro-batch.
std::vector<PipeOp> dualpipev_order(int P, int M, int s) {
  std::vector<PipeOp> out;
  int next[2][2] = {{0, 0}, {0, 0}};  // [kind][run]
  auto op = [&](PipeOp::Kind kind, int run) { out.push_back({kind, next[kind][run]++, run}); };
  auto pair = [&](int forward_run) { op(PipeOp::forward, forward_run), out.back().paired = true, op(PipeOp::backward, 1 - forward_run); };
  const auto F = PipeOp::forward, B = PipeOp::backward;
  for (int i = 0; i < 2 * (P - s - 1); ++i) op(F, 0);
  for (int i = 0; i < s + 1; ++i) op(F, 0), op(F, 1);
  for (int i = 0; i < P - s - 1; ++i) op(B, 1), op(F, 1);
  for (int i = 0; i < M - 2 * P + s + 1; ++i) pair(0), pair(1);  // F0 with B1, F1 with B0
  for (int i = 0; i < P - s - 1; ++i) op(B, 1), pair(1);
  for (int i = 0; i < s + 1; ++i) op(B, 1), op(B, 0);
  for (int i = 0; i < P - s - 1; ++i) op(B, 0);
  return out;
}

}  // namespace

std::vector<PipeOp> stage_order(PipelineSchedule schedule, int stages, int micro, int stage, int virtual_stages) {
  const int P = stages, M = micro, V = virtual_stages;
  const bool chunked = schedule == PipelineSchedule::interleaved || schedule == PipelineSchedule::dualpipev;
  if (P < 1 || M < 1 || stage < 0 || stage >= P || V < 1 || (!chunked && V != 1) ||
      (schedule == PipelineSchedule::dualpipev && (V != 2 || M < 2 * P)) ||
      (schedule == PipelineSchedule::interleaved && M % P != 0))
    throw std::invalid_argument(fmt::format("stage_order: schedule {}, stage {} of {} x {} chunks, {} micro-batches",
                                            schedule, stage, P, V, M));
  std::vector<PipeOp> out;
  out.reserve(size_t(2 * M * V));
  switch (schedule) {
    case PipelineSchedule::gpipe:
      for (int m = 0; m < M; ++m) out.push_back({PipeOp::forward, m});
      for (int m = 0; m < M; ++m) out.push_back({PipeOp::backward, m});
      return out;
    case PipelineSchedule::one_f_one_b: {
      const int warmup = std::min(P - stage, M);
      int f = 0, b = 0;
      while (f < warmup) out.push_back({PipeOp::forward, f++});
      while (f < M) out.push_back({PipeOp::backward, b++}), out.push_back({PipeOp::forward, f++});
      while (b < M) out.push_back({PipeOp::backward, b++});
      return out;
    }
    case PipelineSchedule::interleaved: {
      const int total = M * V, warmup = std::min(2 * (P - stage - 1) + (V - 1) * P, total);
      int f = 0, b = 0;
      while (f < warmup) out.push_back(interleaved_op(PipeOp::forward, f++, P, V));
      while (f < total)
        out.push_back(interleaved_op(PipeOp::forward, f++, P, V)), out.push_back(interleaved_op(PipeOp::backward, b++, P, V));
      while (b < total) out.push_back(interleaved_op(PipeOp::backward, b++, P, V));
      return out;
    }
    case PipelineSchedule::dualpipev:
      return dualpipev_order(P, M, stage);
  }
  throw std::invalid_argument(fmt::format("stage_order: schedule {} is not built", schedule));
}

int most_in_flight(const std::vector<PipeOp>& order, int run) {
  int now = 0, most = 0;
  for (const PipeOp& op : order)
    if (op.run == run) most = std::max(most, now += op.kind == PipeOp::forward ? 1 : -1);
  return most;
}

std::vector<int> in_flight_per_run(const std::vector<PipeOp>& order, int virtual_stages) {
  std::vector<int> out;
  for (int r = 0; r < virtual_stages; ++r) out.push_back(most_in_flight(order, r));
  return out;
}

double theory_bubble(PipelineSchedule schedule, int stages, int micro, int virtual_stages) {
  const double P = stages, M = micro, V = virtual_stages;
  switch (schedule) {
    case PipelineSchedule::interleaved: return (P - 1) / (V * M + P - 1);
    case PipelineSchedule::dualpipev: return 3 * (P - 1) / (4 * M + 3 * (P - 1));
    default: return (P - 1) / (M + P - 1);
  }
}

PipelineTimeline simulate(PipelineSchedule schedule, int stages, int micro, int virtual_stages, double f, double b,
                          bool paired) {
  const int P = stages, M = micro, V = virtual_stages, K = P * V;
  const bool v_shape = schedule == PipelineSchedule::dualpipev;
  std::vector<std::vector<PipeOp>> order(static_cast<size_t>(P));
  for (int s = 0; s < P; ++s) order[size_t(s)] = stage_order(schedule, P, M, s, V);
  // done[kind][chunk][m]: when that pass ended; < 0: not yet
  std::vector<std::vector<double>> fdone(size_t(K), std::vector<double>(size_t(M), -1)), bdone = fdone;
  std::vector<size_t> next(static_cast<size_t>(P), 0);
  std::vector<double> free_at(size_t(P), 0), busy(size_t(P), 0);
  PipelineTimeline t;
  t.max_in_flight.assign(size_t(P), 0);
  std::vector<int> in_flight(size_t(P), 0);
  for (bool moved = true; moved;) {
    moved = false;
    for (int s = 0; s < P; ++s) {
      while (next[size_t(s)] < order[size_t(s)].size()) {
        // when op's input is there (< 0: not yet)
        auto ready_of = [&](const PipeOp& op) {
          const int k = chunk_of(P, V, v_shape, s, op.run);
          if (op.kind == PipeOp::forward) return k > 0 ? fdone[size_t(k - 1)][size_t(op.micro)] : 0.0;
          const double mine = fdone[size_t(k)][size_t(op.micro)];
          if (mine < 0 || k + 1 == K) return mine;
          const double up = bdone[size_t(k + 1)][size_t(op.micro)];
          return up < 0 ? up : std::max(mine, up);
        };
        // a paired F&B step starts with both inputs there, its passes one after the other
        const size_t at = next[size_t(s)], n = paired && order[size_t(s)][at].paired ? 2 : 1;
        double ready = 0;
        for (size_t i = at; i < at + n && ready >= 0; ++i) {
          const double r = ready_of(order[size_t(s)][i]);
          ready = r < 0 ? r : std::max(ready, r);
        }
        if (ready < 0) break;
        double clock = std::max(ready, free_at[size_t(s)]);
        for (size_t i = at; i < at + n; ++i) {
          const PipeOp op = order[size_t(s)][i];
          const int k = chunk_of(P, V, v_shape, s, op.run);
          const double cost = op.kind == PipeOp::forward ? f : b;
          clock += cost, busy[size_t(s)] += cost;
          (op.kind == PipeOp::forward ? fdone : bdone)[size_t(k)][size_t(op.micro)] = clock;
          in_flight[size_t(s)] += op.kind == PipeOp::forward ? 1 : -1;
          t.max_in_flight[size_t(s)] = std::max(t.max_in_flight[size_t(s)], in_flight[size_t(s)]);
        }
        free_at[size_t(s)] = clock;
        next[size_t(s)] += n;
        moved = true;
      }
    }
  }
  t.complete = true;
  for (int s = 0; s < P; ++s) t.complete &= next[size_t(s)] == order[size_t(s)].size();
  t.makespan = *std::max_element(free_at.begin(), free_at.end());
  for (int s = 0; s < P; ++s) t.bubble.push_back(t.makespan > 0 ? 1.0 - busy[size_t(s)] / t.makespan : 0.0);
  return t;
}

}  // namespace xx

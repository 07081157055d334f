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
  const auto F = PipeOp::forward, B = PipeOp::backward;
  for (int i = 0; i < 2 * (P - s - 1); ++i) op(F, 0);
  for (int i = 0; i < s + 1; ++i) op(F, 0), op(F, 1);
  for (int i = 0; i < P - s - 1; ++i) op(B, 1), op(F, 1);
  for (int i = 0; i < M - 2 * P + s + 1; ++i) op(F, 0), op(B, 1), op(F, 1), op(B, 0);  // F0 with B1, F1 with B0
  for (int i = 0; i < P - s - 1; ++i) op(B, 1), op(F, 1), op(B, 0);
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

PipelineTimeline simulate(PipelineSchedule schedule, int stages, int micro, int virtual_stages, double f, double b) {
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
        const PipeOp op = order[size_t(s)][next[size_t(s)]];
        const int k = chunk_of(P, V, v_shape, s, op.run);
        double ready = 0;
        if (op.kind == PipeOp::forward) {
          if (k > 0 && (ready = fdone[size_t(k - 1)][size_t(op.micro)]) < 0) break;
        } else {
          ready = fdone[size_t(k)][size_t(op.micro)];
          if (ready < 0) break;
          if (k + 1 < K) {
            const double up = bdone[size_t(k + 1)][size_t(op.micro)];
            if (up < 0) break;
            ready = std::max(ready, up);
          }
        }
        const double cost = op.kind == PipeOp::forward ? f : b;
        const double start = std::max(ready, free_at[size_t(s)]);
        free_at[size_t(s)] = start + cost, busy[size_t(s)] += cost;
        (op.kind == PipeOp::forward ? fdone : bdone)[size_t(k)][size_t(op.micro)] = start + cost;
        in_flight[size_t(s)] += op.kind == PipeOp::forward ? 1 : -1;
        t.max_in_flight[size_t(s)] = std::max(t.max_in_flight[size_t(s)], in_flight[size_t(s)]);
        ++next[size_t(s)];
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

#include "train/pipeline_schedule.h"
#include <algorithm>
#include <stdexcept>
#include <fmt/format.h>

namespace xx {

std::vector<PipeOp> stage_order(PipelineSchedule schedule, int stages, int micro, int stage) {
  if (stages < 1 || micro < 1 || stage < 0 || stage >= stages)
    throw std::invalid_argument(fmt::format("stage_order: stage {} of {}, {} micro-batches", stage, stages, micro));
  std::vector<PipeOp> out;
  out.reserve(size_t(2 * micro));
  switch (schedule) {
    case PipelineSchedule::gpipe:
      for (int m = 0; m < micro; ++m) out.push_back({PipeOp::forward, m});
      for (int m = 0; m < micro; ++m) out.push_back({PipeOp::backward, m});
      return out;
    case PipelineSchedule::one_f_one_b: {
      const int warmup = std::min(stages - stage, micro);
      int f = 0, b = 0;
      while (f < warmup) out.push_back({PipeOp::forward, f++});
      while (f < micro) out.push_back({PipeOp::backward, b++}), out.push_back({PipeOp::forward, f++});
      while (b < micro) out.push_back({PipeOp::backward, b++});
      return out;
    }
    default:
      throw std::invalid_argument(fmt::format("stage_order: schedule {} is not built", schedule));
  }
}

int most_in_flight(const std::vector<PipeOp>& order) {
  int now = 0, most = 0;
  for (const PipeOp& op : order) most = std::max(most, now += op.kind == PipeOp::forward ? 1 : -1);
  return most;
}

double theory_bubble(PipelineSchedule, int stages, int micro) {
  return double(stages - 1) / double(micro + stages - 1);
}

PipelineTimeline simulate(PipelineSchedule schedule, int stages, int micro, double f, double b) {
  const int P = stages, M = micro;
  std::vector<std::vector<PipeOp>> order(static_cast<size_t>(P));
  for (int s = 0; s < P; ++s) order[size_t(s)] = stage_order(schedule, P, M, s);
  // done[s][kind][m]: when that pass ended; < 0: not yet
  std::vector<std::vector<double>> fdone(size_t(P), std::vector<double>(size_t(M), -1)), bdone = fdone;
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
        double ready = 0;
        if (op.kind == PipeOp::forward) {
          if (s > 0 && (ready = fdone[size_t(s - 1)][size_t(op.micro)]) < 0) break;
        } else {
          ready = fdone[size_t(s)][size_t(op.micro)];
          if (ready < 0) break;
          if (s + 1 < P) {
            const double up = bdone[size_t(s + 1)][size_t(op.micro)];
            if (up < 0) break;
            ready = std::max(ready, up);
          }
        }
        const double cost = op.kind == PipeOp::forward ? f : b;
        const double start = std::max(ready, free_at[size_t(s)]);
        free_at[size_t(s)] = start + cost, busy[size_t(s)] += cost;
        (op.kind == PipeOp::forward ? fdone : bdone)[size_t(s)][size_t(op.micro)] = start + cost;
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

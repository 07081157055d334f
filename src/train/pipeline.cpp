#include "train/pipeline.h"
#include <algorithm>
#include <chrono>
#include <fmt/format.h>

namespace xx {

PipelineExecutor::PipelineExecutor(PipelineSchedule schedule, int micro, StageLink& link)
    : schedule_(schedule), micro_(micro), link_(link),
      order_(stage_order(schedule, link.cut().stages, micro, link.cut().stage, int(link.cut().runs.size()))) {}

PipelineStepTimes PipelineExecutor::step(const StagePasses& p) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  const StageCut& cut = link_.cut();
  in_.resize(size_t(p.width)), out_.resize(size_t(p.width));
  for (const PipeOp& op : order_) {
    const int k = cut.runs[size_t(op.run)].chunk;
    const bool first = k == 0, last = k + 1 == cut.chunks;
    if (op.kind == PipeOp::forward) {
      if (!first) link_.recv_activation(k, op.micro, in_.data(), p.width);
      p.forward(op.run, op.micro, first ? nullptr : in_.data(), last ? nullptr : out_.data());
      if (!last) link_.send_activation(k, op.micro, out_.data(), p.width);
    } else {
      if (!last) link_.recv_gradient(k, op.micro, in_.data(), p.width);
      p.backward(op.run, op.micro, last ? nullptr : in_.data(), first ? nullptr : out_.data());
      if (!first) link_.send_gradient(k, op.micro, out_.data(), p.width);
    }
  }
PipelineStepTimes t;
  t.waited = link_.finish_step();
  t.seconds = std::chrono::duration<double>(clock::now() - t0).count();
  t.theory = theory_bubble(schedule_, cut.stages, micro_, int(cut.runs.size()));
  return t;
}

}  // namespace xx

namespace xx {

int ActivationSets::take(int micro) {
  const auto free = std::find(holder_.begin(), holder_.end(), -1);
  if (free == holder_.end())
    throw std::logic_error(fmt::format("pipeline: micro-batch {} finds all {} activation sets held", micro, holder_.size()));
  *free = micro;
  return int(free - holder_.begin());
}

int ActivationSets::release(int micro) {
  const auto held = std::find(holder_.begin(), holder_.end(), micro);
  if (held == holder_.end())
    throw std::logic_error(fmt::format("pipeline: the backward of micro-batch {}, whose forward holds no set", micro));
  *held = -1;
  return int(held - holder_.begin());
}

}  // namespace xx

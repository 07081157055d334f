#include "train/pipeline.h"
#include <algorithm>
#include <chrono>
#include <fmt/format.h>

namespace xx {

PipelineExecutor::PipelineExecutor(PipelineSchedule schedule, int micro, StageLink& link, bool overlap)
    : schedule_(schedule), micro_(micro), link_(link),
      order_(stage_order(schedule, link.cut().stages, micro, link.cut().stage, int(link.cut().runs.size()))),
      overlap_(overlap), in_(link.cut().runs.size()), out_(link.cut().runs.size()) {}

// op's input from the chunk before (a forward) or after (a backward), where it is not its own
void PipelineExecutor::receive(const StagePasses& p, const PipeOp& op) {
  const StageCut& cut = link_.cut();
  const int k = cut.runs[size_t(op.run)].chunk;
  float* in = in_[size_t(op.run)].data();
  if (op.kind == PipeOp::forward && k > 0) link_.recv_activation(k, op.micro, in, p.width);
  if (op.kind == PipeOp::backward && k + 1 < cut.chunks) link_.recv_gradient(k, op.micro, in, p.width);
}

// op's pass, its output sent on to the chunk after (a forward) or before (a backward)
void PipelineExecutor::pass(const StagePasses& p, const PipeOp& op) {
  const StageCut& cut = link_.cut();
  const int k = cut.runs[size_t(op.run)].chunk;
  const bool first = k == 0, last = k + 1 == cut.chunks;
  float* in = in_[size_t(op.run)].data();
  float* out = out_[size_t(op.run)].data();
  if (op.kind == PipeOp::forward) {
    p.forward(op.run, op.micro, first ? nullptr : in, last ? nullptr : out);
    if (!last) link_.send_activation(k, op.micro, out, p.width);
  } else {
    p.backward(op.run, op.micro, last ? nullptr : in, first ? nullptr : out);
    if (!first) link_.send_gradient(k, op.micro, out, p.width);
  }
}

PipelineStepTimes PipelineExecutor::step(const StagePasses& p) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  const StageCut& cut = link_.cut();
  for (auto& b : in_) b.resize(size_t(p.width));
  for (auto& b : out_) b.resize(size_t(p.width));
  for (size_t i = 0; i < order_.size(); ++i) {
    const PipeOp& op = order_[i];
    if (overlap_ && op.paired) {  // both inputs first, then the two passes interleaved (train/pass_pair.h)
      const PipeOp& then = order_[++i];
      receive(p, op), receive(p, then);
      pair_.run([&] { pass(p, op); }, [&] { pass(p, then); });
    } else {
      receive(p, op), pass(p, op);
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

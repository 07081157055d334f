// The trainer's resilience (docs/RESILIENCE.md): the NaN verdict every step,
// the periodic health check, stop signals at the step boundary, and fault
// injection for the tests of all three.
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <thread>
#include <fmt/format.h>
#include "kernels/health.h"
#include "kernels/precision.h"
#include "resilience/health.h"
#include "resilience/signals.h"
#include "train/trainer.h"
#include "comm/agree.h"

namespace xx {

// One all-reduce: the global mean of the losses, and whether any rank saw an
// inf or NaN in its own loss or gradients (health nan skip|stop). Every rank
// sees the same count, so all skip together or all stop with one message.
bool Trainer::agree_on_losses(const LossParts& mine) {
  const bool scaled = precision_->scaler() != nullptr;  // a loss scaler decided overflows already
  last_.own_loss = mine.total;
  nonfinite_.own |= !scaled && !std::isfinite(mine.total);
  double sums[5] = {mine.total, mine.main, mine.mtp, mine.aux, nonfinite_.own ? 1.0 : 0.0};
  sum_over_ranks(sums, comm_);
  last_.parts = {sums[0] / world_, sums[1] / world_, sums[2] / world_, sums[3] / world_};
  nonfinite_.last_skipped = false;
  if (sums[4] == 0) {
    if (!scaled) nonfinite_.in_row = 0;
    return false;
  }
  const std::string who = ranks_with(comm_, nonfinite_.own);
  const std::string what = fmt::format("step {}: inf or NaN in the loss or gradients of {}", step_ + 1, who);
  if (cfg_.health.nan == NanPolicy::stop) throw HealthError(what + " (health nan stop; `health nan skip` skips such steps)");
  if (++nonfinite_.in_row > cfg_.health.max_skips)
    throw HealthError(fmt::format("{}: {} non-finite steps in a row (health max_skips {})", what, nonfinite_.in_row,
                                  cfg_.health.max_skips));
  log_->console(fmt::format("{}: step skipped on every rank ({} in a row, at most {})", what, nonfinite_.in_row,
                            cfg_.health.max_skips));
  ++last_.nonfinite_skipped;
  return nonfinite_.last_skipped = true;
}

// health every N: one all-gather of every rank's health; a failure ends the
// job on every rank with the same message.
void Trainer::check_health_now() {
  ExecSpace().fence();
  const auto P = model_->params().extent(0);
  // A step skipped for an inf or NaN (health nan skip, or the loss scaler's
  // overflow) was already decided on every rank: not a failure here.
  const bool decided = nonfinite_.last_skipped || precision_->scaler();
  RankHealth mine;
  mine.finite_loss = decided || std::isfinite(last_.own_loss);
  mine.finite_grads = decided || !kernels::has_nonfinite(Vec<const float>(model_->grads().data(), P));
  mine.step = step_;
  mine.available_mb = available_memory_mb();
  mine.params_fingerprint = kernels::fingerprint(Vec<const float>(model_->params().data(), P));
  // Where the strategy says the ranks hold the same parameters, a rank that
  // does not is named (silent divergence).
  const Agreement agree = strategy_->agreement(step_);
  // (under ep each rank holds its own experts: no two need hold the same bits)
  // Fingerprints compare whole fp32 weights: not a rank's pieces of them, nor its expert share.
  // (under pipeline stages each rank holds its own stage's layers)
  const bool comparable = agree.params && !placement_.master_sharded() && placement_.experts().ep == 1 &&
                          placement_.stage().whole();
  const HealthVerdict verdict = check_health(comm_, mine, comparable);
  if (!verdict.failure.empty()) throw HealthError(fmt::format("step {}: health check failed: {}", step_, verdict.failure));
  log_->rank(verdict.summary);
}

// Stop signals: every rank looks at the step boundary, and one all-reduce
// makes a signal to any rank stop them all.
bool Trainer::stop_requested() {
  // With the signal, whether a background checkpoint write failed: its
  // writers fail on every rank alike, but the ranks see it at different steps.
  int mine[2] = {pending_stop_signal(), saver_->failed()};
  if (world_ > 1) max_over_ranks(mine, comm_);
  if (mine[1]) {
    finish_checkpoint();  // rethrows the writer's CheckpointWriteError
    throw CheckpointWriteError("a background checkpoint write failed on another rank");
  }
  stop_signal_ = mine[0];
  return mine[0] != 0;
}

void Trainer::stop_on_signal(double loss) {
  save_checkpoint(loss);  // a no-op when this step's checkpoint was just written
  finish_checkpoint();    // durably on disk before anyone exits
  ignore_stop_signals();  // the state is safe: a requeue's SIGTERM need not cut the exit short
  if (rank_ == 0) write_stop_marker(cfg_.output.dir, step_, stop_signal_, world_);  // a launcher's proof of it
  log_->console(fmt::format("stopped at step {} on {}; resume with -resume auto", step_, signal_name(stop_signal_)));
  const char* job = std::getenv("SLURM_JOB_ID");
  if (rank_ == 0 && cfg_.resilience.requeue && job) {
    const std::string command = fmt::format("scontrol requeue {}", job);
    const int rc = std::system(command.c_str());
    log_->console(fmt::format("preempt requeue: `{}` {}", command,
                              rc == 0 ? std::string("done") : fmt::format("failed (exit {})", rc)));
  }
}

// fault kill|hang|nan|signal|throw rank R step S: tests of the machinery above.
void Trainer::inject_fault(int64_t step) {
  const auto& f = cfg_.fault;
  // A resumed run injects nothing: the test that killed a run can resume the same deck.
  if (f.kind == FaultKind::off || resumed_ || f.step != step || f.rank != rank_) return;
  if (f.kind == FaultKind::detach) return;  // a standing fault: inject_gradient_fault set it up
  // The wall clock, so that an experiment can time how long the job takes to end after it.
  const double unix_s = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  log_->rank(fmt::format("fault {} injected at step {} (unix time {:.3f})", f.kind, step, unix_s));
  if (f.kind == FaultKind::kill) {
    std::raise(SIGKILL);
  } else if (f.kind == FaultKind::hang) {
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  } else if (f.kind == FaultKind::signal) {
    std::raise(SIGTERM);
  } else if (f.kind == FaultKind::throw_error) {
    throw std::runtime_error(fmt::format("fault throw injected at step {}", step));
  } else if (f.kind == FaultKind::nan) {  // in this step's backward, before the gradients are averaged
    inject_gradient_fault(step, rank_, std::numeric_limits<float>::quiet_NaN());
  }
}

}  // namespace xx

#include "train/schedule.h"
#include <algorithm>
#include <climits>
#include <cmath>
#include "core/rng.h"

namespace xx {

namespace {

constexpr uint64_t kJitterStream = 0x5c4ed;  // mix_seed purpose word of the restart jitter
constexpr int64_t kNever = INT64_MAX / 4;    // an offset past any step a run can reach

int64_t saturating_mul(int64_t a, int64_t b) { return a > kNever / b ? kNever : a * b; }

// sgdr cycle boundaries for M > 1, in post-warmup steps: B_0 = 0,
// B_{c+1} = round(P * (1 + M + ... + M^c)). Each call walks the same
// sequence of double operations, so offset() and cycle_at() agree exactly.
struct Boundaries {
  double period, mult, sum = 0, power = 1;
  int64_t next() {  // the boundary after the current one
    sum += power;
    power *= mult;
    const double b = period * sum;
    return b >= double(kNever) ? kNever : std::llround(b);
  }
};

}  // namespace

Schedule::Schedule(const OptimizerConfig& opt, const ScheduleConfig& cfg, uint64_t seed)
    : opt_(opt), cfg_(cfg), stream_(mix_seed(seed, kJitterStream)) {}

int64_t Schedule::offset(int c) const {
  if (c <= 0) return 0;
  if (cfg_.kind == ScheduleKind::step) return saturating_mul(cfg_.every, c);
  if (cfg_.mult == 1.0) return saturating_mul(cfg_.period, c);
  Boundaries b{double(cfg_.period), cfg_.mult};
  int64_t out = 0;
  for (int k = 0; k < c && out < kNever; ++k) out = b.next();
  return out;
}

int Schedule::cycle_at(int64_t s) const {
  int64_t c = 0;
  if (cfg_.kind == ScheduleKind::step) c = s / cfg_.every;
  else if (cfg_.mult == 1.0) c = s / cfg_.period;
  else
    for (Boundaries b{double(cfg_.period), cfg_.mult}; b.next() <= s && c < INT_MAX;) ++c;
  return int(std::min<int64_t>(c, INT_MAX));
}

double Schedule::lr(int64_t step) const {
  const ScheduleConfig& schedule = cfg_;
  const OptimizerConfig& opt = opt_;
  if (schedule.warmup > 0 && step <= schedule.warmup) return opt.lr * double(step) / double(schedule.warmup);
  if (schedule.kind == ScheduleKind::sgdr) {
    const int64_t s = std::max<int64_t>(step - schedule.warmup - 1, 0);
    const int c = cycle_at(s);
    const int64_t start = offset(c), length = offset(c + 1) - start;
    const double progress = length > 1 ? double(s - start) / double(length - 1) : 0.0;
    const double peak = opt.lr * jitter_factor(c);
    return schedule.min_lr + 0.5 * (peak - schedule.min_lr) * (1.0 + std::cos(M_PI * progress));
  }
  if (schedule.kind == ScheduleKind::step) {
    const int level = cycle_at(std::max<int64_t>(step - schedule.warmup - 1, 0));
    return opt.lr * std::pow(schedule.factor, double(level)) * jitter_factor(level);
  }
  // cosine, exactly as before warm restarts existed (loss curves are compared against it)
  const int64_t span = schedule.total - schedule.warmup;
  if (span <= 0) return opt.lr;
  const double progress = std::clamp(double(step - schedule.warmup) / double(span), 0.0, 1.0);
  return schedule.min_lr + 0.5 * (opt.lr - schedule.min_lr) * (1.0 + std::cos(M_PI * progress));
}

int Schedule::cycle(int64_t step) const {
  if (cfg_.kind != ScheduleKind::sgdr && cfg_.kind != ScheduleKind::step) return 0;
  if (step <= cfg_.warmup) return 0;
  return cycle_at(step - cfg_.warmup - 1);
}

bool Schedule::is_restart(int64_t step) const {
  if (cfg_.kind != ScheduleKind::sgdr) return false;
  const int c = cycle(step);
  return c > 0 && step == cycle_start(c);
}

int64_t Schedule::cycle_start(int c) const {
  if (c <= 0 || (cfg_.kind != ScheduleKind::sgdr && cfg_.kind != ScheduleKind::step)) return 1;
  return cfg_.warmup + 1 + offset(c);
}

double Schedule::jitter_factor(int c) const {
  if (c <= 0 || cfg_.jitter <= 0) return 1.0;
  return 1.0 + cfg_.jitter * (2.0 * uniform01(stream_, uint64_t(c)) - 1.0);
}

bool Schedule::restart_from_best() const { return cfg_.kind == ScheduleKind::sgdr && cfg_.restart_from == RestartFrom::best; }

}  // namespace xx

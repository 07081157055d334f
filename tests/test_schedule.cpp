// Learning-rate schedules (src/train/schedule.h): cosine as it always was,
// sgdr restarts with period multiplication, step decay, seeded jitter, and
// the deck lines that set them.
#include <catch2/catch.hpp>
#include <algorithm>
#include <climits>
#include <cmath>
#include <stdexcept>
#include "mode_words.h"
#include "core/error.h"
#include "deck/deck.h"
#include "temp_dir.h"
#include "train/optimizer.h"
#include "train/schedule.h"

using namespace xx;
using xx::test::TempDir;

namespace {

OptimizerConfig with_lr(double lr) {
  OptimizerConfig o;
  o.lr = lr;
  return o;
}

ScheduleConfig sgdr(int64_t period, double mult, double min_lr, int64_t warmup, double jitter = 0) {
  ScheduleConfig s;
  s.kind = ScheduleKind::sgdr;
  s.period = period;
  s.mult = mult;
  s.min_lr = min_lr;
  s.warmup = warmup;
  s.jitter = jitter;
  return s;
}

ScheduleConfig step_decay(int64_t every, double factor, int64_t warmup, double jitter = 0) {
  ScheduleConfig s;
  s.kind = ScheduleKind::step;
  s.every = every;
  s.factor = factor;
  s.warmup = warmup;
  s.jitter = jitter;
  return s;
}

// The cosine schedule as the trainer computed it before warm restarts existed.
double old_cosine(const OptimizerConfig& opt, const ScheduleConfig& schedule, int64_t step) {
  if (schedule.warmup > 0 && step <= schedule.warmup) return opt.lr * double(step) / double(schedule.warmup);
  const int64_t span = schedule.total - schedule.warmup;
  if (span <= 0) return opt.lr;
  const double progress = std::clamp(double(step - schedule.warmup) / double(span), 0.0, 1.0);
  return schedule.min_lr + 0.5 * (opt.lr - schedule.min_lr) * (1.0 + std::cos(M_PI * progress));
}

// The smallest deck that builds, plus `schedule_line`.
Program build(const TempDir& t, const std::string& schedule_line) {
  return build_program(read_deck(t.write("test.deck", "model dense vocab 256 dim 16 layers 1 heads 2 ffn 32 seq 8\n"
                                                      "data bytes corpus.txt\n" +
                                                          schedule_line + "\nrun 100\n"),
                                 {}),
                       false);
}

std::string error_of(const TempDir& t, const std::string& schedule_line) {
  try {
    build(t, schedule_line);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("schedule: cosine is bit-identical to the original formula", "[schedule]") {
  const OptimizerConfig opt = with_lr(1e-3);
  ScheduleConfig s;  // cosine
  s.warmup = 10;
  s.min_lr = 1e-4;
  s.total = 110;
  const Schedule sched(opt, s, 1234);
  // Hand-computed: warmup 1e-3 * 3/10; halfway through the decay the cosine
  // term is 1 (cos(pi/2) ~ 6e-17), so 1e-4 + 0.5 * 9e-4; at total: min_lr.
  CHECK(sched.lr(3) == Approx(3e-4).epsilon(1e-15));
  CHECK(sched.lr(10) == 1e-3);
  CHECK(sched.lr(60) == Approx(5.5e-4).epsilon(1e-14));
  CHECK(sched.lr(110) == 1e-4);
  CHECK(sched.lr(500) == 1e-4);
  CHECK(sched.lr(60) == 1e-4 + 0.5 * (1e-3 - 1e-4) * (1.0 + std::cos(M_PI * 0.5)));

  // Bit for bit against the original code, over several configurations.
  for (int64_t warmup : {0, 1, 7, 300})
    for (int64_t total : {0, 50, 300, 1000})
      for (double min_lr : {0.0, 3e-5}) {
        ScheduleConfig c;
        c.warmup = warmup, c.total = total, c.min_lr = min_lr;
        c.period = 3, c.jitter = 0.5;  // leftovers of other kinds change nothing
        const Schedule x(opt, c, 99);
        for (int64_t step = 1; step <= 1100; ++step) {
          REQUIRE(x.lr(step) == old_cosine(opt, c, step));
          REQUIRE(Schedule(opt, c, 7).lr(step) == old_cosine(opt, c, step));
          REQUIRE(!x.is_restart(step));
          REQUIRE(x.cycle(step) == 0);
        }
      }
}

TEST_CASE("schedule: sgdr restarts after P, P*M, P*M^2 ... steps", "[schedule]") {
  const OptimizerConfig opt = with_lr(2e-3);
  const int64_t W = 5;
  const Schedule s(opt, sgdr(10, 2, 1e-4, W), 7);
  // P=10, M=2: restarts 10, 30, 70, 150 steps after the warmup.
  const std::vector<int64_t> restarts = {W + 10 + 1, W + 30 + 1, W + 70 + 1, W + 150 + 1};
  std::vector<int64_t> seen;
  for (int64_t step = 1; step <= 300; ++step)
    if (s.is_restart(step)) seen.push_back(step);
  CHECK(seen == restarts);
  for (int c = 1; c <= 4; ++c) CHECK(s.cycle_start(c) == restarts[c - 1]);
  CHECK(s.cycle_start(0) == 1);

  // Warmup: linear up to the peak at step W; cycle 0 starts at the peak.
  CHECK(s.lr(1) == Approx(2e-3 / 5));
  CHECK(s.lr(W) == 2e-3);
  CHECK(s.lr(W + 1) == 2e-3);
  CHECK(s.cycle(1) == 0);
  CHECK(s.cycle(W + 10) == 0);

  for (int c = 0; c < 4; ++c) {
    const int64_t first = c == 0 ? W + 1 : s.cycle_start(c), last = s.cycle_start(c + 1) - 1;
    INFO("cycle " << c << " steps " << first << ".." << last);
    CHECK(s.cycle(first) == c);
    CHECK(s.cycle(last) == c);
    CHECK(s.cycle(last + 1) == c + 1);
    CHECK(s.lr(first) == 2e-3);  // the peak (no jitter)
    CHECK(s.lr(last) == 1e-4);   // min_lr, exactly, at the end of every cycle
    CHECK(last - first + 1 == 10 << c);
    for (int64_t step = first; step < last; ++step) REQUIRE(s.lr(step + 1) < s.lr(step));  // decreasing
    // halfway through (odd length: the middle step) the cosine is at the mean
    if ((last - first) % 2 == 0) CHECK(s.lr((first + last) / 2) == Approx(0.5 * (2e-3 + 1e-4)));
  }
}

TEST_CASE("schedule: sgdr edge cases", "[schedule]") {
  const OptimizerConfig opt = with_lr(1.0);
  SECTION("no warmup, M = 1: a restart every P steps") {
    const Schedule s(opt, sgdr(4, 1, 0.0, 0), 1);
    for (int64_t step = 1; step <= 40; ++step) {
      REQUIRE(s.is_restart(step) == (step > 1 && (step - 1) % 4 == 0));
      REQUIRE(s.cycle(step) == int((step - 1) / 4));
    }
    CHECK(s.lr(1) == 1.0);
    CHECK(s.lr(4) == 0.0);
    CHECK(s.lr(5) == 1.0);
    CHECK(s.lr(2) == Approx(0.75));  // (1 + cos(pi/3)) / 2
  }
  SECTION("P = 1: every step is at the peak") {
    const Schedule s(opt, sgdr(1, 1, 0.1, 0), 1);
    for (int64_t step = 1; step <= 10; ++step) CHECK(s.lr(step) == 1.0);
    CHECK(!s.is_restart(1));
    CHECK(s.is_restart(2));
  }
  SECTION("a real M: rounded boundaries of P (1 + M + M^2 ...)") {
    const Schedule s(opt, sgdr(4, 1.5, 0.0, 0), 1);
    // 4, 4 * 2.5 = 10, 4 * 4.75 = 19, 4 * 8.125 = 32.5 -> 33
    CHECK(s.cycle_start(1) == 5);
    CHECK(s.cycle_start(2) == 11);
    CHECK(s.cycle_start(3) == 20);
    CHECK(s.cycle_start(4) == 34);
    for (int64_t step = 1; step <= 2000; ++step) {
      const int c = s.cycle(step);
      REQUIRE(s.cycle_start(c) <= step);
      REQUIRE(step < s.cycle_start(c + 1));
      REQUIRE(s.is_restart(step) == (c > 0 && step == s.cycle_start(c)));
    }
  }
  SECTION("far-away steps are cheap and finite") {
    const Schedule one(opt, sgdr(1, 1, 0.0, 0), 1);
    CHECK(one.cycle(int64_t(1) << 40) == INT_MAX);  // saturates rather than overflows
    const Schedule grow(opt, sgdr(100, 1.001, 0.01, 10), 1);
    const double v = grow.lr(int64_t(1) << 40);
    CHECK(v >= 0.01);
    CHECK(v <= 1.0);
  }
}

TEST_CASE("schedule: step decay", "[schedule]") {
  const OptimizerConfig opt = with_lr(1.0);
  const Schedule s(opt, step_decay(3, 0.5, 2), 1);
  const std::vector<double> expected = {0.5, 1, 1, 1, 1, 0.5, 0.5, 0.5, 0.25, 0.25, 0.25, 0.125};
  for (size_t i = 0; i < expected.size(); ++i) {
    INFO("step " << i + 1);
    CHECK(s.lr(int64_t(i) + 1) == expected[i]);
  }
  CHECK(s.cycle(5) == 0);
  CHECK(s.cycle(6) == 1);
  CHECK(s.cycle_start(1) == 6);
  CHECK(s.cycle_start(2) == 9);
  for (int64_t step = 1; step <= 100; ++step) REQUIRE(!s.is_restart(step));  // the LR never goes back up
  CHECK(s.lr(2 + 3 * 10 + 1) == std::pow(0.5, 10));

  const Schedule none(opt, step_decay(1, 1.0, 0), 1);  // factor 1: constant
  CHECK(none.lr(1000) == 1.0);
}

TEST_CASE("schedule: jitter is seeded, bounded and replays", "[schedule]") {
  const OptimizerConfig opt = with_lr(1e-3);
  const double J = 0.2;
  const Schedule a(opt, sgdr(10, 1, 1e-5, 0, J), 42), again(opt, sgdr(10, 1, 1e-5, 0, J), 42),
      other(opt, sgdr(10, 1, 1e-5, 0, J), 43);
  CHECK(a.jitter_factor(0) == 1.0);  // the first cycle starts at the optimizer's lr
  double lo = 2, hi = 0;
  int differ = 0;
  for (int c = 1; c <= 200; ++c) {
    const double f = a.jitter_factor(c);
    REQUIRE(f >= 1 - J);
    REQUIRE(f <= 1 + J);
    REQUIRE(f == again.jitter_factor(c));
    differ += f != other.jitter_factor(c);
    lo = std::min(lo, f), hi = std::max(hi, f);
  }
  CHECK(differ >= 195);
  CHECK(lo < 1 - 0.8 * J);  // the draws spread over the range
  CHECK(hi > 1 + 0.8 * J);

  // At each restart the LR is the jittered peak; the cycle still ends at min_lr.
  for (int c = 1; c <= 5; ++c) {
    CHECK(a.lr(a.cycle_start(c)) == Approx(1e-3 * a.jitter_factor(c)).epsilon(1e-14));
    CHECK(a.lr(a.cycle_start(c + 1) - 1) == 1e-5);
  }
  // Replay: another Schedule with the same seed, asked in reverse order (as
  // after a resume at step N), gives the same bits; another seed does not.
  int changed = 0;
  for (int64_t step = 300; step >= 1; --step) {
    REQUIRE(again.lr(step) == a.lr(step));
    changed += other.lr(step) != a.lr(step);
  }
  CHECK(changed > 250);

  // step decay: each level's value times its own factor
  const Schedule d(opt, step_decay(5, 0.5, 0, J), 42);
  for (int level = 0; level < 6; ++level) {
    const double f = d.jitter_factor(level);
    CHECK(d.lr(1 + 5 * level) == Approx(1e-3 * std::pow(0.5, level) * f).epsilon(1e-14));
    CHECK(f >= 1 - J);
    CHECK(f <= 1 + J);
  }
  CHECK(d.jitter_factor(0) == 1.0);
}

TEST_CASE("schedule: deck lines for sgdr and step", "[schedule][deck]") {
  TempDir t;
  SECTION("sgdr with every keyword") {
    const auto p = build(t, "schedule sgdr period 10 mult 2 min_lr 1e-5 warmup 20 jitter 0.1 restart_from best");
    const ScheduleConfig& s = p.phases[0].config.schedule;
    CHECK(s.kind == "sgdr");
    CHECK(s.period == 10);
    CHECK(s.mult == 2.0);
    CHECK(s.min_lr == 1e-5);
    CHECK(s.warmup == 20);
    CHECK(s.jitter == 0.1);
    CHECK(s.restart_from == RestartFrom::best);
    CHECK(Schedule(p.phases[0].config.optimizer, s, p.phases[0].config.seed).restart_from_best());
  }
  SECTION("sgdr defaults") {
    const auto p = build(t, "schedule sgdr period 7");
    const ScheduleConfig& s = p.phases[0].config.schedule;
    CHECK(s.period == 7);
    CHECK(s.mult == 1.0);
    CHECK(s.jitter == 0.0);
    CHECK(s.restart_from == RestartFrom::last);
    CHECK(!Schedule(p.phases[0].config.optimizer, s, 1).restart_from_best());
  }
  SECTION("step") {
    const auto p = build(t, "schedule step every 30 factor 0.5 jitter 0.05 warmup 4");
    const ScheduleConfig& s = p.phases[0].config.schedule;
    CHECK(s.kind == "step");
    CHECK(s.every == 30);
    CHECK(s.factor == 0.5);
    CHECK(s.jitter == 0.05);
    CHECK(s.warmup == 4);
    CHECK(error_of(t, "schedule step every 1 factor 1") == "");
  }
  SECTION("errors name the file, the line, the key and what was expected") {
    const std::string at = (t.dir / "test.deck").string() + ":3: ";
    auto check = [&](const std::string& line, const std::string& what) {
      const std::string msg = error_of(t, line);
      INFO(msg);
      CHECK_THAT(msg, Catch::StartsWith(at + what));
    };
    check("schedule sgdr mult 2", "'schedule sgdr' is missing keyword 'period' (expected schedule cosine");
    check("schedule sgdr period 0", "value 0 for 'period' is out of range (expected >= 1)");
    check("schedule sgdr period 2.5", "bad value '2.5' for 'period' (expected an integer)");
    check("schedule sgdr period 10 mult 0.5", "value 0.5 for 'mult' is out of range (expected >= 1)");
    check("schedule sgdr period 10 jitter 1", "value 1 for 'jitter' is out of range (expected in [0, 1))");
    check("schedule sgdr period 10 jitter -0.1", "value -0.1 for 'jitter' is out of range (expected in [0, 1))");
    check("schedule sgdr period 10 restart_from first",
          "bad value 'first' for 'restart_from' (expected one of: last, best)");
    check("schedule sgdr period 10 total 100", "unknown keyword 'total' for 'schedule sgdr' (expected one of: period,");
    check("schedule sgdr period 10 restart best", "unknown keyword 'restart' for 'schedule sgdr'");
    check("schedule step every 10", "'schedule step' is missing keyword 'factor'");
    check("schedule step factor 0.5", "'schedule step' is missing keyword 'every'");
    check("schedule step every 0 factor 0.5", "value 0 for 'every' is out of range (expected >= 1)");
    check("schedule step every 10 factor 0", "value 0 for 'factor' is out of range (expected in (0, 1])");
    check("schedule step every 10 factor 1.5", "value 1.5 for 'factor' is out of range (expected in (0, 1])");
    check("schedule step every 10 factor 0.5 min_lr 0", "unknown keyword 'min_lr' for 'schedule step'");
    check("schedule sgd period 10",
          "unknown kind 'sgd' for 'schedule' (expected one of: cosine, sgdr, step) (did you mean 'sgdr'?)");
  }
  SECTION("phases: a later schedule line switches kind; keywords not given keep their value") {
    const auto p = build_program(
        read_deck(t.write("test.deck", "model dense vocab 256 dim 16 layers 1 heads 2 ffn 32 seq 8\n"
                                       "data bytes corpus.txt\n"
                                       "schedule cosine warmup 10 min_lr 1e-5\nrun 100\n"
                                       "schedule sgdr period 50\nrun 100\n"),
                  {}),
        false);
    REQUIRE(p.phases.size() == 2);
    CHECK(p.phases[0].config.schedule.kind == ScheduleKind::cosine);
    CHECK(p.phases[1].config.schedule.kind == ScheduleKind::sgdr);
    CHECK(p.phases[1].config.schedule.warmup == 10);
    CHECK(p.phases[1].config.schedule.min_lr == 1e-5);
  }
}

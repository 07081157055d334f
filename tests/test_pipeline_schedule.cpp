// Pipeline schedules (src/core/pipeline_schedule.h) and the stage cut
// (core/placement.h, StageCut): each table runs every pass once, in an order
// the neighbouring stages can follow, with the theory's bubble and the
// activations each schedule keeps.
#include <catch2/catch.hpp>
#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>
#include "core/placement.h"
#include "model/estimate.h"
#include "train/pipeline.h"
#include "core/pipeline_schedule.h"

using namespace xx;

TEST_CASE("gpipe and 1f1b: every pass once, backwards in micro-batch order, the theory's bubble", "[pipeline]") {
  for (const PipelineSchedule s : {PipelineSchedule::gpipe, PipelineSchedule::one_f_one_b})
    for (int P = 1; P <= 4; ++P)
      for (int M = 1; M <= 8; ++M) {
        if (s == PipelineSchedule::one_f_one_b && M < P) continue;  // the deck refuses it
        INFO("schedule " << int(s) << " P " << P << " M " << M);
        for (int st = 0; st < P; ++st) {
          const auto order = stage_order(s, P, M, st);
          REQUIRE(order.size() == size_t(2 * M));
          std::vector<int> f, b;
          for (const PipeOp& op : order) (op.kind == PipeOp::forward ? f : b).push_back(op.micro);
          std::vector<int> all(static_cast<size_t>(M));
          for (int m = 0; m < M; ++m) all[size_t(m)] = m;
          CHECK(f == all);
          CHECK(b == all);  // the gradients add up in the order of an unsplit loop over micro-batches
          for (int m = 0; m < M; ++m) {
            auto at = [&](PipeOp::Kind k) {
              return std::find(order.begin(), order.end(), PipeOp{k, m}) - order.begin();
            };
            CHECK(at(PipeOp::forward) < at(PipeOp::backward));
          }
        }
        const PipelineTimeline t = simulate(s, P, M);
        REQUIRE(t.complete);
        CHECK(t.makespan == Approx(2.0 * (M + P - 1)));
        for (int st = 0; st < P; ++st) {
          CHECK(t.bubble[size_t(st)] == Approx(theory_bubble(s, P, M)).margin(1e-12));
          CHECK(t.max_in_flight[size_t(st)] == (s == PipelineSchedule::gpipe ? M : std::min(P - st, M)));
          // the sets of activations a stage builds, counted from its table, as the plan counts them
          CHECK(most_in_flight(stage_order(s, P, M, st)) == t.max_in_flight[size_t(st)]);
          if (P > 1) CHECK(PipelinePlan{P, s, M}.in_flight(st) == t.max_in_flight[size_t(st)]);
        }
      }
  CHECK(theory_bubble(PipelineSchedule::one_f_one_b, 4, 8) == Approx(3.0 / 11.0));
  CHECK_THROWS_AS(stage_order(PipelineSchedule::gpipe, 2, 4, 2), std::invalid_argument);
  CHECK_THROWS_AS(stage_order(PipelineSchedule::gpipe, 2, 4, 0, 2), std::invalid_argument);  // chunks: not gpipe's
}

// The chunked schedules: each run's passes once, forwards and backwards in
// micro-batch order (the unsplit model's sums), a table every stage can
// follow with blocking receives, and the simulated bubble beside the theory.
TEST_CASE("interleaved and dualpipev: each run's passes once in micro order, followable, their bubbles",
          "[pipeline]") {
  struct Case { PipelineSchedule s; int P, V, M; };
  std::vector<Case> cases;
  for (int P = 2; P <= 4; ++P) {
    for (int V = 2; V <= 3; ++V)
      for (int M = P; M <= 3 * P; M += P) cases.push_back({PipelineSchedule::interleaved, P, V, M});
    for (int M = 2 * P; M <= 2 * P + 5; ++M) cases.push_back({PipelineSchedule::dualpipev, P, 2, M});
  }
  for (const Case& c : cases) {
    INFO("schedule " << int(c.s) << " P " << c.P << " V " << c.V << " M " << c.M);
    for (int st = 0; st < c.P; ++st) {
      const auto order = stage_order(c.s, c.P, c.M, st, c.V);
      REQUIRE(order.size() == size_t(2 * c.M * c.V));
      for (int r = 0; r < c.V; ++r) {
        std::vector<int> f, b, all;
        for (const PipeOp& op : order)
          if (op.run == r) (op.kind == PipeOp::forward ? f : b).push_back(op.micro);
        for (int m = 0; m < c.M; ++m) all.push_back(m);
        CHECK(f == all);
        CHECK(b == all);
        CHECK(most_in_flight(order, r) >= 1);
      }
    }
    const PipelineTimeline t = simulate(c.s, c.P, c.M, c.V);
    REQUIRE(t.complete);
    // busy 2 M V per stage: the makespan and bubble agree
    for (int st = 0; st < c.P; ++st) {
      CHECK(t.bubble[size_t(st)] == Approx(1 - 2.0 * c.M * c.V / t.makespan).margin(1e-12));
      // the chunked tables idle less than 1f1b with the same stages and micro-batches
      CHECK(t.bubble[size_t(st)] < theory_bubble(PipelineSchedule::one_f_one_b, c.P, c.M) + 1e-12);
    }
    // Both tables idle (P - 1)(F + B) with equal passes: Megatron's V-fold
    // smaller bubble for interleaved; for dualpipev less than DeepSeek's
    // (P - 1)(F&B + B) for a whole backward without overlap (theory_bubble)
    CHECK(t.makespan == Approx(2.0 * (c.V * c.M + c.P - 1)));
    if (c.s == PipelineSchedule::interleaved) CHECK(t.bubble[0] == Approx(theory_bubble(c.s, c.P, c.M, c.V)));
    else CHECK(t.bubble[0] < theory_bubble(c.s, c.P, c.M, c.V));
    // dualpipev's F&B steps: a forward, then a backward of the other run; M - 2P + s + 1 pairs of each
    // kind (F0 B1, F1 B0) and P - s - 1 more F1 B0. Started together (overlap), with nothing hidden,
    // each stage idles exactly DeepSeek's (P - 1)(F&B + B) with F&B = F + B: its stated bubble.
    for (int st = 0; st < c.P; ++st) {
      const auto order = stage_order(c.s, c.P, c.M, st, c.V);
      int pairs[2] = {0, 0};
      for (size_t i = 0; i < order.size(); ++i) {
        if (!order[i].paired) continue;
        REQUIRE(c.s == PipelineSchedule::dualpipev);
        REQUIRE(i + 1 < order.size());
        CHECK(order[i].kind == PipeOp::forward);
        CHECK(order[i + 1].kind == PipeOp::backward);
        CHECK(order[i + 1].run == 1 - order[i].run);
        CHECK(!order[i + 1].paired);
        ++pairs[order[i].run];
      }
      if (c.s != PipelineSchedule::dualpipev) continue;
      CHECK(pairs[0] == c.M - 2 * c.P + st + 1);
      CHECK(pairs[1] == c.M - 2 * c.P + st + 1 + c.P - st - 1);
    }
    if (c.s == PipelineSchedule::dualpipev) {
      const PipelineTimeline paired = simulate(c.s, c.P, c.M, c.V, 1, 1, true);
      REQUIRE(paired.complete);
      for (int st = 0; st < c.P; ++st) CHECK(paired.bubble[size_t(st)] == Approx(theory_bubble(c.s, c.P, c.M, c.V)));
    }
  }
  CHECK_THROWS_AS(stage_order(PipelineSchedule::interleaved, 2, 3, 0, 2), std::invalid_argument);  // M not a multiple of P
  CHECK_THROWS_AS(stage_order(PipelineSchedule::dualpipev, 2, 3, 0, 2), std::invalid_argument);   // M < 2P
  CHECK_THROWS_AS(stage_order(PipelineSchedule::dualpipev, 2, 4, 0, 3), std::invalid_argument);   // a V is two runs
}

TEST_CASE("the stage cut: consecutive replicas per stage, L / P consecutive layers per stage", "[pipeline]") {
  const StageCut c = stage_cut(8, 5, 4, 8);  // P 4 x dp 2
  CHECK(c.stages == 4);
  CHECK(c.replicas == 2);
  CHECK(c.stage == 2);
  CHECK(c.replica == 1);
  REQUIRE(c.runs.size() == 1);
  CHECK(c.runs[0].chunk == 2);
  CHECK(c.runs[0].begin == 4);
  CHECK(c.runs[0].end == 6);
  CHECK(c.holders == std::vector<int>{0, 1, 2, 3});
  CHECK(!c.first());
  CHECK(!c.last());
  CHECK(c.rank_of(2, 1) == 5);
  CHECK(stage_cut(4, 3, 4, 4).last());
  CHECK(stage_cut(1, 0, 1, 3).runs[0].end == 3);
  CHECK_THROWS_AS(stage_cut(6, 0, 4, 8), std::invalid_argument);  // 4 stages do not fill 6 ranks
  CHECK_THROWS_AS(stage_cut(4, 0, 4, 6), std::invalid_argument);  // nor cut 6 layers
  // a cut of its own: each stage's blocks
  const StageCut uneven = stage_cut(4, 3, 2, 5, {3, 2});  // P 2 x dp 2: rank 3 on stage 1, replica 1
  CHECK(uneven.stage == 1);
  CHECK(uneven.replica == 1);
  CHECK(uneven.runs[0].begin == 3);
  CHECK(uneven.runs[0].end == 5);
  CHECK(stage_cut(2, 0, 2, 5, {3, 2}).runs[0].end == 3);
  CHECK_THROWS_AS(stage_cut(2, 0, 2, 5, {3, 1}), std::invalid_argument);     // 4 blocks of 5 layers
  CHECK_THROWS_AS(stage_cut(2, 0, 2, 5, {5, 0}), std::invalid_argument);     // a stage without one
  CHECK_THROWS_AS(stage_cut(2, 0, 2, 5, {1, 2, 2}), std::invalid_argument);  // 3 stages named
}

// Virtual stages: interleaved puts chunks s, s + P, ... on stage s; the
// V-shape chunks s and 2P - 1 - s, so that stage 0 holds both ends.
TEST_CASE("the stage cut with virtual stages: interleaved and V-shaped runs of layers", "[pipeline]") {
  const StageCut i = stage_cut(3, 1, 3, 12, {}, 2);  // P 3 x V 2: chunks of 2 blocks
  CHECK(i.chunks == 6);
  REQUIRE(i.runs.size() == 2);
  CHECK(i.runs[0].chunk == 1);
  CHECK(i.runs[0].begin == 2);
  CHECK(i.runs[0].end == 4);
  CHECK(i.runs[1].chunk == 4);
  CHECK(i.runs[1].begin == 8);
  CHECK(i.runs[1].end == 10);
  CHECK(i.holders == std::vector<int>{0, 1, 2, 0, 1, 2});
  CHECK(!i.first());
  CHECK(!i.last());
  CHECK(i.holds_layer(3));
  CHECK(!i.holds_layer(4));
  CHECK(i.holds_layer(9));
  CHECK(stage_cut(3, 2, 3, 12, {}, 2).last());
  const StageCut v0 = stage_cut(2, 0, 2, 8, {}, 2, true);  // P 2, V-shape: stage 0 holds chunks 0 and 3
  CHECK(v0.first());
  CHECK(v0.last());
  CHECK(v0.runs[1].chunk == 3);
  CHECK(v0.runs[1].begin == 6);
  CHECK(v0.holders == std::vector<int>{0, 1, 1, 0});
  const StageCut v1 = stage_cut(2, 1, 2, 8, {1, 2, 3, 2}, 2, true);  // a cut of its own, per chunk
  CHECK(!v1.first());
  CHECK(!v1.last());
  CHECK(v1.runs[0].begin == 1);
  CHECK(v1.runs[0].end == 3);
  CHECK(v1.runs[1].begin == 3);
  CHECK(v1.runs[1].end == 6);
  CHECK_THROWS_AS(stage_cut(2, 0, 2, 6, {}, 2), std::invalid_argument);        // 4 chunks do not cut 6 layers
  CHECK_THROWS_AS(stage_cut(2, 0, 2, 12, {}, 3, true), std::invalid_argument);  // a V has two arms
  CHECK_THROWS_AS(stage_cut(2, 0, 2, 8, {4, 4}, 2), std::invalid_argument);     // a count per chunk
}

// Which set of activations holds a micro-batch: the lowest free one, freed by
// its backward; under 1f1b's table min(P - s, M) sets never run out.
TEST_CASE("activation sets: a free set per forward, freed by its backward", "[pipeline]") {
  ActivationSets sets(2);
  CHECK(sets.take(0) == 0);
  CHECK(sets.take(1) == 1);
  CHECK_THROWS_AS(sets.take(2), std::logic_error);  // both held
  CHECK(sets.release(0) == 0);
  CHECK_THROWS_AS(sets.release(0), std::logic_error);  // its set was freed
  CHECK(sets.take(2) == 0);
  CHECK(sets.release(1) == 1);
  CHECK(sets.release(2) == 0);
  for (const PipelineSchedule s : {PipelineSchedule::gpipe, PipelineSchedule::one_f_one_b})
    for (int P = 2; P <= 4; ++P)
      for (int st = 0; st < P; ++st) {
        const auto order = stage_order(s, P, 8, st);
        ActivationSets run(most_in_flight(order));
        for (const PipeOp& op : order)
          CHECK_NOTHROW(op.kind == PipeOp::forward ? run.take(op.micro) : run.release(op.micro));
      }
}

// dualpipev's overlap (train/pass_pair.h): two passes, one running at a
// time, handing over at each wait; the order of their steps follows from
// the passes alone, a pass that ends lets the other run on, and a failure
// in either comes back from run().
TEST_CASE("a pass pair: two passes in turn at their hand-overs, in one order, failures returned", "[pipeline]") {
  PassPair pair;
  std::vector<std::string> steps;
  auto pass = [&](const std::string& name, int waits) {
    return [&steps, &pair, name, waits] {
      for (int i = 0; i <= waits; ++i) {
        steps.push_back(name + std::to_string(i));
        if (i < waits) pair.hand_over();
      }
    };
  };
  for (int again = 0; again < 3; ++again) {  // the same order every time
    steps.clear();
    pair.run(pass("F", 3), pass("B", 1));
    CHECK(steps == std::vector<std::string>{"F0", "B0", "F1", "B1", "F2", "F3"});
  }
  steps.clear();
  pair.run(pass("F", 0), pass("B", 2));  // the first ends at once: the second runs alone
  CHECK(steps == std::vector<std::string>{"F0", "B0", "B1", "B2"});
  const int64_t before = pair.hand_overs();
  pair.hand_over();  // outside a pair: nothing
  CHECK(pair.hand_overs() == before);
  steps.clear();
  auto failing = [&] {
    steps.push_back("F0");
    pair.hand_over();
    throw std::runtime_error("forward failed");
  };
  CHECK_THROWS_WITH(pair.run(failing, pass("B", 2)), "forward failed");
  CHECK(steps == std::vector<std::string>{"F0", "B0", "B1", "B2"});  // the other pass ran to its end
  CHECK_THROWS_WITH(pair.run(pass("F", 1), [] { throw std::runtime_error("backward failed"); }), "backward failed");
}

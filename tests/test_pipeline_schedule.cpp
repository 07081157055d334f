// Pipeline schedules (src/train/pipeline_schedule.h) and the stage cut
// (core/placement.h, StageCut): each table runs every pass once, in an order
// the neighbouring stages can follow, with the theory's bubble and the
// activations each schedule keeps.
#include <catch2/catch.hpp>
#include <algorithm>
#include <stdexcept>
#include "core/placement.h"
#include "model/estimate.h"
#include "train/pipeline.h"
#include "train/pipeline_schedule.h"

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
  CHECK_THROWS_AS(stage_order(PipelineSchedule::interleaved, 2, 4, 0), std::invalid_argument);
  CHECK_THROWS_AS(stage_order(PipelineSchedule::gpipe, 2, 4, 2), std::invalid_argument);
}

TEST_CASE("the stage cut: consecutive replicas per stage, L / P consecutive layers per stage", "[pipeline]") {
  const StageCut c = stage_cut(8, 5, 4, 8);  // P 4 x dp 2
  CHECK(c.stages == 4);
  CHECK(c.replicas == 2);
  CHECK(c.stage == 2);
  CHECK(c.replica == 1);
  CHECK(c.layer_begin == 4);
  CHECK(c.layer_end == 6);
  CHECK(!c.first());
  CHECK(!c.last());
  CHECK(c.rank_of(2, 1) == 5);
  CHECK(stage_cut(4, 3, 4, 4).last());
  CHECK(stage_cut(1, 0, 1, 3).layer_end == 3);
  CHECK_THROWS_AS(stage_cut(6, 0, 4, 8), std::invalid_argument);  // 4 stages do not fill 6 ranks
  CHECK_THROWS_AS(stage_cut(4, 0, 4, 6), std::invalid_argument);  // nor cut 6 layers
  // a cut of its own: each stage's blocks
  const StageCut uneven = stage_cut(4, 3, 2, 5, {3, 2});  // P 2 x dp 2: rank 3 on stage 1, replica 1
  CHECK(uneven.stage == 1);
  CHECK(uneven.replica == 1);
  CHECK(uneven.layer_begin == 3);
  CHECK(uneven.layer_end == 5);
  CHECK(stage_cut(2, 0, 2, 5, {3, 2}).layer_end == 3);
  CHECK_THROWS_AS(stage_cut(2, 0, 2, 5, {3, 1}), std::invalid_argument);     // 4 blocks of 5 layers
  CHECK_THROWS_AS(stage_cut(2, 0, 2, 5, {5, 0}), std::invalid_argument);     // a stage without one
  CHECK_THROWS_AS(stage_cut(2, 0, 2, 5, {1, 2, 2}), std::invalid_argument);  // 3 stages named
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

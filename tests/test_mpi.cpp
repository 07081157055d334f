// Multi-rank training tests; ctest runs this binary at 1, 2 and 4 ranks.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cstring>
#include <functional>
#include <numeric>
#include "mode_words.h"
#include "mpi_fixture.h"
#include "resilience/flight_recorder.h"
#include "train/trainer.h"

using namespace xx;
using namespace xx::test;

TEST_CASE("all ranks hold identical parameters after every step", "[mpi]") {
  const auto dir = shared_scratch("identical");
  const auto corpus = make_corpus(dir);
  const auto program = make_program(dir, "deck", small_deck(corpus, dir + "/run", 6));
  RunOptions options;
  options.quiet = true;
  Trainer trainer(MPI_COMM_WORLD, program, options);
  const uint64_t initial = fingerprint(trainer.model().params());
  for (int s = 0; s < 6; ++s) {
    const double loss = trainer.train_step();
    REQUIRE(std::isfinite(loss));
    const uint64_t mine = fingerprint(trainer.model().params());
    std::vector<uint64_t> all(mpi_size());
    MPI_Allgather(&mine, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD);
    for (auto h : all) REQUIRE(h == mine);
    REQUIRE(mine != initial);  // and they did move
  }
}

TEST_CASE("the same deck twice gives bit-identical losses", "[mpi]") {
  const auto dir = shared_scratch("twice");
  const auto corpus = make_corpus(dir);
  const auto a = run_deck(make_program(dir, "a", small_deck(corpus, dir + "/a", 8)));
  const auto b = run_deck(make_program(dir, "b", small_deck(corpus, dir + "/b", 8)));
  REQUIRE(a.size() == 8);
  REQUIRE(a == b);  // exact, not approximate
  REQUIRE(a.back() < a.front());  // and it learns
  // Another seed is a different run.
  const auto c = run_deck(make_program(dir, "c", "seed 100\n" + small_deck(corpus, dir + "/c", 8).substr(8)));
  REQUIRE(c != a);
}

TEST_CASE("2N steps equal N steps, checkpoint, resume, N steps", "[mpi]") {
  const int N = 5;
  const auto dir = shared_scratch("resume");
  const auto corpus = make_corpus(dir);
  const auto full = run_deck(make_program(dir, "full", small_deck(corpus, dir + "/full", 2 * N)));
  // First half, checkpointed at its end (the schedule's horizon is the same 12 steps).
  const auto first = run_deck(make_program(dir, "first", small_deck(corpus, dir + "/half", N)));
  REQUIRE(first.size() == size_t(N));
  const auto second = run_deck(make_program(dir, "second", small_deck(corpus, dir + "/half", 2 * N)), "auto");
  REQUIRE(second.size() == size_t(N));
  for (int i = 0; i < N; ++i) {
    INFO("step " << i + 1);
    REQUIRE(first[i] == full[i]);
  }
  for (int i = 0; i < N; ++i) {
    INFO("step " << N + i + 1);
    REQUIRE(second[i] == full[N + i]);  // bit-identical after the restart
  }
}

TEST_CASE("a deck with two run phases continues the step count", "[mpi]") {
  const auto dir = shared_scratch("phases");
  const auto corpus = make_corpus(dir);
  const auto deck = small_deck(corpus, dir + "/run", 3) + "optimizer adamw lr 1e-3\nrun 2\n";
  RunOptions options;
  options.quiet = true;
  Trainer trainer(MPI_COMM_WORLD, make_program(dir, "deck", deck), options);
  trainer.run();
  REQUIRE(trainer.step() == 5);
  REQUIRE(trainer.losses().size() == 5);
}


TEST_CASE("sync accumulate K equals one step on K times the batch, with one all-reduce", "[mpi][sync]") {
  const auto dir = shared_scratch("accumulate");
  const auto corpus = make_corpus(dir);
  auto deck = [&](const std::string& name, int batch, const std::string& sync) {
    std::string d = small_deck(corpus, dir + "/" + name, 4, sync + "\n");
    const auto at = d.find("batch 4");
    return d.replace(at, 7, "batch " + std::to_string(batch));
  };
  RunOptions options;
  options.quiet = true;
  Trainer big(MPI_COMM_WORLD, make_program(dir, "big", deck("big", 4, "sync dense")), options);
  Trainer acc(MPI_COMM_WORLD, make_program(dir, "acc", deck("acc", 2, "sync accumulate 2")), options);
  for (int s = 0; s < 4; ++s) {
    const double a = big.train_step(), b = acc.train_step();
    INFO("step " << s + 1);
    // The same windows in the same order; only the summation order differs.
    REQUIRE(b == Approx(a).epsilon(1e-5));
    REQUIRE(acc.last_comm().rounds == big.last_comm().rounds);
    REQUIRE(all_equal(all_fingerprints(acc.model().params())));
  }
}

TEST_CASE("sync local K averages every K steps and only then", "[mpi][sync]") {
  const auto outer = GENERATE(as<std::string>{}, "average", "nesterov");
  CAPTURE(outer);
  const auto dir = shared_scratch("local_" + outer);
  const auto corpus = make_corpus(dir);
  const std::string sync = outer == Outer::average ? "sync local 3" : "sync local 3 outer nesterov lr 0.7 momentum 0.9";
  RunOptions options;
  options.quiet = true;
  Trainer trainer(MPI_COMM_WORLD, make_program(dir, "deck", small_deck(corpus, dir + "/run", 9, sync + "\n")), options);
  for (int s = 1; s <= 9; ++s) {
    trainer.train_step();
    const auto prints = all_fingerprints(trainer.model().params());
    INFO("step " << s);
    if (s % 3 == 0) {
      REQUIRE(all_equal(prints));  // consensus right after a sync
      REQUIRE(trainer.last_comm().rounds == (mpi_size() > 1 ? 2 : 0));  // parameters, then the distance
      if (mpi_size() > 1) REQUIRE(trainer.last_comm().bytes_sent > 0);
      if (mpi_size() > 1) REQUIRE(trainer.consensus_distance() > 0);  // the ranks had drifted apart
    } else {
      REQUIRE(trainer.last_comm().rounds == 0);  // no gradient all-reduce between syncs
      if (mpi_size() > 1) REQUIRE_FALSE(all_equal(prints));
    }
  }
}

TEST_CASE("clusters partition the ranks, agree everywhere and cover every rank", "[mpi][topology]") {
  for (int world : {1, 2, 4, 5, 8})
    for (int size : {1, 2, 3, 4}) {
      const auto groups = Topology::clusters(world, size, 7, 3);
      std::vector<int> seen;
      for (const auto& g : groups) {
        REQUIRE(int(g.size()) <= size);
        seen.insert(seen.end(), g.begin(), g.end());
      }
      std::sort(seen.begin(), seen.end());
      std::vector<int> all(world);
      std::iota(all.begin(), all.end(), 0);
      REQUIRE(seen == all);
    }
  // Another draw is another partition (for a world where that is possible).
  REQUIRE(Topology::clusters(8, 4, 7, 3) != Topology::clusters(8, 4, 7, 4));
}

TEST_CASE("topology clusters and ring average within their groups; a phase ends in global consensus",
          "[mpi][topology]") {
  const auto kind = GENERATE(as<std::string>{}, "clusters 2 redraw 2", "ring");
  CAPTURE(kind);
  const auto dir = shared_scratch(kind.substr(0, 4));
  const auto corpus = make_corpus(dir);
  const std::string deck = small_deck(corpus, dir + "/run", 4, "topology " + kind + "\n");
  RunOptions options;
  options.quiet = true;
  Trainer trainer(MPI_COMM_WORLD, make_program(dir, "deck", deck), options);
  for (int s = 0; s < 4; ++s) {
    trainer.train_step();
    const auto prints = all_fingerprints(trainer.model().params());
    if (kind[0] == 'c') {
      // Ranks agree within their cluster of this step (drawn from the shared seed).
      const auto groups = Topology::clusters(mpi_size(), 2, 99, s / 2);
      for (const auto& g : groups)
        for (int r : g) REQUIRE(prints[r] == prints[g.front()]);
      if (mpi_size() == 4) REQUIRE_FALSE(all_equal(prints));  // but not across clusters
    } else if (mpi_size() <= 2) {
      REQUIRE(all_equal(prints));  // a ring of two is a pair
    } else {
      REQUIRE_FALSE(all_equal(prints));  // gossip: neighbours only
    }
    REQUIRE(trainer.last_comm().rounds >= (mpi_size() > 1 ? 1 : 0));
  }
  // run() ends the phase with a global average.
  const auto dir2 = shared_scratch(kind.substr(0, 4) + "2");
  Trainer whole(MPI_COMM_WORLD, make_program(dir2, "deck", small_deck(corpus, dir2 + "/run", 4, "topology " + kind + "\n")),
                options);
  whole.run();
  REQUIRE(all_equal(all_fingerprints(whole.model().params())));
}

TEST_CASE("output barrier on: one world barrier after each logged step, and nothing else changes", "[mpi]") {
  const auto dir = shared_scratch("barrier");
  const auto corpus = make_corpus(dir);
  const int steps = 4;
  // The barriers of one run on MPI_COMM_WORLD, counted by the flight recorder
  // (the PMPI wrappers see every call, whoever makes it).
  auto run = [&](const std::string& name, const std::string& barrier) {
    const Program p = make_program(dir, name, small_deck(corpus, dir + "/" + name, steps,
                                                        "output dir " + dir + "/" + name + " log_every 1 barrier " +
                                                            barrier + "\n"));
    const uint64_t before = flight::recorder().status().calls;
    const auto losses = run_deck(p);
    const uint64_t after = flight::recorder().status().calls;
    REQUIRE(after - before < 1000);  // all of them still in the recorder's ring of 1024
    int barriers = 0;
    for (uint64_t id = before + 1; id <= after; ++id) {
      const flight::Entry e = flight::recorder().entry(id);
      REQUIRE(e.id == id);
      barriers += std::strcmp(e.op, "MPI_Barrier") == 0 && flight::recorder().comm_label(e.comm) == "world";
    }
    return std::pair{losses, barriers};
  };
  const auto [off_losses, off_barriers] = run("off", "off");
  const auto [on_losses, on_barriers] = run("on", "on");
  CHECK(on_barriers - off_barriers == steps);  // log_every 1: one per step
  CHECK(on_losses == off_losses);              // a barrier moves no number
}

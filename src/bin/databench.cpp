// xx_databench: how fast the batch loader (src/data/loader.*) delivers batches
// for a deck's data settings, against the number of worker threads.
//
// usage: xx_databench -in DECK [-var NAME VALUE]... [--workers 0,1,2,4] [--batches N]
//          [--repeats R] [--consume-us X] [--json FILE]
//
// One process (run it directly or under mpirun -n 1; more ranks each measure
// their own loader and rank 0 prints). The deck's first run phase gives the
// corpus, B, T, queue, shuffle, chaos seed and common pool; the pool lives in
// the shared-memory window as in training.
//
// Figures, per workers count, median over R repeats (min-max beside it):
//   batches/s  N / time, time = wall time of N next() calls after the first
//              (the first fills the queue and is not timed)
//   tokens/s   batches/s * B * T
//   wait       mean time one next() blocked, in microseconds
// --consume-us 0 (default): raw loader throughput, the consumer takes batches
// back to back. --consume-us X: the consumer "trains" X microseconds per batch
// (a busy loop), as the trainer does; then batches/s is capped by 1e6/X and
// `wait` is the stall the trainer would see.
// Exit status: 0 OK, 2 bad usage or deck.

// MPI_Init: the common pool's shared window and the chaos seed broadcast
#include <mpi.h>
// fmt::print for the table
#include <fmt/format.h>
// --json FILE
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

// InputError: bad decks
#include "core/error.h"
// CommonPool: the pool's node copy
#include "data/common_pool.h"
// BatchLoader: what is measured
#include "data/loader.h"
// choose_chaos_seed, sampler_options, training_sampler: as the trainer sets them up
#include "data/seeding.h"
// read_deck, build_program
#include "deck/deck.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  std::string deck;
  std::map<std::string, std::string> vars;
  std::vector<int> workers = {0, 1, 2, 4};
  int64_t batches = 2000;
  int repeats = 3;
  double consume_us = 0;
  std::string json;
};

const char* kUsage =
    "usage: xx_databench -in DECK [-var NAME VALUE]... [--workers 0,1,2,4] [--batches N] [--repeats R] "
    "[--consume-us X] [--json FILE]\n";

[[noreturn]] void usage_error(const std::string& what) {
  std::fprintf(stderr, "xx_databench: %s\n%s", what.c_str(), kUsage);
  MPI_Finalize();
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  auto value = [&](int& i) -> std::string {
    if (i + 1 >= argc) usage_error(std::string(argv[i]) + " needs a value");
    return argv[++i];
  };
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      if (arg == "-in") a.deck = value(i);
      else if (arg == "-var") {
        const std::string name = value(i);
        a.vars[name] = value(i);
      } else if (arg == "--workers") {
        a.workers.clear();
        const std::string list = value(i);
        for (size_t start = 0, end; start <= list.size(); start = end + 1) {
          end = std::min(list.find(',', start), list.size());
          a.workers.push_back(std::stoi(list.substr(start, end - start)));
          if (a.workers.back() < 0) usage_error("--workers " + list + " (expected counts >= 0)");
        }
      } else if (arg == "--batches") a.batches = std::stoll(value(i));
      else if (arg == "--repeats") a.repeats = std::stoi(value(i));
      else if (arg == "--consume-us") a.consume_us = std::stod(value(i));
      else if (arg == "--json") a.json = value(i);
      else if (arg == "-h" || arg == "--help") {
        std::fputs(kUsage, stdout);
        MPI_Finalize();
        std::exit(0);
      } else usage_error("unknown argument '" + arg + "'");
    }
  } catch (const std::logic_error&) {  // stoi and friends
    usage_error("a number did not parse");
  }
  if (a.deck.empty()) usage_error("-in DECK is required");
  if (a.batches < 1 || a.repeats < 1 || a.consume_us < 0)
    usage_error("--batches and --repeats must be >= 1, --consume-us >= 0");
  return a;
}

void busy_wait_us(double us) {
  const auto until = Clock::now() + std::chrono::duration<double, std::micro>(us);
  while (Clock::now() < until) {
  }
}

struct Timing {
  double batches_per_s, wait_us;
};

Timing measure(const xx::Corpus& corpus, const xx::DistributedSampler& sampler, const xx::PoolTokens& pool,
               const xx::DataConfig& d, int64_t seq, int workers, const Args& a) {
  xx::BatchLoader loader(corpus, sampler, 0, d.batch, seq, workers, d.queue, 0, pool);
  loader.next();  // start-up: threads start, the queue fills
  double waited = 0;
  const auto t0 = Clock::now();
  for (int64_t i = 0; i < a.batches; ++i) {
    const auto w0 = Clock::now();
    const xx::Batch b = loader.next();
    waited += std::chrono::duration<double>(Clock::now() - w0).count();
    if (a.consume_us > 0) busy_wait_us(a.consume_us);
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return {double(a.batches) / seconds, 1e6 * waited / double(a.batches)};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

int run(const Args& a) {
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const xx::Program program = xx::build_program(xx::read_deck(a.deck, a.vars), true);
  const xx::Config& cfg = program.phases.front().config;
  const xx::DataConfig& d = cfg.data;
  const int64_t seq = cfg.model.seq;
  const xx::Corpus corpus = xx::Corpus::load(d.path, d.format);
  const xx::WindowSplit split = xx::split_windows(corpus, seq, d.valid_fraction);
  const uint64_t chaos_seed = xx::choose_chaos_seed(MPI_COMM_WORLD, d, "", 0, program.phases.front().where);
  const xx::DistributedSampler sampler = xx::training_sampler(
      split.train_windows, world, rank, xx::sampler_options(d, cfg.seed, chaos_seed), program.phases.front().where);
  std::unique_ptr<xx::CommonPool> pool;
  if (!sampler.pool_windows().empty())
    pool = std::make_unique<xx::CommonPool>(MPI_COMM_WORLD, corpus, sampler.pool_windows(), seq);
  const xx::PoolTokens pool_tokens = pool ? pool->tokens() : xx::PoolTokens{};

  if (rank == 0) {
    fmt::print("# xx_databench: {} ({}), B {} T {}, queue {}, {}\n", a.deck, d.path, d.batch, seq, d.queue,
               xx::describe_sampling(d, chaos_seed, sampler));
    fmt::print("# {} batches per case after one untimed batch, median of {} repeats (min-max); consumer: {}\n",
               a.batches, a.repeats,
               a.consume_us > 0 ? fmt::format("{} us of work per batch", a.consume_us) : std::string("back to back (raw loader)"));
    fmt::print("# {:>7} {:>12} {:>21} {:>12} {:>10}\n", "workers", "batches/s", "(min-max)", "tokens/s", "wait");
    fmt::print("# {:>7} {:>12} {:>21} {:>12} {:>10}\n", "", "(1/s)", "(1/s)", "(1/s)", "(us)");
  }
  nlohmann::json rows = nlohmann::json::array();
  // Cases interleaved: repeat r of every workers count before repeat r+1.
  std::map<int, std::vector<Timing>> timings;
  for (int r = 0; r < a.repeats; ++r)
    for (int w : a.workers) timings[w].push_back(measure(corpus, sampler, pool_tokens, d, seq, w, a));
  for (int w : a.workers) {
    std::vector<double> rate, wait;
    for (const auto& t : timings[w]) rate.push_back(t.batches_per_s), wait.push_back(t.wait_us);
    const double med = median(rate), med_wait = median(wait);
    const auto [lo, hi] = std::minmax_element(rate.begin(), rate.end());
    if (rank == 0)
      fmt::print("  {:>7} {:>12.0f} {:>21} {:>12.3g} {:>10.2f}\n", w, med, fmt::format("{:.0f}-{:.0f}", *lo, *hi),
                 med * d.batch * seq, med_wait);
    rows.push_back({{"workers", w}, {"batches_per_s", med}, {"min", *lo}, {"max", *hi},
                    {"tokens_per_s", med * d.batch * seq}, {"wait_us", med_wait}});
  }
  if (rank == 0) {
    fmt::print("# OK\n");
    if (!a.json.empty())
      std::ofstream(a.json) << nlohmann::json{{"deck", a.deck}, {"batch", d.batch}, {"seq", seq},
                                              {"queue", d.queue}, {"shuffle", d.shuffle}, {"common", d.common},
                                              {"chaos_seed", chaos_seed}, {"consume_us", a.consume_us},
                                              {"batches", a.batches}, {"repeats", a.repeats}, {"rows", rows}}
                                     .dump(2)
                            << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const Args args = parse(argc, argv);
  int status = 0;
  try {
    status = run(args);
  } catch (const xx::InputError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    status = 2;
  }
  MPI_Finalize();
  return status;
}

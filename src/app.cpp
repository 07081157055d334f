#include "app.h"
#include <cstdio>
#include <map>
#include <string>
#include <fmt/format.h>
#include "ckpt/checkpoint.h"
#include "core/error.h"
#include "deck/deck.h"
#include "generate.h"
#include "model/estimate.h"
#include "resilience/flight_recorder.h"
#include "resilience/health.h"
#include "resilience/signals.h"
#include "train/trainer.h"

namespace xx {

namespace {

constexpr const char* kUsage =
    "usage: xuanxue -in DECK [-var NAME VALUE]... [-resume auto|PATH] [-dry-run]\n"
    "       xuanxue generate -ckpt FILE -prompt TEXT [...]   (xuanxue generate -h)\n"
    "  -in DECK          input deck (see input/tiny.deck)\n"
    "  -var NAME VALUE   set deck variable NAME (wins over the deck's own `variable`)\n"
    "  -resume auto      continue from the newest complete checkpoint in RUN_DIR/ckpt, if any\n"
    "  -resume PATH      continue from that checkpoint\n"
    "  -dry-run          check the deck, print parameter counts and memory per rank, allocate nothing\n";

struct Args {
  std::string deck, resume;
  bool dry_run = false;
  std::map<std::string, std::string> vars;
};

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto need = [&](int n) {
      if (i + n >= argc) input_error("command line: '{}' needs {} value(s)\n{}", arg, n, kUsage);
    };
    if (arg == "-in") need(1), a.deck = argv[++i];
    else if (arg == "-var") need(2), a.vars[argv[i + 1]] = argv[i + 2], i += 2;
    else if (arg == "-resume") need(1), a.resume = argv[++i];
    else if (arg == "-dry-run") a.dry_run = true;
    else if (arg == "-h" || arg == "-help" || arg == "--help") input_error("{}", kUsage);
    else input_error("command line: unknown option '{}'{}\n{}", arg,
                     did_you_mean(arg, {"-in", "-var", "-resume", "-dry-run"}), kUsage);
  }
  if (a.deck.empty()) input_error("command line: no deck given (expected -in DECK)\n{}", kUsage);
  return a;
}

void broadcast_string(std::string& s, MPI_Comm comm) {
  int n = int(s.size());
  MPI_Bcast(&n, 1, MPI_INT, 0, comm);
  s.resize(n);
  MPI_Bcast(s.data(), n, MPI_CHAR, 0, comm);
}

// Rank 0 reads and validates the deck; every rank gets the resolved lines or
// the error, so a bad deck ends every rank before anything is allocated.
Program load_program(MPI_Comm comm, int rank, int argc, char** argv, Args& args) {
  std::string blob, error;
  if (rank == 0) try {
      args = parse_args(argc, argv);
      auto lines = read_deck(args.deck, args.vars);
      build_program(lines, /*check_files=*/!args.dry_run);
      blob = serialize(lines);
    } catch (const InputError& e) {
      error = e.what();
    }
  broadcast_string(error, comm);
  if (!error.empty()) throw InputError(error);
  broadcast_string(blob, comm);
  broadcast_string(args.resume, comm);
  int dry = args.dry_run;
  MPI_Bcast(&dry, 1, MPI_INT, 0, comm);
  args.dry_run = dry;
  return build_program(deserialize(blob), /*check_files=*/false);
}

}  // namespace

int run_app(MPI_Comm comm, int argc, char** argv) {
  int rank = 0, world = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &world);
  try {
    if (argc > 1 && std::string(argv[1]) == "generate") return run_generate(comm, argc, argv);
    Args args;
    const Program program = load_program(comm, rank, argc, argv, args);
    if (rank == 0) {
      fmt::print("xuanxue: {} rank(s), deck {}\n# resolved deck\n{}\n# parameters\n{}\n", world, args.deck,
                 program.deck_text, describe(program.phases.front().config));
    }
    if (args.dry_run) {
      const auto& c = program.phases.front().config;
      if (rank == 0) fmt::print("{}", dry_run_report(c.model, c.data.batch, world));
      return 0;
    }
    RunOptions options;
    options.resume = args.resume;
    if (rank == 0) clear_stop_marker(program.phases.front().config.output.dir);  // a marker says: this launch stopped
    install_stop_signals();
    Trainer trainer(comm, program, options);
    if (rank == 0) fmt::print("# backends\n{}\n\n", trainer.backends());
    std::fflush(stdout);
    trainer.run();
    return 0;
  } catch (const CheckpointWriteError& e) {
    // Every rank of the write agreed on the failure (src/ckpt/checkpoint.cpp): one message.
    if (rank == 0) fmt::print(stderr, "xuanxue: {}\n", e.what());
    return kExitWriteFailed;
  } catch (const HealthError& e) {
    // Every rank reached the same verdict (one all-gather): one message.
    if (rank == 0) fmt::print(stderr, "xuanxue: {}\n", e.what());
    return kExitUnhealthy;
  } catch (const InputError& e) {
    // Bad input is found collectively (rank 0 checks, then broadcasts), so
    // every rank is here: one message, a clean exit with code 2.
    if (rank == 0) fmt::print(stderr, "{}\n", e.what());
    return kExitBadInput;
  } catch (const std::exception& e) {
    flight::dump(fmt::format("exception: {}", e.what()));  // RUN_DIR/rank<r>/flight.json, once a run dir is known
    fmt::print(stderr, "xuanxue: rank {} failed: {}\n", rank, e.what());
    std::fflush(stderr);
    MPI_Abort(comm, 1);
    return 1;
  }
}

}  // namespace xx

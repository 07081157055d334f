#include "app.h"
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <Kokkos_Core.hpp>
#include <fmt/format.h>
#include "ckpt/checkpoint.h"
#include "comm/agree.h"
#include "hf/config.h"
#include "core/error.h"
#include "core/host_memory.h"
#include "core/units.h"
#include "deck/deck.h"
#include "generate.h"
#include "io/run_dir_lock.h"
#include "model/estimate.h"
#include "resilience/flight_recorder.h"
#include "resilience/health.h"
#include "resilience/signals.h"
#include "train/trainer.h"

namespace xx {

namespace {

constexpr const char* kUsage =
    "usage: xuanxue -in DECK [-var NAME VALUE]... [-resume auto|PATH] [-dry-run [-ranks N] [-plan GRID]]\n"
    "               [-device-gb G]\n"
    "       xuanxue -in DECK [-var NAME VALUE]... -print-config json\n"
    "       xuanxue generate -ckpt FILE -prompt TEXT [...]   (xuanxue generate -h)\n"
    "  -in DECK          input deck (see input/tiny.deck)\n"
    "  -var NAME VALUE   set deck variable NAME (wins over the deck's own `variable`)\n"
    "  -resume auto      continue from the newest complete checkpoint in RUN_DIR/ckpt, if any\n"
    "  -resume PATH      continue from that checkpoint\n"
    "  -dry-run          check the deck, print parameter counts and memory per rank at every sharding level,\n"
    "                    allocate nothing\n"
    "  -ranks N          with -dry-run: plan for N ranks without launching them (default: the ranks launched)\n"
    "  -plan GRID        with -dry-run: also one row per combination of GRID, space-separated KEY=V1,V2,...\n"
    "                    of P (pipeline stages), ep, shard, recompute, micro (micro-batches per step),\n"
    "                    schedule (1f1b|gpipe); keys left out take the deck's. Names the smallest that fits,\n"
    "                    e.g. -plan \"P=1,2,4 ep=1,8 shard=optimizer,params recompute=off,selective micro=8\"\n"
    "  -print-config json  print every phase's resolved configuration as JSON on stdout and exit (what tools\n"
    "                    read instead of parsing decks; files the deck names need not exist)\n"
    "  -device-gb G      memory per rank is G GiB (a device's); default: this node's MemAvailable divided by\n"
    "                    the ranks on it. A run whose plan does not fit stops before allocating (exit 2)\n";

struct Args {
  std::string deck, resume;
  bool dry_run = false;
  bool print_config = false;  // -print-config json
  std::string plan;           // -plan GRID ("" when not given)
  int ranks = 0;         // -ranks: planned ranks (0: the world size)
  double device_gb = 0;  // -device-gb: GiB per rank (0: this node's available memory)
  std::map<std::string, std::string> vars;
};

// The value of `option`: a number in (0, most], an integer when `integer`;
// else an input error with the expected form.
double positive_value(const std::string& option, const std::string& text, bool integer, double most,
                      const char* expected) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !(v > 0) || v > most || (integer && v != double(int64_t(v))))
    input_error("command line: bad value '{}' for {} (expected {})\n{}", text, option, expected, kUsage);
  return v;
}

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
    else if (arg == "-plan") {
      need(1), a.plan = argv[++i];
      try {
        parse_plan_grid(a.plan);
      } catch (const InputError& e) {
        input_error("{}\n{}", e.what(), kUsage);
      }
    }
    else if (arg == "-print-config") {
      need(1);
      if (std::string(argv[++i]) != "json")
        input_error("command line: bad value '{}' for -print-config (expected -print-config json)\n{}", argv[i], kUsage);
      a.print_config = true;
    }
    else if (arg == "-ranks") need(1), a.ranks = int(positive_value(arg, argv[++i], true, 1e7, "-ranks N, an integer N >= 1"));
    else if (arg == "-device-gb") need(1), a.device_gb = positive_value(arg, argv[++i], false, 1e9, "-device-gb G, GiB > 0");
    else if (arg == "-h" || arg == "-help" || arg == "--help") input_error("{}", kUsage);
    else input_error("command line: unknown option '{}'{}\n{}", arg,
                     did_you_mean(arg, {"-in", "-var", "-resume", "-dry-run", "-ranks", "-plan", "-device-gb",
                                        "-print-config"}),
                     kUsage);
  }
  if (a.deck.empty()) input_error("command line: no deck given (expected -in DECK)\n{}", kUsage);
  if (a.ranks > 0 && !a.dry_run)
    input_error("command line: -ranks plans without launching (expected -dry-run -ranks N)\n{}", kUsage);
  if (!a.plan.empty() && !a.dry_run)
    input_error("command line: -plan plans without launching (expected -dry-run -plan GRID)\n{}", kUsage);
  return a;
}

// Rank 0 reads and validates the deck; every rank gets the resolved lines or
// the error, so a bad deck ends every rank before anything is allocated.
Program load_program(MPI_Comm comm, int rank, int argc, char** argv, Args& args) {
  std::string blob;
  on_rank0_or_throw(comm, rank, [&] {
    args = parse_args(argc, argv);
    auto lines = expand_hf_init(read_deck(args.deck, args.vars));  // init hf: config.json's model lines
    build_program(lines, /*check_files=*/!args.dry_run && !args.print_config);
    blob = serialize(lines);
  });
  from_rank0(blob, comm);
  from_rank0(args.resume, comm);
  from_rank0(args.plan, comm);
  int flags[2] = {args.dry_run, args.print_config};
  MPI_Bcast(flags, 2, MPI_INT, 0, comm);
  args.dry_run = flags[0], args.print_config = flags[1];
  MPI_Bcast(&args.ranks, 1, MPI_INT, 0, comm);
  MPI_Bcast(&args.device_gb, 1, MPI_DOUBLE, 0, comm);
  return build_program(deserialize(blob), /*check_files=*/false);
}

// The memory one rank may use: -device-gb, or this node's MemAvailable split
// among the ranks launched on it (the smallest share over the nodes, so every
// rank reaches the same verdict). A device build without -device-gb has no
// limit: the host's memory says nothing about the device's.
MemoryLimit memory_limit(MPI_Comm comm, double device_gb) {
  if (device_gb > 0) return {device_gb * 1024 * 1024 * 1024, fmt::format("-device-gb {}", device_gb)};
  if (!Kokkos::SpaceAccessibility<Kokkos::HostSpace, Kokkos::DefaultExecutionSpace::memory_space>::accessible)
    return {0, "a device build: pass -device-gb G"};
  MPI_Comm node;
  MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int on_node = 1, world = 1;
  MPI_Comm_size(node, &on_node);
  MPI_Comm_free(&node);
  MPI_Comm_size(comm, &world);
  const int64_t available = mem_available_bytes();
  // -1 when one node cannot tell: then no limit anywhere.
  int64_t share = available < 0 ? -1 : available / on_node, smallest = 0, unknown = 0, mine = share < 0;
  MPI_Allreduce(&share, &smallest, 1, MPI_INT64_T, MPI_MIN, comm);
  MPI_Allreduce(&mine, &unknown, 1, MPI_INT64_T, MPI_MAX, comm);
  if (unknown) return {0, "no /proc/meminfo"};
  std::string source = fmt::format("MemAvailable {} on this node", format_bytes(double(available)));
  if (on_node > 1) source += fmt::format(" / {} ranks launched on it", on_node);
  if (on_node < world) source += ", the smallest share over the nodes";
  return {double(smallest), source};
}

}  // namespace

int run_app(MPI_Comm comm, int argc, char** argv) {
  int rank = 0, world = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &world);
  std::optional<RunDirLock> run_dir_lock;  // rank 0's, held until the process ends (also past the catch below)
  try {
    if (argc > 1 && std::string(argv[1]) == "generate") return run_generate(comm, argc, argv);
    Args args;
    const Program program = load_program(comm, rank, argc, argv, args);
    if (args.print_config) {  // stdout is the JSON alone: no echo of the deck
      if (rank == 0) fmt::print("{}\n", program_json(program));
      return 0;
    }
    if (rank == 0) {
      fmt::print("xuanxue: {} rank(s), deck {}\n# resolved deck\n{}\n# parameters\n{}\n", world, args.deck,
                 program.deck_text, describe(program.phases.front().config));
    }
    const MemoryLimit limit = memory_limit(comm, args.device_gb);
    if (args.dry_run) {
      // every rank plans, so a plan's InputError (ep not dividing -ranks) ends all alike
      const int ranks = args.ranks > 0 ? args.ranks : world;
      std::string report = dry_run_report(program, ranks, limit);
      if (!args.plan.empty()) report += plan_grid_report(program, ranks, parse_plan_grid(args.plan), limit);
      if (rank == 0) fmt::print("{}", report);
      return 0;
    }
    // Every rank holds the same plan against the same limit: all stop here,
    // before the model allocates anything.
    if (const std::string refusal = memory_refusal(program, world, limit); !refusal.empty()) throw InputError(refusal);
    // One job per run directory: rank 0 locks RUN_DIR/.lock before anything
    // is written there; a taken lock ends every rank with one message, exit 2.
    {
      std::string busy, failed;
      if (rank == 0) try {
          run_dir_lock = RunDirLock::take(program.phases.front().config.output.dir, busy);
        } catch (const std::exception& e) {
          failed = e.what();
        }
      from_rank0(failed, comm);
      if (!failed.empty()) throw std::runtime_error(failed);
      from_rank0(busy, comm);
      if (!busy.empty()) throw InputError(busy);
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
    // every rank is here: one message, a clean exit with code 2. A deck
    // refused after the lock was taken leaves no run directory behind.
    if (run_dir_lock) run_dir_lock->abandon();
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

// Drawing, choosing and recording the chaos seed (seeding.h).
#include "data/seeding.h"
#include <unistd.h>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/rng.h"

namespace xx {

uint64_t draw_chaos_seed(MPI_Comm comm) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  uint64_t seed = 0;
  if (rank == 0) {
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    uint64_t node = 1469598103934665603ULL;  // FNV-1a of the host name
    for (const char* c = host; *c; ++c) node = (node ^ uint64_t((unsigned char)*c)) * 1099511628211ULL;
    const uint64_t clock = uint64_t(std::chrono::high_resolution_clock::now().time_since_epoch().count());
    seed = mix_seed(node, clock, uint64_t(::getpid()));
    if (seed == 0) seed = 1;
  }
  MPI_Bcast(&seed, 1, MPI_UINT64_T, 0, comm);
  return seed;
}

uint64_t choose_chaos_seed(MPI_Comm comm, const DataConfig& data, const std::string& resume_path,
                           uint64_t checkpoint_seed, const std::string& where) {
  const bool chaotic = data.shuffle != Shuffle::fixed;
  if (!resume_path.empty()) {
    if (!chaotic && checkpoint_seed != 0)
      input_error("{}: written by a shuffle chaos|independent run (chaos_seed {}), resumed with shuffle fixed "
                  "(expected the checkpoint's shuffle mode)", resume_path, checkpoint_seed);
    if (chaotic && checkpoint_seed == 0)
      input_error("{}: written by a shuffle fixed run (no chaos_seed), resumed with shuffle {} (expected the "
                  "checkpoint's shuffle mode)", resume_path, data.shuffle);
    if (chaotic && data.chaos_seed != 0 && data.chaos_seed != checkpoint_seed)
      input_error("{}: the deck's chaos_seed {} differs from the checkpoint's {} in {} (expected the same seed, or "
                  "chaos_seed 0 to continue the checkpoint's)", where, data.chaos_seed, checkpoint_seed, resume_path);
    return checkpoint_seed;
  }
  if (!chaotic) return 0;
  if (data.chaos_seed != 0) return data.chaos_seed;
  return draw_chaos_seed(comm);
}

SamplerOptions sampler_options(const DataConfig& data, uint64_t run_seed, uint64_t chaos_seed) {
  SamplerOptions o;
  o.shuffle = data.shuffle;
  o.seed = o.shuffle == Shuffle::fixed ? run_seed : chaos_seed;
  o.common = data.common;
  o.common_rate = data.common > 0 ? data.common_rate : 0.0;
  o.contiguous = data.partition == Partition::contiguous;
  return o;
}

DistributedSampler training_sampler(int64_t windows, int world, int rank, const SamplerOptions& options,
                                    const std::string& where) {
  try {
    return DistributedSampler(windows, world, rank, options);
  } catch (const std::invalid_argument& e) {
    input_error("{}: data {}", where, e.what());
  }
}

std::string describe_sampling(const DataConfig& data, uint64_t chaos_seed, const DistributedSampler& sampler) {
  std::string line = fmt::format("shuffle {}", data.shuffle);
  if (data.shuffle != Shuffle::fixed)
    line += fmt::format(", chaos seed {} (replay: data ... chaos_seed {}, or -var chaos_seed {} with "
                        "chaos_seed ${{chaos_seed}} on the data line)", chaos_seed, chaos_seed, chaos_seed);
  if (!sampler.pool_windows().empty())
    line += fmt::format("; common pool {} of {} windows, {} of each rank's samples", sampler.pool_windows().size(),
                        sampler.windows(), data.common_rate);
  if (data.partition == Partition::contiguous)
    line += "; partition contiguous: each rank reads its own slice of the windows";
  return line;
}

void write_run_metadata(const std::string& run_dir, const DataConfig& data, uint64_t run_seed, uint64_t chaos_seed,
                        int64_t pool_windows, int world) {
  const auto path = std::filesystem::path(run_dir) / "run.json";
  nlohmann::json meta = nlohmann::json::object();
  if (std::ifstream in(path); in) {
    meta = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (!meta.is_object()) meta = nlohmann::json::object();  // unreadable: start over rather than fail the run
  }
  meta["shuffle"] = data.shuffle;
  meta["chaos_seed"] = chaos_seed;
  meta["seed"] = run_seed;
  meta["common"] = data.common;
  meta["common_rate"] = data.common > 0 ? data.common_rate : 0.0;
  meta["pool_windows"] = pool_windows;
  meta["world"] = world;
  write_file_atomic(path.string(), meta.dump(2) + "\n");
}

}  // namespace xx

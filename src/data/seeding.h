// The seeds behind a rank's training stream (docs/DATA.md, "Shuffle modes"):
// the chaos seed of shuffle chaos|independent is drawn once on rank 0 from
// the node id and the clock, broadcast, recorded (console, rank-0 log,
// RUN_DIR/run.json, checkpoints), and replayed by the deck's `chaos_seed S`.
#pragma once
#include <mpi.h>
#include <cstdint>
#include <string>
#include "deck/config.h"
#include "data/sampler.h"

namespace xx {

// Rank 0 mixes its host name, the high-resolution clock and its pid into a
// seed and broadcasts it. Collective; never 0 (0 means "no chaos seed").
uint64_t draw_chaos_seed(MPI_Comm comm);

// The chaos seed this run uses, the same on every rank; 0 under shuffle fixed.
// A resumed run continues with its checkpoint's seed (resume_path non-empty,
// checkpoint_seed as read); a fresh one takes the deck's chaos_seed, or draws
// one. Collective. Throws InputError (naming `where` or the checkpoint) when
// the checkpoint and the deck disagree.
uint64_t choose_chaos_seed(MPI_Comm comm, const DataConfig& data, const std::string& resume_path,
                           uint64_t checkpoint_seed, const std::string& where);

// The sampler's settings: fixed shuffles with the run seed, the others with the chaos seed.
SamplerOptions sampler_options(const DataConfig& data, uint64_t run_seed, uint64_t chaos_seed);

// The sampler of `windows` training windows; a pool that leaves no shard
// window is an InputError naming `where`.
DistributedSampler training_sampler(int64_t windows, int world, int rank, const SamplerOptions& options,
                                    const std::string& where);

// One line for the start-up output: the shuffle, the seed and how to replay it, the pool.
std::string describe_sampling(const DataConfig& data, uint64_t chaos_seed, const DistributedSampler& sampler);

// Merges the data settings into RUN_DIR/run.json ({"shuffle", "chaos_seed",
// "seed", "common", "common_rate", "pool_windows", "world"}), keeping keys
// others wrote, through write_file_atomic. Call on rank 0.
void write_run_metadata(const std::string& run_dir, const DataConfig& data, uint64_t run_seed, uint64_t chaos_seed,
                        int64_t pool_windows, int world);

}  // namespace xx

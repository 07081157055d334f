// Rank health (deck: health every N [nan skip|stop] [max_skips K];
// docs/RESILIENCE.md). Every rank reports a few numbers; one all-gather
// lets every rank reach the same verdict, so they stop together with one
// message naming the ranks and the cause.
#pragma once
#include <mpi.h>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace xx {

// A failure every rank agreed on: the job ends with this message (rank 0
// prints it) and exit code kExitUnhealthy, without a checkpoint of the bad state.
struct HealthError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
constexpr int kExitUnhealthy = 3;

struct RankHealth {
  int32_t finite_loss = 1;
  int32_t finite_grads = 1;
  int64_t step = 0;                 // optimizer steps taken: ranks out of step have desynchronised
  double available_mb = 0;          // MemAvailable of the node
  uint64_t params_fingerprint = 0;  // kernels::fingerprint of the parameters
};

struct HealthVerdict {
  std::string failure;  // empty: healthy; else one line naming the ranks and the cause
  std::string summary;  // one line for the log: min free memory, steps
  double min_available_mb = 0;
};

// Collective over comm. `same_params`: the ranks are meant to hold the same
// parameter bits now (dense sync, full topology), so different fingerprints are a failure.
HealthVerdict check_health(MPI_Comm comm, const RankHealth& mine, bool same_params);

// Collective: the ranks whose flag is set, "rank 1" or "ranks 0, 3".
std::string ranks_with(MPI_Comm comm, bool flag);

double available_memory_mb();  // the node's MemAvailable (/proc/meminfo), 0 if unknown

}  // namespace xx

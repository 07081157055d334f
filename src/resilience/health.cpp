#include "resilience/health.h"
#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>
#include <fmt/format.h>
#include <fmt/ranges.h>

namespace xx {
namespace {

std::string name_ranks(const std::vector<int>& ranks) {
  return fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", fmt::join(ranks, ", "));
}

}  // namespace

std::string ranks_with(MPI_Comm comm, bool flag) {
  int world = 1, mine = flag ? 1 : 0;
  MPI_Comm_size(comm, &world);
  std::vector<int> flags(world);
  MPI_Allgather(&mine, 1, MPI_INT, flags.data(), 1, MPI_INT, comm);
  std::vector<int> ranks;
  for (int r = 0; r < world; ++r)
    if (flags[r]) ranks.push_back(r);
  return ranks.empty() ? std::string() : name_ranks(ranks);
}

HealthVerdict check_health(MPI_Comm comm, const RankHealth& mine, bool same_params) {
  int world = 1;
  MPI_Comm_size(comm, &world);
  std::vector<RankHealth> all(world);
  MPI_Allgather(&mine, int(sizeof mine), MPI_BYTE, all.data(), int(sizeof mine), MPI_BYTE, comm);

  std::vector<int> bad_loss, bad_grads, out_of_step, different;
  std::map<int64_t, int> steps;
  std::map<uint64_t, int> prints;
  for (const auto& h : all) ++steps[h.step], ++prints[h.params_fingerprint];
  // The majority's value is the reference; ties go to rank 0's.
  auto majority = [&](const auto& counts, auto value0) {
    auto best = value0;
    for (const auto& [v, n] : counts)
      if (n > counts.at(best)) best = v;
    return best;
  };
  const int64_t step = majority(steps, all[0].step);
  const uint64_t print = majority(prints, all[0].params_fingerprint);
  HealthVerdict verdict;
  verdict.min_available_mb = all[0].available_mb;
  for (int r = 0; r < world; ++r) {
    const auto& h = all[r];
    if (!h.finite_loss) bad_loss.push_back(r);
    if (!h.finite_grads) bad_grads.push_back(r);
    if (h.step != step) out_of_step.push_back(r);
    if (same_params && h.params_fingerprint != print) different.push_back(r);
    verdict.min_available_mb = std::min(verdict.min_available_mb, h.available_mb);
  }
  std::vector<std::string> causes;
  if (!bad_loss.empty()) causes.push_back(name_ranks(bad_loss) + ": loss is not finite");
  if (!bad_grads.empty()) causes.push_back(name_ranks(bad_grads) + ": gradients hold inf or NaN");
  if (!out_of_step.empty())
    causes.push_back(fmt::format("{}: out of step (the others are at step {})", name_ranks(out_of_step), step));
  if (!different.empty())
    causes.push_back(name_ranks(different) + ": parameters differ from the other ranks' (silent divergence)");
  verdict.failure = fmt::format("{}", fmt::join(causes, "; "));
  verdict.summary = fmt::format("health ok at step {}: {} ranks, min MemAvailable {:.0f} MB", step, world,
                                verdict.min_available_mb);
  return verdict;
}

double available_memory_mb() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb / 1024;
  return 0;
}

}  // namespace xx

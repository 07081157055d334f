// Rank health (src/resilience/health.h): every rank reaches the same
// verdict, naming the ranks at fault; the parameter fingerprint sees one bit.
#include <catch2/catch.hpp>
#include <bit>
#include <cmath>
#include <vector>
#include "kernels/health.h"
#include "mpi_fixture.h"
#include "resilience/health.h"

using namespace xx;
using xx::test::mpi_rank;
using xx::test::mpi_size;

namespace {

// Every rank's verdict must be the same text: the job stops on all of them.
std::string agreed(const std::string& failure) {
  int n = int(failure.size()), lo = 0, hi = 0;
  MPI_Allreduce(&n, &lo, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&n, &hi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  REQUIRE(lo == hi);
  std::string first = failure;
  MPI_Bcast(first.data(), n, MPI_CHAR, 0, MPI_COMM_WORLD);
  int same = first == failure, all = 0;
  MPI_Allreduce(&same, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  REQUIRE(all == 1);
  return failure;
}

RankHealth healthy() {
  RankHealth h;
  h.step = 7;
  h.available_mb = 1000;
  h.params_fingerprint = 42;
  return h;
}

}  // namespace

TEST_CASE("fingerprint: one flipped bit changes it; the order of the sum does not", "[health]") {
  std::vector<float> x(10007);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * float(i));
  const uint64_t base = kernels::fingerprint(Vec<const float>(x.data(), x.size()));
  CHECK(base == kernels::fingerprint(Vec<const float>(x.data(), x.size())));
  for (size_t i : {size_t(0), size_t(5000), x.size() - 1}) {
    auto y = x;
    y[i] = std::bit_cast<float>(std::bit_cast<uint32_t>(y[i]) ^ 1u);  // the lowest mantissa bit
    CHECK(kernels::fingerprint(Vec<const float>(y.data(), y.size())) != base);
  }
  // Swapping two values changes it too: the index is part of the hash.
  auto z = x;
  std::swap(z[1], z[2]);
  CHECK(kernels::fingerprint(Vec<const float>(z.data(), z.size())) != base);
}

TEST_CASE("check_health: healthy ranks pass; a failure names the ranks on every rank", "[health][mpi]") {
  const int rank = mpi_rank(), world = mpi_size();
  {
    const auto verdict = check_health(MPI_COMM_WORLD, healthy(), true);
    CHECK(agreed(verdict.failure).empty());
    CHECK(verdict.min_available_mb == 1000);
  }
  if (world < 2) return;
  const int last = world - 1;
  {
    auto h = healthy();
    if (rank == last) h.finite_loss = 0;
    const auto failure = agreed(check_health(MPI_COMM_WORLD, h, true).failure);
    CHECK(failure == fmt::format("rank {}: loss is not finite", last));
  }
  {
    auto h = healthy();
    if (rank == 1) h.step = 6;  // a rank that missed a step
    const auto failure = agreed(check_health(MPI_COMM_WORLD, h, false).failure);
    if (world > 2) CHECK(failure == "rank 1: out of step (the others are at step 7)");
    else CHECK(!failure.empty());  // 1 against 1: the tie goes to rank 0's step
  }
  {
    auto h = healthy();
    if (rank == 0) h.params_fingerprint = 43;  // silent divergence of rank 0
    const auto with = agreed(check_health(MPI_COMM_WORLD, h, true).failure);
    const auto without = agreed(check_health(MPI_COMM_WORLD, h, false).failure);
    if (world > 2) CHECK(with == "rank 0: parameters differ from the other ranks' (silent divergence)");
    else CHECK(!with.empty());
    CHECK(without.empty());  // sync local between averages: ranks may differ
  }
  {
    auto h = healthy();
    if (rank == 0 || rank == last) h.finite_grads = 0;
    h.available_mb = 100 + rank;
    const auto verdict = check_health(MPI_COMM_WORLD, h, true);
    CHECK(agreed(verdict.failure) == fmt::format("ranks 0, {}: gradients hold inf or NaN", last));
    CHECK(verdict.min_available_mb == 100);
  }
  CHECK(ranks_with(MPI_COMM_WORLD, rank == last) == fmt::format("rank {}", last));
  CHECK(ranks_with(MPI_COMM_WORLD, false).empty());
}

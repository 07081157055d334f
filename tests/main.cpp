// Test main: MPI first, then Kokkos, then the Catch2 session (as Cabana does),
// so the same binary serves unit tests and multi-rank tests.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <mpi.h>
#include <Kokkos_Core.hpp>
#include "core/device_memory.h"
#include <cstdio>

// With several ranks, a failed assertion on one rank would leave the others
// waiting in a collective of the same test forever: report it and abort.
struct AbortOnFailure : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;
  bool assertionEnded(const Catch::AssertionStats& stats) override {
    int world = 1, rank = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    const auto& r = stats.assertionResult;
    if (world > 1 && !r.isOk()) {
      std::fprintf(stderr, "rank %d: %s:%zu: FAILED: %s\n  with expansion: %s\n  %s\n", rank,
                   r.getSourceInfo().file, r.getSourceInfo().line, r.getExpressionInMacro().c_str(),
                   r.getExpandedExpression().c_str(), r.getMessage().c_str());
      for (const auto& info : stats.infoMessages) std::fprintf(stderr, "  info: %s\n", info.message.c_str());
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    return true;
  }
  // Catch installs its SIGSEGV handler per test case; the device emulation needs its own.
  void sectionStarting(const Catch::SectionInfo& info) override {
    if (xx::device_emulated()) xx::start_device_emulation_if_asked();
    TestEventListenerBase::sectionStarting(info);
  }
};
CATCH_REGISTER_LISTENER(AbortOnFailure)

int main(int argc, char** argv) {
  // Threads: an async checkpoint writes collectively (on its own
  // communicator) while the training thread runs its collectives.
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int result = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    xx::start_device_emulation_if_asked();  // XX_EMULATE_DEVICE=1: core/device_memory.h
    result = Catch::Session().run(argc, argv);
  }
  // A failure on one rank must fail the whole mpiexec.
  int worst = 0;
  MPI_Allreduce(&result, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}

// Test main: MPI first, then Kokkos, then the Catch2 session (as Cabana does),
// so the same binary serves unit tests and multi-rank tests.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <mpi.h>
#include <Kokkos_Core.hpp>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int result = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    result = Catch::Session().run(argc, argv);
  }
  // A failure on one rank must fail the whole mpiexec.
  int worst = 0;
  MPI_Allreduce(&result, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}

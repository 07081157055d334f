// xuanxue: MPI-native training of DeepSeek-style language models.
#include <mpi.h>
#include <Kokkos_Core.hpp>
#include "app.h"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int code = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    code = xx::run_app(MPI_COMM_WORLD, argc, argv);
  }
  MPI_Finalize();
  return code;
}

// xuanxue: MPI-native training of DeepSeek-style language models.
#include <mpi.h>
#include <Kokkos_Core.hpp>
#include "app.h"

int main(int argc, char** argv) {
  // Threads: an async checkpoint writes collectively (on its own
  // communicator) while the training thread runs its collectives.
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int code = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    code = xx::run_app(MPI_COMM_WORLD, argc, argv);
  }
  MPI_Finalize();
  return code;
}

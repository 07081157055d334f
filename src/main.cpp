// xuanxue: MPI-native training of DeepSeek-style language models.
#include <mpi.h>
#include <cstdlib>
#include <string>
#include <Kokkos_Core.hpp>
#include "core/device_memory.h"
#include "app.h"
#ifdef XX_HAVE_NCCL
#include <cuda_runtime.h>
#endif

namespace {

// A CUDA build gives each rank of a node its own GPU. The rank's place on its
// node comes from MPI (the ranks sharing memory), not from launcher
// variables, so srun, mpirun and any other launcher agree. KOKKOS_DEVICE_ID,
// when set, wins.
void choose_device() {
#ifdef XX_HAVE_NCCL
  int devices = 0;
  if (std::getenv("KOKKOS_DEVICE_ID") || cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) return;
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int local = 0;
  MPI_Comm_rank(node, &local);
  MPI_Comm_free(&node);
  setenv("KOKKOS_DEVICE_ID", std::to_string(local % devices).c_str(), 1);
  cudaSetDevice(local % devices);
#endif
}

}  // namespace

int main(int argc, char** argv) {
  // Threads: an async checkpoint writes collectively (on its own
  // communicator) while the training thread runs its collectives.
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  choose_device();
  int code = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    xx::start_device_emulation_if_asked();  // XX_EMULATE_DEVICE=1: core/device_memory.h
    code = xx::run_app(MPI_COMM_WORLD, argc, argv);
  }
  MPI_Finalize();
  return code;
}

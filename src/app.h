// The xuanxue command line: xuanxue -in DECK [-var NAME VALUE]... [-resume auto|PATH]
#pragma once
#include <mpi.h>

namespace xx {

// Runs the whole job on this rank; returns the process exit code
// (0 done, 2 bad input). Other failures end the job through MPI_Abort.
int run_app(MPI_Comm comm, int argc, char** argv);

}  // namespace xx

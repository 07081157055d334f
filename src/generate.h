// xuanxue generate -ckpt FILE -prompt TEXT [...]: text from a checkpoint (src/generate.cpp).
#pragma once
#include <mpi.h>

namespace xx {

// Returns the exit code (0 done); bad input throws InputError (exit 2 in run_app).
int run_generate(MPI_Comm comm, int argc, char** argv);

}  // namespace xx

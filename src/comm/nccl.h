// NCCL context for dense all-reduce of device buffers (CUDA builds only).
// The unique id is created on rank 0 and broadcast over MPI.
#pragma once
#ifdef XX_HAVE_NCCL
#include <mpi.h>
#include <cstddef>
#include <string>

namespace xx {

class NcclContext {
 public:
  explicit NcclContext(MPI_Comm comm);  // collective over comm
  ~NcclContext();
  NcclContext(const NcclContext&) = delete;
  NcclContext& operator=(const NcclContext&) = delete;

  // In-place sum of n floats that live on this rank's GPU; waits for completion.
  void allreduce_sum(float* device_buffer, size_t n);
  // Empty when healthy, else NCCL's description of the asynchronous error.
  std::string async_error() const;

 private:
  struct Handles;
  Handles* handles_;
};

}  // namespace xx
#endif

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
  // The same sum queued on this context's own stream once the work queued so
  // far on `compute_stream` (a cudaStream_t) has run; returns at once.
  void allreduce_sum_after(float* device_buffer, size_t n, void* compute_stream);
  // The work queued on `compute_stream` from now on waits for every sum queued here.
  void join(void* compute_stream);
  // Empty when healthy, else NCCL's description of the asynchronous error.
  std::string async_error() const;

 private:
  struct Handles;
  Handles* handles_;
};

}  // namespace xx
#endif

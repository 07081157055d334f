// Nonblocking MPI collectives on kernel memory, in place. Where MPI can read
// kernel memory (host memory, or a CUDA-aware MPI: mpi_reaches_kernel_memory)
// they are MPI's own calls on it. Where it cannot, each goes through a host
// copy of its span: copied out before it starts, copied back when it
// completes (wait or test here), so the caller's code is the same either way.
// The sums are MPI's on the same values: the same bits.
#pragma once
#include <mpi.h>
#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

namespace xx {

class KernelMemoryMpi {
 public:
  KernelMemoryMpi();  // decides staging once (comm/ops.h)
  ~KernelMemoryMpi();  // waits for what is in flight (not while an exception unwinds)
  KernelMemoryMpi(const KernelMemoryMpi&) = delete;
  KernelMemoryMpi& operator=(const KernelMemoryMpi&) = delete;
  bool staged() const { return staged_; }

  // MPI_Iallreduce(MPI_IN_PLACE, data[0, n)), a float sum; and MPI_Allreduce, blocking.
  void iallreduce_sum(float* data, int n, MPI_Comm comm, MPI_Request* request);
  void allreduce_sum(float* data, int n, MPI_Comm comm);
  // MPI_Iallgatherv(MPI_IN_PLACE) into base: rank r's piece at base + displs[r].
  void iallgatherv(void* base, const int* counts, const int* displs, MPI_Datatype type, MPI_Comm comm,
                   MPI_Request* request);
  void allgatherv(void* base, const int* counts, const int* displs, MPI_Datatype type, MPI_Comm comm);

  void wait(MPI_Request* request);
  bool test(MPI_Request* request);  // true when done (its values are then in kernel memory)
  void wait_all(std::vector<MPI_Request>& requests);

 private:
  struct Staging {
    void* kernel = nullptr;  // the span in kernel memory
    std::vector<std::byte> host;
  };
  Staging& stage(void* kernel, int64_t bytes);  // copies the span out
  static void copy_back(Staging& s);
  void finish(MPI_Request key);  // copies a completed one back
  bool staged_ = false;
  Staging pending_;                          // the one being started
  std::map<MPI_Request, Staging> in_flight_;  // by request, while it runs
};

}  // namespace xx

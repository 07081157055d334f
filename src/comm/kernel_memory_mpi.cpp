#include "comm/kernel_memory_mpi.h"
#include <algorithm>
#include <exception>
#include "comm/ops.h"
#include "core/views.h"

namespace xx {
namespace {

using KernelBytes = Kokkos::View<char*, MemSpace, Unmanaged>;
using HostBytes = Kokkos::View<char*, Kokkos::HostSpace, Unmanaged>;

// The bytes an in-place all-gather writes: from base to the end of the last piece.
int64_t gathered_bytes(const int* counts, const int* displs, MPI_Datatype type, MPI_Comm comm) {
  int ranks = 1, size = 1;
  MPI_Comm_size(comm, &ranks);
  MPI_Type_size(type, &size);
  int64_t end = 0;
  for (int r = 0; r < ranks; ++r) end = std::max(end, int64_t(displs[r]) + counts[r]);
  return end * size;
}

}  // namespace

KernelMemoryMpi::KernelMemoryMpi() : staged_(!mpi_reaches_kernel_memory()) {}

KernelMemoryMpi::~KernelMemoryMpi() {
  // Unwinding a failure: the job is ending, and a collective the other
  // ranks never joined would hang here.
  if (std::uncaught_exceptions() > 0) return;
  while (!in_flight_.empty()) {
    MPI_Request r = in_flight_.begin()->first;
    wait(&r);
  }
}

KernelMemoryMpi::Staging& KernelMemoryMpi::stage(void* kernel, int64_t bytes) {
  pending_.kernel = kernel;
  pending_.host.resize(size_t(bytes));
  ExecSpace().fence();  // the kernels that wrote the span are done
  Kokkos::deep_copy(HostBytes(reinterpret_cast<char*>(pending_.host.data()), bytes),
                    KernelBytes(static_cast<char*>(kernel), bytes));
  return pending_;
}

void KernelMemoryMpi::copy_back(Staging& s) {
  const int64_t bytes = int64_t(s.host.size());
  Kokkos::deep_copy(KernelBytes(static_cast<char*>(s.kernel), bytes),
                    HostBytes(reinterpret_cast<char*>(s.host.data()), bytes));
}

void KernelMemoryMpi::finish(MPI_Request key) {
  auto it = in_flight_.find(key);
  if (it == in_flight_.end()) return;
  copy_back(it->second);
  in_flight_.erase(it);
}

void KernelMemoryMpi::iallreduce_sum(float* data, int n, MPI_Comm comm, MPI_Request* request) {
  if (!staged_) {
    MPI_Iallreduce(MPI_IN_PLACE, data, n, MPI_FLOAT, MPI_SUM, comm, request);
    return;
  }
  Staging& s = stage(data, int64_t(n) * int64_t(sizeof(float)));
  MPI_Iallreduce(MPI_IN_PLACE, s.host.data(), n, MPI_FLOAT, MPI_SUM, comm, request);
  in_flight_[*request] = std::move(s);
}

void KernelMemoryMpi::allreduce_sum(float* data, int n, MPI_Comm comm) {
  if (!staged_) {
    MPI_Allreduce(MPI_IN_PLACE, data, n, MPI_FLOAT, MPI_SUM, comm);
    return;
  }
  Staging& s = stage(data, int64_t(n) * int64_t(sizeof(float)));
  MPI_Allreduce(MPI_IN_PLACE, s.host.data(), n, MPI_FLOAT, MPI_SUM, comm);
  copy_back(s);
}

void KernelMemoryMpi::iallgatherv(void* base, const int* counts, const int* displs, MPI_Datatype type,
                                  MPI_Comm comm, MPI_Request* request) {
  if (!staged_) {
    MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, base, counts, displs, type, comm, request);
    return;
  }
  Staging& s = stage(base, gathered_bytes(counts, displs, type, comm));
  MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, s.host.data(), counts, displs, type, comm, request);
  in_flight_[*request] = std::move(s);
}

void KernelMemoryMpi::allgatherv(void* base, const int* counts, const int* displs, MPI_Datatype type,
                                 MPI_Comm comm) {
  MPI_Request request = MPI_REQUEST_NULL;
  iallgatherv(base, counts, displs, type, comm, &request);
  wait(&request);
}

void KernelMemoryMpi::wait(MPI_Request* request) {
  if (*request == MPI_REQUEST_NULL) return;
  const MPI_Request key = *request;
  MPI_Wait(request, MPI_STATUS_IGNORE);
  if (staged_) finish(key);
}

bool KernelMemoryMpi::test(MPI_Request* request) {
  if (*request == MPI_REQUEST_NULL) return true;
  const MPI_Request key = *request;
  int done = 0;
  MPI_Test(request, &done, MPI_STATUS_IGNORE);
  if (done && staged_) finish(key);
  return done != 0;
}

void KernelMemoryMpi::wait_all(std::vector<MPI_Request>& requests) {
  if (!staged_) {
    MPI_Waitall(int(requests.size()), requests.data(), MPI_STATUSES_IGNORE);
    return;
  }
  for (auto& r : requests) wait(&r);
}

}  // namespace xx

#include "comm/nccl.h"
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdexcept>
#include <fmt/format.h>

namespace xx {

struct NcclContext::Handles {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
};

static void nccl_check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw std::runtime_error(fmt::format("NCCL {} failed: {}", what, ncclGetErrorString(r)));
}
static void cuda_check(cudaError_t r, const char* what) {
  if (r != cudaSuccess) throw std::runtime_error(fmt::format("CUDA {} failed: {}", what, cudaGetErrorString(r)));
}

NcclContext::NcclContext(MPI_Comm comm) : handles_(new Handles) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  ncclUniqueId id;
  if (rank == 0) nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, comm);
  cuda_check(cudaStreamCreate(&handles_->stream), "cudaStreamCreate");
  nccl_check(ncclCommInitRank(&handles_->comm, size, id, rank), "ncclCommInitRank");
}

NcclContext::~NcclContext() {
  if (handles_->comm) ncclCommDestroy(handles_->comm);
  if (handles_->stream) cudaStreamDestroy(handles_->stream);
  delete handles_;
}

void NcclContext::allreduce_sum(float* device_buffer, size_t n) {
  nccl_check(ncclAllReduce(device_buffer, device_buffer, n, ncclFloat, ncclSum, handles_->comm, handles_->stream),
             "ncclAllReduce");
  cuda_check(cudaStreamSynchronize(handles_->stream), "cudaStreamSynchronize");
}

// An event per hand-over between the streams: destroying it once the wait is
// queued is allowed (CUDA frees it when the work it marks has run).
static void hand_over(cudaStream_t from, cudaStream_t to) {
  cudaEvent_t event = nullptr;
  cuda_check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  cuda_check(cudaEventRecord(event, from), "cudaEventRecord");
  cuda_check(cudaStreamWaitEvent(to, event, 0), "cudaStreamWaitEvent");
  cuda_check(cudaEventDestroy(event), "cudaEventDestroy");
}

void NcclContext::allreduce_sum_after(float* device_buffer, size_t n, void* compute_stream) {
  hand_over(static_cast<cudaStream_t>(compute_stream), handles_->stream);
  nccl_check(ncclAllReduce(device_buffer, device_buffer, n, ncclFloat, ncclSum, handles_->comm, handles_->stream),
             "ncclAllReduce");
}

void NcclContext::join(void* compute_stream) { hand_over(handles_->stream, static_cast<cudaStream_t>(compute_stream)); }

std::string NcclContext::async_error() const {
  ncclResult_t state = ncclSuccess;
  if (ncclCommGetAsyncError(handles_->comm, &state) != ncclSuccess) return "ncclCommGetAsyncError failed";
  return state == ncclSuccess ? std::string() : std::string(ncclGetErrorString(state));
}

}  // namespace xx

// Which transport carries which traffic. Each kind of traffic has an ordered
// list of ops; the first one whose enabled() holds serves it for the whole
// run, and start-up prints the choice and why the ones before it were passed
// over:
//
//   dense all-reduce   nccl (buffers on a CUDA device, NCCL built, a GPU
//                      for every rank of each node)                   >  mpi
//   sparse exchange    ucx (UCX started on every rank)              >  mpi
//
// The deck may name one (sync ... transport nccl|mpi, compress ... transport
// ucx|mpi); one that cannot serve here is an input error, with its reason.
// Under the device emulation (core/device_memory.h) "nccl" is emulated: the
// same device-side path, its sums run by MPI on the host buffers.
//
// Each transport's handles live in its own context: the MPI communicator,
// NcclContext (comm/nccl.h), the UCX worker inside the UCX PayloadExchange
// (comm/exchange.h). Contexts are created only for traffic the deck has:
// no UCX worker without `compress`.
#pragma once
#include <mpi.h>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>
#include "comm/exchange.h"
#include "comm/comm_stats.h"
#include "deck/config.h"

namespace xx {

// In-place sum of a float buffer over a group of ranks, blocking.
class DenseAllreduce {
 public:
  virtual ~DenseAllreduce() = default;
  virtual const char* name() const = 0;
  virtual DenseTransport transport() const = 0;  // which of the deck's sync ... transport this is
  virtual bool enabled() const = 0;
  virtual std::string disabled_reason() const = 0;  // empty when enabled
  // group: a communicator holding this rank (the world, or a topology group).
  virtual void execute(float* buffer, int64_t n, MPI_Comm group, CommStats& stats) = 0;
  // A device transport may queue instead (NCCL on its own stream): start()
  // returns at once, the sum to begin when the kernels queued so far on the
  // execution space have run (an event, not a host fence), and finish()
  // makes the execution space wait for every sum started since the last.
  virtual bool queues() const { return false; }
  virtual void start(float* buffer, int64_t n, MPI_Comm group, CommStats& stats) { execute(buffer, n, group, stats); }
  virtual void finish(CommStats& stats) {}
};

// Whether MPI may be handed kernel memory: yes where it is host memory, and
// on a device where this MPI is CUDA-aware (Open MPI's MPIX_Query_cuda_support);
// no under the device emulation (core/device_memory.h). Where not, the dense
// all-reduce over MPI stages each bucket through host memory.
bool mpi_reaches_kernel_memory();

// What stands between NCCL and the dense sums, each rank's facts agreed
// over the world (so every rank makes the same choice).
struct NcclFacts {
  bool built = false;              // this binary has NCCL
  bool buffers_on_device = false;  // the gradients live in GPU memory
  bool emulated = false;           // the device emulation stands in for both
  int ranks_on_node = 1;           // the most ranks sharing one node
  int gpus_on_node = 0;            // the GPUs visible on that node
};
NcclFacts gather_nccl_facts(MPI_Comm world);
// Every obstacle, "; "-joined; empty when NCCL can carry the sums.
std::string nccl_obstacles(const NcclFacts& facts);

class Communicator {
 public:
  // Collective over world. dense_transport: "auto", "nccl" or "mpi";
  // sparse_transport: "" (no sparse traffic), "auto", "ucx" or "mpi".
  // Throws InputError when the deck asks for a transport that cannot start.
  // sparse: the compressed exchange's transport, or none (no phase compresses)
  Communicator(MPI_Comm world, DenseTransport dense, std::optional<SparseTransport> sparse);
  ~Communicator();

  DenseAllreduce& dense() { return *dense_; }
  PayloadExchange& sparse();  // only when constructed with a sparse transport
  bool has_sparse() const { return sparse_ != nullptr; }
  // One line per kind of traffic: the op serving it, and the ones passed over.
  std::string report() const;

 private:
  std::vector<std::unique_ptr<DenseAllreduce>> dense_ops_;
  std::vector<std::unique_ptr<PayloadExchange>> sparse_ops_;
  DenseAllreduce* dense_ = nullptr;
  PayloadExchange* sparse_ = nullptr;
};

}  // namespace xx

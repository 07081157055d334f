// The expert all-to-all over MPI (core/expert_exchange.h): one
// MPI_Ialltoallv per direction, rows as a contiguous datatype. MPI's
// all-to-all places every source's rows at fixed displacements, so the
// result never depends on timing. Where the kernels' memory is not the
// host's (a CUDA build), the rows go through host buffers: the start copies
// them out, the wait copies the arrivals in (an MPI that reads device memory
// would not need it, but nothing here can tell one apart).
// XX_EMULATE_LINK_MBPS=R (an experiment's setting, said at start-up): the
// rows from other ranks arrive no sooner than their bytes take at R MB/s
// from the start, as over a link that moves them with hardware of its own (a
// NIC, a GPU's copy engines) while the rank computes; the wait sleeps out
// the rest. On one machine's shared memory the CPUs themselves copy the
// rows, inside the wait, and there is nothing for other work to hide.
#pragma once
#include <mpi.h>
#include <map>
#include <string>
#include <vector>
#include "comm/ops.h"
#include "core/expert_exchange.h"
#include "core/views.h"

namespace xx {

class MpiExpertExchange final : public ExpertExchange {
 public:
  // Not owned. `staged`: through host buffers (by default where MPI cannot read kernel memory: comm/ops.h).
  explicit MpiExpertExchange(MPI_Comm group, bool staged = !mpi_reaches_kernel_memory());
  ~MpiExpertExchange() override;
  int ranks() const override { return ranks_; }
  int rank() const override { return rank_; }
  void start_counts(const int32_t* send, int32_t* recv, int n) override;
  void start(const void* send, const std::vector<int64_t>& send_rows, void* recv,
             const std::vector<int64_t>& recv_rows, int64_t row_bytes) override;
  void wait() override;
  ExchangeStats& stats() override { return stats_; }
  std::string describe() const override;

 private:
  MPI_Datatype row_type(int64_t row_bytes);
  MPI_Comm group_;
  int ranks_ = 1, rank_ = 0;
  MPI_Request request_ = MPI_REQUEST_NULL;
  double started_ = 0;
  double link_bytes_per_s_ = 0;  // XX_EMULATE_LINK_MBPS; 0: off
  double arrival_ = 0;           // ... the soonest the rows started last may be there
  std::vector<int> send_counts_, send_displs_, recv_counts_, recv_displs_;
  std::map<int64_t, MPI_Datatype> row_types_;
  bool staged_ = false;
  std::vector<char> send_host_, recv_host_;  // staged: the rows on the host
  void* recv_ = nullptr;                     // staged rows: where the arrivals go; null for counts
  ExchangeStats stats_;
};

}  // namespace xx

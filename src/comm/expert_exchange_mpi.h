// The expert all-to-all over MPI (core/expert_exchange.h): one
// MPI_Ialltoallv per direction, rows as a contiguous datatype. MPI's
// all-to-all places every source's rows at fixed displacements, so the
// result never depends on timing.
#pragma once
#include <mpi.h>
#include <map>
#include <vector>
#include "core/expert_exchange.h"

namespace xx {

class MpiExpertExchange final : public ExpertExchange {
 public:
  explicit MpiExpertExchange(MPI_Comm group);  // not owned
  ~MpiExpertExchange() override;
  int ranks() const override { return ranks_; }
  int rank() const override { return rank_; }
  void counts(const int32_t* send, int32_t* recv, int n) override;
  void start(const void* send, const std::vector<int64_t>& send_rows, void* recv,
             const std::vector<int64_t>& recv_rows, int64_t row_bytes) override;
  void wait() override;
  ExchangeStats& stats() override { return stats_; }

 private:
  MPI_Datatype row_type(int64_t row_bytes);
  MPI_Comm group_;
  int ranks_ = 1, rank_ = 0;
  MPI_Request request_ = MPI_REQUEST_NULL;
  double started_ = 0;
  std::vector<int> send_counts_, send_displs_, recv_counts_, recv_displs_;
  std::map<int64_t, MPI_Datatype> row_types_;
  ExchangeStats stats_;
};

}  // namespace xx

// Under expert parallelism (deck: moe ... ep N) the routed experts of a MoE
// layer are spread over the N ranks of a group, and each rank's tokens travel
// to the rank that holds their expert and back: an all-to-all. The model asks
// for it through this interface and stays free of MPI; comm/ implements it
// (MPI_Ialltoallv; NCCL grouped send/recv in CUDA builds).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace xx {

struct ExchangeStats {
  int64_t rounds = 0, bytes_sent = 0;
  double seconds = 0;         // wall time from start to arrival, summed
  double waited = 0;          // of it, spent in wait(): what the work in between did not hide
  ExchangeStats& operator+=(const ExchangeStats& o) {
    rounds += o.rounds, bytes_sent += o.bytes_sent, seconds += o.seconds, waited += o.waited;
    return *this;
  }
};

class ExpertExchange {
 public:
  virtual ~ExpertExchange() = default;
  virtual int ranks() const = 0;  // N
  virtual int rank() const = 0;   // this rank's place in the group
  // Starts moving n ints to every rank of the group (send[r * n ..]);
  // recv[r * n ..] arrive from rank r. counts: started and waited for.
  virtual void start_counts(const int32_t* send, int32_t* recv, int n) = 0;
  void counts(const int32_t* send, int32_t* recv, int n) { start_counts(send, recv, n), wait(); }
  // Starts moving send_rows[r] rows of row_bytes bytes each to rank r (rows
  // for rank 0 first); recv_rows[r] rows arrive from rank r, in rank order.
  virtual void start(const void* send, const std::vector<int64_t>& send_rows, void* recv,
                     const std::vector<int64_t>& recv_rows, int64_t row_bytes) = 0;
  virtual void wait() = 0;  // what was started last has arrived
  virtual ExchangeStats& stats() = 0;
  virtual std::string describe() const = 0;  // how the rows travel, for the start-up table
};

}  // namespace xx

#include "comm/expert_exchange_mpi.h"
#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <thread>
#include <fmt/format.h>
#include "core/error.h"
#include "core/views.h"

namespace xx {

MpiExpertExchange::MpiExpertExchange(MPI_Comm group, bool staged) : group_(group), staged_(staged) {
  MPI_Comm_size(group, &ranks_);
  MPI_Comm_rank(group, &rank_);
  if (const char* rate = std::getenv("XX_EMULATE_LINK_MBPS")) {
    char* end = nullptr;
    const double mbps = std::strtod(rate, &end);
    if (end == rate || *end != '\0' || !(mbps > 0))
      input_error("XX_EMULATE_LINK_MBPS={}: expected a rate in MB/s above 0 (the expert all-to-all's emulated link)", rate);
    link_bytes_per_s_ = mbps * 1e6;
  }
}

MpiExpertExchange::~MpiExpertExchange() {
  for (auto& [bytes, type] : row_types_) MPI_Type_free(&type);
}

// The counts are the host's (ints the routing read back).
void MpiExpertExchange::start_counts(const int32_t* send, int32_t* recv, int n) {
  if (request_ != MPI_REQUEST_NULL) throw std::logic_error("expert exchange: a start before the last one's wait");
  started_ = MPI_Wtime(), recv_ = nullptr, arrival_ = 0;
  MPI_Ialltoall(send, n, MPI_INT32_T, recv, n, MPI_INT32_T, group_, &request_);
}

// One contiguous datatype per row size: counts and displacements in rows stay
// far below INT_MAX where bytes would not.
MPI_Datatype MpiExpertExchange::row_type(int64_t row_bytes) {
  auto it = row_types_.find(row_bytes);
  if (it != row_types_.end()) return it->second;
  MPI_Datatype t;
  MPI_Type_contiguous(int(row_bytes), MPI_BYTE, &t);
  MPI_Type_commit(&t);
  return row_types_[row_bytes] = t;
}

void MpiExpertExchange::start(const void* send, const std::vector<int64_t>& send_rows, void* recv,
                              const std::vector<int64_t>& recv_rows, int64_t row_bytes) {
  if (request_ != MPI_REQUEST_NULL) throw std::logic_error("expert exchange: a start before the last one's wait");
  ExecSpace().fence();  // the rows are written before MPI reads them
  started_ = MPI_Wtime();
  send_counts_.assign(ranks_, 0), send_displs_.assign(ranks_, 0);
  recv_counts_.assign(ranks_, 0), recv_displs_.assign(ranks_, 0);
  int64_t s = 0, r = 0;
  for (int q = 0; q < ranks_; ++q) {
    send_counts_[q] = int(send_rows[q]), send_displs_[q] = int(s), s += send_rows[q];
    recv_counts_[q] = int(recv_rows[q]), recv_displs_[q] = int(r), r += recv_rows[q];
  }
  const MPI_Datatype t = row_type(row_bytes);
  if (staged_) {  // out through the host
    using Bytes = Kokkos::View<char*, MemSpace, Unmanaged>;
    using HostBytes = Kokkos::View<char*, Kokkos::HostSpace, Unmanaged>;
    send_host_.resize(size_t(s * row_bytes)), recv_host_.resize(size_t(r * row_bytes));
    Kokkos::deep_copy(HostBytes(send_host_.data(), send_host_.size()),
                      Bytes(static_cast<char*>(const_cast<void*>(send)), send_host_.size()));
    send = send_host_.data(), recv_ = recv, recv = recv_host_.data();
  } else {
    recv_ = nullptr;
  }
  MPI_Ialltoallv(send, send_counts_.data(), send_displs_.data(), t, recv, recv_counts_.data(), recv_displs_.data(), t,
                 group_, &request_);
  stats_.rounds += 1;
  stats_.bytes_sent += (s - send_rows[rank_]) * row_bytes;  // what leaves this rank
  arrival_ = link_bytes_per_s_ > 0 ? started_ + double((r - recv_rows[rank_]) * row_bytes) / link_bytes_per_s_ : 0;
}

void MpiExpertExchange::wait() {
  const double t0 = MPI_Wtime();
  MPI_Wait(&request_, MPI_STATUS_IGNORE);
  if (const double rest = arrival_ - MPI_Wtime(); rest > 0)  // the emulated link: its bytes are still on the way
    std::this_thread::sleep_for(std::chrono::duration<double>(rest));
  if (recv_)  // staged rows: in from the host
    Kokkos::deep_copy(Kokkos::View<char*, MemSpace, Unmanaged>(static_cast<char*>(recv_), recv_host_.size()),
                      Kokkos::View<char*, Kokkos::HostSpace, Unmanaged>(recv_host_.data(), recv_host_.size()));
  const double t1 = MPI_Wtime();
  stats_.waited += t1 - t0, stats_.seconds += t1 - started_;
}

std::string MpiExpertExchange::describe() const {
  const std::string how = staged_ ? "MPI_Ialltoallv through host buffers (this MPI cannot read kernel memory)" : "MPI_Ialltoallv";
  if (link_bytes_per_s_ <= 0) return how;
  return fmt::format("{} over an emulated link of {:g} MB/s (XX_EMULATE_LINK_MBPS)", how, link_bytes_per_s_ / 1e6);
}

}  // namespace xx

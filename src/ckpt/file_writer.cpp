#include "ckpt/file_writer.h"
#include <algorithm>
#include <cstdio>
#include <deque>
#include <fmt/format.h>
#include "ckpt/h5_writer.h"
#include "ckpt/schema.h"

namespace xx {
namespace {

// Every rank of comm with parallel HDF5 (MPI-IO); each rank writes its own /ranks/<r>.
class CollectiveWriter : public FileWriter {
 public:
  explicit CollectiveWriter(MPI_Comm comm) : comm_(comm) {}
  std::string write(const EncodedCheckpoint& enc, WriteGuard& guard) override {
    int rank = 0, world = 1;
    MPI_Comm_rank(comm_, &rank);
    MPI_Comm_size(comm_, &world);
    RankParts ranks;
    ranks.at.assign(world, std::vector<const void*>(enc.parts.size(), nullptr));
    for (size_t i = 0; i < enc.parts.size(); ++i) ranks.at[rank][i] = enc.parts[i].data;
    try {
      H5Writer w(comm_, guard);
      write_file(w, enc, world, ranks);
    } catch (const WriteFailed& e) {
      return e.what();  // thrown on every rank at the same sync; the file is closed
    }
    return "";
  }

 private:
  MPI_Comm comm_;
};

// Every rank's /ranks/<r> is gathered onto rank 0, which alone builds the
// file in memory (HDF5's core driver) and writes it with POSIX calls: HDF5
// never meets a full disk (h5_writer.h). The other ranks wait in the
// broadcast of its outcome, so nothing can strand them.
class Rank0Writer : public FileWriter {
 public:
  explicit Rank0Writer(MPI_Comm comm) : comm_(comm) {}
  std::string write(const EncodedCheckpoint& enc, WriteGuard& guard) override {
    int rank = 0, world = 1;
    MPI_Comm_rank(comm_, &rank);
    MPI_Comm_size(comm_, &world);
    std::deque<std::vector<char>> received;  // the other ranks' bytes, which `ranks` points into
    RankParts ranks;
    if (enc.has_ranks) ranks = gather(enc, rank, world, received);
    std::string error;
    if (rank == 0) try {
        H5Writer w(guard, bytes_at_least(enc, world));
        write_file(w, enc, world, ranks);
      } catch (const WriteFailed& e) {
        error = e.what();
      }
    // Nothing of a failed file may stay open: HDF5 would close it again at exit.
    if (const ssize_t left = rank == 0 && !error.empty() ? H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL) : 0; left > 0)
      std::fprintf(stderr, "xuanxue: warning: HDF5 still holds %zd open object(s) after the failed write of %s\n",
                   left, guard.tmp().c_str());
    broadcast_text(error, 0, comm_);
    return error;
  }

 private:
  // Collective: rank 0 gets every rank's parts (their sizes are in
  // enc.meta), rank after rank, point to point in pieces of at most 1 GiB:
  // MPI counts are int, and one rank's tensor may pass 2 GiB.
  RankParts gather(const EncodedCheckpoint& enc, int rank, int world, std::deque<std::vector<char>>& received) {
    constexpr int64_t kPiece = int64_t(1) << 30;
    const size_t parts = enc.parts.size();
    auto check = [](int rc, const char* what) {
      if (rc != MPI_SUCCESS)
        throw std::runtime_error(fmt::format("checkpoint: gathering the ranks' state: {} failed", what));
    };
    RankParts out;
    out.gathered = true;
    if (rank == 0) {
      out.at.assign(world, std::vector<const void*>(parts, nullptr));
      for (size_t i = 0; i < parts; ++i) out.at[0][i] = enc.parts[i].data;
    }
    for (int r = 1; r < world; ++r) {
      if (rank != 0 && rank != r) continue;
      for (size_t i = 0; i < parts; ++i) {
        const int64_t bytes = enc.count(r, i) * int64_t(H5Tget_size(enc.parts[i].type));
        char* into = nullptr;
        if (rank == 0) into = received.emplace_back(size_t(bytes)).data(), out.at[r][i] = into;
        const char* from = static_cast<const char*>(enc.parts[i].data);
        for (int64_t done = 0; done < bytes; done += kPiece) {
          const int n = int(std::min(kPiece, bytes - done));
          if (rank == 0) check(MPI_Recv(into + done, n, MPI_BYTE, r, 0, comm_, MPI_STATUS_IGNORE), "MPI_Recv");
          else check(MPI_Send(from + done, n, MPI_BYTE, 0, 0, comm_), "MPI_Send");
        }
      }
    }
    return out;
  }

  MPI_Comm comm_;
};

}  // namespace

std::unique_ptr<FileWriter> make_file_writer(CheckpointWriter writer, MPI_Comm comm) {
  if (writer == CheckpointWriter::rank0) return std::make_unique<Rank0Writer>(comm);
  return std::make_unique<CollectiveWriter>(comm);
}

}  // namespace xx

// write_encoded: one checkpoint onto the disk, its steps in order (room,
// the file, publish) under the failure protocol (write_guard.h).
#include "ckpt/checkpoint.h"
#include <filesystem>
#include "ckpt/encoded.h"
#include "ckpt/file_writer.h"
#include "ckpt/h5.h"
#include "ckpt/store.h"
#include "ckpt/write_guard.h"

namespace xx {
namespace fs = std::filesystem;

std::string write_encoded(MPI_Comm comm, const std::string& dir, const EncodedCheckpoint& enc,
                          CheckpointWriter writer) {
  h5::quiet();
  int rank = 0, world = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &world);
  const std::string path = (fs::path(dir) / enc.name).string();
  WriteGuard guard(path, rank);
  // Every failure below ends up in `error`, the same text on every rank.
  std::string error;
  if (rank == 0) error = prepare_directory(dir);
  if (rank == 0 && error.empty()) error = reserve_space(guard.tmp(), bytes_at_least(enc, world));
  broadcast_text(error, 0, comm);
  if (error.empty()) error = make_file_writer(writer, comm)->write(enc, guard);
  // Rank 0 makes it the checkpoint; the broadcast is the barrier that keeps
  // every rank here until it is on disk.
  if (error.empty()) {
    if (rank == 0) error = publish(guard.tmp(), dir, enc.name);
    broadcast_text(error, 0, comm);
  }
  if (error.empty()) return path;
  std::string line;
  if (rank == 0) {
    std::error_code ec;
    fs::remove(guard.tmp(), ec);
    line = failure_line(path, error);
  }
  broadcast_text(line, 0, comm);
  throw CheckpointWriteError(line);  // given up together: the guard's deadline ends with it
}

std::string write_checkpoint(MPI_Comm comm, const std::string& dir, const Frame& frame,
                             const CheckpointData& data, const RankState* mine, const CheckpointFormat& format,
                             ChainBase* chain) {
  return write_encoded(comm, dir, *encode_checkpoint(comm, frame, data, mine, format, chain));
}

std::string write_checkpoint(const std::string& dir, const Frame& frame, const CheckpointData& data) {
  fs::create_directories(dir);
  const auto encoded = encode_checkpoint(MPI_COMM_SELF, frame, data, nullptr, {});
  return write_encoded(MPI_COMM_SELF, dir, *encoded, CheckpointWriter::rank0);  // one process: no MPI-IO needed
}

}  // namespace xx

// Who writes the file (deck: checkpoint ... writer collective|rank0, the
// CheckpointWriter of checkpoint.h); the file is the same either way.
#pragma once
#include <mpi.h>
#include <memory>
#include <string>
#include "ckpt/checkpoint.h"
#include "ckpt/encoded.h"
#include "ckpt/write_guard.h"

namespace xx {

class FileWriter {
 public:
  virtual ~FileWriter() = default;
  // Collective over the writer's communicator: `enc` as the file
  // guard.tmp(). Returns "" or the error, the same on every rank.
  virtual std::string write(const EncodedCheckpoint& enc, WriteGuard& guard) = 0;
};

// The writer of kind `writer` over comm.
std::unique_ptr<FileWriter> make_file_writer(CheckpointWriter writer, MPI_Comm comm);

}  // namespace xx

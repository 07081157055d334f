// Writing the Trainer's checkpoints (docs/CHECKPOINT.md): each snapshot is
// encoded on the training thread (the codec kernels: Kokkos' host backend
// shares its reduction scratch between threads), then its file is written in
// place or, under `checkpoint ... async on`, by one background thread at a
// time (HDF5 is not thread-safe) on a communicator of its own, so its
// collectives never meet the training's. One console line per checkpoint.
#pragma once
#include <mpi.h>
#include <atomic>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include "ckpt/checkpoint.h"
#include "deck/config.h"

namespace xx {

class CheckpointSaver {
 public:
  using Say = std::function<void(const std::string&)>;
  // `file_layout`: the whole model (what the file holds); `say`: a console line.
  CheckpointSaver(MPI_Comm comm, const Frame& frame, Say say);
  // Waits for a write in flight; a failure nobody waited for is printed (a
  // destructor cannot throw it).
  ~CheckpointSaver();
  CheckpointSaver(const CheckpointSaver&) = delete;
  CheckpointSaver& operator=(const CheckpointSaver&) = delete;

  // Collective: waits for the previous write, takes the snapshot (`take`
  // fills the base and this rank's own state), encodes it against the
  // chain and writes it into DIR (RUN_DIR/ckpt) as `settings` say.
  void save(const CheckpointConfig& settings, const std::string& dir,
            const std::function<CheckpointData(RankState&)>& take);
  // Waits for the background write, logs it and rethrows its error. Not collective.
  void finish();
  // A background write ended in CheckpointWriteError (every rank's writers
  // fail alike, but the ranks see it at different steps: the step boundary agrees on it).
  bool failed() const { return failed_; }

 private:
  struct Written {
    std::string path, kind, how;    // file, chain kind, "diff lossless" / "full copies"
    std::string writer;             // "collective" / "rank 0 writes"
    double stall = 0, write_s = 0;  // training-thread seconds in save; seconds the write took
    double waited = 0;              // of the stall: waiting for the previous write (async on)
    bool async = false;
  };
  void write_now(MPI_Comm comm, const std::string& dir, const EncodedCheckpoint& encoded, CheckpointWriter writer,
                 int64_t keep);
  bool async_possible();
  void log();

  MPI_Comm comm_;
  int rank_ = 0;
  const Frame& frame_;  // the whole model, as files hold it (the job's Placement owns it)
  Say say_;
  ChainBase chain_;  // diff across time: the chain's base
  Written last_;
  std::thread writer_;
  MPI_Comm writer_comm_ = MPI_COMM_NULL;  // dup of comm_, made at the first background write
  std::exception_ptr error_;              // the background write's failure, rethrown by finish
  std::atomic<bool> failed_{false};
  int async_ok_ = -1;                     // MPI_THREAD_MULTIPLE provided (-1: not asked yet)
};

}  // namespace xx

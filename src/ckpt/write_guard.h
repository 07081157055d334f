// A write that fails (docs/RESILIENCE.md, "A failed checkpoint write").
//
// A write fails on some ranks only: with MPI-IO's collective buffering only
// the aggregators touch the disk, so a full disk fails rank 0's pwritev
// inside H5Dwrite while rank 1's returns success; rank 0's rename and
// `latest` are its own. Throwing there hung the job: rank 0 unwound into
// H5Fclose (collective) while rank 1 had gone on to the next dataset's
// H5Dwrite, each waiting for the other forever. So nothing throws where it
// fails: a rank records its first error, every rank goes on making the same
// calls, and at each sync point agree_on_error tells every rank whether any
// rank failed; then all of them give the write up from the same place.
//
// WriteGuard is that protocol's state for one write, on the thread that
// makes it, with two backstops for a failure deep inside HDF5 or MPI-IO that
// leaves the ranks unable to meet again:
//  - MPI-IO errors are recorded where they happen, with their errno, by an
//    error handler that every file opened during the write inherits: the
//    message says "No space left on device".
//  - a deadline: kFailureDeadline seconds after this rank first knows of a
//    failure (arm), unless the write is given up cleanly by then (the guard
//    ends), a thread of the guard prints the error, removes the .tmp and
//    ends the job with MPI_Abort (exit code kExitWriteFailed).
#pragma once
#include <mpi.h>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace xx {

class WriteGuard {
 public:
  static constexpr double kFailureDeadline = 10;  // seconds

  // The write of checkpoint `path` (through path + ".tmp") by this rank of the writers.
  WriteGuard(const std::string& path, int rank);
  ~WriteGuard();  // the write is over: the deadline is off
  WriteGuard(const WriteGuard&) = delete;
  WriteGuard& operator=(const WriteGuard&) = delete;

  const std::string& path() const { return path_; }
  const std::string& tmp() const { return tmp_; }
  // This rank's first MPI-IO error in the write ("" : none).
  std::string io_error() const;
  // From now on this rank has kFailureDeadline seconds to give the write up
  // (once per write: later calls keep the first error).
  void arm(const std::string& error);

 private:
  static void on_file_error(MPI_File*, int* code, ...);
  void record_io_error(int code, int saved_errno);
  void arm_locked(const std::string& error);

  std::string path_, tmp_;
  int rank_ = 0;
  MPI_Errhandler previous_ = MPI_ERRHANDLER_NULL;  // the files' handler before this write
  mutable std::mutex mutex_;
  std::condition_variable over_;
  std::string io_error_;
  bool armed_ = false, done_ = false;
  std::thread deadline_;
};

// The one line a failed write ends the job with: the file, the error, the
// last good checkpoint.
std::string failure_line(const std::string& path, const std::string& error);

// `s` on every rank of comm as `root` holds it.
void broadcast_text(std::string& s, int root, MPI_Comm comm);

// Collective: the lowest failing rank's error (`error` "" on a rank that did
// not fail) on every rank, "" when none failed; `failing_rank`: that rank.
std::string agree_on_error(const std::string& error, MPI_Comm comm, int* failing_rank = nullptr);

}  // namespace xx

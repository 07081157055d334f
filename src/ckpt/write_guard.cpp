#include "ckpt/write_guard.h"
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fmt/format.h>
#include "ckpt/checkpoint.h"
#include "ckpt/h5.h"
#include "ckpt/store.h"

namespace xx {
namespace fs = std::filesystem;

namespace {

// The guard of the write this thread is making: MPI calls its file error
// handler on the thread whose call failed, with no room for a pointer.
thread_local WriteGuard* t_guard = nullptr;

// An MPI error code as the reason a file operation failed: the errno text
// where MPI's class names one, else errno at the failure, and MPI's words.
std::string io_error_text(int code, int saved_errno) {
  int cls = MPI_ERR_OTHER, n = 0;
  MPI_Error_class(code, &cls);
  char buf[MPI_MAX_ERROR_STRING] = {0};
  MPI_Error_string(code, buf, &n);
  int e = saved_errno;
  if (cls == MPI_ERR_NO_SPACE) e = ENOSPC;
  if (cls == MPI_ERR_QUOTA) e = EDQUOT;
  if (cls == MPI_ERR_READ_ONLY) e = EROFS;
  if (cls == MPI_ERR_NO_SUCH_FILE) e = ENOENT;
  if (cls == MPI_ERR_ACCESS) e = EACCES;
  const std::string mpi(buf, size_t(std::max(n, 0)));
  return e ? fmt::format("{} (MPI-IO: {})", h5::errno_text(e), mpi) : fmt::format("MPI-IO: {}", mpi);
}

}  // namespace

WriteGuard::WriteGuard(const std::string& path, int rank) : path_(path), tmp_(path + ".tmp"), rank_(rank) {
  t_guard = this;
  // The default of every file opened from now on (HDF5 opens its own).
  MPI_Errhandler handler;
  MPI_File_get_errhandler(MPI_FILE_NULL, &previous_);
  MPI_File_create_errhandler(on_file_error, &handler);
  MPI_File_set_errhandler(MPI_FILE_NULL, handler);
  MPI_Errhandler_free(&handler);  // (the files hold it)
}

WriteGuard::~WriteGuard() {
  {
    std::lock_guard lock(mutex_);
    done_ = true;
  }
  over_.notify_all();
  if (deadline_.joinable()) deadline_.join();
  MPI_File_set_errhandler(MPI_FILE_NULL, previous_);
  if (previous_ != MPI_ERRORS_RETURN && previous_ != MPI_ERRORS_ARE_FATAL) MPI_Errhandler_free(&previous_);
  t_guard = nullptr;
}

std::string WriteGuard::io_error() const {
  std::lock_guard lock(mutex_);
  return io_error_;
}

void WriteGuard::arm(const std::string& error) {
  std::lock_guard lock(mutex_);
  arm_locked(error);
}

void WriteGuard::arm_locked(const std::string& error) {
  if (armed_) return;
  armed_ = true;
  const std::string line = fmt::format("xuanxue: rank {}: {} (the ranks could not give the write up together within "
                                       "{:.0f} s: ending the job)", rank_, failure_line(path_, error), kFailureDeadline);
  deadline_ = std::thread([this, line] {
    std::unique_lock lock(mutex_);
    if (over_.wait_for(lock, std::chrono::duration<double>(kFailureDeadline), [this] { return done_; })) return;
    std::fprintf(stderr, "%s\n", line.c_str());
    std::fflush(stderr);
    ::unlink(tmp_.c_str());
    MPI_Abort(MPI_COMM_WORLD, kExitWriteFailed);
  });
}

void WriteGuard::record_io_error(int code, int saved_errno) {
  std::lock_guard lock(mutex_);
  if (!io_error_.empty()) return;
  io_error_ = io_error_text(code, saved_errno);
  arm_locked(io_error_);
}

void WriteGuard::on_file_error(MPI_File*, int* code, ...) {
  const int saved_errno = errno;
  if (t_guard) t_guard->record_io_error(*code, saved_errno);
}

std::string failure_line(const std::string& path, const std::string& error) {
  const std::string dir = fs::path(path).parent_path().string();
  return fmt::format("checkpoint {} could not be written: {}; the last good checkpoint is {} (resume with "
                     "-resume auto once the cause is fixed); the partial {}.tmp was removed",
                     path, error, last_good_checkpoint(dir), fs::path(path).filename().string());
}

void broadcast_text(std::string& s, int root, MPI_Comm comm) {
  int n = int(s.size());
  MPI_Bcast(&n, 1, MPI_INT, root, comm);
  s.resize(size_t(n));
  MPI_Bcast(s.data(), n, MPI_CHAR, root, comm);
}

std::string agree_on_error(const std::string& error, MPI_Comm comm, int* failing_rank) {
  int rank = 0, world = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &world);
  int first = error.empty() ? world : rank;
  MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, comm);
  if (failing_rank) *failing_rank = first;
  if (first == world) return "";
  std::string agreed = error;
  broadcast_text(agreed, first, comm);
  return agreed;
}

}  // namespace xx

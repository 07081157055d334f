// One job per run directory (docs/RESILIENCE.md): rank 0 takes an exclusive,
// non-blocking flock on RUN_DIR/.lock before anything is written into
// RUN_DIR and holds it for the process's life. The OS drops the lock when the
// process ends, crash or not, so a stale .lock file never blocks a later job.
//
// The file holds who took it (host, pid, Slurm job id if any, start time), one
// "key value" per line, for the message a second job prints when it finds the
// lock taken.
#pragma once
#include <optional>
#include <string>

namespace xx {

class RunDirLock {
 public:
  // Who holds a lock, as read from the file ("?" for what it does not say).
  struct Holder {
    std::string host = "?", pid = "?", slurm_job, started = "?";
  };

  // Creates run_dir if needed and takes its lock. Returns the lock, or the
  // holder's line when another process holds it:
  //   xuanxue: RUN_DIR is in use by another job (host H, pid P, started T; its
  //   lock RUN_DIR/.lock); expected one job per run directory
  // Throws std::runtime_error when the file cannot be created or locked for
  // another reason (a read-only directory, a file system without locks).
  static std::optional<RunDirLock> take(const std::string& run_dir, std::string& refusal);

  RunDirLock(RunDirLock&& o) noexcept
      : fd_(o.fd_), path_(std::move(o.path_)), created_(std::move(o.created_)), created_file_(o.created_file_) {
    o.fd_ = -1;
  }
  RunDirLock& operator=(RunDirLock&& o) noexcept;
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;
  ~RunDirLock();  // closing the file releases the lock

  const std::string& path() const { return path_; }

  // For a start-up refused as bad input after the lock was taken: removes the
  // lock file if take() created it, then the directories take() created, where
  // still empty, so a refused deck leaves no run directory behind and an
  // existing one as it was. Releases the lock.
  void abandon();
  static Holder read_holder(const std::string& lock_path);

 private:
  RunDirLock(int fd, std::string path, std::string created, bool created_file)
      : fd_(fd), path_(std::move(path)), created_(std::move(created)), created_file_(created_file) {}
  int fd_ = -1;
  std::string path_;
  std::string created_;  // the topmost directory take() created ("" if RUN_DIR existed)
  bool created_file_ = false;  // the .lock file did not exist before take()
};

}  // namespace xx

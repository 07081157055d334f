#include "io/run_dir_lock.h"
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <fmt/format.h>

namespace xx {

namespace {

std::string hostname() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "?";
  return buf;
}

std::string now_iso8601() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S%z", &tm);
  return buf;
}

}  // namespace

RunDirLock& RunDirLock::operator=(RunDirLock&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_, path_ = std::move(o.path_), created_ = std::move(o.created_), created_file_ = o.created_file_;
    o.fd_ = -1;
  }
  return *this;
}

RunDirLock::~RunDirLock() {
  if (fd_ >= 0) ::close(fd_);
}

void RunDirLock::abandon() {
  if (fd_ < 0) return;
  std::error_code ec;
  if (created_file_) std::filesystem::remove(path_, ec);
  ::close(fd_);
  fd_ = -1;
  if (created_.empty()) return;
  // RUN_DIR and its parents up to the topmost one created, each only if empty
  const std::filesystem::path top(created_);
  for (auto dir = std::filesystem::path(path_).parent_path(); !dir.empty(); dir = dir.parent_path()) {
    if (!std::filesystem::remove(dir, ec) || ec) break;  // not empty, or gone: stop
    if (dir == top) break;
  }
}

RunDirLock::Holder RunDirLock::read_holder(const std::string& lock_path) {
  Holder h;
  std::ifstream in(lock_path);
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    std::string key, value;
    fields >> key;
    std::getline(fields >> std::ws, value);
    if (value.empty()) continue;
    if (key == "host") h.host = value;
    else if (key == "pid") h.pid = value;
    else if (key == "slurm_job") h.slurm_job = value;
    else if (key == "started") h.started = value;
  }
  return h;
}

std::optional<RunDirLock> RunDirLock::take(const std::string& run_dir, std::string& refusal) {
  refusal.clear();
  std::error_code ec;
  std::string created;  // the topmost directory that does not exist yet
  for (auto dir = std::filesystem::absolute(run_dir, ec).lexically_normal(); !dir.empty() && !ec;
       dir = dir.parent_path()) {
    if (std::filesystem::exists(dir, ec)) break;
    created = dir.string();
    if (dir == dir.parent_path()) break;
  }
  std::filesystem::create_directories(run_dir, ec);
  if (ec) throw std::runtime_error(fmt::format("cannot create the run directory {}: {}", run_dir, ec.message()));
  const std::string path = (std::filesystem::absolute(run_dir) / ".lock").lexically_normal().string();
  const bool created_file = !std::filesystem::exists(path, ec);
  // O_CLOEXEC: a program this one starts does not inherit the lock.
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0)
    throw std::runtime_error(fmt::format("cannot open {}: {} (expected a writable run directory)", path,
                                         std::strerror(errno)));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd);
    if (err != EWOULDBLOCK)
      throw std::runtime_error(fmt::format("cannot lock {}: {} (expected a file system with flock)", path,
                                           std::strerror(err)));
    // The holder writes its details right after taking the lock: give it a moment.
    Holder h = read_holder(path);
    for (int i = 0; i < 20 && h.pid == "?"; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      h = read_holder(path);
    }
    refusal = fmt::format(
        "xuanxue: {} is in use by another job (host {}, pid {}{}, started {}; its lock {}); expected one job per "
        "run directory",
        run_dir, h.host, h.pid, h.slurm_job.empty() ? "" : fmt::format(", Slurm job {}", h.slurm_job), h.started,
        path);
    return std::nullopt;
  }
  RunDirLock lock(fd, path, created, created_file);
  const char* job = std::getenv("SLURM_JOB_ID");
  const std::string info = fmt::format("host {}\npid {}\nslurm_job {}\nstarted {}\n", hostname(), ::getpid(),
                                       job ? job : "", now_iso8601());
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, info.data(), info.size(), 0) != ssize_t(info.size()))
    throw std::runtime_error(fmt::format("cannot write {}: {}", path, std::strerror(errno)));
  return lock;
}

}  // namespace xx

#include "core/atomic_file.h"
#include <fcntl.h>
#include <unistd.h>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <fmt/format.h>

namespace xx {
namespace fs = std::filesystem;

namespace {
std::string errno_text(int e) { return std::strerror(e); }
}  // namespace

void fsync_path(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) throw std::runtime_error(fmt::format("cannot open {} to fsync: {}", path, errno_text(errno)));
  // (a directory on a file system that cannot sync one says EINVAL: nothing to do there)
  const int failed = ::fsync(fd) != 0 && !(directory && errno == EINVAL) ? errno : 0;
  ::close(fd);
  if (failed) throw std::runtime_error(fmt::format("cannot fsync {}: {}", path, errno_text(failed)));
}

int write_all(int fd, const char* data, size_t size) {
  for (size_t done = 0; done < size;) {
    const ssize_t n = ::write(fd, data + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    done += size_t(n);
  }
  return 0;
}

void write_file_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  // Any failure (no space, an I/O error) names the file and errno, and leaves no .tmp behind.
  auto fail = [&](const std::string& what, int e) {
    ::unlink(tmp.c_str());
    throw std::runtime_error(fmt::format("cannot {} {}: {}", what, tmp, errno_text(e)));
  };
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error(fmt::format("cannot create {}: {}", tmp, errno_text(errno)));
  if (const int e = write_all(fd, text.data(), text.size()); e != 0) {
    ::close(fd);
    fail("write", e);
  }
  if (::fsync(fd) != 0) {
    const int e = errno;
    ::close(fd);
    fail("fsync", e);
  }
  if (::close(fd) != 0) fail("close", errno);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw std::runtime_error(fmt::format("cannot rename {} to {}: {}", tmp, path, errno_text(e)));
  }
  fsync_path(fs::path(path).parent_path().empty() ? "." : fs::path(path).parent_path().string(), true);
}

}  // namespace xx

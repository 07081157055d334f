#include "core/atomic_file.h"
#include <fcntl.h>
#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace xx {
namespace fs = std::filesystem;

void fsync_path(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) throw std::runtime_error("cannot open " + path + " to fsync");
  ::fsync(fd);
  ::close(fd);
}

void write_file_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    if (!out.flush()) throw std::runtime_error("cannot write " + tmp);
  }
  fsync_path(tmp, false);
  fs::rename(tmp, path);
  fsync_path(fs::path(path).parent_path().empty() ? "." : fs::path(path).parent_path().string(), true);
}

}  // namespace xx

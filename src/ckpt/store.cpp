#include "ckpt/store.h"
#include <fcntl.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <fmt/format.h>
#include "ckpt/chain.h"
#include "ckpt/h5.h"
#include "core/atomic_file.h"

namespace xx {
namespace fs = std::filesystem;
using h5::errno_text;

namespace {

// The file name `latest` holds ("" without one).
std::string latest_name(const std::string& dir) {
  std::string name;
  if (std::ifstream in(fs::path(dir) / "latest"); in) std::getline(in, name);
  return name;
}

}  // namespace

std::vector<std::string> step_files(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  const std::regex pattern("step_([0-9]+)\\.h5");
  for (const auto& e : fs::directory_iterator(dir)) {
    std::smatch m;
    const std::string name = e.path().filename().string();
    if (std::regex_match(name, m, pattern)) found.emplace_back(std::stoll(m[1]), e.path().string());
  }
  std::sort(found.rbegin(), found.rend());
  std::vector<std::string> out;
  for (auto& [step, path] : found) out.push_back(std::move(path));
  return out;
}

std::string latest_checkpoint(const std::string& dir) {
  h5::quiet();
  if (!fs::is_directory(dir)) return "";
  // Newest first by step number; the first whose `complete` attribute is set wins.
  for (const auto& path : step_files(dir)) {
    if (H5Fis_hdf5(path.c_str()) <= 0) continue;
    h5::H5 file = h5::open_read_only(path);
    if (file < 0 || H5Aexists(file, "complete") <= 0) continue;
    h5::H5 attr(H5Aopen(file, "complete", H5P_DEFAULT), H5Aclose);
    int complete = 0;
    if (H5Aread(attr, H5T_NATIVE_INT, &complete) >= 0 && complete == 1) return path;
  }
  return "";
}

void prune_checkpoints(const std::string& dir, int64_t keep) {
  const std::vector<std::string> found = step_files(dir);
  const std::string latest = latest_name(dir);
  // Kept: the newest `keep`, the one `latest` names, and every base a kept delta needs.
  std::set<std::string> kept;
  for (size_t i = 0; i < found.size(); ++i) {
    const std::string name = fs::path(found[i]).filename().string();
    if (i >= size_t(keep) && name != latest) continue;
    kept.insert(name);
    if (const std::string parent = chain_parent_of(found[i]); !parent.empty()) kept.insert(parent);
  }
  for (const auto& path : found)
    if (!kept.count(fs::path(path).filename().string())) fs::remove(path);
}

std::string last_good_checkpoint(const std::string& dir) {
  const std::string name = latest_name(dir);
  std::error_code ec;
  if (!name.empty() && fs::is_regular_file(fs::path(dir) / name, ec)) return (fs::path(dir) / name).string();
  return fmt::format("none (no {}/latest)", dir);
}

std::string prepare_directory(const std::string& dir) {
  std::error_code ec;
  if (fs::is_directory(dir, ec)) return "";
  const fs::path parent = fs::path(dir).parent_path();
  if (!parent.empty() && !fs::is_directory(parent, ec))
    return fmt::format("its directory's parent {} is gone: {}", parent.string(), errno_text(ENOENT));
  if (parent.empty() ? !fs::create_directories(dir, ec) && ec : !fs::create_directory(dir, ec) && ec)
    return fmt::format("cannot create the directory {}: {}", dir, ec.message());
  return "";
}

std::string reserve_space(const std::string& tmp, int64_t bytes) {
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return fmt::format("cannot create {}: {}", tmp, errno_text(errno));
  const int e = bytes <= 0 || ::fallocate(fd, 0, 0, off_t(bytes)) == 0 ? 0 : errno;
  ::close(fd);
  ::unlink(tmp.c_str());
  if (e == 0 || e == EOPNOTSUPP || e == ENOSYS || e == EINVAL) return "";
  return fmt::format("no room for its {:.2f} MB: {}", double(bytes) / 1e6, errno_text(e));
}

std::string publish(const std::string& tmp, const std::string& dir, const std::string& name) {
  const std::string path = (fs::path(dir) / name).string();
  try {
    fsync_path(tmp, false);
    if (::rename(tmp.c_str(), path.c_str()) != 0)
      return fmt::format("cannot rename {} to {}: {}", tmp, path, errno_text(errno));
    fsync_path(dir, true);
    write_file_atomic((fs::path(dir) / "latest").string(), name + "\n");
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace xx

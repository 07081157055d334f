#include "ckpt/h5_writer.h"
#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fmt/format.h>
#include "ckpt/slabs.h"
#include "core/atomic_file.h"

namespace xx {
namespace fs = std::filesystem;
using h5::errno_text;
using h5::H5;

namespace {

// Parallel HDF5 writes metadata at "sync points", whenever the ranks have
// made dirty_bytes_threshold bytes of it (256 KB by default): inside
// whichever call made it, where a failed write on one rank leaves the others
// waiting inside HDF5. Holding it all (up to 32 MB, far more than a
// checkpoint's metadata) until the flush at the end leaves the chunks
// (allocated and filled at H5Dcreate, written at H5Dwrite, each dataset
// followed by a sync) and the flush as the places to fail.
void hold_metadata(hid_t fapl) {
  H5AC_cache_config_t config;
  config.version = H5AC__CURR_CACHE_CONFIG_VERSION;
  if (H5Pget_mdc_config(fapl, &config) < 0) return;
  config.set_initial_size = true;
  config.initial_size = size_t(32) << 20;
  config.min_size = std::min(config.min_size, config.initial_size);
  config.max_size = std::max(config.max_size, size_t(64) << 20);
  config.dirty_bytes_threshold = size_t(32) << 20;  // HDF5's largest
  H5Pset_mdc_config(fapl, &config);  // (tuning only: the default works too, with more places to fail)
}

// Why a write may have failed when nothing said (ompio reports a write cut
// short by a full disk as a short count, without errno): the file system's
// state, "" when it looks fine.
std::string file_system_state(const std::string& path) {
  struct statvfs v {};
  const std::string dir = fs::path(path).parent_path().string();
  if (::statvfs(dir.empty() ? "." : dir.c_str(), &v) != 0) return "";
  if (v.f_flag & ST_RDONLY) return fmt::format("{} ({} is read-only)", errno_text(EROFS), dir);
  const double free = double(v.f_bavail) * double(v.f_frsize);
  if (free < (1 << 20)) return fmt::format("{} ({:.0f} bytes free in {})", errno_text(ENOSPC), free, dir);
  return "";
}

// `bytes` as the whole of file `path`, with POSIX calls: "" or what failed
// ("write the file: No space left on device").
std::string write_whole_file(const std::string& path, const std::vector<char>& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return fmt::format("create the file: {}", errno_text(errno));
  if (const int e = write_all(fd, bytes.data(), bytes.size()); e != 0) {
    ::close(fd);
    return fmt::format("write the file: {}", errno_text(e));
  }
  if (::close(fd) != 0) return fmt::format("close the file: {}", errno_text(errno));  // NFS reports late
  return "";
}

hsize_t element_count(const std::vector<hsize_t>& dims) {
  hsize_t total = 1;
  for (auto d : dims) total *= d;
  return total;
}

}  // namespace

H5Writer::H5Writer(MPI_Comm comm, WriteGuard& guard, bool alone, int64_t bytes)
    : comm_(comm), guard_(guard), alone_(alone) {
  MPI_Comm_rank(comm, &rank_);
  MPI_Comm_size(comm, &world_);
  H5 fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  // (the in-memory file grows by the expected size: one or two allocations)
  if (alone_) ok(H5Pset_fapl_core(fapl, size_t(std::max<int64_t>(bytes, 1 << 20)), false), "set in-memory file access");
  else ok(H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL), "set MPI-IO file access");
  hold_metadata(fapl);
  errno = 0;
  file_ = H5Fcreate(guard_.tmp().c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
  if (file_ < 0) fail("create the file");
  dxpl_ = H5Pcreate(H5P_DATASET_XFER);
  if (!alone_) ok(H5Pset_dxpl_mpio(dxpl_, H5FD_MPIO_COLLECTIVE), "set collective transfer");
  try {
    sync();
  } catch (...) {
    release();
    throw;
  }
}

void H5Writer::sync() {
  if (error_.empty()) error_ = guard_.io_error();  // an MPI-IO error that HDF5 did not report is a failure all the same
  int first = 0;
  std::string error = agree_on_error(error_, comm_, &first);
  if (error.empty()) return;
  error = fmt::format("{} (rank {})", error, first);
  guard_.arm(error);
  // The file is given up: its space back first (a full disk), so that the
  // collective close can write what HDF5 still holds without failing again.
  if (rank_ == 0 && ::truncate(guard_.tmp().c_str(), 0) != 0) {
    // (nothing to give back: the close may fail again, and the deadline covers it)
  }
  MPI_Barrier(comm_);
  throw WriteFailed(error);
}

void H5Writer::close() {
  errno = 0;
  H5Pclose(dxpl_);
  dxpl_ = -1;
  if (alone_) return close_alone();
  const herr_t status = H5Fclose(file_);
  file_ = -1;
  ok(status, "close the file");
  sync();
}

void H5Writer::flush() {
  errno = 0;
  ok(H5Fflush(file_, H5F_SCOPE_GLOBAL), "flush the file");
}

H5 H5Writer::group(hid_t parent, const std::string& name) {
  errno = 0;
  const hid_t id = H5Gcreate2(parent, name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  if (id < 0) fail("create group " + name);
  return H5(id, H5Gclose);
}

void H5Writer::string_attr(hid_t obj, const char* name, const std::string& value) {
  errno = 0;
  H5 type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type, std::max<size_t>(1, value.size()));
  H5Tset_strpad(type, H5T_STR_NULLPAD);
  H5 space(H5Screate(H5S_SCALAR), H5Sclose);
  H5 a(H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (a < 0) return fail(std::string("create attribute ") + name);
  ok(H5Awrite(a, type, value.data()), std::string("write attribute ") + name);
}

void H5Writer::dataset(hid_t group, const std::string& name, hid_t type, const std::vector<hsize_t>& dims, int owner,
                       const void* data, uint32_t crc, bool deflate, int64_t offset, const char* encoding) {
  H5 ds = create_dataset(group, name, type, dims, deflate);
  if (ds >= 0 && element_count(dims) > 0) {
    H5 mem(H5Screate_simple(int(dims.size()), dims.data(), nullptr), H5Sclose);
    H5 file(H5Dget_space(ds), H5Sclose);
    if (rank_ != owner) H5Sselect_none(mem), H5Sselect_none(file);
    ok(H5Dwrite(ds, type, mem, file, dxpl_, rank_ == owner ? data : nullptr), "write dataset " + name);
  }
  // The owner's checksum: attributes are collective, and only the owner's bytes were written.
  MPI_Bcast(&crc, 1, MPI_UINT32_T, owner, comm_);
  finish_dataset(ds, crc, offset, encoding);
}

void H5Writer::slabs_of(hid_t group, const std::string& name, const std::vector<hsize_t>& dims, const FrameSlab* first,
                        const FrameSlab* last, const void* values, size_t count, hid_t type, uint32_t crc,
                        int64_t offset, const char* encoding) {
  H5 ds = create_dataset(group, name, type, dims, false);
  if (ds >= 0 && element_count(dims) > 0) {
    const hsize_t n = std::max<hsize_t>(1, count);
    H5 mem(H5Screate_simple(1, &n, nullptr), H5Sclose);
    H5 file(H5Dget_space(ds), H5Sclose);
    slabs::select_slabs(mem, file, dims, first, last);
    ok(H5Dwrite(ds, type, mem, file, dxpl_, count == 0 ? nullptr : values), "write dataset " + name);
  }
  finish_dataset(ds, crc, offset, encoding);
}

// Collective: the dataset, chunked (rows of about 1 MiB), fletcher32, optionally shuffle + deflate.
H5 H5Writer::create_dataset(hid_t group, const std::string& name, hid_t type, const std::vector<hsize_t>& dims,
                            bool deflate) {
  errno = 0;
  H5 space(H5Screate_simple(int(dims.size()), dims.data(), nullptr), H5Sclose);
  H5 plist(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  const hsize_t total = element_count(dims);
  std::vector<hsize_t> chunk = dims;
  const hsize_t row = dims.empty() || dims[0] == 0 ? 1 : total / dims[0];
  if (!chunk.empty()) chunk[0] = std::max<hsize_t>(1, std::min<hsize_t>(dims[0], (1u << 18) / std::max<hsize_t>(1, row)));
  if (total > 0) {
    ok(H5Pset_chunk(plist, int(chunk.size()), chunk.data()), "set chunk");
    if (deflate) ok(H5Pset_shuffle(plist), "set shuffle"), ok(H5Pset_deflate(plist, 1), "set deflate");
    ok(H5Pset_fletcher32(plist), "set fletcher32");
  }
  H5 ds(H5Dcreate2(group, name.c_str(), type, space, H5P_DEFAULT, plist, H5P_DEFAULT), H5Dclose);
  if (ds < 0) fail("create dataset " + name);
  return ds;
}

// Collective: the dataset's attributes crc32c (and offset, when >= 0; encoding, when given), then a sync.
void H5Writer::finish_dataset(hid_t ds, uint32_t crc, int64_t offset, const char* encoding) {
  attr(ds, "crc32c", H5T_NATIVE_UINT32, crc);
  if (offset >= 0) attr(ds, "offset", H5T_NATIVE_INT64, offset);
  if (encoding) string_attr(ds, "encoding", encoding);
  sync();
}

// This rank's first failure: what it was doing, and why (MPI-IO's error
// with its errno when the handler saw one, else HDF5's innermost message).
void H5Writer::fail(const std::string& what) {
  const int e = errno;  // set by this call: every operation clears it first
  if (!error_.empty()) return;
  const std::string io_error = guard_.io_error();
  std::string hdf5 = h5::error_text();
  if (hdf5.empty()) hdf5 = "HDF5 error";
  const std::string state = io_error.empty() && !e ? file_system_state(guard_.tmp()) : "";
  if (!io_error.empty()) error_ = fmt::format("{}: {}", what, io_error);
  else if (e) error_ = fmt::format("{}: {} ({})", what, errno_text(e), hdf5);
  else if (!state.empty()) error_ = fmt::format("{}: {} ({})", what, state, hdf5);
  else error_ = fmt::format("{}: {}", what, hdf5);
  guard_.arm(error_);
}

// Alone: the finished file's image, out of memory onto the disk.
void H5Writer::close_alone() {
  ok(H5Fflush(file_, H5F_SCOPE_GLOBAL), "flush the file");  // the image is what was flushed: `complete` too
  std::vector<char> image;
  if (const ssize_t size = H5Fget_file_image(file_, nullptr, 0); size < 0) {
    fail("take the file's image");
  } else {
    image.resize(size_t(size));
    if (H5Fget_file_image(file_, image.data(), image.size()) != size) fail("take the file's image");
  }
  const herr_t status = H5Fclose(file_);  // in memory: nothing can fail on the disk
  file_ = -1;
  ok(status, "close the file");
  if (error_.empty()) error_ = write_whole_file(guard_.tmp(), image);
  sync();
}

// Collective: every rank closes what it still holds (after a sync threw,
// at the same place on every rank).
void H5Writer::release() {
  if (dxpl_ >= 0) H5Pclose(dxpl_);
  if (file_ >= 0) H5Fclose(file_);
  dxpl_ = file_ = -1;
}

}  // namespace xx

#include "ckpt/checkpoint.h"
#include <fcntl.h>
#include <hdf5.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <regex>
#include <set>
#include <thread>
#include <tuple>
#include <fmt/format.h>
#include "ckpt/slabs.h"
#include "core/device_memory.h"
#include "core/atomic_file.h"
#include "core/crc32c.h"
#include "core/error.h"
#include "kernels/ckpt_codec.h"

namespace xx {
namespace fs = std::filesystem;

namespace {

// HDF5 handle that closes itself.
struct H5 {
  hid_t id = -1;
  herr_t (*close)(hid_t) = nullptr;
  H5(hid_t i, herr_t (*c)(hid_t)) : id(i), close(c) {}
  ~H5() {
    if (id >= 0 && close) close(id);
  }
  H5(const H5&) = delete;
  H5& operator=(const H5&) = delete;
  H5(H5&& o) noexcept : id(o.id), close(o.close) { o.id = -1; }
  operator hid_t() const { return id; }
};

void quiet_hdf5() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

std::string errno_text(int e) { return std::strerror(e); }

template <class V>
V read_attr(hid_t obj, const char* name, hid_t type, const std::string& path) {
  if (H5Aexists(obj, name) <= 0) input_error("{}: attribute '{}' is missing (expected a xuanxue checkpoint)", path, name);
  H5 attr(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  V value{};
  if (H5Aread(attr, type, &value) < 0) input_error("{}: cannot read attribute '{}'", path, name);
  return value;
}

std::string read_string_attr(hid_t obj, const char* name, const std::string& path) {
  if (H5Aexists(obj, name) <= 0) input_error("{}: attribute '{}' is missing (expected a xuanxue checkpoint)", path, name);
  H5 attr(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  H5 type(H5Aget_type(attr), H5Tclose);
  std::string value(H5Tget_size(type), '\0');
  H5 memtype(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(memtype, value.size());
  H5Tset_strpad(memtype, H5T_STR_NULLPAD);
  if (H5Aread(attr, memtype, value.data()) < 0) input_error("{}: cannot read attribute '{}'", path, name);
  while (!value.empty() && value.back() == '\0') value.pop_back();
  return value;
}

// Version 2 files carry a crc32c attribute on every dataset: the checksum
// of the values as written, verified on top of HDF5's fletcher32.
void verify_crc(hid_t ds, const void* data, size_t bytes, const std::string& where, const std::string& path) {
  if (H5Aexists(ds, "crc32c") <= 0) return;  // version 1
  const auto want = read_attr<uint32_t>(ds, "crc32c", H5T_NATIVE_UINT32, path);
  const uint32_t got = crc32c(data, bytes);
  if (got != want)
    input_error("{}: dataset '{}' fails its checksum (crc32c {:08x}, expected {:08x})", path, where, got, want);
}

void read_tensor(hid_t group, const std::string& group_name, const TensorInfo& t, float* data,
                 const std::string& path) {
  const std::string where = group_name + "/" + t.name;
  if (H5Lexists(group, t.name.c_str(), H5P_DEFAULT) <= 0)
    input_error("{}: tensor '{}' is missing (expected by the deck's model)", path, where);
  H5 ds(H5Dopen2(group, t.name.c_str(), H5P_DEFAULT), H5Dclose);
  H5 space(H5Dget_space(ds), H5Sclose);
  const int rank = H5Sget_simple_extent_ndims(space);
  std::vector<hsize_t> dims(std::max(rank, 0));
  H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  std::vector<int64_t> shape(dims.begin(), dims.end());
  if (shape != t.shape)
    input_error("{}: tensor '{}' has shape [{}] (expected [{}] from the deck's model)", path, where,
                fmt::join(shape, ", "), fmt::join(t.shape, ", "));
  if (H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data + t.offset) < 0)
    input_error("{}: tensor '{}' cannot be read (checksum mismatch or corrupt data)", path, where);
  verify_crc(ds, data + t.offset, size_t(t.size) * sizeof(float), where, path);
}

// A 1-D dataset of `expect` values (-1: any), its crc32c attribute verified.
template <class T>
std::vector<T> read_vector(hid_t group, const std::string& name, hid_t type, int64_t expect, const std::string& where,
                           const std::string& path) {
  if (H5Lexists(group, name.c_str(), H5P_DEFAULT) <= 0)
    input_error("{}: dataset '{}' is missing (expected by the deck's run)", path, where);
  H5 ds(H5Dopen2(group, name.c_str(), H5P_DEFAULT), H5Dclose);
  H5 space(H5Dget_space(ds), H5Sclose);
  hsize_t n = 0;
  if (H5Sget_simple_extent_ndims(space) != 1)
    input_error("{}: dataset '{}' is not one-dimensional (expected a flat vector)", path, where);
  H5Sget_simple_extent_dims(space, &n, nullptr);
  if (expect >= 0 && int64_t(n) != expect)
    input_error("{}: dataset '{}' has {} values (expected {})", path, where, n, expect);
  std::vector<T> v(n);
  if (n > 0 && H5Dread(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) < 0)
    input_error("{}: dataset '{}' cannot be read (checksum mismatch or corrupt data)", path, where);
  verify_crc(ds, v.data(), v.size() * sizeof(T), where, path);
  return v;
}

// The datasets directly in `group` (not its subgroups), by name.
std::vector<std::string> dataset_names(hid_t group, const std::string& where, const std::string& path) {
  H5G_info_t info;
  if (H5Gget_info(group, &info) < 0) input_error("{}: cannot list group '{}'", path, where);
  std::vector<std::string> out;
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    char name[256] = {0};
    if (H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, i, name, sizeof name, H5P_DEFAULT) < 0) continue;
    if (H5 ds(H5Dopen2(group, name, H5P_DEFAULT), H5Dclose); ds >= 0) out.push_back(name);
  }
  return out;
}

// Every dataset directly under /train, by name.
std::map<std::string, std::vector<double>> read_series(hid_t group, const std::string& path) {
  std::map<std::string, std::vector<double>> out;
  for (const auto& name : dataset_names(group, "/train", path))
    out[name] = read_vector<double>(group, name, H5T_NATIVE_DOUBLE, -1, "/train/" + name, path);
  return out;
}



// ---------------------------------------------------------------------------
// A write that fails (docs/RESILIENCE.md, "A failed checkpoint write").
//
// A write fails on some ranks only: with MPI-IO's collective buffering only
// the aggregators touch the disk, so a full disk fails rank 0's pwritev
// inside H5Dwrite while rank 1's returns success; rank 0's rename and
// `latest` are its own. Throwing there hung the job: rank 0 unwound into
// H5Fclose (collective: ompio's barrier in MPI_File_set_size) while rank 1
// had gone on to the next dataset's H5Dwrite (an MPI_Allreduce), each
// waiting for the other forever. So the Writer never throws where it fails:
// it records this rank's first error, every rank goes on making the same
// HDF5 calls, and at each sync point (the file created, every group and
// dataset, the flush, the close, rank 0's rename) one MPI_Allreduce tells
// every rank whether any rank failed; then all of them throw the same error
// from the same place, close the file together, and rank 0 removes it.
// Two backstops for a failure deep inside HDF5 or MPI-IO that leaves the
// ranks unable to meet again:
//  - MPI-IO errors are recorded where they happen, with their errno, by an
//    error handler that every file opened afterwards inherits (set on
//    MPI_FILE_NULL): the message says "No space left on device".
//  - a deadline: kFailureDeadline seconds after a rank first knows of a
//    failure, if the write has not been given up cleanly by then, that rank
//    prints the error, removes the .tmp and ends the job with MPI_Abort
//    (exit code kExitWriteFailed).
constexpr double kFailureDeadline = 10;  // seconds

std::atomic<bool> g_write_failed{false};

// The write in progress in this process (one at a time: the trainer waits
// for the previous one), for the MPI-IO error handler.
struct ActiveWrite {
  std::mutex mutex;
  bool active = false;
  std::string path, tmp;  // the checkpoint being written, and its temporary file
  int rank = 0;
  std::string io_error;   // this rank's first MPI-IO error in it ("" : none)
};
ActiveWrite& active_write() {
  static auto* w = new ActiveWrite;  // never destroyed: the deadline thread may outlive main
  return *w;
}

// "DIR/step_N.h5" as `latest` names it, when that file is there; else "none".
std::string last_good_checkpoint(const std::string& dir) {
  std::string name;
  if (std::ifstream in(fs::path(dir) / "latest"); in) std::getline(in, name);
  std::error_code ec;
  if (!name.empty() && fs::is_regular_file(fs::path(dir) / name, ec)) return (fs::path(dir) / name).string();
  return fmt::format("none (no {}/latest)", dir);
}

// The one line the job ends with.
std::string failure_line(const std::string& path, const std::string& error) {
  const std::string dir = fs::path(path).parent_path().string();
  return fmt::format("checkpoint {} could not be written: {}; the last good checkpoint is {} (resume with "
                     "-resume auto once the cause is fixed); the partial {}.tmp was removed",
                     path, error, last_good_checkpoint(dir), fs::path(path).filename().string());
}

std::atomic<uint64_t> g_deadline_generation{0};

void disarm_deadline() { ++g_deadline_generation; }

// From now on this rank has kFailureDeadline seconds to give the write up
// cleanly (disarm_deadline); then it ends the job itself.
void arm_deadline(const std::string& path, const std::string& tmp, int rank, const std::string& error) {
  static std::atomic<uint64_t> armed{0};
  const uint64_t generation = g_deadline_generation.load();
  if (armed.exchange(generation + 1) == generation + 1) return;  // armed already for this write
  const std::string line = fmt::format("xuanxue: rank {}: {} (the ranks could not give the write up together within "
                                       "{:.0f} s: ending the job)", rank, failure_line(path, error), kFailureDeadline);
  std::thread([generation, line, tmp] {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(kFailureDeadline);
    while (std::chrono::steady_clock::now() < end) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (g_deadline_generation.load() != generation) return;
    }
    std::fprintf(stderr, "%s\n", line.c_str());
    std::fflush(stderr);
    ::unlink(tmp.c_str());
    MPI_Abort(MPI_COMM_WORLD, kExitWriteFailed);
  }).detach();
}

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
  return e ? fmt::format("{} (MPI-IO: {})", errno_text(e), mpi) : fmt::format("MPI-IO: {}", mpi);
}

void on_file_error(MPI_File*, int* code, ...) {
  const int saved_errno = errno;
  auto& w = active_write();
  std::lock_guard lock(w.mutex);
  if (!w.active || !w.io_error.empty()) return;
  w.io_error = io_error_text(*code, saved_errno);
  arm_deadline(w.path, w.tmp, w.rank, w.io_error);
}

void install_file_error_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    MPI_Errhandler handler;
    MPI_File_create_errhandler(on_file_error, &handler);
    MPI_File_set_errhandler(MPI_FILE_NULL, handler);  // the default of every file opened from now on
  });
}

// The innermost message on HDF5's error stack (the cause), "" when empty.
std::string hdf5_error() {
  std::string out;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_DOWNWARD,
      [](unsigned, const H5E_error2_t* e, void* data) -> herr_t {
        if (e->desc && *e->desc) *static_cast<std::string*>(data) = fmt::format("{}: {}", e->func_name, e->desc);
        return 0;
      },
      &out);
  return out;
}

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

// Thrown by Writer::sync on every rank alike: the first failure, its rank.
struct WriteFailed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

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

void broadcast_text(std::string& s, int root, MPI_Comm comm) {
  int n = int(s.size());
  MPI_Bcast(&n, 1, MPI_INT, root, comm);
  s.resize(size_t(n));
  MPI_Bcast(s.data(), n, MPI_CHAR, root, comm);
}

// The collective writer: every rank of `comm` calls every HDF5 function in
// the same order with the same arguments (metadata is collective in parallel
// HDF5); a dataset's data comes from one rank (`owner`), the others select
// nothing, in one collective transfer (filters such as fletcher32 need it).
// A failure is recorded, not thrown, until the next sync() (above).
//
// Alone (`writer rank0`'s rank 0, a one-process write) the same calls run on
// MPI_COMM_SELF, and HDF5 builds the file in memory (the core driver); the
// image goes to disk with plain POSIX writes at close(). HDF5 never meets a
// full disk there: once one of its writes has failed, HDF5 1.10.8 cannot
// close that file (a failed H5Fflush leaves its metadata cache unable to
// flush again: "slist already enabled?"), and closes it again at exit, in
// MPI_Finalize, on freed memory: a segfault (exit 139) after the right
// message, through MPI-IO on MPI_COMM_SELF and through sec2 (POSIX) alike.
class Writer {
 public:
  // Every rank of comm, parallel HDF5.
  Writer(MPI_Comm comm, const std::string& path) : Writer(comm, path, false, 0) {}
  // This process alone: in memory, then to `path` (about `bytes` in all).
  Writer(const std::string& path, int64_t bytes) : Writer(MPI_COMM_SELF, path, true, bytes) {}
  ~Writer() { release(); }
  hid_t file() const { return file_; }
  int rank() const { return rank_; }

  // Closes the file (collective; it flushes what HDF5 still holds) and syncs.
  void close() {
    errno = 0;
    H5Pclose(dxpl_);
    dxpl_ = -1;
    if (alone_) return close_alone();
    const herr_t status = H5Fclose(file_);
    file_ = -1;
    ok(status, "close the file");
    sync();
  }

  // Collective: when any rank has failed since the last sync, every rank
  // throws WriteFailed with the lowest failing rank's error.
  void sync() {
    if (error_.empty()) {  // an MPI-IO error that HDF5 did not report is a failure all the same
      auto& w = active_write();
      std::lock_guard lock(w.mutex);
      if (!w.io_error.empty()) error_ = w.io_error;
    }
    int first = error_.empty() ? world_ : rank_;
    MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, comm_);
    if (first == world_) return;
    std::string error = error_;
    broadcast_text(error, first, comm_);
    error = fmt::format("{} (rank {})", error, first);
    std::string tmp;
    {
      auto& w = active_write();
      std::lock_guard lock(w.mutex);
      arm_deadline(w.path, w.tmp, rank_, error);
      tmp = w.tmp;
    }
    // The file is given up: its space back first (a full disk), so that the
    // collective close can write what HDF5 still holds without failing again.
    if (rank_ == 0 && ::truncate(tmp.c_str(), 0) != 0) {
      // (nothing to give back: the close may fail again, and the deadline covers it)
    }
    MPI_Barrier(comm_);
    throw WriteFailed(error);
  }

  // A group; a failure is recorded (the id is then invalid, and so are the
  // calls on it, on this rank only, until the sync after it).
  H5 group(hid_t parent, const std::string& name) {
    errno = 0;  // so that a failure's errno is its own
    const hid_t id = H5Gcreate2(parent, name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (id < 0) fail("create group " + name);
    return H5(id, H5Gclose);
  }

  template <class V>
  void attr(hid_t obj, const char* name, hid_t type, const V& value) {
    errno = 0;
    H5 space(H5Screate(H5S_SCALAR), H5Sclose);
    H5 a(H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
    if (a < 0) return fail(std::string("create attribute ") + name);
    ok(H5Awrite(a, type, &value), std::string("write attribute ") + name);
  }

  void string_attr(hid_t obj, const char* name, const std::string& value) {
    errno = 0;
    H5 type(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(type, std::max<size_t>(1, value.size()));
    H5Tset_strpad(type, H5T_STR_NULLPAD);
    H5 space(H5Screate(H5S_SCALAR), H5Sclose);
    H5 a(H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
    if (a < 0) return fail(std::string("create attribute ") + name);
    ok(H5Awrite(a, type, value.data()), std::string("write attribute ") + name);
  }

  void flush() {
    errno = 0;
    ok(H5Fflush(file_, H5F_SCOPE_GLOBAL), "flush the file");
  }

  // Dataset `name` in `group` of `type` and shape `dims`, chunked, fletcher32,
  // optionally shuffle + deflate; data from `owner` (nullptr elsewhere);
  // attribute crc32c = the checksum of the bytes, which every rank passes.
  // `offset` >= 0: the tensor's offset in the flat buffer, as attribute `offset`.
  void dataset(hid_t group, const std::string& name, hid_t type, const std::vector<hsize_t>& dims, int owner,
               const void* data, uint32_t crc, bool deflate = false, int64_t offset = -1) {
    H5 ds = create_dataset(group, name, type, dims, deflate);
    if (ds >= 0 && element_count(dims) > 0) {
      H5 mem(H5Screate_simple(int(dims.size()), dims.data(), nullptr), H5Sclose);
      H5 file(H5Dget_space(ds), H5Sclose);
      if (rank_ != owner) H5Sselect_none(mem), H5Sselect_none(file);
      ok(H5Dwrite(ds, type, mem, file, dxpl_, rank_ == owner ? data : nullptr), "write dataset " + name);
    }
    // The owner's checksum: attributes are collective, and only the owner's bytes were written.
    MPI_Bcast(&crc, 1, MPI_UINT32_T, owner, comm_);
    finish_dataset(ds, crc, offset);
  }

  // A float tensor dataset as dataset() makes it, whose elements come from
  // every rank's slabs of it, [first, last) this rank's (all of this tensor)
  // from `values`, in one collective transfer; `crc` is the whole tensor's,
  // the same on every rank (slabs::tensor_crcs).
  void dataset_slabs(hid_t group, const std::string& name, const std::vector<hsize_t>& dims,
                     const TensorSlab* first, const TensorSlab* last, const std::vector<float>& values, uint32_t crc,
                     int64_t offset) {
    H5 ds = create_dataset(group, name, H5T_NATIVE_FLOAT, dims, false);
    if (ds >= 0 && element_count(dims) > 0) {
      const hsize_t n = std::max<hsize_t>(1, values.size());
      H5 mem(H5Screate_simple(1, &n, nullptr), H5Sclose);
      H5 file(H5Dget_space(ds), H5Sclose);
      slabs::select_slabs(mem, file, dims, first, last);
      ok(H5Dwrite(ds, H5T_NATIVE_FLOAT, mem, file, dxpl_, values.empty() ? nullptr : values.data()),
         "write dataset " + name);
    }
    finish_dataset(ds, crc, offset);
  }

 private:
  static hsize_t element_count(const std::vector<hsize_t>& dims) {
    hsize_t total = 1;
    for (auto d : dims) total *= d;
    return total;
  }

  // Collective: the dataset, chunked (rows of about 1 MiB), fletcher32, optionally shuffle + deflate.
  H5 create_dataset(hid_t group, const std::string& name, hid_t type, const std::vector<hsize_t>& dims, bool deflate) {
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

  // Collective: the dataset's attributes crc32c (and offset, when >= 0), then a sync.
  void finish_dataset(hid_t ds, uint32_t crc, int64_t offset) {
    attr(ds, "crc32c", H5T_NATIVE_UINT32, crc);
    if (offset >= 0) attr(ds, "offset", H5T_NATIVE_INT64, offset);
    sync();
  }

  bool ok(herr_t status, const std::string& what) {
    if (status < 0) fail(what);
    return status >= 0;
  }
  // This rank's first failure: what it was doing, and why (MPI-IO's error
  // with its errno when the handler saw one, else HDF5's innermost message).
  void fail(const std::string& what) {
    const int e = errno;  // set by this call: every operation clears it first
    if (!error_.empty()) return;
    auto& w = active_write();
    std::lock_guard lock(w.mutex);
    std::string hdf5 = hdf5_error();
    if (hdf5.empty()) hdf5 = "HDF5 error";
    const std::string state = w.io_error.empty() && !e ? file_system_state(w.tmp) : "";
    if (!w.io_error.empty()) error_ = fmt::format("{}: {}", what, w.io_error);
    else if (e) error_ = fmt::format("{}: {} ({})", what, errno_text(e), hdf5);
    else if (!state.empty()) error_ = fmt::format("{}: {} ({})", what, state, hdf5);
    else error_ = fmt::format("{}: {}", what, hdf5);
    arm_deadline(w.path, w.tmp, rank_, error_);
  }
  Writer(MPI_Comm comm, const std::string& path, bool alone, int64_t bytes) : comm_(comm), alone_(alone), path_(path) {
    MPI_Comm_rank(comm, &rank_);
    MPI_Comm_size(comm, &world_);
    install_file_error_handler();
    H5 fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
    // (the in-memory file grows by the expected size: one or two allocations)
    if (alone_) ok(H5Pset_fapl_core(fapl, size_t(std::max<int64_t>(bytes, 1 << 20)), false), "set in-memory file access");
    else ok(H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL), "set MPI-IO file access");
    hold_metadata(fapl);
    errno = 0;
    file_ = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
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

  // Alone: the finished file's image, out of memory onto the disk.
  void close_alone() {
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
    if (error_.empty()) error_ = write_whole_file(path_, image);
    sync();
  }

  // Collective: every rank closes what it still holds (after a sync threw,
  // at the same place on every rank).
  void release() {
    if (dxpl_ >= 0) H5Pclose(dxpl_);
    if (file_ >= 0) H5Fclose(file_);
    dxpl_ = file_ = -1;
  }

  MPI_Comm comm_;
  bool alone_ = false;  // MPI_COMM_SELF, in memory: one process writes the whole file
  std::string path_;
  int rank_ = 0, world_ = 1;
  hid_t file_ = -1, dxpl_ = -1;
  std::string error_;  // this rank's first failure since the file was created
};

// Bytes `data` points to as one CRC-32C.
template <class T>
uint32_t crc_of(const std::vector<T>& v) {
  return crc32c(v.data(), v.size() * sizeof(T));
}

// One rank's tensor (params, adam_m or adam_v) as stored: the arrays a codec
// turns it into, by dataset name suffix ("" for full and lossless).
struct Encoded {
  std::string codec;  // full, lossless, int8, topk
  std::vector<float> floats;       // full; int8 scales; topk kept values
  std::vector<uint32_t> words;     // lossless XOR; topk indices
  std::vector<int8_t> codes;       // int8
};

// `lossless` forces the lossless codec (int8 refused a block on some rank).
// Mode full keeps the values as they are.
Encoded encode(const float* value, const float* base, int64_t n, const CheckpointFormat& f, bool lossless = false) {
  namespace cc = kernels::ckpt_codec;
  Encoded e;
  if (f.mode == "full") {
    e.codec = "full", e.floats.assign(value, value + n);
    return e;
  }
  // The codec kernels read and write kernel memory; these arrays are the host's (KernelCopy).
  const KernelCopy<const float> value_k(value, n), base_k(base, n);
  const Vec<const float> v = value_k.vec(), b = base_k.vec();
  if (f.codec.kind == cc::Codec::int8 && !lossless) {
    e.codes.resize(n), e.floats.resize(cc::scale_count(n, f.codec.block));
    const KernelCopy<int8_t> codes(e.codes.data(), n, false);
    const KernelCopy<float> scales(e.floats.data(), int64_t(e.floats.size()), false);
    const auto result = cc::int8_encode(codes.vec(), scales.vec(), v, b, f.codec.block);
    if (result.ok()) return codes.copy_back(), scales.copy_back(), e.codec = "int8", e;
    e.codes.clear(), e.floats.clear();  // a non-finite difference: this tensor goes lossless
  } else if (f.codec.kind == cc::Codec::topk && !lossless) {
    const int64_t k = cc::kept_count(n, f.codec.ratio);
    cc::TopkWorkspace ws(n, k);
    e.words.resize(k), e.floats.resize(k);
    const KernelCopy<uint32_t> index(e.words.data(), k, false);
    const KernelCopy<float> kept(e.floats.data(), k, false);
    cc::topk_encode(index.vec(), kept.vec(), v, b, ws);
    return index.copy_back(), kept.copy_back(), e.codec = "topk", e;
  }
  e.words.resize(n);
  const KernelCopy<uint32_t> words(e.words.data(), n, false);
  cc::lossless_encode<float>(words.vec(), v, b);
  words.copy_back();
  e.codec = "lossless";
  return e;
}

// value = what `e` rebuilds against base: exactly what a reader of the file gets.
void decode(float* value, const Encoded& e, const float* base, int64_t n, int64_t block) {
  namespace cc = kernels::ckpt_codec;
  if (e.codec == "full") return void(std::copy(e.floats.begin(), e.floats.end(), value));
  // The codec kernels read and write kernel memory; these arrays are the host's (KernelCopy).
  const KernelCopy<float> value_k(value, n, false);
  const KernelCopy<const float> base_k(base, n), floats(e.floats.data(), int64_t(e.floats.size()));
  const Vec<float> v = value_k.vec();
  const Vec<const float> b = base_k.vec();
  if (e.codec == "lossless") cc::lossless_decode<float>(v, KernelCopy<const uint32_t>(e.words.data(), n).vec(), b);
  if (e.codec == "int8")
    cc::int8_decode(v, KernelCopy<const int8_t>(e.codes.data(), n).vec(), floats.vec(), b, block);
  if (e.codec == "topk")
    cc::topk_decode(v, KernelCopy<const uint32_t>(e.words.data(), int64_t(e.words.size())).vec(), floats.vec(), b);
  value_k.copy_back();
}

// A dataset to write: `count` values of `type` from `data` (on the rank that owns it).
struct Part {
  std::string name;
  hid_t type;
  int64_t count;
  const void* data;
  uint32_t crc;
  std::string codec;
  int64_t offset = -1;  // a tensor's offset in the flat buffer (attribute `offset`), -1: none
};

// The datasets one Encoded tensor becomes, named after `name` (suffixes by codec).
void add_parts(std::vector<Part>& parts, const std::string& name, const Encoded& e, int64_t offset = -1) {
  auto part = [&](const std::string& suffix, hid_t type, const auto& v) {
    parts.push_back({name + suffix, type, int64_t(v.size()), v.data(), crc_of(v), e.codec, offset});
    offset = -1;  // on the first dataset of a tensor only
  };
  if (e.codec == "full") part("", H5T_NATIVE_FLOAT, e.floats);
  if (e.codec == "lossless") part("", H5T_NATIVE_UINT32, e.words);
  if (e.codec == "int8") part(".codes", H5T_NATIVE_INT8, e.codes), part(".scales", H5T_NATIVE_FLOAT, e.floats);
  if (e.codec == "topk") part(".index", H5T_NATIVE_UINT32, e.words), part(".kept", H5T_NATIVE_FLOAT, e.floats);
}

const char* const kRankTensors[3] = {"params", "adam_m", "adam_v"};

}  // namespace

struct EncodedCheckpoint {
  std::string name;                  // step_<N>.h5
  CheckpointData data;               // the base: /model and /optimizer of a base file, /buffers, /train
  CheckpointFormat format;
  bool has_ranks = false;
  std::string kind = "base", parent;  // diff across time
  std::vector<TensorInfo> tensors;
  std::deque<Encoded> store;          // what the parts point into (a deque: stable addresses)
  std::vector<Part> base_parts[3];    // a delta's /model, /optimizer/m, /optimizer/v
  std::vector<uint32_t> slab_crcs[3];  // written by slabs: each tensor's crc32c in /model, /optimizer/m, /optimizer/v
  std::vector<Part> parts;            // this rank's /ranks/<r>, in the same order on every rank
  std::vector<int64_t> meta;          // every rank's (count, crc) of each part, rank after rank
  std::vector<int64_t> batches;       // every rank's sampler position
};

std::string chain_kind_of(const EncodedCheckpoint& encoded) { return encoded.kind; }

std::shared_ptr<EncodedCheckpoint> encode_checkpoint(MPI_Comm comm, const ParamLayout& layout,
                                                     const CheckpointData& data, const RankState* mine,
                                                     const CheckpointFormat& format, ChainBase* chain) {
  int rank = 0, world = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &world);
  auto out = std::make_shared<EncodedCheckpoint>();
  out->name = fmt::format("step_{:08d}.h5", data.state.step);
  out->data = data;
  out->format = format;
  out->has_ranks = mine != nullptr;
  out->tensors = layout.tensors();
  const int64_t n = layout.total();
  // Diff across time: while the chain is young and the format unchanged, a
  // delta against its base file's own values (never against another delta,
  // so restore reads two files and a lossy codec's error does not add up).
  const bool chained = chain && format.base_every > 1;
  if (data.slabs && chained) throw std::logic_error("checkpoint: a chain cannot be written by slabs");
  if (data.slabs)
    for (int i = 0; i < 3; ++i) {
      const auto& mine = (*data.slabs)[size_t(i)].slabs;
      for (size_t k = 1; k < mine.size(); ++k)
        if (std::tie(mine[k].tensor, mine[k].begin) < std::tie(mine[k - 1].tensor, mine[k - 1].begin) ||
            mine[k].at < mine[k - 1].at)
          throw std::logic_error("checkpoint: slabs out of file order");
      out->slab_crcs[i] = slabs::tensor_crcs(comm, layout, (*data.slabs)[size_t(i)]);
    }
  const bool delta = chained && !chain->name.empty() && chain->written < format.base_every &&
                     chain->format == format && int64_t(chain->params.size()) == n && chain->name != out->name;
  out->kind = delta ? "delta" : "base";
  out->parent = delta ? chain->name : "";
  CheckpointFormat through_codec = format;  // deltas across time always go through the codec
  through_codec.mode = "diff";
  const std::vector<float>* now[3] = {&data.params, &data.adam_m, &data.adam_v};
  // The base as a reader will rebuild it: the ranks' diffs are against these bits.
  const std::vector<float>* rebuilt[3] = {now[0], now[1], now[2]};
  std::vector<float> decoded[3];
  if (delta) {
    const std::vector<float>* was[3] = {&chain->params, &chain->adam_m, &chain->adam_v};
    for (int i = 0; i < 3; ++i) {
      decoded[i].resize(n);
      // Every rank holds the same base bits, so every rank makes the same choices.
      for (const auto& t : layout.tensors()) {
        const auto& e = out->store.emplace_back(
            encode(now[i]->data() + t.offset, was[i]->data() + t.offset, t.size, through_codec));
        decode(decoded[i].data() + t.offset, e, was[i]->data() + t.offset, t.size, format.codec.block);
        add_parts(out->base_parts[i], t.name, e, t.offset);
      }
      rebuilt[i] = &decoded[i];
    }
  }
  if (mine && !data.slabs) {  // (by slabs the ranks agree: each one's tensors are the base)
    // Mode diff: against the base as rebuilt. Mode full in a delta: against
    // this rank's own tensors in the chain's base file.
    const bool own_delta = delta && format.mode == "full";
    const std::vector<float>* own[3] = {&mine->params, &mine->adam_m, &mine->adam_v};
    const std::vector<float>* own_was[3] = {&chain->own_params, &chain->own_m, &chain->own_v};
    const CheckpointFormat& f = own_delta ? through_codec : format;
    for (int i = 0; i < 3; ++i) {
      const float* against = own_delta ? own_was[i]->data() : rebuilt[i]->data();
      auto e = encode(own[i]->data(), against, n, f);
      // int8 refuses a non-finite difference; the ranks agree on the fallback,
      // so every rank writes the same datasets.
      int refused = f.mode == "diff" && f.codec.kind == kernels::ckpt_codec::Codec::int8 && e.codec != "int8";
      MPI_Allreduce(MPI_IN_PLACE, &refused, 1, MPI_INT, MPI_MAX, comm);
      if (refused && e.codec != "lossless") e = encode(own[i]->data(), against, n, f, true);
      add_parts(out->parts, kRankTensors[i], out->store.emplace_back(std::move(e)));
    }
  }
  if (mine) {
    // A named type, not the macro inside the braces: nvcc's front end garbles
    // a braced list holding H5T_NATIVE_FLOAT (a comma expression).
    const hid_t native_float = H5T_NATIVE_FLOAT;
    for (const auto& [name, values] : mine->extra)
      out->parts.push_back({name, native_float, int64_t(values.size()), values.data(), crc_of(values), "full"});
  }
  // Every rank has the same parts (names, types); their sizes and checksums
  // are shared, since creating datasets and attributes is collective.
  int min_parts = int(out->parts.size()), max_parts = min_parts;
  MPI_Allreduce(MPI_IN_PLACE, &min_parts, 1, MPI_INT, MPI_MIN, comm);
  MPI_Allreduce(MPI_IN_PLACE, &max_parts, 1, MPI_INT, MPI_MAX, comm);
  if (min_parts != max_parts) throw std::runtime_error("checkpoint: ranks hold different kinds of per-rank state");
  std::vector<int64_t> mine_meta;
  for (const auto& p : out->parts) mine_meta.insert(mine_meta.end(), {p.count, int64_t(p.crc)});
  out->meta.resize(mine_meta.size() * world);
  MPI_Allgather(mine_meta.data(), int(mine_meta.size()), MPI_INT64_T, out->meta.data(), int(mine_meta.size()),
                MPI_INT64_T, comm);
  out->batches.resize(world);
  const int64_t my_batches = mine ? mine->sampler_batches : data.state.sampler_batches;
  MPI_Allgather(&my_batches, 1, MPI_INT64_T, out->batches.data(), 1, MPI_INT64_T, comm);
  if (chained && delta) {
    ++chain->written;
  } else if (chained) {  // a new chain starts at this base
    *chain = ChainBase{};
    chain->name = out->name, chain->written = 1, chain->format = format;
    chain->params = data.params, chain->adam_m = data.adam_m, chain->adam_v = data.adam_v;
    if (mine && format.mode == "full") chain->own_params = mine->params, chain->own_m = mine->adam_m, chain->own_v = mine->adam_v;
  } else if (chain) {
    *chain = ChainBase{};
  }
  return out;
}

namespace {

// Marks the write in progress for the MPI-IO error handler, for one call of write_encoded.
struct ActiveWriteScope {
  ActiveWriteScope(const std::string& path, const std::string& tmp, int rank) {
    auto& w = active_write();
    std::lock_guard lock(w.mutex);
    w.active = true, w.path = path, w.tmp = tmp, w.rank = rank, w.io_error.clear();
  }
  ~ActiveWriteScope() {
    auto& w = active_write();
    std::lock_guard lock(w.mutex);
    w.active = false;
  }
};

// Rank 0, before the file: DIR made when missing, but only inside a parent
// that is there (the run directory, made at start-up): a run directory that
// has vanished (purged, its file system unmounted) is an error, not a new one.
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

// The bytes a checkpoint needs at least: its datasets stored as they are
// (deflated ones may shrink, so they count for nothing).
int64_t bytes_at_least(const EncodedCheckpoint& enc, int world) {
  int64_t n = 0;
  if (enc.kind == "base")
    for (const auto& t : enc.tensors) n += 3 * t.size * int64_t(sizeof(float));
  for (const auto& [name, values] : enc.data.buffers) n += int64_t(values.size() * sizeof(float));
  for (const auto& [name, values] : enc.data.series) n += int64_t(values.size() * sizeof(double));
  if (enc.has_ranks)
    for (int r = 0; r < world; ++r)
      for (size_t i = 0; i < enc.parts.size(); ++i)
        if (const auto& p = enc.parts[i]; p.codec == "full")
          n += enc.meta[r * 2 * enc.parts.size() + 2 * i] * int64_t(H5Tget_size(p.type));
  return n;
}

// Rank 0, before HDF5 touches the disk: room for `bytes` in the file's place
// (fallocate, then the file removed again). A full disk, a quota, a
// read-only file system are found here, where every rank can still stop
// cleanly, rather than inside a collective HDF5 call. File systems without
// fallocate skip the check.
std::string reserve_space(const std::string& tmp, int64_t bytes) {
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return fmt::format("cannot create {}: {}", tmp, errno_text(errno));
  const int e = bytes <= 0 || ::fallocate(fd, 0, 0, off_t(bytes)) == 0 ? 0 : errno;
  ::close(fd);
  ::unlink(tmp.c_str());
  if (e == 0 || e == EOPNOTSUPP || e == ENOSYS || e == EINVAL) return "";
  return fmt::format("no room for its {:.2f} MB: {}", double(bytes) / 1e6, errno_text(e));
}

// Rank 0, after the file is closed on every rank: fsync, rename, `latest`.
std::string publish(const std::string& tmp, const std::string& path, const std::string& dir, const std::string& name) {
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

// The root attributes: format, deck, state index, mode, codec, chain.
void write_root(Writer& w, hid_t file, const EncodedCheckpoint& enc) {
  const auto& data = enc.data;
  const auto& format = enc.format;
  const bool diff = enc.has_ranks && format.mode == "diff";
  w.string_attr(file, "format", "xuanxue-checkpoint");
  w.attr(file, "format_version", H5T_NATIVE_INT, kCheckpointVersion);
  w.string_attr(file, "deck", data.deck);
  if (!data.state_index.empty()) w.string_attr(file, "state_index", data.state_index);
  w.string_attr(file, "mode", enc.has_ranks ? format.mode : "full");
  w.string_attr(file, "codec", diff ? kernels::ckpt_codec::codec_name(format.codec.kind) : "none");
  w.attr(file, "codec_block", H5T_NATIVE_INT64, format.codec.block);
  w.string_attr(file, "chain_kind", enc.kind);
  w.string_attr(file, "chain_parent", enc.parent);
  if (enc.kind == "delta") w.string_attr(file, "chain_codec", kernels::ckpt_codec::codec_name(format.codec.kind));
  if (data.slabs) w.string_attr(file, "rank_tensors", "base");  // /ranks/<r> holds no tensors: the base is every rank's
  w.sync();
}

// The base: /model, /optimizer, /buffers, /train.
void write_base(Writer& w, hid_t file, const EncodedCheckpoint& enc) {
  const auto& data = enc.data;
  // The base: rank 0's copy of what every rank passes alike.
  auto tensors = [&](hid_t group, const std::vector<float>& flat) {
    for (const auto& t : enc.tensors) {
      std::vector<hsize_t> dims(t.shape.begin(), t.shape.end());
      const uint32_t crc = crc32c(flat.data() + t.offset, size_t(t.size) * sizeof(float));
      w.dataset(group, t.name, H5T_NATIVE_FLOAT, dims, 0, flat.data() + t.offset, crc, false, t.offset);
    }
  };
  // By slabs: every rank writes its own slabs of each tensor (they come tensor by tensor).
  auto tensor_slabs = [&](hid_t group, int i) {
    const TensorSlabs& mine = (*data.slabs)[size_t(i)];
    const TensorSlab *s = mine.slabs.data(), *end = s + mine.slabs.size();
    for (size_t k = 0; k < enc.tensors.size(); ++k) {
      const auto& t = enc.tensors[k];
      const TensorSlab* first = s;
      while (s != end && s->tensor == k) ++s;
      w.dataset_slabs(group, t.name, std::vector<hsize_t>(t.shape.begin(), t.shape.end()), first, s, mine.values,
                      enc.slab_crcs[i][k], t.offset);
    }
  };
  // A delta: each tensor's change since the chain's base, flat, through its codec.
  auto changes = [&](hid_t group, const std::vector<Part>& parts) {
    for (const auto& p : parts)
      w.dataset(group, p.name, p.type, {hsize_t(p.count)}, 0, p.data, p.crc, true, p.offset);
  };
  auto base_group = [&](hid_t group, int i, const std::vector<float>& flat) {
    if (enc.kind == "delta") changes(group, enc.base_parts[i]);
    else if (data.slabs) tensor_slabs(group, i);
    else tensors(group, flat);
  };
  {
    H5 model = w.group(file, "model");
    base_group(model, 0, data.params);
    H5 opt = w.group(file, "optimizer");
    w.string_attr(opt, "kind", "adamw");
    w.sync();
    H5 m = w.group(opt, "m");
    base_group(m, 1, data.adam_m);
    H5 v = w.group(opt, "v");
    base_group(v, 2, data.adam_v);
    if (!data.buffers.empty()) {
      H5 buffers = w.group(file, "buffers");
      for (const auto& [n, values] : data.buffers)
        w.dataset(buffers, n, H5T_NATIVE_FLOAT, {hsize_t(values.size())}, 0, values.data(), crc_of(values));
    }
    H5 train = w.group(file, "train");
    const auto& s = data.state;
    w.attr(train, "step", H5T_NATIVE_INT64, s.step);
    w.attr(train, "sampler_batches", H5T_NATIVE_INT64, s.sampler_batches);
    w.attr(train, "epoch", H5T_NATIVE_INT64, s.epoch);
    w.attr(train, "seed", H5T_NATIVE_UINT64, s.seed);
    w.attr(train, "world_size", H5T_NATIVE_INT, s.world_size);
    w.attr(train, "ep", H5T_NATIVE_INT, s.ep);
    w.attr(train, "loss", H5T_NATIVE_DOUBLE, s.last_loss);
    w.attr(train, "chaos_seed", H5T_NATIVE_UINT64, s.chaos_seed);
    w.sync();
    for (const auto& [n, values] : data.series)
      w.dataset(train, n, H5T_NATIVE_DOUBLE, {hsize_t(values.size())}, 0, values.data(), crc_of(values));
  }
}

// Every rank's /ranks/<r> datasets on rank 0, for `writer rank0`.
struct GatheredParts {
  std::vector<std::vector<const void*>> at;  // at[r][i]: rank r's part i (rank 0's: its own, in place)
  std::deque<std::vector<char>> received;    // the other ranks' bytes, which `at` points into
};

// Collective over comm: rank 0 gets every rank's parts (their sizes are in
// enc.meta), rank after rank, point to point in pieces of at most 1 GiB:
// MPI counts are int, and one rank's tensor may pass 2 GiB.
GatheredParts gather_parts(MPI_Comm comm, const EncodedCheckpoint& enc, int rank, int world) {
  constexpr int64_t kPiece = int64_t(1) << 30;
  const size_t parts = enc.parts.size(), stride = 2 * parts;
  auto check = [](int rc, const char* what) {
    if (rc != MPI_SUCCESS) throw std::runtime_error(fmt::format("checkpoint: gathering the ranks' state: {} failed", what));
  };
  GatheredParts out;
  if (rank == 0) {
    out.at.assign(world, std::vector<const void*>(parts, nullptr));
    for (size_t i = 0; i < parts; ++i) out.at[0][i] = enc.parts[i].data;
  }
  for (int r = 1; r < world; ++r) {
    if (rank != 0 && rank != r) continue;
    for (size_t i = 0; i < parts; ++i) {
      const int64_t bytes = enc.meta[r * stride + 2 * i] * int64_t(H5Tget_size(enc.parts[i].type));
      char* into = nullptr;
      if (rank == 0) into = out.received.emplace_back(size_t(bytes)).data(), out.at[r][i] = into;
      const char* from = static_cast<const char*>(enc.parts[i].data);
      for (int64_t done = 0; done < bytes; done += kPiece) {
        const int n = int(std::min(kPiece, bytes - done));
        if (rank == 0) check(MPI_Recv(into + done, n, MPI_BYTE, r, 0, comm, MPI_STATUS_IGNORE), "MPI_Recv");
        else check(MPI_Send(from + done, n, MPI_BYTE, 0, 0, comm), "MPI_Send");
      }
    }
  }
  return out;
}

// Each rank's own state: /ranks/<r>. Collectively every rank passes its own
// (owner r); alone, rank 0 passes everyone's from `gathered` (owner 0).
void write_ranks(Writer& w, hid_t file, const EncodedCheckpoint& enc, int world, const GatheredParts* gathered) {
  const size_t stride = 2 * enc.parts.size();
  H5 ranks = w.group(file, "ranks");
  for (int r = 0; r < world; ++r) {
    H5 group = w.group(ranks, std::to_string(r).c_str());
    w.attr(group, "sampler_batches", H5T_NATIVE_INT64, enc.batches[r]);
    w.sync();
    for (size_t i = 0; i < enc.parts.size(); ++i) {
      const int64_t count = enc.meta[r * stride + 2 * i];
      const auto crc = uint32_t(enc.meta[r * stride + 2 * i + 1]);
      const auto& p = enc.parts[i];
      const int owner = gathered ? 0 : r;
      const void* data = gathered ? gathered->at[r][i] : r == w.rank() ? p.data : nullptr;
      w.dataset(group, p.name, p.type, {hsize_t(count)}, owner, data, crc, p.codec != "full");
    }
    for (const auto& p : enc.parts)
      if (p.codec != "full") {
        const std::string tensor = p.name.substr(0, p.name.find('.'));
        if (H5Aexists(group, (tensor + ".codec").c_str()) <= 0)
          w.string_attr(group, (tensor + ".codec").c_str(), p.codec);
      }
    w.sync();
  }
}

// The whole file through `w`; WriteFailed on a failure.
void write_file(Writer& w, const EncodedCheckpoint& enc, int world, const GatheredParts* gathered) {
  const hid_t file = w.file();
  write_root(w, file, enc);
  write_base(w, file, enc);
  if (enc.has_ranks) write_ranks(w, file, enc, world, gathered);
  w.flush();
  w.sync();
  w.attr(file, "complete", H5T_NATIVE_INT, 1);  // last: a file without it never counts
  w.close();
}

// Every rank writes its share with parallel HDF5. Returns "" or the error,
// the same on every rank.
std::string write_collectively(MPI_Comm comm, const std::string& tmp, const EncodedCheckpoint& enc, int world) {
  try {
    Writer w(comm, tmp);
    write_file(w, enc, world, nullptr);
  } catch (const WriteFailed& e) {
    return e.what();  // thrown on every rank at the same sync; the file is closed
  }
  return "";
}

// Rank 0 writes the file alone, every rank's own state gathered onto it
// first; its outcome is broadcast. Returns "" or the error, on every rank.
std::string write_on_rank0(MPI_Comm comm, const std::string& tmp, const EncodedCheckpoint& enc, int rank, int world) {
  const GatheredParts gathered = enc.has_ranks ? gather_parts(comm, enc, rank, world) : GatheredParts{};
  std::string error;
  if (rank == 0) try {
    Writer w(tmp, bytes_at_least(enc, world));
    write_file(w, enc, world, &gathered);
  } catch (const WriteFailed& e) {
    error = e.what();
  }
  // Nothing of a failed file may stay open: HDF5 would close it again at exit.
  if (const ssize_t left = rank == 0 && !error.empty() ? H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL) : 0; left > 0)
    std::fprintf(stderr, "xuanxue: warning: HDF5 still holds %zd open object(s) after the failed write of %s\n", left,
                 tmp.c_str());
  broadcast_text(error, 0, comm);
  return error;
}

}  // namespace

bool checkpoint_write_failed() { return g_write_failed; }

std::string write_encoded(MPI_Comm comm, const std::string& dir, const EncodedCheckpoint& enc,
                          CheckpointWriter writer) {
  quiet_hdf5();
  int rank = 0, world = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &world);
  const std::string path = (fs::path(dir) / enc.name).string(), tmp = path + ".tmp";
  ActiveWriteScope scope(path, tmp, rank);
  // Every failure below ends up in `error`, the same text on every rank.
  std::string error;
  if (rank == 0) error = prepare_directory(dir);
  if (rank == 0 && error.empty()) error = reserve_space(tmp, bytes_at_least(enc, world));
  broadcast_text(error, 0, comm);
  if (error.empty())
    error = writer == CheckpointWriter::rank0 ? write_on_rank0(comm, tmp, enc, rank, world)
                                              : write_collectively(comm, tmp, enc, world);
  // Rank 0 makes it the checkpoint; the broadcast is the barrier that keeps
  // every rank here until it is on disk.
  if (error.empty()) {
    if (rank == 0) error = publish(tmp, path, dir, enc.name);
    broadcast_text(error, 0, comm);
  }
  if (error.empty()) {
    disarm_deadline();
    return path;
  }
  std::string line;
  if (rank == 0) {
    std::error_code ec;
    fs::remove(tmp, ec);
    line = failure_line(path, error);
  }
  broadcast_text(line, 0, comm);
  g_write_failed = true;
  disarm_deadline();  // given up together
  throw CheckpointWriteError(line);
}

std::string write_checkpoint(MPI_Comm comm, const std::string& dir, const ParamLayout& layout,
                             const CheckpointData& data, const RankState* mine, const CheckpointFormat& format,
                             ChainBase* chain) {
  return write_encoded(comm, dir, *encode_checkpoint(comm, layout, data, mine, format, chain));
}

std::string write_checkpoint(const std::string& dir, const ParamLayout& layout, const CheckpointData& data) {
  fs::create_directories(dir);
  const auto encoded = encode_checkpoint(MPI_COMM_SELF, layout, data, nullptr, {});
  return write_encoded(MPI_COMM_SELF, dir, *encoded, CheckpointWriter::rank0);  // one process: no MPI-IO needed
}

namespace {

// The chain attributes of an open file (files from before chains: a base).
ChainLink chain_link(hid_t file, const std::string& path) {
  ChainLink link;
  if (H5Aexists(file, "chain_kind") > 0) link.kind = read_string_attr(file, "chain_kind", path);
  if (H5Aexists(file, "chain_parent") > 0) link.parent = read_string_attr(file, "chain_parent", path);
  if (link.kind != "base" && link.kind != "delta")
    input_error("{}: attribute 'chain_kind' is '{}' (expected base or delta)", path, link.kind);
  if (link.kind == "delta" && link.parent.empty())
    input_error("{}: attribute 'chain_parent' is empty (expected the base file this delta is written against)", path);
  return link;
}

// The base file a delta needs, next to it: one clear error when it is gone.
std::string chain_parent_path(const std::string& path, const ChainLink& link) {
  const std::string parent = (fs::path(path).parent_path() / link.parent).string();
  if (!fs::exists(parent))
    input_error("{}: its chain base '{}' is missing (expected {} next to it: a delta checkpoint stores only the "
                "change since that file)", path, link.parent, parent);
  return parent;
}

// int8's block from root attribute codec_block; -1 in files from before it.
int64_t codec_block(hid_t file, const std::string& path) {
  return H5Aexists(file, "codec_block") > 0 ? read_attr<int64_t>(file, "codec_block", H5T_NATIVE_INT64, path) : -1;
}

// value[0, n) = the tensor stored as `name` in `group` through `codec`,
// rebuilt against base[0, n). `block` -1: the int8 block from the number of
// scales (files from before codec_block hold one flat vector per dataset).
void decode_stored(hid_t group, const std::string& name, const std::string& at, const std::string& codec,
                   float* value, const float* base, int64_t n, int64_t block, const std::string& path) {
  namespace cc = kernels::ckpt_codec;
  // The codec kernels read and write kernel memory; these arrays are the host's (KernelCopy).
  const KernelCopy<float> value_k(value, n, false);
  const KernelCopy<const float> base_k(base, n);
  const Vec<float> v = value_k.vec();
  const Vec<const float> bv = base_k.vec();
  try {
    if (codec == "lossless") {
      const auto diff = read_vector<uint32_t>(group, name, H5T_NATIVE_UINT32, n, at, path);
      cc::lossless_decode<float>(v, KernelCopy<const uint32_t>(diff.data(), n).vec(), bv);
    } else if (codec == "int8") {
      const auto codes = read_vector<int8_t>(group, name + ".codes", H5T_NATIVE_INT8, n, at + ".codes", path);
      const auto scales = read_vector<float>(group, name + ".scales", H5T_NATIVE_FLOAT, -1, at + ".scales", path);
      if (block < 1) block = scales.empty() ? 1 : (n + int64_t(scales.size()) - 1) / int64_t(scales.size());
      if (cc::scale_count(n, block) != int64_t(scales.size()))
        input_error("{}: dataset '{}.scales' has {} values (expected one per block of {} of its {} values)", path, at,
                    scales.size(), block, n);
      cc::int8_decode(v, KernelCopy<const int8_t>(codes.data(), n).vec(),
                      KernelCopy<const float>(scales.data(), int64_t(scales.size())).vec(), bv, block);
    } else if (codec == "topk") {
      const auto index = read_vector<uint32_t>(group, name + ".index", H5T_NATIVE_UINT32, -1, at + ".index", path);
      const auto kept =
          read_vector<float>(group, name + ".kept", H5T_NATIVE_FLOAT, int64_t(index.size()), at + ".kept", path);
      cc::topk_decode(v, KernelCopy<const uint32_t>(index.data(), int64_t(index.size())).vec(),
                      KernelCopy<const float>(kept.data(), int64_t(kept.size())).vec(), bv);
    } else {
      input_error("{}: tensor '{}' is stored with codec '{}' (expected lossless, int8 or topk)", path, at, codec);
    }
    value_k.copy_back();
  } catch (const std::runtime_error& e) {
    if (dynamic_cast<const InputError*>(&e)) throw;
    input_error("{}: dataset '{}' cannot be decoded ({})", path, at, e.what());
  }
}

// A delta's tensor: its codec is told by which datasets are there.
std::string delta_codec(hid_t group, const std::string& name) {
  if (H5Lexists(group, name.c_str(), H5P_DEFAULT) > 0) return "lossless";
  if (H5Lexists(group, (name + ".codes").c_str(), H5P_DEFAULT) > 0) return "int8";
  if (H5Lexists(group, (name + ".index").c_str(), H5P_DEFAULT) > 0) return "topk";
  return "";
}

}  // namespace

namespace {

// A complete checkpoint of a known format version, opened for reading.
H5 open_complete(const std::string& path) {
  quiet_hdf5();
  if (!fs::exists(path)) input_error("{}: no such checkpoint (expected an .h5 file written by xuanxue)", path);
  if (H5Fis_hdf5(path.c_str()) <= 0) input_error("{}: not an HDF5 file (expected a xuanxue checkpoint)", path);
  H5 file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (file < 0) input_error("{}: cannot open (corrupt or truncated HDF5 file)", path);
  if (read_string_attr(file, "format", path) != "xuanxue-checkpoint")
    input_error("{}: attribute 'format' is not 'xuanxue-checkpoint'", path);
  const int version = read_attr<int>(file, "format_version", H5T_NATIVE_INT, path);
  if (version < 1 || version > kCheckpointVersion)
    input_error("{}: format_version {} (expected 1 to {})", path, version, kCheckpointVersion);
  if (read_attr<int>(file, "complete", H5T_NATIVE_INT, path) != 1)
    input_error("{}: checkpoint is incomplete (attribute 'complete' is not 1)", path);
  return file;
}

}  // namespace

std::pair<int, int> read_checkpoint_layout(const std::string& path) {
  H5 file = open_complete(path);
  H5 train(H5Gopen2(file, "train", H5P_DEFAULT), H5Gclose);
  const int world = read_attr<int>(train, "world_size", H5T_NATIVE_INT, path);
  return {world, H5Aexists(train, "ep") > 0 ? read_attr<int>(train, "ep", H5T_NATIVE_INT, path) : 1};
}

std::string read_checkpoint_deck(const std::string& path) {
  H5 file = open_complete(path);
  return read_string_attr(file, "deck", path);
}

CheckpointData read_checkpoint(const std::string& path, const ParamLayout& layout,
                               const std::map<std::string, int64_t>& buffers, bool tensors) {
  H5 file = open_complete(path);
  CheckpointData data;
  data.deck = read_string_attr(file, "deck", path);
  if (tensors) {
    data.params.resize(layout.total());
    data.adam_m.resize(layout.total());
    data.adam_v.resize(layout.total());
  }
  for (const char* g : {"model", "optimizer/m", "optimizer/v", "train"})
    if (H5Lexists(file, "optimizer", H5P_DEFAULT) <= 0 || H5Lexists(file, g, H5P_DEFAULT) <= 0)
      input_error("{}: group '/{}' is missing (expected a xuanxue checkpoint)", path, g);
  // A delta: its chain's base file first (every check of that file applies),
  // then each tensor's change since it.
  const ChainLink link = chain_link(file, path);
  data.chain_kind = link.kind, data.chain_parent = link.parent;
  CheckpointData parent;
  if (link.kind == "delta" && tensors) {
    parent = read_checkpoint(chain_parent_path(path, link), layout, buffers);
    if (parent.chain_kind != "base")
      input_error("{}: its chain base '{}' is a {} (expected a base file)", path, link.parent, parent.chain_kind);
  }
  const int64_t block = codec_block(file, path);
  auto read_group = [&](const std::string& g, std::vector<float>& out, const std::vector<float>& was) {
    H5 group(H5Gopen2(file, g.c_str(), H5P_DEFAULT), H5Gclose);
    for (const auto& t : layout.tensors()) {
      if (link.kind == "base") {
        read_tensor(group, "/" + g, t, out.data(), path);
        continue;
      }
      const std::string at = "/" + g + "/" + t.name, codec = delta_codec(group, t.name);
      if (codec.empty())
        input_error("{}: tensor '{}' is missing (expected its change since {} for the deck's model)", path, at,
                    link.parent);
      decode_stored(group, t.name, at, codec, out.data() + t.offset, was.data() + t.offset, t.size, block, path);
    }
  };
  {
    if (tensors) {
      read_group("model", data.params, parent.params);
      read_group("optimizer/m", data.adam_m, parent.adam_m);
      read_group("optimizer/v", data.adam_v, parent.adam_v);
    }
    for (const auto& [name, size] : buffers) {
      if (H5Lexists(file, "buffers", H5P_DEFAULT) <= 0)
        input_error("{}: group '/buffers' is missing (expected the model's state buffers, e.g. '{}')", path, name);
      H5 group(H5Gopen2(file, "buffers", H5P_DEFAULT), H5Gclose);
      TensorInfo t;
      t.name = name;
      t.shape = {size};
      t.size = size;
      auto& values = data.buffers[name];
      values.resize(size);
      read_tensor(group, "/buffers", t, values.data(), path);
    }
    // Optional buffers (the outer optimizer's anchor, ...): whatever else is there.
    if (H5Lexists(file, "buffers", H5P_DEFAULT) > 0) {
      H5 group(H5Gopen2(file, "buffers", H5P_DEFAULT), H5Gclose);
      for (const auto& name : dataset_names(group, "/buffers", path))
        if (!data.buffers.count(name))
          data.buffers[name] = read_vector<float>(group, name, H5T_NATIVE_FLOAT, -1, "/buffers/" + name, path);
    }
    H5 train(H5Gopen2(file, "train", H5P_DEFAULT), H5Gclose);
    auto& s = data.state;
    s.step = read_attr<int64_t>(train, "step", H5T_NATIVE_INT64, path);
    s.sampler_batches = read_attr<int64_t>(train, "sampler_batches", H5T_NATIVE_INT64, path);
    s.epoch = read_attr<int64_t>(train, "epoch", H5T_NATIVE_INT64, path);
    s.seed = read_attr<uint64_t>(train, "seed", H5T_NATIVE_UINT64, path);
    s.world_size = read_attr<int>(train, "world_size", H5T_NATIVE_INT, path);
    if (H5Aexists(train, "ep") > 0) s.ep = read_attr<int>(train, "ep", H5T_NATIVE_INT, path);  // (absent before ep: 1)
    s.last_loss = read_attr<double>(train, "loss", H5T_NATIVE_DOUBLE, path);
    // (absent in checkpoints from before shuffle chaos: 0, no chaos seed)
    if (H5Aexists(train, "chaos_seed") > 0) s.chaos_seed = read_attr<uint64_t>(train, "chaos_seed", H5T_NATIVE_UINT64, path);
    data.series = read_series(train, path);
  }
  return data;
}

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
  quiet_hdf5();
  if (!fs::is_directory(dir)) return "";
  // Newest first by step number; the first whose `complete` attribute is set wins.
  for (const auto& path : step_files(dir)) {
    if (H5Fis_hdf5(path.c_str()) <= 0) continue;
    H5 file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
    if (file < 0 || H5Aexists(file, "complete") <= 0) continue;
    H5 attr(H5Aopen(file, "complete", H5P_DEFAULT), H5Aclose);
    int complete = 0;
    if (H5Aread(attr, H5T_NATIVE_INT, &complete) >= 0 && complete == 1) return path;
  }
  return "";
}


bool has_rank_state(const std::string& path) {
  quiet_hdf5();
  H5 file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  return file >= 0 && H5Lexists(file, "ranks", H5P_DEFAULT) > 0;
}

bool written_by_slabs(const std::string& path) {
  H5 file = open_complete(path);
  return chain_link(file, path).kind == "base" && H5Aexists(file, "rank_tensors") > 0 &&
         read_string_attr(file, "rank_tensors", path) == "base";
}

void read_slabs(MPI_Comm comm, const std::string& path, const ParamLayout& layout, std::array<TensorSlabs, 3>& slabs) {
  // Every rank learns the lowest failing rank's error, and throws it.
  auto agree = [&](std::string error) {
    int rank = 0, world = 1;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &world);
    int first = error.empty() ? world : rank;
    MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, comm);
    if (first == world) return;
    broadcast_text(error, first, comm);
    throw InputError(error);
  };
  const char* groups[3] = {"model", "optimizer/m", "optimizer/v"};
  std::array<std::map<size_t, uint32_t>, 3> want;  // the crc32c attribute of each tensor this rank read from
  std::string error;
  try {
    // Each rank alone, read-only: reads need no MPI-IO, and a bad chunk fails only here.
    H5 file = open_complete(path);
    for (int i = 0; i < 3; ++i) {
      TensorSlabs& mine = slabs[size_t(i)];
      int64_t size = 0;
      for (const auto& s : mine.slabs) size = std::max(size, s.at + s.count);
      mine.values.assign(size_t(size), 0.0f);
      H5 group(H5Gopen2(file, groups[i], H5P_DEFAULT), H5Gclose);
      if (group < 0) input_error("{}: group '/{}' is missing (expected a xuanxue checkpoint)", path, groups[i]);
      for (auto s = mine.slabs.begin(); s != mine.slabs.end();) {
        const TensorInfo& t = layout.tensors().at(s->tensor);
        const std::string where = fmt::format("/{}/{}", groups[i], t.name);
        if (H5Lexists(group, t.name.c_str(), H5P_DEFAULT) <= 0)
          input_error("{}: tensor '{}' is missing (expected by the deck's model)", path, where);
        H5 ds(H5Dopen2(group, t.name.c_str(), H5P_DEFAULT), H5Dclose);
        H5 space(H5Dget_space(ds), H5Sclose);
        std::vector<hsize_t> dims(size_t(std::max(H5Sget_simple_extent_ndims(space), 0)));
        H5Sget_simple_extent_dims(space, dims.data(), nullptr);
        if (std::vector<int64_t>(dims.begin(), dims.end()) != t.shape)
          input_error("{}: tensor '{}' has shape [{}] (expected [{}] from the deck's model)", path, where,
                      fmt::join(dims, ", "), fmt::join(t.shape, ", "));
        const hsize_t n = std::max<hsize_t>(1, mine.values.size());
        H5 mem(H5Screate_simple(1, &n, nullptr), H5Sclose);
        const size_t tensor = s->tensor;
        const auto first = s;
        while (s != mine.slabs.end() && s->tensor == tensor) ++s;
        slabs::select_slabs(mem, space, dims, &*first, &*first + (s - first));
        if (H5Sget_select_npoints(space) > 0 && H5Dread(ds, H5T_NATIVE_FLOAT, mem, space, H5P_DEFAULT, mine.values.data()) < 0)
          input_error("{}: tensor '{}' cannot be read (checksum mismatch or corrupt data)", path, where);
        if (H5Aexists(ds, "crc32c") <= 0)
          input_error("{}: tensor '{}' has no crc32c attribute (expected one in a file written by slabs)", path, where);
        want[size_t(i)][tensor] = read_attr<uint32_t>(ds, "crc32c", H5T_NATIVE_UINT32, path);
      }
    }
  } catch (const InputError& e) {
    error = e.what();
  }
  agree(error);
  // The checksums of the whole tensors, from every rank's slabs.
  for (int i = 0; i < 3; ++i) {
    const auto got = slabs::tensor_crcs(comm, layout, slabs[size_t(i)]);
    for (const auto& [tensor, crc] : want[size_t(i)])
      if (got[tensor] != crc && error.empty())
        error = fmt::format("{}: dataset '/{}/{}' fails its checksum (crc32c {:08x}, expected {:08x})", path, groups[i],
                            layout.tensors()[tensor].name, got[tensor], crc);
  }
  agree(error);
}

RankState read_rank_state(const std::string& path, const ParamLayout& layout, const CheckpointData& base, int rank,
                          const std::map<std::string, int64_t>& extra) {
  quiet_hdf5();
  H5 file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (file < 0) input_error("{}: cannot open (corrupt or truncated HDF5 file)", path);
  const std::string where = fmt::format("/ranks/{}", rank);
  if (H5Lexists(file, "ranks", H5P_DEFAULT) <= 0 || H5Lexists(file, where.c_str(), H5P_DEFAULT) <= 0)
    input_error("{}: group '{}' is missing (expected the state of rank {})", path, where, rank);
  H5 group(H5Gopen2(file, where.c_str(), H5P_DEFAULT), H5Gclose);
  const std::string mode = read_string_attr(file, "mode", path);
  const int64_t n = layout.total();
  // Written by slabs: the ranks agreed, and /ranks/<r> holds no tensors.
  const bool base_tensors = H5Aexists(file, "rank_tensors") > 0 &&
                            read_string_attr(file, "rank_tensors", path) == "base";
  if (mode == "diff" && !base_tensors && int64_t(base.params.size()) != n)
    input_error("{}: mode diff needs the base of the file to rebuild rank {} (expected {} values, got {})", path, rank,
                n, base.params.size());
  // Mode full in a delta: each tensor is the change since this rank's own
  // tensor in the chain's base file.
  const ChainLink link = chain_link(file, path);
  const bool own_delta = mode == "full" && link.kind == "delta" && !base_tensors;
  RankState was;
  if (own_delta) was = read_rank_state(chain_parent_path(path, link), layout, base, rank, extra);
  const int64_t block = codec_block(file, path);
  RankState out;
  out.sampler_batches = read_attr<int64_t>(group, "sampler_batches", H5T_NATIVE_INT64, path);
  const std::vector<float>* bases[3] = {&base.params, &base.adam_m, &base.adam_v};
  const std::vector<float>* owns[3] = {&was.params, &was.adam_m, &was.adam_v};
  std::vector<float>* targets[3] = {&out.params, &out.adam_m, &out.adam_v};
  const char* names[3] = {"params", "adam_m", "adam_v"};
  for (int i = 0; i < 3; ++i) {
    const std::string name = names[i], at = where + "/" + name;
    auto& value = *targets[i];
    if (base_tensors) {
      value = *bases[i];
      continue;
    }
    if (mode == "full" && !own_delta) {
      value = read_vector<float>(group, name, H5T_NATIVE_FLOAT, n, at, path);
      continue;
    }
    const std::string codec = read_string_attr(group, (name + ".codec").c_str(), path);
    value.assign(n, 0.0f);
    decode_stored(group, name, at, codec, value.data(), (own_delta ? *owns[i] : *bases[i]).data(), n, block, path);
    // A lossy second moment could dip below zero; AdamW takes its square root.
    if (i == 2 && codec != "lossless")
      for (auto& x : value) x = std::max(x, 0.0f);
  }
  for (const auto& [name, size] : extra)
    out.extra[name] = read_vector<float>(group, name, H5T_NATIVE_FLOAT, size, where + "/" + name, path);
  // Optional per-rank buffers (the outer optimizer's state): whatever else is there.
  for (const auto& n : dataset_names(group, where, path))
    if (!out.extra.count(n) && !n.starts_with("params") && !n.starts_with("adam_m") && !n.starts_with("adam_v"))
      out.extra[n] = read_vector<float>(group, n, H5T_NATIVE_FLOAT, -1, where + "/" + n, path);
  return out;
}


ChainLink read_chain_link(const std::string& path) {
  quiet_hdf5();
  H5 file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (file < 0) input_error("{}: cannot open (corrupt or truncated HDF5 file)", path);
  return chain_link(file, path);
}

void prune_checkpoints(const std::string& dir, int64_t keep) {
  quiet_hdf5();
  const std::vector<std::string> found = step_files(dir);
  std::string latest;
  if (std::ifstream in(fs::path(dir) / "latest"); in) std::getline(in, latest);
  // Kept: the newest `keep`, the one `latest` names, and every base a kept delta needs.
  std::set<std::string> kept;
  for (size_t i = 0; i < found.size(); ++i) {
    const std::string name = fs::path(found[i]).filename().string();
    if (i >= size_t(keep) && name != latest) continue;
    kept.insert(name);
    H5 file(H5Fopen(found[i].c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
    if (file >= 0 && H5Aexists(file, "chain_parent") > 0) {
      const std::string parent = read_string_attr(file, "chain_parent", found[i]);
      if (!parent.empty()) kept.insert(parent);
    }
  }
  for (const auto& path : found)
    if (!kept.count(fs::path(path).filename().string())) fs::remove(path);
}

}  // namespace xx

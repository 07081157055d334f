// Writing one checkpoint file with HDF5 under the failure protocol
// (write_guard.h): every rank of `comm` calls every HDF5 function in the
// same order with the same arguments (metadata is collective in parallel
// HDF5); a dataset's data comes from one rank (`owner`), the others select
// nothing, in one collective transfer (filters such as fletcher32 need it).
// A failure is recorded, not thrown, until the next sync(), where every rank
// throws WriteFailed alike.
//
// Alone (`writer rank0`'s rank 0, a one-process write) the same calls run on
// MPI_COMM_SELF, and HDF5 builds the file in memory (the core driver); the
// image goes to disk with plain POSIX writes at close(). HDF5 never meets a
// full disk there: once one of its writes has failed, HDF5 1.10.8 cannot
// close that file (a failed H5Fflush leaves its metadata cache unable to
// flush again: "slist already enabled?"), and closes it again at exit, in
// MPI_Finalize, on freed memory: a segfault (exit 139) after the right
// message, through MPI-IO on MPI_COMM_SELF and through sec2 (POSIX) alike.
#pragma once
#include <hdf5.h>
#include <mpi.h>
#include <stdexcept>
#include <string>
#include <vector>
#include "ckpt/checkpoint.h"
#include "ckpt/h5.h"
#include "ckpt/write_guard.h"

namespace xx {

// Thrown by H5Writer::sync on every rank alike: the first failure, its rank.
struct WriteFailed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class H5Writer {
 public:
  // Every rank of comm, parallel HDF5, into guard.tmp().
  H5Writer(MPI_Comm comm, WriteGuard& guard) : H5Writer(comm, guard, false, 0) {}
  // This process alone: in memory, then to guard.tmp() (about `bytes` in all).
  H5Writer(WriteGuard& guard, int64_t bytes) : H5Writer(MPI_COMM_SELF, guard, true, bytes) {}
  ~H5Writer() { release(); }
  H5Writer(const H5Writer&) = delete;
  H5Writer& operator=(const H5Writer&) = delete;
  hid_t file() const { return file_; }
  int rank() const { return rank_; }

  // Collective: when any rank has failed since the last sync, every rank
  // throws WriteFailed with the lowest failing rank's error.
  void sync();
  // Closes the file (collective; it flushes what HDF5 still holds) and syncs.
  void close();
  void flush();

  // A group; a failure is recorded (the id is then invalid, and so are the
  // calls on it, on this rank only, until the sync after it).
  h5::H5 group(hid_t parent, const std::string& name);
  template <class V>
  void attr(hid_t obj, const char* name, hid_t type, const V& value) {
    errno = 0;  // so that a failure's errno is its own
    h5::H5 space(H5Screate(H5S_SCALAR), H5Sclose);
    h5::H5 a(H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
    if (a < 0) return fail(std::string("create attribute ") + name);
    ok(H5Awrite(a, type, &value), std::string("write attribute ") + name);
  }
  void string_attr(hid_t obj, const char* name, const std::string& value);

  // Dataset `name` in `group` of `type` and shape `dims`, chunked, fletcher32,
  // optionally shuffle + deflate; data from `owner` (nullptr elsewhere);
  // attribute crc32c = the checksum of the bytes, which every rank passes.
  // `offset` >= 0: the tensor's offset in the flat buffer, as attribute `offset`.
  // `encoding`: attribute encoding, where the stored type is not what the
  // values are ("bfloat16": a float's top 16 bits, in uint16).
  void dataset(hid_t group, const std::string& name, hid_t type, const std::vector<hsize_t>& dims, int owner,
               const void* data, uint32_t crc, bool deflate = false, int64_t offset = -1,
               const char* encoding = nullptr);
  // A float tensor dataset as dataset() makes it, whose elements come from
  // every rank's slabs of it, [first, last) this rank's (all of this tensor)
  // from `values`, in one collective transfer; `crc` is the whole tensor's,
  // the same on every rank (slabs::tensor_crcs).
  void dataset_slabs(hid_t group, const std::string& name, const std::vector<hsize_t>& dims, const FrameSlab* first,
                     const FrameSlab* last, const std::vector<float>& values, uint32_t crc, int64_t offset) {
    slabs_of(group, name, dims, first, last, values.data(), values.size(), H5T_NATIVE_FLOAT, crc, offset, nullptr);
  }
  // ... of bf16 values, each a float's top 16 bits (`bits`, laid out as `values`): uint16, encoding "bfloat16"
  void dataset_slabs(hid_t group, const std::string& name, const std::vector<hsize_t>& dims, const FrameSlab* first,
                     const FrameSlab* last, const std::vector<uint16_t>& bits, uint32_t crc, int64_t offset) {
    slabs_of(group, name, dims, first, last, bits.data(), bits.size(), H5T_NATIVE_UINT16, crc, offset, "bfloat16");
  }

 private:
  H5Writer(MPI_Comm comm, WriteGuard& guard, bool alone, int64_t bytes);
  h5::H5 create_dataset(hid_t group, const std::string& name, hid_t type, const std::vector<hsize_t>& dims,
                        bool deflate);
  void slabs_of(hid_t group, const std::string& name, const std::vector<hsize_t>& dims, const FrameSlab* first,
                const FrameSlab* last, const void* values, size_t count, hid_t type, uint32_t crc, int64_t offset,
                const char* encoding);
  void finish_dataset(hid_t ds, uint32_t crc, int64_t offset, const char* encoding = nullptr);
  void close_alone();
  void release();
  bool ok(herr_t status, const std::string& what) {
    if (status < 0) fail(what);
    return status >= 0;
  }
  void fail(const std::string& what);

  MPI_Comm comm_;
  WriteGuard& guard_;
  bool alone_ = false;  // MPI_COMM_SELF, in memory: one process writes the whole file
  int rank_ = 0, world_ = 1;
  hid_t file_ = -1, dxpl_ = -1;
  std::string error_;  // this rank's first failure since the file was created
};

}  // namespace xx

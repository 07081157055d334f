// HDF5 helpers the checkpoint writers and readers share: a handle that
// closes itself, HDF5's error stack as text, and checked reads (every one
// throws InputError naming the file and the dataset or attribute).
#pragma once
#include <hdf5.h>
#include <sys/stat.h>
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>
#include <fmt/format.h>
#include "core/crc32c.h"
#include "core/error.h"
#include "core/placement.h"
#include "kernels/precision.h"

namespace xx::h5 {

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

// No automatic error printing: every failure is reported by the caller.
inline void quiet() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

inline std::string errno_text(int e) { return std::strerror(e); }

// The innermost message on HDF5's error stack (the cause), "" when empty.
inline std::string error_text() {
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

// " (HDF5: <cause>)" after a failed call, for the end of its message; "" when HDF5 said nothing.
inline std::string cause() {
  const std::string text = error_text();
  return text.empty() ? "" : fmt::format(" (HDF5: {})", text);
}

// HDF5's native type for T.
template <class T>
hid_t native();
template <> inline hid_t native<int>() { return H5T_NATIVE_INT; }
template <> inline hid_t native<int64_t>() { return H5T_NATIVE_INT64; }
template <> inline hid_t native<uint64_t>() { return H5T_NATIVE_UINT64; }
template <> inline hid_t native<double>() { return H5T_NATIVE_DOUBLE; }

// The bytes of file `path` (0 when it cannot be told): no dataset or
// attribute of it can hold more, before compression.
inline uint64_t file_bytes(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? uint64_t(st.st_size) : 0;
}

// Attribute `name` of `obj`, opened, holding one value (a scalar or one
// element): H5Aread writes every element, so more would overrun the value read into.
inline H5 open_single_attr(hid_t obj, const char* name, const std::string& path) {
  if (H5Aexists(obj, name) <= 0) input_error("{}: attribute '{}' is missing (expected a xuanxue checkpoint)", path, name);
  H5 attr(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  if (attr < 0) input_error("{}: cannot open attribute '{}'{}", path, name, cause());
  H5 space(H5Aget_space(attr), H5Sclose);
  const hssize_t n = space < 0 ? -1 : H5Sget_simple_extent_npoints(space);
  if (n != 1) input_error("{}: attribute '{}' holds {} values (expected one)", path, name, n);
  return attr;
}

template <class V>
V read_attr(hid_t obj, const char* name, hid_t type, const std::string& path) {
  H5 attr = open_single_attr(obj, name, path);
  V value{};
  if (H5Aread(attr, type, &value) < 0)
    input_error("{}: cannot read attribute '{}' as a number{}", path, name, cause());
  return value;
}

inline std::string read_string_attr(hid_t obj, const char* name, const std::string& path) {
  H5 attr = open_single_attr(obj, name, path);
  H5 type(H5Aget_type(attr), H5Tclose);
  if (type < 0 || H5Tget_class(type) != H5T_STRING || H5Tis_variable_str(type) != 0)
    input_error("{}: attribute '{}' is not a fixed-length string (expected one, as xuanxue writes it)", path, name);
  // Its bytes lie in the file: a longer string is a corrupt size, not a reason to allocate it.
  const size_t size = H5Tget_size(type);
  if (size == 0 || size > file_bytes(path))
    input_error("{}: attribute '{}' is a string of {} bytes (expected 1 to the file's {} bytes)", path, name, size,
                file_bytes(path));
  std::string value(size, '\0');
  H5 memtype(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(memtype, value.size());
  H5Tset_strpad(memtype, H5T_STR_NULLPAD);
  if (H5Aread(attr, memtype, value.data()) < 0)
    input_error("{}: cannot read attribute '{}' as a string{}", path, name, cause());
  while (!value.empty() && value.back() == '\0') value.pop_back();
  return value;
}

// Dataset `ds` must be stored in `type`, the type it is read into (as
// xuanxue writes it): then HDF5 copies its bytes without converting them.
// Its conversion of a corrupt stored type can overrun its own buffers
// (libhdf5 1.10.8, H5D__scatgath_read; found by tools/lab/fuzz).
inline void check_type(hid_t ds, hid_t type, const std::string& where, const std::string& path) {
  H5 stored(H5Dget_type(ds), H5Tclose);
  if (stored < 0 || H5Tequal(stored, type) <= 0) {
    const auto described = [](hid_t t) {
      if (t < 0) return std::string("unreadable");
      const H5T_class_t c = H5Tget_class(t);
      const char* name = c == H5T_INTEGER ? "integer" : c == H5T_FLOAT ? "float" : c == H5T_STRING ? "string" : "other";
      return fmt::format("{} of {} bytes", name, H5Tget_size(t));
    };
    input_error("{}: dataset '{}' is stored as {} (expected {}, as xuanxue writes it)", path, where,
                described(stored), described(type));
  }
}

// AdamW's moments kept in bf16 (optimizer adamw ... moments bf16) are stored
// as they are kept: each value's 16 bits (a float's top half) in uint16,
// with attribute encoding = "bfloat16"; read back widened, exactly.
inline bool stored_as_bf16(hid_t ds, const std::string& where, const std::string& path) {
  H5 stored(H5Dget_type(ds), H5Tclose);
  if (stored < 0 || H5Tequal(stored, H5T_STD_U16LE) <= 0) return false;
  const std::string encoding = H5Aexists(ds, "encoding") > 0 ? read_string_attr(ds, "encoding", path) : "";
  if (encoding != "bfloat16")
    input_error("{}: dataset '{}' is stored as uint16 with encoding '{}' (expected float32, or uint16 with "
                "encoding bfloat16)", path, where, encoding);
  return true;
}
inline void widen_bf16(const uint16_t* bits, size_t n, float* out) {
  std::transform(bits, bits + n, out, kernels::bf16_bits_to_float);
}

// Version 2 files carry a crc32c attribute on every dataset: the checksum
// of the values as written, verified on top of HDF5's fletcher32.
inline void verify_crc(hid_t ds, const void* data, size_t bytes, const std::string& where, const std::string& path) {
  if (H5Aexists(ds, "crc32c") <= 0) return;  // version 1
  const auto want = read_attr<uint32_t>(ds, "crc32c", H5T_NATIVE_UINT32, path);
  const uint32_t got = crc32c(data, bytes);
  if (got != want)
    input_error("{}: dataset '{}' fails its checksum (crc32c {:08x}, expected {:08x})", path, where, got, want);
}

// The tensor `t` of `group` into data + t.offset, its shape and checksums checked.
inline void read_tensor(hid_t group, const std::string& group_name, const FrameTensor& t, float* data,
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
  if (stored_as_bf16(ds, where, path)) {  // moments kept in bf16: widened (exact)
    std::vector<uint16_t> bits(size_t(t.size));
    if (H5Dread(ds, H5T_NATIVE_UINT16, H5S_ALL, H5S_ALL, H5P_DEFAULT, bits.data()) < 0)
      input_error("{}: tensor '{}' cannot be read (checksum mismatch or corrupt data){}", path, where, cause());
    widen_bf16(bits.data(), bits.size(), data + t.offset);
  } else {
    check_type(ds, H5T_NATIVE_FLOAT, where, path);
    if (H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data + t.offset) < 0)
      input_error("{}: tensor '{}' cannot be read (checksum mismatch or corrupt data){}", path, where, cause());
  }
  verify_crc(ds, data + t.offset, size_t(t.size) * sizeof(float), where, path);
}

// The most bytes dataset `ds` of file `path` can give back: what the file
// holds of it (at most the whole file), times deflate's largest ratio (1032)
// when it is deflated. Dimensions beyond this are corrupt (or chunks never
// written, which read as fill values): refused before anything is allocated.
inline uint64_t max_dataset_bytes(hid_t ds, const std::string& path) {
  const uint64_t stored = std::min<uint64_t>(H5Dget_storage_size(ds), file_bytes(path));
  H5 plist(H5Dget_create_plist(ds), H5Pclose);
  bool deflated = false;
  const int filters = plist < 0 ? 0 : H5Pget_nfilters(plist);
  for (int i = 0; i < filters; ++i) {
    unsigned flags = 0, config = 0;
    size_t cd_count = 0;
    deflated |= H5Pget_filter2(plist, unsigned(i), &flags, &cd_count, nullptr, 0, nullptr, &config) == H5Z_FILTER_DEFLATE;
  }
  return deflated ? stored * 1032 + 1024 : stored;
}

// A 1-D dataset of `expect` values (-1: any, as many as the file can hold), its crc32c attribute verified.
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
  if (const uint64_t most = max_dataset_bytes(ds, path); n > most / sizeof(T))
    input_error("{}: dataset '{}' claims {} values of {} bytes (expected at most {} bytes from the file's size)", path,
                where, n, sizeof(T), most);
  check_type(ds, type, where, path);
  std::vector<T> v(n);
  if (n > 0 && H5Dread(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) < 0)
    input_error("{}: dataset '{}' cannot be read (checksum mismatch or corrupt data){}", path, where, cause());
  verify_crc(ds, v.data(), v.size() * sizeof(T), where, path);
  return v;
}

// The datasets directly in `group` (not its subgroups), by name.
inline std::vector<std::string> dataset_names(hid_t group, const std::string& where, const std::string& path) {
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

// A file opened read-only (a negative id when it cannot be).
inline H5 open_read_only(const std::string& path) {
  quiet();
  return H5(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
}

}  // namespace xx::h5

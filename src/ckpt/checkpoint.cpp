#include "ckpt/checkpoint.h"
#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <fmt/format.h>
#include "core/error.h"

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
  operator hid_t() const { return id; }
};

void quiet_hdf5() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

void fsync_path(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) throw std::runtime_error("cannot open " + path + " to fsync");
  ::fsync(fd);
  ::close(fd);
}

void check(herr_t status, const std::string& what) {
  if (status < 0) throw std::runtime_error("HDF5: " + what + " failed");
}

template <class V>
void write_attr(hid_t obj, const char* name, hid_t type, const V& value) {
  H5 space(H5Screate(H5S_SCALAR), H5Sclose);
  H5 attr(H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  check(H5Awrite(attr, type, &value), std::string("write attribute ") + name);
}

void write_string_attr(hid_t obj, const char* name, const std::string& value) {
  H5 type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type, std::max<size_t>(1, value.size()));
  H5Tset_strpad(type, H5T_STR_NULLPAD);
  H5 space(H5Screate(H5S_SCALAR), H5Sclose);
  H5 attr(H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  check(H5Awrite(attr, type, value.data()), std::string("write attribute ") + name);
}

// One dataset per tensor, with its real shape, chunked so fletcher32 can guard it.
void write_tensor(hid_t group, const TensorInfo& t, const float* data) {
  std::vector<hsize_t> dims(t.shape.begin(), t.shape.end());
  H5 space(H5Screate_simple(int(dims.size()), dims.data(), nullptr), H5Sclose);
  H5 plist(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  std::vector<hsize_t> chunk = dims;
  // Keep chunks under ~1 MiB: shrink the leading dimension.
  const hsize_t row = t.size / std::max<int64_t>(1, t.shape[0]);
  chunk[0] = std::max<hsize_t>(1, std::min<hsize_t>(dims[0], (1u << 18) / std::max<hsize_t>(1, row)));
  check(H5Pset_chunk(plist, int(chunk.size()), chunk.data()), "set chunk");
  check(H5Pset_fletcher32(plist), "set fletcher32");
  H5 ds(H5Dcreate2(group, t.name.c_str(), H5T_NATIVE_FLOAT, space, H5P_DEFAULT, plist, H5P_DEFAULT), H5Dclose);
  if (ds < 0) throw std::runtime_error("HDF5: cannot create dataset " + t.name);
  check(H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data + t.offset), "write " + t.name);
}

// A named double vector under /train (chunked, fletcher32 like the tensors).
void write_series(hid_t group, const std::string& name, const std::vector<double>& values) {
  const hsize_t n = values.size(), chunk = std::max<hsize_t>(1, std::min<hsize_t>(n, 1 << 17));
  H5 space(H5Screate_simple(1, &n, nullptr), H5Sclose);
  H5 plist(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  check(H5Pset_chunk(plist, 1, &chunk), "set chunk");
  check(H5Pset_fletcher32(plist), "set fletcher32");
  H5 ds(H5Dcreate2(group, name.c_str(), H5T_NATIVE_DOUBLE, space, H5P_DEFAULT, plist, H5P_DEFAULT), H5Dclose);
  if (ds < 0) throw std::runtime_error("HDF5: cannot create dataset /train/" + name);
  if (n > 0) check(H5Dwrite(ds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), "write " + name);
}

// Every dataset directly under /train, by name.
std::map<std::string, std::vector<double>> read_series(hid_t group, const std::string& path) {
  std::map<std::string, std::vector<double>> out;
  H5G_info_t info;
  if (H5Gget_info(group, &info) < 0) input_error("{}: cannot list group '/train'", path);
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    char name[256] = {0};
    if (H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, i, name, sizeof name, H5P_DEFAULT) < 0) continue;
    H5 ds(H5Dopen2(group, name, H5P_DEFAULT), H5Dclose);
    if (ds < 0) continue;
    H5 space(H5Dget_space(ds), H5Sclose);
    if (H5Sget_simple_extent_ndims(space) != 1)
      input_error("{}: dataset '/train/{}' is not one-dimensional (expected a vector of doubles)", path, name);
    hsize_t n = 0;
    H5Sget_simple_extent_dims(space, &n, nullptr);
    auto& v = out[name];
    v.resize(n);
    if (n > 0 && H5Dread(ds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) < 0)
      input_error("{}: dataset '/train/{}' cannot be read (checksum mismatch or corrupt data)", path, name);
  }
  return out;
}

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
}

}  // namespace

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

std::string write_checkpoint(const std::string& dir, const ParamLayout& layout, const CheckpointData& data) {
  quiet_hdf5();
  fs::create_directories(dir);
  const std::string name = fmt::format("step_{:08d}.h5", data.state.step);
  const std::string path = (fs::path(dir) / name).string(), tmp = path + ".tmp";
  {
    H5 file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
    if (file < 0) throw std::runtime_error("HDF5: cannot create " + tmp);
    write_string_attr(file, "format", "xuanxue-checkpoint");
    write_attr(file, "format_version", H5T_NATIVE_INT, kCheckpointVersion);
    write_string_attr(file, "deck", data.deck);
    {
      H5 model(H5Gcreate2(file, "model", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
      for (const auto& t : layout.tensors()) write_tensor(model, t, data.params.data());
      H5 opt(H5Gcreate2(file, "optimizer", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
      write_string_attr(opt, "kind", "adamw");
      H5 m(H5Gcreate2(opt, "m", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
      for (const auto& t : layout.tensors()) write_tensor(m, t, data.adam_m.data());
      H5 v(H5Gcreate2(opt, "v", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
      for (const auto& t : layout.tensors()) write_tensor(v, t, data.adam_v.data());
      if (!data.buffers.empty()) {
        H5 buffers(H5Gcreate2(file, "buffers", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
        for (const auto& [name, values] : data.buffers) {
          TensorInfo t;
          t.name = name;
          t.shape = {int64_t(values.size())};
          t.size = int64_t(values.size());
          write_tensor(buffers, t, values.data());
        }
      }
      H5 train(H5Gcreate2(file, "train", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
      const auto& s = data.state;
      write_attr(train, "step", H5T_NATIVE_INT64, s.step);
      write_attr(train, "sampler_batches", H5T_NATIVE_INT64, s.sampler_batches);
      write_attr(train, "epoch", H5T_NATIVE_INT64, s.epoch);
      write_attr(train, "seed", H5T_NATIVE_UINT64, s.seed);
      write_attr(train, "world_size", H5T_NATIVE_INT, s.world_size);
      write_attr(train, "loss", H5T_NATIVE_DOUBLE, s.last_loss);
      write_attr(train, "chaos_seed", H5T_NATIVE_UINT64, s.chaos_seed);
      for (const auto& [name, values] : data.series) write_series(train, name, values);
    }
    H5Fflush(file, H5F_SCOPE_GLOBAL);
    write_attr(file, "complete", H5T_NATIVE_INT, 1);  // last: a file without it never counts
  }
  fsync_path(tmp, false);
  fs::rename(tmp, path);
  fsync_path(dir, true);
  write_file_atomic((fs::path(dir) / "latest").string(), name + "\n");
  return path;
}

CheckpointData read_checkpoint(const std::string& path, const ParamLayout& layout,
                               const std::map<std::string, int64_t>& buffers) {
  quiet_hdf5();
  if (!fs::exists(path)) input_error("{}: no such checkpoint (expected an .h5 file written by xuanxue)", path);
  if (H5Fis_hdf5(path.c_str()) <= 0) input_error("{}: not an HDF5 file (expected a xuanxue checkpoint)", path);
  H5 file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (file < 0) input_error("{}: cannot open (corrupt or truncated HDF5 file)", path);
  if (read_string_attr(file, "format", path) != "xuanxue-checkpoint")
    input_error("{}: attribute 'format' is not 'xuanxue-checkpoint'", path);
  const int version = read_attr<int>(file, "format_version", H5T_NATIVE_INT, path);
  if (version != kCheckpointVersion)
    input_error("{}: format_version {} (expected {})", path, version, kCheckpointVersion);
  if (read_attr<int>(file, "complete", H5T_NATIVE_INT, path) != 1)
    input_error("{}: checkpoint is incomplete (attribute 'complete' is not 1)", path);
  CheckpointData data;
  data.deck = read_string_attr(file, "deck", path);
  data.params.resize(layout.total());
  data.adam_m.resize(layout.total());
  data.adam_v.resize(layout.total());
  for (const char* g : {"model", "optimizer/m", "optimizer/v", "train"})
    if (H5Lexists(file, "optimizer", H5P_DEFAULT) <= 0 || H5Lexists(file, g, H5P_DEFAULT) <= 0)
      input_error("{}: group '/{}' is missing (expected a xuanxue checkpoint)", path, g);
  {
    H5 model(H5Gopen2(file, "model", H5P_DEFAULT), H5Gclose);
    for (const auto& t : layout.tensors()) read_tensor(model, "/model", t, data.params.data(), path);
    H5 m(H5Gopen2(file, "optimizer/m", H5P_DEFAULT), H5Gclose);
    for (const auto& t : layout.tensors()) read_tensor(m, "/optimizer/m", t, data.adam_m.data(), path);
    H5 v(H5Gopen2(file, "optimizer/v", H5P_DEFAULT), H5Gclose);
    for (const auto& t : layout.tensors()) read_tensor(v, "/optimizer/v", t, data.adam_v.data(), path);
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
    H5 train(H5Gopen2(file, "train", H5P_DEFAULT), H5Gclose);
    auto& s = data.state;
    s.step = read_attr<int64_t>(train, "step", H5T_NATIVE_INT64, path);
    s.sampler_batches = read_attr<int64_t>(train, "sampler_batches", H5T_NATIVE_INT64, path);
    s.epoch = read_attr<int64_t>(train, "epoch", H5T_NATIVE_INT64, path);
    s.seed = read_attr<uint64_t>(train, "seed", H5T_NATIVE_UINT64, path);
    s.world_size = read_attr<int>(train, "world_size", H5T_NATIVE_INT, path);
    s.last_loss = read_attr<double>(train, "loss", H5T_NATIVE_DOUBLE, path);
    // (absent in checkpoints from before shuffle chaos: 0, no chaos seed)
    if (H5Aexists(train, "chaos_seed") > 0) s.chaos_seed = read_attr<uint64_t>(train, "chaos_seed", H5T_NATIVE_UINT64, path);
    data.series = read_series(train, path);
  }
  return data;
}

std::string latest_checkpoint(const std::string& dir) {
  quiet_hdf5();
  if (!fs::is_directory(dir)) return "";
  // Newest first by step number; the first whose `complete` attribute is set wins.
  std::vector<std::pair<int64_t, std::string>> found;
  const std::regex pattern("step_([0-9]+)\\.h5");
  for (const auto& e : fs::directory_iterator(dir)) {
    std::smatch m;
    const std::string name = e.path().filename().string();
    if (std::regex_match(name, m, pattern)) found.emplace_back(std::stoll(m[1]), e.path().string());
  }
  std::sort(found.rbegin(), found.rend());
  for (const auto& [step, path] : found) {
    if (H5Fis_hdf5(path.c_str()) <= 0) continue;
    H5 file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
    if (file < 0 || H5Aexists(file, "complete") <= 0) continue;
    H5 attr(H5Aopen(file, "complete", H5P_DEFAULT), H5Aclose);
    int complete = 0;
    if (H5Aread(attr, H5T_NATIVE_INT, &complete) >= 0 && complete == 1) return path;
  }
  return "";
}

}  // namespace xx

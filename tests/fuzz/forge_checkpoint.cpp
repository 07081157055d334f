// Hand-made bad checkpoints for tests/fuzz/replay.sh: a copy of a real one
// with one thing changed through HDF5's own API, so that the file is valid
// HDF5 and only xuanxue's reader can refuse it. Each case is a finding of
// the fuzzing work (docs/CHECKPOINT.md, "Fuzzing the reader") or a control.
//   xx_ckpt_forge CASE IN OUT     (CASE: see kCases below)
#include <hdf5.h>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace {

// Root attribute `name` replaced by one of `type` over `space`, holding `data`.
void replace_attr(hid_t obj, const char* name, hid_t type, hid_t space, const void* data) {
  if (H5Aexists(obj, name) > 0) H5Adelete(obj, name);
  const hid_t a = H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(a, type, data);
  H5Aclose(a);
}

void string_attr(hid_t obj, const char* name, const std::string& value) {
  const hid_t type = H5Tcopy(H5T_C_S1);
  H5Tset_size(type, value.size());
  const hid_t space = H5Screate(H5S_SCALAR);
  replace_attr(obj, name, type, space, value.data());
  H5Sclose(space), H5Tclose(type);
}

void int_attr(hid_t obj, const char* name, int value) {
  const hid_t space = H5Screate(H5S_SCALAR);
  replace_attr(obj, name, H5T_NATIVE_INT, space, &value);
  H5Sclose(space);
}

// A chunked 1-D dataset of n values never written: it reads as fill values
// and takes no room in the file, whatever n says.
void unwritten_dataset(hid_t group, const char* name, hid_t type, hsize_t n) {
  const hid_t space = H5Screate_simple(1, &n, nullptr);
  const hid_t plist = H5Pcreate(H5P_DATASET_CREATE);
  const hsize_t chunk = 1 << 16;
  H5Pset_chunk(plist, 1, &chunk);
  H5Dclose(H5Dcreate2(group, name, type, space, H5P_DEFAULT, plist, H5P_DEFAULT));
  H5Pclose(plist), H5Sclose(space);
}

void small_dataset(hid_t group, const char* name, const std::vector<float>& values) {
  const hsize_t n = values.size();
  const hid_t space = H5Screate_simple(1, &n, nullptr);
  const hid_t ds = H5Dcreate2(group, name, H5T_NATIVE_FLOAT, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data());
  H5Dclose(ds), H5Sclose(space);
}

std::string first_link(hid_t group) {
  char name[256] = {0};
  H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, 0, name, sizeof name, H5P_DEFAULT);
  return name;
}

struct Case {
  const char* name;
  const char* what;
  std::function<void(hid_t file, const std::string& out)> forge;
};

const Case kCases[] = {
    {"shape", "the first tensor of /model replaced by one of 3 values",
     [](hid_t f, const std::string&) {
       const hid_t g = H5Gopen2(f, "model", H5P_DEFAULT);
       const std::string t = first_link(g);
       H5Ldelete(g, t.c_str(), H5P_DEFAULT);
       small_dataset(g, t.c_str(), {1, 2, 3});
       H5Gclose(g);
     }},
    {"wide_float", "the first tensor of /model stored as floats of 8 bytes (32 bits used), its shape kept",
     [](hid_t f, const std::string&) {
       // The fuzzer's crash: a float type of 262144 bytes made HDF5's
       // conversion read 1 MB past a 260-byte buffer. Any stored type but
       // the one read into is refused before HDF5 converts it.
       const hid_t g = H5Gopen2(f, "model", H5P_DEFAULT);
       const std::string t = first_link(g);
       const hid_t old = H5Dopen2(g, t.c_str(), H5P_DEFAULT);
       const hid_t space = H5Dget_space(old);
       const hssize_t n = H5Sget_simple_extent_npoints(space);
       H5Dclose(old);
       H5Ldelete(g, t.c_str(), H5P_DEFAULT);
       const hid_t wide = H5Tcopy(H5T_IEEE_F32LE);
       H5Tset_size(wide, 8);
       const hid_t ds = H5Dcreate2(g, t.c_str(), wide, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
       std::vector<float> values(size_t(n), 0.5f);
       H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data());
       H5Dclose(ds), H5Tclose(wide), H5Sclose(space), H5Gclose(g);
     }},
    {"huge_series", "/train/huge: 2^40 doubles never written (a series of any length)",
     [](hid_t f, const std::string&) {
       const hid_t g = H5Gopen2(f, "train", H5P_DEFAULT);
       unwritten_dataset(g, "huge", H5T_NATIVE_DOUBLE, hsize_t(1) << 40);
       H5Gclose(g);
     }},
    {"huge_buffer", "/buffers/huge: 2^36 floats never written (an optional buffer)",
     [](hid_t f, const std::string&) {
       const hid_t g = H5Lexists(f, "buffers", H5P_DEFAULT) > 0 ? H5Gopen2(f, "buffers", H5P_DEFAULT)
                                                               : H5Gcreate2(f, "buffers", H5P_DEFAULT, H5P_DEFAULT,
                                                                            H5P_DEFAULT);
       unwritten_dataset(g, "huge", H5T_NATIVE_FLOAT, hsize_t(1) << 36);
       H5Gclose(g);
     }},
    {"array_attr", "root attribute complete: 8000 ints instead of one (read into one int)",
     [](hid_t f, const std::string&) {
       const hsize_t n = 8000;
       std::vector<int> ones(n, 1);
       const hid_t space = H5Screate_simple(1, &n, nullptr);
       replace_attr(f, "complete", H5T_NATIVE_INT, space, ones.data());
       H5Sclose(space);
     }},
    {"array_string", "root attribute format: 2000 strings instead of one (read into one)",
     [](hid_t f, const std::string&) {
       const hsize_t n = 2000;
       const std::string one = "xuanxue-checkpoint";
       std::string all;
       for (hsize_t i = 0; i < n; ++i) all += one;
       const hid_t type = H5Tcopy(H5T_C_S1);
       H5Tset_size(type, one.size());
       const hid_t space = H5Screate_simple(1, &n, nullptr);
       replace_attr(f, "format", type, space, all.data());
       H5Sclose(space), H5Tclose(type);
     }},
    {"vlen_string", "root attribute mode: a variable-length string",
     [](hid_t f, const std::string&) {
       const hid_t type = H5Tcopy(H5T_C_S1);
       H5Tset_size(type, H5T_VARIABLE);
       const hid_t space = H5Screate(H5S_SCALAR);
       const char* value = "full";
       replace_attr(f, "mode", type, space, &value);
       H5Sclose(space), H5Tclose(type);
     }},
    {"self_chain", "a delta whose chain base is itself",
     [](hid_t f, const std::string& out) {
       string_attr(f, "chain_kind", "delta");
       string_attr(f, "chain_parent", std::filesystem::path(out).filename().string());
     }},
    {"world_zero", "/train world_size 0 (a resume divides by it)",
     [](hid_t f, const std::string&) {
       const hid_t g = H5Gopen2(f, "train", H5P_DEFAULT);
       int_attr(g, "world_size", 0);
       H5Gclose(g);
     }},
    {"extra_one_rank", "an optional per-rank buffer /ranks/0/foo that rank 1 lacks (ranks merged on resume)",
     [](hid_t f, const std::string&) {
       const hid_t g = H5Gopen2(f, "ranks/0", H5P_DEFAULT);
       small_dataset(g, "foo", {1, 2, 3, 4});
       H5Gclose(g);
     }},
};

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "-list") == 0) {
    for (const auto& c : kCases) std::printf("%s\t%s\n", c.name, c.what);
    return 0;
  }
  if (argc != 4) {
    std::fprintf(stderr, "usage: xx_ckpt_forge CASE IN OUT | xx_ckpt_forge -list\n");
    return 1;
  }
  for (const auto& c : kCases) {
    if (c.name != std::string(argv[1])) continue;
    std::filesystem::copy_file(argv[2], argv[3], std::filesystem::copy_options::overwrite_existing);
    const hid_t f = H5Fopen(argv[3], H5F_ACC_RDWR, H5P_DEFAULT);
    if (f < 0) return std::fprintf(stderr, "xx_ckpt_forge: cannot open %s\n", argv[3]), 1;
    c.forge(f, argv[3]);
    return H5Fclose(f) < 0 ? 1 : 0;
  }
  std::fprintf(stderr, "xx_ckpt_forge: no case '%s' (-list names them)\n", argv[1]);
  return 1;
}

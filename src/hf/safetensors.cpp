// Safetensors files and sets (interface in safetensors.h).
#include "hf/safetensors.h"
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <stdexcept>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include "core/error.h"

namespace xx {

namespace {

using json = nlohmann::json;

constexpr uint64_t kMaxHeader = uint64_t(100) << 20;  // the format's own bound

struct Kind {
  const char* name;
  StDtype dtype;
  int bytes;
};
// Every dtype the format defines; the ones read first.
constexpr Kind kKinds[] = {{"F32", StDtype::f32, 4},      {"F16", StDtype::f16, 2},     {"BF16", StDtype::bf16, 2},
                           {"F8_E4M3", StDtype::f8_e4m3, 1}, {"F64", StDtype::other, 8},  {"I64", StDtype::other, 8},
                           {"U64", StDtype::other, 8},      {"I32", StDtype::other, 4},   {"U32", StDtype::other, 4},
                           {"I16", StDtype::other, 2},      {"U16", StDtype::other, 2},   {"I8", StDtype::other, 1},
                           {"U8", StDtype::other, 1},       {"BOOL", StDtype::other, 1},  {"F8_E5M2", StDtype::other, 1}};

std::array<float, 256> f8_table() {
  std::array<float, 256> t{};
  for (int b = 0; b < 256; ++b) {
    const int sign = b >> 7, exponent = (b >> 3) & 0xf, mantissa = b & 7;
    float v;
    if (exponent == 0xf && mantissa == 7) v = std::numeric_limits<float>::quiet_NaN();  // e4m3fn: no infinities
    else if (exponent == 0) v = std::ldexp(float(mantissa) / 8.0f, -6);                  // subnormal
    else v = std::ldexp(1.0f + float(mantissa) / 8.0f, exponent - 7);
    t[size_t(b)] = sign ? -v : v;
  }
  return t;
}

}  // namespace

float bf16_to_float(uint16_t bits) {
  const uint32_t u = uint32_t(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

float f16_to_float(uint16_t bits) {
  const uint32_t sign = uint32_t(bits >> 15) << 31, exponent = (bits >> 10) & 0x1f, mantissa = bits & 0x3ff;
  uint32_t u;
  if (exponent == 0x1f) {
    u = sign | 0x7f800000u | (mantissa << 13);  // inf, nan
  } else if (exponent != 0) {
    u = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else {  // zero or subnormal: mantissa * 2^-24, exact in float
    const float v = std::ldexp(float(mantissa), -24);
    std::memcpy(&u, &v, 4);
    u |= sign;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

float f8_e4m3_to_float(uint8_t bits) {
  static const std::array<float, 256> table = f8_table();
  return table[bits];
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) input_error("{}: cannot open ({}) (expected a safetensors file)", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    input_error("{}: not a regular file (expected a safetensors file)", path);
  }
  size_ = size_t(st.st_size);
  if (size_ < 8) {
    ::close(fd);
    input_error("{}: {} bytes (expected at least 8: the header's length)", path, size_);
  }
  void* m = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) input_error("{}: cannot map ({})", path, std::strerror(errno));
  map_ = static_cast<const unsigned char*>(m);
  try {
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | map_[i];
    if (n < 2 || n > kMaxHeader || n > size_ - 8)
      input_error("{}: offset 0: header length {} (expected 2 to {} bytes, within the file's {})", path, n,
                  std::min<uint64_t>(kMaxHeader, size_ - 8), size_);
    data_at_ = 8 + n;
    const uint64_t data_size = size_ - data_at_;
    json header;
    try {
      header = json::parse(map_ + 8, map_ + 8 + n);
    } catch (const json::parse_error& e) {
      input_error("{}: offset {}: the header is not JSON ({}) (expected the tensors' JSON)", path, 8 + e.byte, e.what());
    }
    if (!header.is_object()) input_error("{}: offset 8: the header is {} (expected a JSON object)", path, header.type_name());
    for (auto it = header.begin(); it != header.end(); ++it) {
      const std::string& name = it.key();
      const json& v = it.value();
      if (name == "__metadata__") {
        if (!v.is_object()) input_error("{}: __metadata__ is {} (expected an object of strings)", path, v.type_name());
        for (auto m2 = v.begin(); m2 != v.end(); ++m2)
          if (m2.value().is_string()) metadata_[m2.key()] = m2.value().get<std::string>();
        continue;
      }
      auto bad = [&](const std::string& what) {
        input_error("{}: tensor '{}': {} (expected \"dtype\", \"shape\" and \"data_offsets\" of the safetensors "
                    "format)", path, name, what);
      };
      if (!v.is_object()) bad(fmt::format("is {}", v.type_name()));
      StTensor t;
      t.name = name;
      const auto d = v.find("dtype");
      if (d == v.end() || !d->is_string()) bad("no dtype string");
      t.dtype_name = d->get<std::string>();
      const Kind* kind = nullptr;
      for (const auto& k : kKinds)
        if (t.dtype_name == k.name) kind = &k;
      if (!kind) bad(fmt::format("dtype '{}' is not one of the format's", t.dtype_name));
      t.dtype = kind->dtype;
      t.element_bytes = kind->bytes;
      const auto s = v.find("shape");
      if (s == v.end() || !s->is_array() || s->size() > 16) bad("no shape list (of at most 16 sizes)");
      uint64_t count = 1;
      for (const auto& x : *s) {
        if (!x.is_number_unsigned()) bad(fmt::format("shape {} (expected sizes >= 0)", s->dump()));
        const uint64_t e = x.get<uint64_t>();
        if (e != 0 && count > data_size / e) bad(fmt::format("shape {} holds more than the file's {} data bytes", s->dump(), data_size));
        count *= e;
        t.shape.push_back(int64_t(e));
      }
      t.count = int64_t(count);
      const auto o = v.find("data_offsets");
      if (o == v.end() || !o->is_array() || o->size() != 2 || !(*o)[0].is_number_unsigned() ||
          !(*o)[1].is_number_unsigned())
        bad("no data_offsets [begin, end]");
      t.begin = (*o)[0].get<uint64_t>(), t.end = (*o)[1].get<uint64_t>();
      if (t.begin > t.end || t.end > data_size)
        bad(fmt::format("data_offsets [{}, {}] outside the {} data bytes", t.begin, t.end, data_size));
      if (t.end - t.begin != count * uint64_t(kind->bytes))
        bad(fmt::format("data_offsets [{}, {}] hold {} bytes, but {} elements of {} take {}", t.begin, t.end,
                        t.end - t.begin, count, t.dtype_name, count * uint64_t(kind->bytes)));
      by_name_[name] = tensors_.size();
      tensors_.push_back(std::move(t));
    }
    // No two tensors share bytes (the format lays them back to back).
    std::vector<const StTensor*> order;
    for (const auto& t : tensors_) order.push_back(&t);
    std::sort(order.begin(), order.end(), [](const StTensor* a, const StTensor* b) { return a->begin < b->begin; });
    for (size_t i = 1; i < order.size(); ++i)
      if (order[i]->begin < order[i - 1]->end)
        input_error("{}: tensors '{}' and '{}' overlap (data bytes [{}, {}) and [{}, {})) (expected disjoint byte "
                    "ranges)", path, order[i - 1]->name, order[i]->name, order[i - 1]->begin, order[i - 1]->end,
                    order[i]->begin, order[i]->end);
  } catch (...) {
    ::munmap(const_cast<unsigned char*>(map_), size_);
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(const_cast<unsigned char*>(map_), size_);
}

const StTensor* SafetensorsFile::find(const std::string& name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

void SafetensorsFile::read(const StTensor& t, int64_t first, int64_t count, float* out) const {
  if (first < 0 || count < 0 || first > t.count || count > t.count - first)
    throw std::out_of_range(fmt::format("{}: tensor '{}': elements [{}, {}) of {}", path_, t.name, first,
                                        first + count, t.count));
  const unsigned char* p = map_ + data_at_ + t.begin;
  switch (t.dtype) {
    case StDtype::f32:
      std::memcpy(out, p + 4 * first, size_t(count) * 4);  // little-endian, as the format and this host
      break;
    case StDtype::bf16:
    case StDtype::f16:
      for (int64_t i = 0; i < count; ++i) {
        const unsigned char* e = p + 2 * (first + i);
        const uint16_t bits = uint16_t(e[0] | (e[1] << 8));
        out[i] = t.dtype == StDtype::bf16 ? bf16_to_float(bits) : f16_to_float(bits);
      }
      break;
    case StDtype::f8_e4m3:
      for (int64_t i = 0; i < count; ++i) out[i] = f8_e4m3_to_float(p[first + i]);
      break;
    case StDtype::other:
      input_error("{}: tensor '{}' is {} (expected F32, F16, BF16 or F8_E4M3 weights)", path_, t.name, t.dtype_name);
  }
}

void SafetensorsFile::release(const StTensor& t, int64_t first, int64_t count) const {
  const uint64_t bytes = uint64_t(t.element_bytes);
  const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = uintptr_t(map_ + data_at_ + t.begin + uint64_t(first) * bytes) / page * page;
  const uintptr_t end = uintptr_t(map_ + data_at_ + t.begin + uint64_t(first + count) * bytes);
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);  // advice: no error to handle
}

std::vector<float> SafetensorsFile::read_all(const StTensor& t) const {
  std::vector<float> out(size_t(t.count));  // t.count * its size fits in the file: checked when mapped
  read(t, 0, t.count, out.data());
  return out;
}

SafetensorsSet::SafetensorsSet(const std::string& dir) : dir_(dir) {
  namespace fs = std::filesystem;
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  const fs::path single = fs::path(dir) / "model.safetensors";
  if (fs::exists(index)) {
    index_ = index.string();
    std::ifstream in(index_, std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    json doc;
    try {
      doc = json::parse(text);
    } catch (const json::parse_error& e) {
      input_error("{}: byte {}: not JSON ({}) (expected the index of a sharded checkpoint)", index_, e.byte, e.what());
    }
    const auto map = doc.is_object() ? doc.find("weight_map") : doc.end();
    if (map == doc.end() || !map->is_object())
      input_error("{}: no weight_map object (expected {{\"weight_map\": {{TENSOR: FILE}}}})", index_);
    for (auto it = map->begin(); it != map->end(); ++it) {
      if (!it.value().is_string())
        input_error("{}: weight_map '{}' is {} (expected a file name)", index_, it.key(), it.value().type_name());
      const std::string file = it.value().get<std::string>();
      if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..")
        input_error("{}: weight_map '{}' names '{}' (expected a file name in {}, without a path)", index_, it.key(),
                    file, dir);
      weight_map_[it.key()] = file;
    }
  } else if (fs::exists(single)) {
    index_ = single.string();
    files_["model.safetensors"] = std::make_unique<SafetensorsFile>(index_);
    for (const auto& t : files_["model.safetensors"]->tensors()) weight_map_[t.name] = "model.safetensors";
  } else {
    input_error("{}: neither model.safetensors nor model.safetensors.index.json (expected a Hugging Face model "
                "directory)", dir);
  }
}

const SafetensorsFile& SafetensorsSet::file(const std::string& name) const {
  auto& f = files_[name];
  if (!f) f = std::make_unique<SafetensorsFile>((std::filesystem::path(dir_) / name).string());
  return *f;
}

bool SafetensorsSet::contains(const std::string& name) const { return weight_map_.count(name) != 0; }

std::vector<std::string> SafetensorsSet::names() const {
  std::vector<std::string> out;
  for (const auto& [name, file] : weight_map_) out.push_back(name);
  return out;
}

std::pair<const SafetensorsFile*, const StTensor*> SafetensorsSet::find(const std::string& name) const {
  const auto it = weight_map_.find(name);
  if (it == weight_map_.end()) input_error("{}: no tensor '{}' (expected the model's weights)", index_, name);
  const SafetensorsFile& f = file(it->second);
  const StTensor* t = f.find(name);
  if (!t) input_error("{}: no tensor '{}', which {} says it holds (expected the shard the index names)", f.path(), name,
                      index_);
  return {&f, t};
}

}  // namespace xx

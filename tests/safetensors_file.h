// Safetensors files written from the format's definition, for the tests of
// its reader (test_safetensors.cpp) and of the import (test_hf_config.cpp):
// an 8-byte little-endian header length, the JSON header naming each
// tensor's dtype, shape and data_offsets, then the data back to back.
#pragma once
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>

namespace xx::test {

// One tensor: name, dtype ("F32", "BF16", ...), shape and raw bytes.
struct StEntry {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

// The file's bytes, the entries in order; `extra` adds header keys (__metadata__).
inline std::string safetensors_bytes(const std::vector<StEntry>& entries,
                                     nlohmann::json extra = nlohmann::json::object()) {
  nlohmann::json header = extra;
  uint64_t at = 0;
  std::string data;
  for (const auto& e : entries) {
    header[e.name] = {{"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {at, at + e.bytes.size()}}};
    data += e.bytes;
    at += e.bytes.size();
  }
  const std::string h = header.dump();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[size_t(i)] = char((uint64_t(h.size()) >> (8 * i)) & 0xff);
  return out + h + data;
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

template <class T>
std::string raw_bytes(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

}  // namespace xx::test

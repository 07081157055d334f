// The index of a sharded Hugging Face checkpoint (model.safetensors.index.json,
// src/hf/safetensors.cpp's SafetensorsSet) on untrusted bytes: the input is
// the index; beside it lie two valid shards (model-00001-of-00002.safetensors:
// "a" F32 [2], "b" BF16 [2, 2]; model-00002-of-00002.safetensors: "c" F16 [3]),
// written once. Every tensor the index names is looked up in its shard and
// read, as an import does. An InputError is the expected outcome of bad bytes;
// anything else (another exception, a crash, a sanitizer report, a hang) is a
// finding. libFuzzer target under XX_FUZZ (tools/lab/fuzz --target
// safetensors_index; seeds in tests/fuzz/seeds/safetensors_index).
#include <unistd.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include "core/error.h"        // InputError
#include "hf/safetensors.h"  // SafetensorsSet

namespace {
std::string g_dir;  // the model directory: the two shards, and each input as its index

// A safetensors file: the 8-byte little-endian header length, the header, the data.
void write_shard(const std::string& name, const std::string& header, const std::string& data) {
  std::ofstream out(g_dir + "/" + name, std::ios::binary | std::ios::trunc);
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.put(char((n >> (8 * i)) & 0xff));
  out << header << data;
}
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  char dir[] = "/tmp/xx-fuzz-sti.XXXXXX";
  if (!mkdtemp(dir)) return perror("mkdtemp"), 1;
  g_dir = dir;
  std::atexit([] { std::error_code ignored; std::filesystem::remove_all(g_dir, ignored); });
  write_shard("model-00001-of-00002.safetensors",
              R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, )"
              R"("b": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [8, 16]}})",
              std::string("\x00\x00\x80\x3f\x00\x00\x00\x40\x80\x3f\x00\x40\x40\x40\x80\x40", 16));
  write_shard("model-00002-of-00002.safetensors",
              R"({"c": {"dtype": "F16", "shape": [3], "data_offsets": [0, 6]}, "__metadata__": {"format": "pt"}})",
              std::string("\x00\x3c\x00\x40\x00\x42", 6));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  {
    std::ofstream out(g_dir + "/model.safetensors.index.json", std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes), std::streamsize(size));
  }
  try {
    xx::SafetensorsSet set(g_dir);
    for (const auto& name : set.names()) {
      if (!set.contains(name)) std::abort();  // names() and contains() disagree: a finding
      const auto [file, tensor] = set.find(name);
      if (tensor->dtype != xx::StDtype::other) file->read_all(*tensor);
    }
  } catch (const xx::InputError&) {
    return 0;  // bad input, reported as such: the expected outcome
  }
  return 0;
}

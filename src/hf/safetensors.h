// Safetensors files, as Hugging Face publishes model weights
// (model.safetensors, or the shards a model.safetensors.index.json names):
// memory-mapped, the header checked against the file before any tensor is
// read, and the elements of a tensor (or of a range of it) converted to
// float32 on the way out, so a rank reads only the pieces it holds.
//
// The file is untrusted input (it is downloaded): every error is an
// InputError naming the file, the byte offset or tensor, and what was
// expected, and nothing is allocated from a size the file states
// (tests/fuzz/fuzz_safetensors.cpp).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace xx {

// The element types read: fp32, fp16, bf16 and FP8 (e4m3fn, DeepSeek-V3's
// weights, dequantized by the caller with their weight_scale_inv blocks).
// The others of the format are known by name and refused when read.
enum class StDtype { f32, f16, bf16, f8_e4m3, other };

struct StTensor {
  std::string name;
  std::string dtype_name;  // as the header spells it ("BF16", ...)
  StDtype dtype = StDtype::other;
  std::vector<int64_t> shape;
  int64_t count = 1;          // elements
  int element_bytes = 0;      // the dtype's size
  uint64_t begin = 0, end = 0;  // bytes, from the start of the data (after the header)
};

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);  // maps and checks it; throws InputError
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<StTensor>& tensors() const { return tensors_; }
  const StTensor* find(const std::string& name) const;  // nullptr when absent
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Elements [first, first + count) of `t` (row-major), as float32. Throws
  // InputError for a dtype that is not read, std::out_of_range for a range
  // outside the tensor.
  void read(const StTensor& t, int64_t first, int64_t count, float* out) const;
  std::vector<float> read_all(const StTensor& t) const;
  // Hands the mapped pages of elements [first, first + count) of `t` back
  // (madvise): an import's resident memory stays what it keeps, not the files.
  void release(const StTensor& t, int64_t first, int64_t count) const;

 private:
  std::string path_;
  const unsigned char* map_ = nullptr;
  size_t size_ = 0;
  uint64_t data_at_ = 0;  // where the data begins: 8 + the header's length
  std::vector<StTensor> tensors_;
  std::map<std::string, size_t> by_name_;
  std::map<std::string, std::string> metadata_;
};

// float32 of one element of each 16- and 8-bit type (round trips of every bit pattern in the tests).
float bf16_to_float(uint16_t bits);
float f16_to_float(uint16_t bits);
float f8_e4m3_to_float(uint8_t bits);

// A model's weights in a directory: model.safetensors, or every file
// model.safetensors.index.json's weight_map names (each mapped once, when
// first needed). Throws InputError naming the file for a missing or bad one.
class SafetensorsSet {
 public:
  explicit SafetensorsSet(const std::string& dir);
  // The tensor and its file; throws InputError naming the index (or file) when absent.
  std::pair<const SafetensorsFile*, const StTensor*> find(const std::string& name) const;
  bool contains(const std::string& name) const;
  std::vector<std::string> names() const;  // every tensor, sorted

 private:
  const SafetensorsFile& file(const std::string& name) const;
  std::string dir_, index_;
  std::map<std::string, std::string> weight_map_;  // tensor -> file name (the index's; or the one file's)
  mutable std::map<std::string, std::unique_ptr<SafetensorsFile>> files_;
};

}  // namespace xx

#include "ckpt/codec.h"
#include <algorithm>
#include "ckpt/h5.h"
#include "core/crc32c.h"
#include "core/device_memory.h"
#include "core/error.h"

namespace xx {
namespace cc = kernels::ckpt_codec;
using h5::read_vector;

Encoded encode(const float* value, const float* base, int64_t n, const CheckpointFormat& f, bool lossless) {
  Encoded e;
  if (f.mode == CheckpointMode::full) {
    e.floats.assign(value, value + n);
    return e;
  }
  // The codec kernels read and write kernel memory; these arrays are the host's (KernelCopy).
  const KernelCopy<const float> value_k(value, n), base_k(base, n);
  const Vec<const float> v = value_k.vec(), b = base_k.vec();
  if (f.codec.kind == Codec::int8 && !lossless) {
    e.codes.resize(n), e.floats.resize(cc::scale_count(n, f.codec.block));
    const KernelCopy<int8_t> codes(e.codes.data(), n, false);
    const KernelCopy<float> scales(e.floats.data(), int64_t(e.floats.size()), false);
    const auto result = cc::int8_encode(codes.vec(), scales.vec(), v, b, f.codec.block);
    if (result.ok()) return codes.copy_back(), scales.copy_back(), e.codec = Codec::int8, e;
    e.codes.clear(), e.floats.clear();  // a non-finite difference: this tensor goes lossless
  } else if (f.codec.kind == Codec::topk && !lossless) {
    const int64_t k = cc::kept_count(n, f.codec.ratio);
    cc::TopkWorkspace ws(n, k);
    e.words.resize(k), e.floats.resize(k);
    const KernelCopy<uint32_t> index(e.words.data(), k, false);
    const KernelCopy<float> kept(e.floats.data(), k, false);
    cc::topk_encode(index.vec(), kept.vec(), v, b, ws);
    return index.copy_back(), kept.copy_back(), e.codec = Codec::topk, e;
  }
  e.words.resize(n);
  const KernelCopy<uint32_t> words(e.words.data(), n, false);
  cc::lossless_encode<float>(words.vec(), v, b);
  words.copy_back();
  e.codec = Codec::lossless;
  return e;
}

void decode(float* value, const Encoded& e, const float* base, int64_t n, int64_t block) {
  if (!e.codec) return void(std::copy(e.floats.begin(), e.floats.end(), value));
  // The codec kernels read and write kernel memory; these arrays are the host's (KernelCopy).
  const KernelCopy<float> value_k(value, n, false);
  const KernelCopy<const float> base_k(base, n), floats(e.floats.data(), int64_t(e.floats.size()));
  const Vec<float> v = value_k.vec();
  const Vec<const float> b = base_k.vec();
  switch (*e.codec) {
    case Codec::lossless:
      cc::lossless_decode<float>(v, KernelCopy<const uint32_t>(e.words.data(), n).vec(), b);
      break;
    case Codec::int8:
      cc::int8_decode(v, KernelCopy<const int8_t>(e.codes.data(), n).vec(), floats.vec(), b, block);
      break;
    case Codec::topk:
      cc::topk_decode(v, KernelCopy<const uint32_t>(e.words.data(), int64_t(e.words.size())).vec(), floats.vec(), b);
      break;
  }
  value_k.copy_back();
}

void add_parts(std::vector<Part>& parts, const std::string& name, const Encoded& e, int64_t offset) {
  auto part = [&](const std::string& suffix, hid_t type, const auto& v) {
    parts.push_back({name + suffix, type, int64_t(v.size()), v.data(), crc32c(v.data(), v.size() * sizeof(v[0])),
                     e.codec, offset});
    offset = -1;  // on the first dataset of a tensor only
  };
  if (!e.codec) return part("", H5T_NATIVE_FLOAT, e.floats);
  switch (*e.codec) {
    case Codec::lossless: part("", H5T_NATIVE_UINT32, e.words); break;
    case Codec::int8: part(".codes", H5T_NATIVE_INT8, e.codes), part(".scales", H5T_NATIVE_FLOAT, e.floats); break;
    case Codec::topk: part(".index", H5T_NATIVE_UINT32, e.words), part(".kept", H5T_NATIVE_FLOAT, e.floats); break;
  }
}

Codec stored_codec(hid_t group, const std::string& name, const std::string& at, const std::string& path) {
  const std::string codec = h5::read_string_attr(group, (name + ".codec").c_str(), path);
  if (const auto c = mode_from_name<Codec>(codec)) return *c;
  input_error("{}: tensor '{}' is stored with codec '{}' (expected lossless, int8 or topk)", path, at, codec);
}

std::optional<Codec> delta_codec(hid_t group, const std::string& name) {
  if (H5Lexists(group, name.c_str(), H5P_DEFAULT) > 0) return Codec::lossless;
  if (H5Lexists(group, (name + ".codes").c_str(), H5P_DEFAULT) > 0) return Codec::int8;
  if (H5Lexists(group, (name + ".index").c_str(), H5P_DEFAULT) > 0) return Codec::topk;
  return std::nullopt;
}

int64_t codec_block(hid_t file, const std::string& path) {
  return H5Aexists(file, "codec_block") > 0 ? h5::read_attr<int64_t>(file, "codec_block", H5T_NATIVE_INT64, path) : -1;
}

void decode_stored(hid_t group, const std::string& name, const std::string& at, Codec codec, float* value,
                   const float* base, int64_t n, int64_t block, const std::string& path) {
  // The codec kernels read and write kernel memory; these arrays are the host's (KernelCopy).
  const KernelCopy<float> value_k(value, n, false);
  const KernelCopy<const float> base_k(base, n);
  const Vec<float> v = value_k.vec();
  const Vec<const float> bv = base_k.vec();
  try {
    switch (codec) {
      case Codec::lossless: {
        const auto diff = read_vector<uint32_t>(group, name, H5T_NATIVE_UINT32, n, at, path);
        cc::lossless_decode<float>(v, KernelCopy<const uint32_t>(diff.data(), n).vec(), bv);
        break;
      }
      case Codec::int8: {
        const auto codes = read_vector<int8_t>(group, name + ".codes", H5T_NATIVE_INT8, n, at + ".codes", path);
        const auto scales = read_vector<float>(group, name + ".scales", H5T_NATIVE_FLOAT, -1, at + ".scales", path);
        if (block < 1) block = scales.empty() ? 1 : (n + int64_t(scales.size()) - 1) / int64_t(scales.size());
        if (cc::scale_count(n, block) != int64_t(scales.size()))
          input_error("{}: dataset '{}.scales' has {} values (expected one per block of {} of its {} values)", path,
                      at, scales.size(), block, n);
        cc::int8_decode(v, KernelCopy<const int8_t>(codes.data(), n).vec(),
                        KernelCopy<const float>(scales.data(), int64_t(scales.size())).vec(), bv, block);
        break;
      }
      case Codec::topk: {
        const auto index = read_vector<uint32_t>(group, name + ".index", H5T_NATIVE_UINT32, -1, at + ".index", path);
        const auto kept =
            read_vector<float>(group, name + ".kept", H5T_NATIVE_FLOAT, int64_t(index.size()), at + ".kept", path);
        cc::topk_decode(v, KernelCopy<const uint32_t>(index.data(), int64_t(index.size())).vec(),
                        KernelCopy<const float>(kept.data(), int64_t(kept.size())).vec(), bv);
        break;
      }
    }
    value_k.copy_back();
  } catch (const std::runtime_error& e) {
    if (dynamic_cast<const InputError*>(&e)) throw;
    input_error("{}: dataset '{}' cannot be decoded ({})", path, at, e.what());
  }
}

}  // namespace xx

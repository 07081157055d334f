// How one rank's tensor is stored (deck: checkpoint ... mode full|diff codec
// ...): as it is, or through a codec of kernels/ckpt_codec.h as its
// difference from a base; the datasets each way makes, and reading them back.
#pragma once
#include <hdf5.h>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>
#include "ckpt/checkpoint.h"
#include "kernels/ckpt_codec.h"

namespace xx {

using kernels::ckpt_codec::Codec;

// One rank's tensor (params, adam_m or adam_v) as stored: the arrays a codec turns it into.
struct Encoded {
  std::optional<Codec> codec;      // none: mode full, the values as they are
  std::vector<float> floats;       // full; int8 scales; topk kept values
  std::vector<uint32_t> words;     // lossless XOR; topk indices
  std::vector<int8_t> codes;       // int8
};

// `value` against `base` (n values) as format `f` stores it. `lossless`
// forces the lossless codec (int8 refused a block on some rank).
Encoded encode(const float* value, const float* base, int64_t n, const CheckpointFormat& f, bool lossless = false);

// value = what `e` rebuilds against base: exactly what a reader of the file gets.
void decode(float* value, const Encoded& e, const float* base, int64_t n, int64_t block);

// A dataset to write: `count` values of `type` from `data` (on the rank that owns it).
struct Part {
  std::string name;
  hid_t type;
  int64_t count;
  const void* data;
  uint32_t crc;
  std::optional<Codec> codec;  // none: stored as it is
  int64_t offset = -1;         // a tensor's offset in the flat buffer (attribute `offset`), -1: none
};

// The datasets one Encoded tensor becomes, named after `name` (by codec:
// NAME; NAME.codes and NAME.scales; NAME.index and NAME.kept).
void add_parts(std::vector<Part>& parts, const std::string& name, const Encoded& e, int64_t offset = -1);

// The codec a per-rank tensor NAME of `group` names in its attribute NAME.codec.
Codec stored_codec(hid_t group, const std::string& name, const std::string& at, const std::string& path);

// A delta's tensor NAME: its codec is told by which datasets are there (none: missing).
std::optional<Codec> delta_codec(hid_t group, const std::string& name);

// int8's block from root attribute codec_block; -1 in files from before it.
int64_t codec_block(hid_t file, const std::string& path);

// value[0, n) = the tensor stored as `name` in `group` through `codec`,
// rebuilt against base[0, n). `block` -1: the int8 block from the number of
// scales (files from before codec_block hold one flat vector per dataset).
// `at` names it in errors.
void decode_stored(hid_t group, const std::string& name, const std::string& at, Codec codec, float* value,
                   const float* base, int64_t n, int64_t block, const std::string& path);

}  // namespace xx

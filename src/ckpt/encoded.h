// A checkpoint encoded into datasets in host memory (encode_checkpoint),
// what the file writers write (file_writer.h, schema.h).
#pragma once
#include <cstdint>
#include <deque>
#include <string>
#include <vector>
#include "ckpt/checkpoint.h"
#include "ckpt/codec.h"

namespace xx {

struct EncodedCheckpoint {
  std::string name;                  // step_<N>.h5
  CheckpointData data;               // the base: /model and /optimizer of a base file, /buffers, /train
  CheckpointFormat format;
  bool has_ranks = false;
  ChainKind kind = ChainKind::base;  // diff across time
  std::string parent;
  std::vector<FrameTensor> tensors;
  std::deque<Encoded> store;          // what the parts point into (a deque: stable addresses)
  std::vector<Part> base_parts[3];    // a delta's /model, /optimizer/m, /optimizer/v
  std::vector<uint32_t> slab_crcs[3];  // written by slabs: each tensor's crc32c in /model, /optimizer/m, /optimizer/v
  std::vector<Part> parts;            // this rank's /ranks/<r>, in the same order on every rank
  std::vector<int64_t> meta;          // every rank's (count, crc) of each part, rank after rank
  std::vector<int64_t> batches;       // every rank's sampler position

  // Rank r's part i: its value count and crc32c.
  int64_t count(int r, size_t i) const { return meta[size_t(r) * 2 * parts.size() + 2 * i]; }
  uint32_t crc(int r, size_t i) const { return uint32_t(meta[size_t(r) * 2 * parts.size() + 2 * i + 1]); }
};

// The bytes the file needs at least: its datasets stored as they are
// (deflated ones may shrink, so they count for nothing).
int64_t bytes_at_least(const EncodedCheckpoint& enc, int world);

}  // namespace xx

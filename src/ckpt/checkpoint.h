// HDF5 checkpoints (layout in docs/CHECKPOINT.md). Rank 0 writes
// RUN_DIR/ckpt/step_<N>.h5 through a temp file, fsync and rename, then
// updates RUN_DIR/ckpt/latest. A file counts only when its root attribute
// `complete` is 1; it is written last. Every dataset carries HDF5's
// fletcher32 checksum, verified on read.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>
#include "model/params.h"

namespace xx {

constexpr int kCheckpointVersion = 1;

// Everything besides the tensors that a run needs to continue exactly.
struct TrainState {
  int64_t step = 0;             // optimizer steps taken
  int64_t sampler_batches = 0;  // batches this rank's loader handed out
  int64_t epoch = 0;            // data epoch of the next sample (informational)
  uint64_t seed = 0;            // run seed; every random stream derives from it
  int world_size = 1;
  double last_loss = 0;
  uint64_t chaos_seed = 0;      // data shuffle chaos|independent: the drawn seed (0: none), for replay
};

// Host copies of the tensors, laid out like the flat parameter buffer.
struct CheckpointData {
  std::vector<float> params, adam_m, adam_v;
  std::map<std::string, std::vector<float>> buffers;  // model state outside the parameters (MoE gate biases)
  // Named training state in double (LR restarts, loss scale, loss weights):
  // datasets /train/<name>; every one present in the file is read back.
  std::map<std::string, std::vector<double>> series;
  TrainState state;
  std::string deck;  // resolved deck text
};

// Writes DIR/step_<N>.h5 atomically and points DIR/latest at it; returns the path.
std::string write_checkpoint(const std::string& dir, const ParamLayout& layout, const CheckpointData& data);

// Reads a checkpoint written for `layout`, with the named state buffers of
// the given sizes; any corruption, missing tensor or shape mismatch throws
// InputError naming the file and the tensor.
CheckpointData read_checkpoint(const std::string& path, const ParamLayout& layout,
                               const std::map<std::string, int64_t>& buffers = {});

// The newest complete checkpoint in DIR ("" when there is none).
std::string latest_checkpoint(const std::string& dir);

// Writes `text` to `path` through a temp file, fsync and rename.
void write_file_atomic(const std::string& path, const std::string& text);

}  // namespace xx

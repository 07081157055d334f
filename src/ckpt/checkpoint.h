// HDF5 checkpoints (layout in docs/CHECKPOINT.md). Rank 0 writes
// RUN_DIR/ckpt/step_<N>.h5 through a temp file, fsync and rename, then
// updates RUN_DIR/ckpt/latest. A file counts only when its root attribute
// `complete` is 1; it is written last. Every dataset carries HDF5's
// fletcher32 checksum, verified on read.
#pragma once
#include <mpi.h>
#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>
#include "ckpt/store.h"  // step_files, latest_checkpoint, prune_checkpoints
#include "kernels/ckpt_codec.h"
#include "core/placement.h"  // Frame, FrameSlab: the whole model, as the file holds it

namespace xx {

// A file's place in its chain: root attribute chain_kind, one of these words.
enum class ChainKind { base, delta };
constexpr auto mode_words(ChainKind) { return std::array{"base"sv, "delta"sv}; }

// 2: per-rank state under /ranks, crc32c attributes, mode and codec; version 1 files still load.
constexpr int kCheckpointVersion = 2;

// A checkpoint that could not be written (no space, an I/O error, the
// directory gone): every rank of the writing communicator throws it alike,
// with the same one-line message (the file, the error, the last good
// checkpoint); the partial .tmp is removed and `latest` left as it was. The
// job ends with kExitWriteFailed (docs/RESILIENCE.md, "A failed checkpoint write").
constexpr int kExitWriteFailed = 4;
struct CheckpointWriteError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Everything besides the tensors that a run needs to continue exactly:
// /train's attributes (schema.cpp's table of fields, which the writer and
// the reader walk). Plain values: it travels between ranks as bytes.
struct TrainState {
  int64_t step = 0;             // optimizer steps taken
  int64_t sampler_batches = 0;  // batches this rank's loader handed out
  int64_t epoch = 0;            // data epoch of the next sample (informational)
  uint64_t seed = 0;            // run seed; every random stream derives from it
  int world_size = 1;
  int ep = 1;                   // moe ... ep N of the run that wrote it (the file holds every expert whatever it is)
  int stages = 1;               // pipeline stages P of the run that wrote it: world_size / P replicas read the data
  double last_loss = 0;
  uint64_t chaos_seed = 0;      // data shuffle chaos|independent: the drawn seed (0: none), for replay
};
static_assert(std::is_trivially_copyable_v<TrainState>);

// One rank's slabs of one group (/model, /optimizer/m or /optimizer/v), in
// file order (by tensor, then begin; `at` rising with them), and their values.
struct TensorSlabs {
  std::vector<FrameSlab> slabs;
  std::vector<float> values;
};

// Host copies of the tensors, laid out like the flat parameter buffer.
struct CheckpointData {
  std::vector<float> params, adam_m, adam_v;
  // A sharded run (docs/CHECKPOINT.md, "Sharded runs"): instead of the three
  // whole buffers above (then empty), this rank's slabs of /model,
  // /optimizer/m, /optimizer/v; every rank writes its own into the same
  // full-tensor datasets, and the file holds no per-rank tensors (the ranks
  // agree: each one's are the base; root attribute rank_tensors = base).
  std::optional<std::array<TensorSlabs, 3>> slabs;
  std::map<std::string, std::vector<float>> buffers;  // model state outside the parameters (MoE gate biases)
  // Named training state in double (LR restarts, loss scale, loss weights):
  // datasets /train/<name>; every one present in the file is read back.
  std::map<std::string, std::vector<double>> series;
  TrainState state;
  std::string deck;  // resolved deck text
  // How the run kept AdamW's moments (deck: optimizer adamw ... moments):
  // /optimizer attribute moments. The file holds their values in fp32 either
  // way (a bf16 value widens exactly); a file without it is fp32.
  Precision moments = Precision::fp32;
  // The training-state registry's datasets in this file, one per line
  // "WHERE NAME" (WHERE: /train, /buffers, /ranks/*), for tools/ckpt; root attribute state_index.
  std::string state_index;
  ChainKind chain_kind = ChainKind::base;  // diff across time: root attributes chain_kind, chain_parent
  std::string chain_parent;
};

// How each rank's own state is stored (deck: checkpoint ... mode full|diff codec ...).
struct CheckpointFormat {
  CheckpointMode mode = CheckpointMode::full;  // full: each rank's tensors as they are; diff: their difference from the base
  kernels::ckpt_codec::CodecSetting codec;  // diff (and deltas across time): lossless (bit-exact), int8, topk R
  int64_t base_every = 1;            // diff across time: a base file every M checkpoints, deltas in between
  bool operator==(const CheckpointFormat&) const = default;
};

// One rank's own state, where ranks may differ (sync local, clusters,
// compression residuals): flat like the parameter buffer.
struct RankState {
  std::vector<float> params, adam_m, adam_v;
  std::map<std::string, std::vector<float>> extra;  // per-rank buffers without a base (compression residual)
  int64_t sampler_batches = 0;
};

// Diff across time (docs/CHECKPOINT.md, "Chains"): what the writer keeps of
// the current chain's base file, so a delta can be encoded against exactly
// the values that file holds. Empty: the next checkpoint is a base.
struct ChainBase {
  std::string name;          // the base's file name ("" : none yet)
  int64_t written = 0;       // checkpoints in this chain so far, the base included
  CheckpointFormat format;   // a different format starts a new chain
  std::vector<float> params, adam_m, adam_v;       // the base file's /model, /optimizer/m, /optimizer/v
  std::vector<float> own_params, own_m, own_v;     // mode full: this rank's /ranks/<r> tensors in it
};

// A checkpoint encoded into datasets in host memory (encode_checkpoint,
// encode.cpp), ready for write_encoded: the codec kernels run in the first,
// HDF5 only in the second, so a background thread can take the second alone.
struct EncodedCheckpoint;

// Collective over comm: encodes `data` and `mine` (as write_checkpoint
// describes) and, with `chain` and format.base_every > 1, decides base or
// delta and updates `chain`. Takes copies: the caller may change its state.
std::shared_ptr<EncodedCheckpoint> encode_checkpoint(MPI_Comm comm, const Frame& frame,
                                                     const CheckpointData& data, const RankState* mine,
                                                     const CheckpointFormat& format, ChainBase* chain = nullptr);
// Who writes the file (deck: checkpoint ... writer collective|rank0); the
// file is the same either way.
//  - collective: every rank of comm, with parallel HDF5 (MPI-IO); each rank
//    writes its own /ranks/<r>.
//  - rank0: every rank's /ranks/<r> is gathered onto rank 0, which alone
//    builds the file in memory (HDF5's core driver) and writes it with POSIX
//    calls: HDF5 never meets a full disk (file_writer.cpp, h5_writer.h).
// (CheckpointWriter: core/modes.h)

// Collective over comm (the same ranks as encode_checkpoint's, possibly a
// dup): writes the file atomically and points DIR/latest at it; returns its path.
// A failure on any rank throws CheckpointWriteError on every rank (above).
std::string write_encoded(MPI_Comm comm, const std::string& dir, const EncodedCheckpoint& encoded,
                          CheckpointWriter writer = CheckpointWriter::collective);
// The file's chain kind ("base" or "delta") once encoded.
ChainKind chain_kind_of(const EncodedCheckpoint& encoded);

// Collective over comm: writes DIR/step_<N>.h5 with parallel HDF5 (MPI-IO,
// collective transfers) atomically and points DIR/latest at it; returns the
// path. `data` is the base (/model, /optimizer, /buffers, /train): the same
// on every rank (the average of the ranks' tensors where they differ).
// `mine`: this rank's own state for /ranks/<rank>, or nullptr for none.
// `chain`: see encode_checkpoint.
std::string write_checkpoint(MPI_Comm comm, const std::string& dir, const Frame& frame,
                             const CheckpointData& data, const RankState* mine, const CheckpointFormat& format,
                             ChainBase* chain = nullptr);
// One process, no per-rank state (tools, tests): written as `writer rank0` writes.
std::string write_checkpoint(const std::string& dir, const Frame& frame, const CheckpointData& data);

// Rank `rank`'s own state in a checkpoint with /ranks, rebuilt against the
// base in `base` (from read_checkpoint; a delta's mode full ranks against
// the same rank in its chain's base file). `extra` names the per-rank buffers
// and their sizes. Throws InputError naming the file and dataset for a
// missing rank, a bad checksum or size.
RankState read_rank_state(const std::string& path, const Frame& frame, const CheckpointData& base, int rank,
                          const std::map<std::string, int64_t>& extra = {});

// True when the checkpoint holds per-rank state (/ranks).
bool has_rank_state(const std::string& path);

// True when a complete base checkpoint was written by slabs (rank_tensors =
// base): what read_slabs reads.
bool written_by_slabs(const std::string& path);

// Collective over comm: each rank reads its own slabs of /model,
// /optimizer/m, /optimizer/v (slabs[i].values sized here) from a file that
// written_by_slabs, opening it read-only by itself. Each tensor's crc32c is
// checked against every rank's slabs together (they must cover it). A
// failure on any rank throws the same InputError on every rank.
void read_slabs(MPI_Comm comm, const std::string& path, const Frame& frame, std::array<TensorSlabs, 3>& slabs);

// Reads a checkpoint written in `frame` (the whole model) (a delta: its chain's base file
// too, next to it), with the named state buffers of
// the given sizes; any corruption, missing tensor or shape mismatch throws
// InputError naming the file and the tensor.
// `tensors` false: /model and /optimizer are left unread (and params,
// adam_m, adam_v empty), for read_slabs.
CheckpointData read_checkpoint(const std::string& path, const Frame& frame,
                               const std::map<std::string, int64_t>& buffers = {}, bool tensors = true);

// The world size and expert parallelism of the run that wrote a complete checkpoint. Throws InputError.
std::pair<int, int> read_checkpoint_layout(const std::string& path);

// The resolved deck a complete checkpoint was written with (what a tool
// needs to rebuild its model before reading the tensors). Throws InputError.
std::string read_checkpoint_deck(const std::string& path);

// A file's root attributes chain_kind ("base" when absent) and chain_parent.
struct ChainLink {
  ChainKind kind = ChainKind::base;
  std::string parent;
};
ChainLink read_chain_link(const std::string& path);

}  // namespace xx

// The file's layout (docs/CHECKPOINT.md): root attributes, /model,
// /optimizer/{m,v}, /buffers, /train (TrainState's attributes, by one table
// of fields, and the series), /ranks/<r>. The writer's walk is here; the
// readers (reader.cpp) walk the same table for /train.
#pragma once
#include <hdf5.h>
#include <string>
#include <vector>
#include "ckpt/encoded.h"
#include "ckpt/h5_writer.h"

namespace xx {

// Where /ranks/<r>'s datasets come from: at[r][i], rank r's part i, written
// by rank r itself (collectively), or all of them by rank 0 (gathered).
struct RankParts {
  bool gathered = false;
  std::vector<std::vector<const void*>> at;
};

// The whole file through `w`; WriteFailed on a failure.
void write_file(H5Writer& w, const EncodedCheckpoint& enc, int world, const RankParts& ranks);

// Whether a frame's model ties its embeddings (model ... tie_embeddings yes):
// it has an 'embed' tensor and no 'head' (the embedding is the head). The
// root attribute tied_embeddings (1 or 0; absent in older files: 0) records
// it; reading refuses a file whose tying differs from the deck's frame.
bool ties_embeddings(const std::vector<FrameTensor>& frame);

// /train's attributes (group `train` of file `path`) as TrainState; those
// absent from older files keep their defaults.
TrainState read_train_state(hid_t train, const std::string& path);

}  // namespace xx

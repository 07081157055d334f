// The training-state registry (core/state.h) in a checkpoint: every entry
// read out into the file's datasets, and put back from them; and a rank's own
// state when the world size changed (docs/CHECKPOINT.md, "Resharding").
#pragma once
#include <map>
#include <string>
#include "ckpt/checkpoint.h"
#include "core/state.h"

namespace xx {

// Every entry's values into `data` (/train, /buffers) or `mine` (/ranks/<r>),
// and their names into data.state_index. Entries that save nothing are left out.
void save_state(const StateRegistry& registry, CheckpointData& data, RankState& mine);

// Every entry put back from `data` and `mine` (null: a file without per-rank
// state). A required entry the file lacks, or one of another size, throws
// InputError naming `path` and the dataset (rank `rank`'s for its own).
void load_state(const StateRegistry& registry, const CheckpointData& data, const RankState* mine,
                const std::string& path, int rank);

// Rank `rank` of `world`'s own state from a checkpoint of `old_world` ranks:
// at the same world size its own; otherwise the average of the old ranks r
// with floor(r * world / old_world) == rank (ranks merge), or of all of them
// when none maps here (a new rank starts from the base). `own`: the per-rank
// buffers and their sizes.
RankState merged_rank_state(const std::string& path, const Frame& frame, const CheckpointData& base,
                            int old_world, int world, int rank, const std::map<std::string, int64_t>& own);

}  // namespace xx

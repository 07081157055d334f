// Diff across time (docs/CHECKPOINT.md, "Chains"): a base file every M
// checkpoints, deltas against it in between (root attributes chain_kind,
// chain_parent). Writing: whether the next checkpoint is a delta, and what
// the writer keeps of the chain's base; reading: a file's link to its base.
#pragma once
#include <hdf5.h>
#include <string>
#include "ckpt/checkpoint.h"

namespace xx {

// Whether checkpoint `name` of `n` values per tensor is a delta against
// `chain`'s base: while the chain is young and the format unchanged (never
// against another delta, so restore reads two files and a lossy codec's
// error does not add up).
bool continues_chain(const ChainBase& chain, const CheckpointFormat& format, int64_t n, const std::string& name);

// After checkpoint `name` is encoded: a delta counts one more in the chain;
// a base starts a new one (its values kept); without chaining it is empty.
void advance_chain(ChainBase& chain, bool chained, bool delta, const std::string& name, const CheckpointFormat& format,
                   const CheckpointData& data, const RankState* mine);

// The chain attributes of an open file (files from before chains: a base), checked.
ChainLink chain_link(hid_t file, const std::string& path);

// The base file a delta needs, next to it: one clear error when it is gone.
std::string chain_parent_path(const std::string& path, const ChainLink& link);

// The base file a checkpoint names (""  for a base, or a file that cannot be read): what pruning keeps.
std::string chain_parent_of(const std::string& path);

}  // namespace xx

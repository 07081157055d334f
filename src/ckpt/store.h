// The checkpoint directory (RUN_DIR/ckpt): its step_<N>.h5 files, the
// `latest` pointer, publishing a finished file, pruning old ones.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace xx {

// DIR's step_<N>.h5 files, complete or not, newest (largest N) first.
std::vector<std::string> step_files(const std::string& dir);

// The newest complete checkpoint in DIR ("" when there is none).
std::string latest_checkpoint(const std::string& dir);

// Deletes all but the newest `keep` step_*.h5 files of DIR, never the one
// `latest` names nor a base that a kept delta needs.
void prune_checkpoints(const std::string& dir, int64_t keep);

// "DIR/step_N.h5" as `latest` names it, when that file is there; else "none (...)".
std::string last_good_checkpoint(const std::string& dir);

// The steps of a write on rank 0; each returns "" or what failed.
//  - before the file: DIR made when missing, but only inside a parent that
//    is there (the run directory, made at start-up): a run directory that
//    has vanished (purged, its file system unmounted) is an error, not a new one.
std::string prepare_directory(const std::string& dir);
//  - before HDF5 touches the disk: room for `bytes` at `tmp` (fallocate, then
//    the file removed again). A full disk, a quota, a read-only file system
//    are found here, where every rank can still stop cleanly, rather than
//    inside a collective HDF5 call. File systems without fallocate skip it.
std::string reserve_space(const std::string& tmp, int64_t bytes);
//  - after the file is closed on every rank: fsync, rename to DIR/NAME, `latest`.
std::string publish(const std::string& tmp, const std::string& dir, const std::string& name);

}  // namespace xx

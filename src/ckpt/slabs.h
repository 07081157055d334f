// What the checkpoint writer and reader need for slabs (checkpoint.h,
// FrameSlab): a flat range of a tensor as an HDF5 selection, and every
// tensor's checksum from the slabs the ranks hold of it.
#pragma once
#include <hdf5.h>
#include <mpi.h>
#include <cstdint>
#include <vector>
#include "ckpt/checkpoint.h"
#include "core/placement.h"

namespace xx::slabs {

// Adds (OR) elements [begin, begin + count) of the row-major flattening of
// `space`, whose extent is `dims`, to its selection: a run of whole rows
// (or planes) as one box, a partial row at either end as another.
void select_flat(hid_t space, const std::vector<hsize_t>& dims, hsize_t begin, hsize_t count);

// One tensor's slabs [first, last) as selections, replacing any earlier
// ones: their elements in `file` (the tensor's dataspace, extent `dims`)
// and their values' places in `mem` (a 1-D space over the rank's values),
// in the same order, as one H5Dwrite or H5Dread pairs them. Empty slabs are skipped.
void select_slabs(hid_t mem, hid_t file, const std::vector<hsize_t>& dims, const FrameSlab* first,
                  const FrameSlab* last);

// Collective over comm: the crc32c of every tensor of `frame`, from every
// rank's checksum of each of its slabs, combined in element order (a slab
// that repeats elements another already covered, as when every rank reads
// a tensor whole, is skipped). `values` are the slabs' values. Throws
// std::runtime_error naming a tensor the ranks' slabs leave a gap in.
std::vector<uint32_t> tensor_crcs(MPI_Comm comm, const Frame& frame, const TensorSlabs& mine);

}  // namespace xx::slabs

#include "ckpt/slabs.h"
#include <algorithm>
#include <stdexcept>
#include <fmt/format.h>
#include "core/crc32c.h"

namespace xx::slabs {

void select_flat(hid_t space, const std::vector<hsize_t>& dims, hsize_t begin, hsize_t count) {
  const size_t n = dims.size();
  if (n == 0 || count == 0) return;
  // stride[d]: elements in one step of dimension d.
  std::vector<hsize_t> stride(n, 1);
  for (size_t d = n - 1; d > 0; --d) stride[d - 1] = stride[d] * dims[d];
  const hsize_t end = begin + count;
  while (begin < end) {
    // The outermost dimension whose whole steps start here and fit: take as
    // many of them as fit before the next outer dimension's step ends.
    size_t d = 0;
    while (begin % stride[d] != 0 || begin + stride[d] > end) ++d;  // stops at n - 1: stride 1
    hsize_t steps = (end - begin) / stride[d];
    if (d > 0) steps = std::min(steps, (stride[d - 1] - begin % stride[d - 1]) / stride[d]);
    std::vector<hsize_t> start(n), size(n, 1);
    for (size_t k = 0; k < n; ++k) start[k] = begin / stride[k] % dims[k];
    size[d] = steps;
    for (size_t k = d + 1; k < n; ++k) size[k] = dims[k];
    H5Sselect_hyperslab(space, H5S_SELECT_OR, start.data(), nullptr, size.data(), nullptr);
    begin += steps * stride[d];
  }
}

void select_slabs(hid_t mem, hid_t file, const std::vector<hsize_t>& dims, const FrameSlab* first,
                  const FrameSlab* last) {
  H5Sselect_none(mem), H5Sselect_none(file);
  for (const FrameSlab* s = first; s != last; ++s) {
    const hsize_t at = hsize_t(s->at), count = hsize_t(s->count);
    if (count == 0) continue;
    H5Sselect_hyperslab(mem, H5S_SELECT_OR, &at, nullptr, &count, nullptr);
    select_flat(file, dims, hsize_t(s->begin), count);
  }
}

std::vector<uint32_t> tensor_crcs(MPI_Comm comm, const Frame& frame, const TensorSlabs& mine) {
  // (tensor, begin, count, crc) of every slab of every rank
  std::vector<int64_t> records;
  for (const auto& s : mine.slabs)
    if (s.count > 0)
      records.insert(records.end(), {int64_t(s.tensor), s.begin, s.count,
                                     int64_t(crc32c(mine.values.data() + s.at, size_t(s.count) * sizeof(float)))});
  int world = 1;
  MPI_Comm_size(comm, &world);
  int size = int(records.size());
  std::vector<int> sizes(world), displs(world);
  MPI_Allgather(&size, 1, MPI_INT, sizes.data(), 1, MPI_INT, comm);
  for (int r = 1; r < world; ++r) displs[r] = displs[r - 1] + sizes[r - 1];
  std::vector<int64_t> all(size_t(displs.back() + sizes.back()));
  MPI_Allgatherv(records.data(), size, MPI_INT64_T, all.data(), sizes.data(), displs.data(), MPI_INT64_T, comm);
  struct Record {
    int64_t tensor, begin, count, crc;
  };
  std::vector<Record> sorted;
  for (size_t i = 0; i < all.size(); i += 4) sorted.push_back({all[i], all[i + 1], all[i + 2], all[i + 3]});
  std::sort(sorted.begin(), sorted.end(), [](const Record& a, const Record& b) {
    return a.tensor != b.tensor ? a.tensor < b.tensor : a.begin != b.begin ? a.begin < b.begin : a.count > b.count;
  });
  const auto& tensors = frame;
  std::vector<uint32_t> crcs(tensors.size(), 0);
  std::vector<int64_t> covered(tensors.size(), 0);
  for (const auto& r : sorted) {
    int64_t& at = covered[size_t(r.tensor)];
    if (r.begin != at) continue;  // already covered, or after a gap (found below)
    crcs[size_t(r.tensor)] = crc32c_combine(crcs[size_t(r.tensor)], uint32_t(r.crc), uint64_t(r.count) * sizeof(float));
    at += r.count;
  }
  for (size_t t = 0; t < tensors.size(); ++t)
    if (covered[t] != tensors[t].size)
      throw std::runtime_error(fmt::format("checkpoint: the ranks' slabs of tensor '{}' cover {} of its {} values "
                                           "from the start", tensors[t].name, covered[t], tensors[t].size));
  return crcs;
}

}  // namespace xx::slabs

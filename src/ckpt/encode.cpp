// encode_checkpoint: a checkpoint's tensors through their codecs (the codec
// kernels run here, HDF5 later in write_encoded), each rank's datasets'
// sizes and checksums shared, the chain decided.
#include <tuple>
#include <fmt/format.h>
#include "ckpt/chain.h"
#include "ckpt/encoded.h"
#include "ckpt/slabs.h"
#include "core/crc32c.h"
#include "kernels/precision.h"

namespace xx {

namespace {

const char* const kRankTensors[3] = {"params", "adam_m", "adam_v"};

// By slabs: each group's slabs in file order, and every tensor's crc32c from every rank's slabs.
void check_slabs(MPI_Comm comm, const Frame& frame, const std::array<TensorSlabs, 3>& slabs,
                 std::vector<uint32_t> (&crcs)[3]) {
  for (int i = 0; i < 3; ++i) {
    const auto& mine = slabs[size_t(i)].slabs;
    for (size_t k = 1; k < mine.size(); ++k)
      if (std::tie(mine[k].tensor, mine[k].begin) < std::tie(mine[k - 1].tensor, mine[k - 1].begin) ||
          mine[k].at < mine[k - 1].at)
        throw std::logic_error("checkpoint: slabs out of file order");
    crcs[i] = slabs::tensor_crcs(comm, frame, slabs[size_t(i)]);
  }
}

// Every rank has the same parts (names, types); their sizes and checksums
// are shared, since creating datasets and attributes is collective.
void share_parts(MPI_Comm comm, EncodedCheckpoint& out, int64_t my_batches) {
  int world = 1;
  MPI_Comm_size(comm, &world);
  int min_parts = int(out.parts.size()), max_parts = min_parts;
  MPI_Allreduce(MPI_IN_PLACE, &min_parts, 1, MPI_INT, MPI_MIN, comm);
  MPI_Allreduce(MPI_IN_PLACE, &max_parts, 1, MPI_INT, MPI_MAX, comm);
  if (min_parts != max_parts) throw std::runtime_error("checkpoint: ranks hold different kinds of per-rank state");
  std::vector<int64_t> mine_meta;
  for (const auto& p : out.parts) mine_meta.insert(mine_meta.end(), {p.count, int64_t(p.crc)});
  out.meta.resize(mine_meta.size() * world);
  MPI_Allgather(mine_meta.data(), int(mine_meta.size()), MPI_INT64_T, out.meta.data(), int(mine_meta.size()),
                MPI_INT64_T, comm);
  out.batches.resize(world);
  MPI_Allgather(&my_batches, 1, MPI_INT64_T, out.batches.data(), 1, MPI_INT64_T, comm);
}

}  // namespace

ChainKind chain_kind_of(const EncodedCheckpoint& encoded) { return encoded.kind; }

std::shared_ptr<EncodedCheckpoint> encode_checkpoint(MPI_Comm comm, const Frame& frame,
                                                     const CheckpointData& given, const RankState* mine,
                                                     const CheckpointFormat& format, ChainBase* chain) {
  auto out = std::make_shared<EncodedCheckpoint>();
  out->name = fmt::format("step_{:08d}.h5", given.state.step);
  out->data = given;
  // Moments kept in bf16 are stored in bf16 (schema.cpp): the base's average
  // of the ranks' moments (per-rank state) is rounded here, as a resume into
  // bf16 moments would round it, so that the ranks' diffs and a chain's
  // deltas are against the bits the file holds. (Kept moments are bf16 already.)
  if (given.moments == Precision::bf16)
    for (std::vector<float>* m : {&out->data.adam_m, &out->data.adam_v})
      for (float& x : *m) x = kernels::bf16_bits_to_float(kernels::float_to_bf16_bits(x));
  const CheckpointData& data = out->data;
  out->format = format;
  out->has_ranks = mine != nullptr;
  out->tensors = frame;
  const int64_t n = frame_total(frame);
  const bool chained = chain && format.base_every > 1;
  if (data.slabs && chained) throw std::logic_error("checkpoint: a chain cannot be written by slabs");
  if (data.slabs) check_slabs(comm, frame, *data.slabs, out->slab_crcs);
  const bool delta = chained && continues_chain(*chain, format, n, out->name);
  out->kind = delta ? ChainKind::delta : ChainKind::base;
  out->parent = delta ? chain->name : "";
  CheckpointFormat through_codec = format;  // deltas across time always go through the codec
  through_codec.mode = CheckpointMode::diff;
  const std::vector<float>* now[3] = {&data.params, &data.adam_m, &data.adam_v};
  // The base as a reader will rebuild it: the ranks' diffs are against these bits.
  const std::vector<float>* rebuilt[3] = {now[0], now[1], now[2]};
  std::vector<float> decoded[3];
  if (delta) {
    const std::vector<float>* was[3] = {&chain->params, &chain->adam_m, &chain->adam_v};
    for (int i = 0; i < 3; ++i) {
      decoded[i].resize(n);
      // Every rank holds the same base bits, so every rank makes the same choices.
      for (const auto& t : frame) {
        const auto& e = out->store.emplace_back(
            encode(now[i]->data() + t.offset, was[i]->data() + t.offset, t.size, through_codec));
        decode(decoded[i].data() + t.offset, e, was[i]->data() + t.offset, t.size, format.codec.block);
        add_parts(out->base_parts[i], t.name, e, t.offset);
      }
      rebuilt[i] = &decoded[i];
    }
  }
  if (mine && !data.slabs) {  // (by slabs the ranks agree: each one's tensors are the base)
    // Mode diff: against the base as rebuilt. Mode full in a delta: against
    // this rank's own tensors in the chain's base file.
    const bool own_delta = delta && format.mode == CheckpointMode::full;
    const std::vector<float>* own[3] = {&mine->params, &mine->adam_m, &mine->adam_v};
    const CheckpointFormat& f = own_delta ? through_codec : format;
    const std::vector<float>* own_was[3] = {};
    if (own_delta) own_was[0] = &chain->own_params, own_was[1] = &chain->own_m, own_was[2] = &chain->own_v;
    for (int i = 0; i < 3; ++i) {
      const float* against = own_delta ? own_was[i]->data() : rebuilt[i]->data();
      auto e = encode(own[i]->data(), against, n, f);
      // int8 refuses a non-finite difference; the ranks agree on the fallback,
      // so every rank writes the same datasets.
      int refused = f.mode == CheckpointMode::diff && f.codec.kind == Codec::int8 && e.codec != Codec::int8;
      MPI_Allreduce(MPI_IN_PLACE, &refused, 1, MPI_INT, MPI_MAX, comm);
      if (refused && e.codec != Codec::lossless) e = encode(own[i]->data(), against, n, f, true);
      add_parts(out->parts, kRankTensors[i], out->store.emplace_back(std::move(e)));
    }
  }
  if (mine) {
    // A named type, not the macro inside the braces: nvcc's front end garbles
    // a braced list holding H5T_NATIVE_FLOAT (a comma expression).
    const hid_t native_float = H5T_NATIVE_FLOAT;
    for (const auto& [name, values] : mine->extra)
      out->parts.push_back({name, native_float, int64_t(values.size()), values.data(),
                            crc32c(values.data(), values.size() * sizeof(float)), std::nullopt});
  }
  share_parts(comm, *out, mine ? mine->sampler_batches : data.state.sampler_batches);
  if (chain) advance_chain(*chain, chained, delta, out->name, format, data, mine);
  return out;
}

int64_t bytes_at_least(const EncodedCheckpoint& enc, int world) {
  int64_t n = 0;
  if (enc.kind == ChainKind::base)
    for (const auto& t : enc.tensors) n += 3 * t.size * int64_t(sizeof(float));
  for (const auto& [name, values] : enc.data.buffers) n += int64_t(values.size() * sizeof(float));
  for (const auto& [name, values] : enc.data.series) n += int64_t(values.size() * sizeof(double));
  if (enc.has_ranks)
    for (int r = 0; r < world; ++r)
      for (size_t i = 0; i < enc.parts.size(); ++i)
        if (!enc.parts[i].codec) n += enc.count(r, i) * int64_t(H5Tget_size(enc.parts[i].type));
  return n;
}

}  // namespace xx

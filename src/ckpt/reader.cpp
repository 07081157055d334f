// Reading checkpoints back: the base, one rank's own state, a sharded run's
// slabs; every check names the file and the dataset (InputError).
#include <filesystem>
#include <fmt/format.h>
#include "ckpt/chain.h"
#include "ckpt/codec.h"
#include "ckpt/h5.h"
#include "ckpt/schema.h"
#include "ckpt/slabs.h"
#include "ckpt/write_guard.h"
#include "core/error.h"

namespace xx {
namespace fs = std::filesystem;
using namespace h5;

namespace {

// A complete checkpoint of a known format version, opened for reading.
H5 open_complete(const std::string& path) {
  quiet();
  if (!fs::exists(path)) input_error("{}: no such checkpoint (expected an .h5 file written by xuanxue)", path);
  if (H5Fis_hdf5(path.c_str()) <= 0) input_error("{}: not an HDF5 file (expected a xuanxue checkpoint)", path);
  H5 file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (file < 0) input_error("{}: cannot open (corrupt or truncated HDF5 file){}", path, cause());
  if (read_string_attr(file, "format", path) != "xuanxue-checkpoint")
    input_error("{}: attribute 'format' is not 'xuanxue-checkpoint'", path);
  const int version = read_attr<int>(file, "format_version", H5T_NATIVE_INT, path);
  if (version < 1 || version > kCheckpointVersion)
    input_error("{}: format_version {} (expected 1 to {})", path, version, kCheckpointVersion);
  if (read_attr<int>(file, "complete", H5T_NATIVE_INT, path) != 1)
    input_error("{}: checkpoint is incomplete (attribute 'complete' is not 1)", path);
  return file;
}

// Root attribute rank_tensors = base: written by slabs, /ranks/<r> holds no tensors.
bool rank_tensors_are_base(hid_t file, const std::string& path) {
  return H5Aexists(file, "rank_tensors") > 0 && mode_from_name<ChainKind>(read_string_attr(file, "rank_tensors", path)) == ChainKind::base;
}

// /buffers: the named ones of the given sizes, then whatever else is there
// (optional buffers: the outer optimizer's anchor, ...).
void read_buffers(hid_t file, const std::map<std::string, int64_t>& buffers, CheckpointData& data,
                  const std::string& path) {
  for (const auto& [name, size] : buffers) {
    if (H5Lexists(file, "buffers", H5P_DEFAULT) <= 0)
      input_error("{}: group '/buffers' is missing (expected the model's state buffers, e.g. '{}')", path, name);
    H5 group(H5Gopen2(file, "buffers", H5P_DEFAULT), H5Gclose);
    FrameTensor t;
    t.name = name;
    t.shape = {size};
    t.size = size;
    auto& values = data.buffers[name];
    values.resize(size);
    read_tensor(group, "/buffers", t, values.data(), path);
  }
  if (H5Lexists(file, "buffers", H5P_DEFAULT) > 0) {
    H5 group(H5Gopen2(file, "buffers", H5P_DEFAULT), H5Gclose);
    for (const auto& name : dataset_names(group, "/buffers", path))
      if (!data.buffers.count(name))
        data.buffers[name] = read_vector<float>(group, name, H5T_NATIVE_FLOAT, -1, "/buffers/" + name, path);
  }
}

}  // namespace

std::pair<int, int> read_checkpoint_layout(const std::string& path) {
  H5 file = open_complete(path);
  H5 train(H5Gopen2(file, "train", H5P_DEFAULT), H5Gclose);
  const TrainState s = read_train_state(train, path);
  return {s.world_size, s.ep};
}

std::string read_checkpoint_deck(const std::string& path) {
  H5 file = open_complete(path);
  return read_string_attr(file, "deck", path);
}

CheckpointData read_checkpoint(const std::string& path, const Frame& frame,
                               const std::map<std::string, int64_t>& buffers, bool tensors) {
  H5 file = open_complete(path);
  CheckpointData data;
  data.deck = read_string_attr(file, "deck", path);
  if (tensors) {
    data.params.resize(frame_total(frame));
    data.adam_m.resize(frame_total(frame));
    data.adam_v.resize(frame_total(frame));
  }
  for (const char* g : {"model", "optimizer/m", "optimizer/v", "train"})
    if (H5Lexists(file, "optimizer", H5P_DEFAULT) <= 0 || H5Lexists(file, g, H5P_DEFAULT) <= 0)
      input_error("{}: group '/{}' is missing (expected a xuanxue checkpoint)", path, g);
  // Tied and untied models differ by a tensor: no conversion, the deck says which it trains.
  const bool tied = H5Aexists(file, "tied_embeddings") > 0 &&
                    read_attr<int>(file, "tied_embeddings", H5T_NATIVE_INT, path) == 1;
  if (tied != ties_embeddings(frame))
    input_error("{}: its model {} (attribute tied_embeddings {}), the deck's {} (expected the deck's model line "
                "with tie_embeddings {}, as the run that wrote it)", path,
                tied ? "ties its embeddings: 'embed' is also the head" : "has its own head tensor 'head'", int(tied),
                tied ? "has its own head" : "ties its embeddings", tied ? "yes" : "no");
  {  // the moments' type: fp32 in files written before it was recorded
    H5 opt(H5Gopen2(file, "optimizer", H5P_DEFAULT), H5Gclose);
    if (H5Aexists(opt, "moments") > 0) {
      const std::string word = read_string_attr(opt, "moments", path);
      const auto type = mode_from_name<Precision>(word);
      if (!type || *type == Precision::fp16)
        input_error("{}: /optimizer attribute 'moments' is '{}' (expected fp32 or bf16)", path, word);
      data.moments = *type;
    }
  }
  // A delta: its chain's base file first (every check of that file applies),
  // then each tensor's change since it.
  const ChainLink link = chain_link(file, path);
  data.chain_kind = link.kind, data.chain_parent = link.parent;
  CheckpointData parent;
  if (link.kind == ChainKind::delta && tensors) {
    parent = read_checkpoint(chain_parent_path(path, link), frame, buffers);
    if (parent.chain_kind != ChainKind::base)
      input_error("{}: its chain base '{}' is a {} (expected a base file)", path, link.parent,
                  mode_name(parent.chain_kind));
  }
  const int64_t block = codec_block(file, path);
  auto read_group = [&](const std::string& g, std::vector<float>& out, const std::vector<float>& was) {
    H5 group(H5Gopen2(file, g.c_str(), H5P_DEFAULT), H5Gclose);
    for (const auto& t : frame) {
      if (link.kind == ChainKind::base) {
        read_tensor(group, "/" + g, t, out.data(), path);
        continue;
      }
      const std::string at = "/" + g + "/" + t.name;
      const auto codec = delta_codec(group, t.name);
      if (!codec)
        input_error("{}: tensor '{}' is missing (expected its change since {} for the deck's model)", path, at,
                    link.parent);
      decode_stored(group, t.name, at, *codec, out.data() + t.offset, was.data() + t.offset, t.size, block, path);
    }
  };
  if (tensors) {
    read_group("model", data.params, parent.params);
    read_group("optimizer/m", data.adam_m, parent.adam_m);
    read_group("optimizer/v", data.adam_v, parent.adam_v);
  }
  read_buffers(file, buffers, data, path);
  H5 train(H5Gopen2(file, "train", H5P_DEFAULT), H5Gclose);
  data.state = read_train_state(train, path);
  for (const auto& name : dataset_names(train, "/train", path))  // every series
    data.series[name] = read_vector<double>(train, name, H5T_NATIVE_DOUBLE, -1, "/train/" + name, path);
  return data;
}

bool has_rank_state(const std::string& path) {
  H5 file = open_read_only(path);
  return file >= 0 && H5Lexists(file, "ranks", H5P_DEFAULT) > 0;
}

bool written_by_slabs(const std::string& path) {
  H5 file = open_complete(path);
  return chain_link(file, path).kind == ChainKind::base && rank_tensors_are_base(file, path);
}

void read_slabs(MPI_Comm comm, const std::string& path, const Frame& frame, std::array<TensorSlabs, 3>& slabs) {
  // Every rank learns the lowest failing rank's error, and throws it.
  auto agree = [&](const std::string& error) {
    if (const std::string agreed = agree_on_error(error, comm); !agreed.empty()) throw InputError(agreed);
  };
  const char* groups[3] = {"model", "optimizer/m", "optimizer/v"};
  std::array<std::map<size_t, uint32_t>, 3> want;  // the crc32c attribute of each tensor this rank read from
  std::string error;
  try {
    // Each rank alone, read-only: reads need no MPI-IO, and a bad chunk fails only here.
    H5 file = open_complete(path);
    for (int i = 0; i < 3; ++i) {
      TensorSlabs& mine = slabs[size_t(i)];
      int64_t size = 0;
      for (const auto& s : mine.slabs) size = std::max(size, s.at + s.count);
      mine.values.assign(size_t(size), 0.0f);
      H5 group(H5Gopen2(file, groups[i], H5P_DEFAULT), H5Gclose);
      if (group < 0) input_error("{}: group '/{}' is missing (expected a xuanxue checkpoint)", path, groups[i]);
      std::vector<uint16_t> bits;  // a group of bf16 moments' slabs as stored
      for (auto s = mine.slabs.begin(); s != mine.slabs.end();) {
        const FrameTensor& t = frame.at(s->tensor);
        const std::string where = fmt::format("/{}/{}", groups[i], t.name);
        if (H5Lexists(group, t.name.c_str(), H5P_DEFAULT) <= 0)
          input_error("{}: tensor '{}' is missing (expected by the deck's model)", path, where);
        H5 ds(H5Dopen2(group, t.name.c_str(), H5P_DEFAULT), H5Dclose);
        H5 space(H5Dget_space(ds), H5Sclose);
        std::vector<hsize_t> dims(size_t(std::max(H5Sget_simple_extent_ndims(space), 0)));
        H5Sget_simple_extent_dims(space, dims.data(), nullptr);
        if (std::vector<int64_t>(dims.begin(), dims.end()) != t.shape)
          input_error("{}: tensor '{}' has shape [{}] (expected [{}] from the deck's model)", path, where,
                      fmt::join(dims, ", "), fmt::join(t.shape, ", "));
        const bool bf16 = stored_as_bf16(ds, where, path);  // moments kept in bf16: widened (h5.h)
        if (!bf16) check_type(ds, H5T_NATIVE_FLOAT, where, path);
        if (bf16 && bits.size() != mine.values.size()) bits.assign(mine.values.size(), 0);
        const hsize_t n = std::max<hsize_t>(1, mine.values.size());
        H5 mem(H5Screate_simple(1, &n, nullptr), H5Sclose);
        const size_t tensor = s->tensor;
        const auto first = s;
        while (s != mine.slabs.end() && s->tensor == tensor) ++s;
        slabs::select_slabs(mem, space, dims, &*first, &*first + (s - first));
        if (H5Sget_select_npoints(space) > 0 &&
            H5Dread(ds, bf16 ? H5T_NATIVE_UINT16 : H5T_NATIVE_FLOAT, mem, space, H5P_DEFAULT,
                    bf16 ? static_cast<void*>(bits.data()) : static_cast<void*>(mine.values.data())) < 0)
          input_error("{}: tensor '{}' cannot be read (checksum mismatch or corrupt data){}", path, where, cause());
        if (bf16)
          for (auto k = first; k != s; ++k)
            widen_bf16(bits.data() + k->at, size_t(k->count), mine.values.data() + k->at);
        if (H5Aexists(ds, "crc32c") <= 0)
          input_error("{}: tensor '{}' has no crc32c attribute (expected one in a file written by slabs)", path, where);
        want[size_t(i)][tensor] = read_attr<uint32_t>(ds, "crc32c", H5T_NATIVE_UINT32, path);
      }
    }
  } catch (const InputError& e) {
    error = e.what();
  }
  agree(error);
  // The checksums of the whole tensors, from every rank's slabs.
  for (int i = 0; i < 3; ++i) {
    const auto got = slabs::tensor_crcs(comm, frame, slabs[size_t(i)]);
    for (const auto& [tensor, crc] : want[size_t(i)])
      if (got[tensor] != crc && error.empty())
        error = fmt::format("{}: dataset '/{}/{}' fails its checksum (crc32c {:08x}, expected {:08x})", path, groups[i],
                            frame[tensor].name, got[tensor], crc);
  }
  agree(error);
}

RankState read_rank_state(const std::string& path, const Frame& frame, const CheckpointData& base, int rank,
                          const std::map<std::string, int64_t>& extra) {
  H5 file = open_read_only(path);
  if (file < 0) input_error("{}: cannot open (corrupt or truncated HDF5 file){}", path, cause());
  const std::string where = fmt::format("/ranks/{}", rank);
  if (H5Lexists(file, "ranks", H5P_DEFAULT) <= 0 || H5Lexists(file, where.c_str(), H5P_DEFAULT) <= 0)
    input_error("{}: group '{}' is missing (expected the state of rank {})", path, where, rank);
  H5 group(H5Gopen2(file, where.c_str(), H5P_DEFAULT), H5Gclose);
  const std::string mode_word = read_string_attr(file, "mode", path);
  const auto stored_mode = mode_from_name<CheckpointMode>(mode_word);
  if (!stored_mode) input_error("{}: attribute 'mode' is '{}' (expected full or diff)", path, mode_word);
  const CheckpointMode mode = *stored_mode;
  const int64_t n = frame_total(frame);
  const bool base_tensors = rank_tensors_are_base(file, path);  // the ranks agreed
  if (mode == CheckpointMode::diff && !base_tensors && int64_t(base.params.size()) != n)
    input_error("{}: mode diff needs the base of the file to rebuild rank {} (expected {} values, got {})", path, rank,
                n, base.params.size());
  // Mode full in a delta: each tensor is the change since this rank's own
  // tensor in the chain's base file.
  const ChainLink link = chain_link(file, path);
  const bool own_delta = mode == CheckpointMode::full && link.kind == ChainKind::delta && !base_tensors;
  RankState was;
  if (own_delta) was = read_rank_state(chain_parent_path(path, link), frame, base, rank, extra);
  const int64_t block = codec_block(file, path);
  RankState out;
  out.sampler_batches = read_attr<int64_t>(group, "sampler_batches", H5T_NATIVE_INT64, path);
  const std::vector<float>* bases[3] = {&base.params, &base.adam_m, &base.adam_v};
  const std::vector<float>* owns[3] = {&was.params, &was.adam_m, &was.adam_v};
  std::vector<float>* targets[3] = {&out.params, &out.adam_m, &out.adam_v};
  const char* names[3] = {"params", "adam_m", "adam_v"};
  for (int i = 0; i < 3; ++i) {
    const std::string name = names[i], at = where + "/" + name;
    auto& value = *targets[i];
    if (base_tensors) {
      value = *bases[i];
      continue;
    }
    if (mode == CheckpointMode::full && !own_delta) {
      value = read_vector<float>(group, name, H5T_NATIVE_FLOAT, n, at, path);
      continue;
    }
    const Codec codec = stored_codec(group, name, at, path);
    value.assign(n, 0.0f);
    decode_stored(group, name, at, codec, value.data(), (own_delta ? *owns[i] : *bases[i]).data(), n, block, path);
    // A lossy second moment could dip below zero; AdamW takes its square root.
    if (i == 2 && codec != Codec::lossless)
      for (auto& x : value) x = std::max(x, 0.0f);
  }
  for (const auto& [name, size] : extra)
    out.extra[name] = read_vector<float>(group, name, H5T_NATIVE_FLOAT, size, where + "/" + name, path);
  // Optional per-rank buffers (the outer optimizer's state): whatever else is there.
  for (const auto& n : dataset_names(group, where, path))
    if (!out.extra.count(n) && !n.starts_with("params") && !n.starts_with("adam_m") && !n.starts_with("adam_v"))
      out.extra[n] = read_vector<float>(group, n, H5T_NATIVE_FLOAT, -1, where + "/" + n, path);
  return out;
}

}  // namespace xx

#include "ckpt/schema.h"
#include <algorithm>
#include <iterator>
#include <optional>
#include <type_traits>
#include <variant>
#include "core/crc32c.h"
#include "kernels/precision.h"

namespace xx {
using h5::H5;

bool ties_embeddings(const std::vector<FrameTensor>& frame) {
  auto has = [&](const char* name) {
    return std::any_of(frame.begin(), frame.end(), [&](const FrameTensor& t) { return t.name == name; });
  };
  return has("embed") && !has("head");
}

namespace {

// TrainState's fields as /train's attributes: the one table the writer, the
// reader and its checks walk. `optional`: absent in older files (the default
// stays). `least`: a count a resume loops over or divides by.
struct TrainField {
  const char* attribute;
  std::variant<int64_t TrainState::*, uint64_t TrainState::*, int TrainState::*, double TrainState::*> member;
  bool optional = false;
  std::optional<int64_t> least = std::nullopt;
};
const TrainField kTrainFields[] = {
    {"step", &TrainState::step, false, 0},
    {"sampler_batches", &TrainState::sampler_batches, false, 0},
    {"epoch", &TrainState::epoch, false, 0},
    {"seed", &TrainState::seed},
    {"world_size", &TrainState::world_size, false, 1},
    {"ep", &TrainState::ep, true, 1},               // (absent before ep: 1)
    {"stages", &TrainState::stages, true, 1},       // (absent before pipeline stages: 1)
    {"loss", &TrainState::last_loss},
    {"chaos_seed", &TrainState::chaos_seed, true},  // (absent before shuffle chaos: 0, no chaos seed)
};

template <class T>
uint32_t crc_of(const std::vector<T>& v) {
  return crc32c(v.data(), v.size() * sizeof(T));
}

// The root attributes: format, deck, tying, state index, mode, codec, chain.
void write_root(H5Writer& w, hid_t file, const EncodedCheckpoint& enc) {
  const auto& data = enc.data;
  const auto& format = enc.format;
  const bool diff = enc.has_ranks && format.mode == CheckpointMode::diff;
  const std::string codec(mode_name(format.codec.kind));
  w.string_attr(file, "format", "xuanxue-checkpoint");
  w.attr(file, "format_version", H5T_NATIVE_INT, kCheckpointVersion);
  w.string_attr(file, "deck", data.deck);
  w.attr(file, "tied_embeddings", H5T_NATIVE_INT, int(ties_embeddings(enc.tensors)));
  if (!data.state_index.empty()) w.string_attr(file, "state_index", data.state_index);
  w.string_attr(file, "mode", std::string(mode_name(enc.has_ranks ? format.mode : CheckpointMode::full)));
  w.string_attr(file, "codec", diff ? codec : "none");
  w.attr(file, "codec_block", H5T_NATIVE_INT64, format.codec.block);
  w.string_attr(file, "chain_kind", std::string(mode_name(enc.kind)));
  w.string_attr(file, "chain_parent", enc.parent);
  if (enc.kind == ChainKind::delta) w.string_attr(file, "chain_codec", codec);
  if (data.slabs) w.string_attr(file, "rank_tensors", "base");  // /ranks/<r> holds no tensors: the base is every rank's
  w.sync();
}

// One group of the base (/model, /optimizer/m or /optimizer/v; i: 0, 1, 2):
// rank 0's copy of what every rank passes alike, each rank's own slabs, or
// a delta's change of each tensor since the chain's base, through its codec.
// Moments kept in bf16 are stored as kept: uint16, encoding "bfloat16"
// (docs/CHECKPOINT.md). They are bf16 values (encode_checkpoint rounds the
// base's average of the ranks' moments), so their bits widen back to the
// floats whose crc32c is stored.
void write_base_group(H5Writer& w, hid_t group, const EncodedCheckpoint& enc, int i, const std::vector<float>& flat) {
  const bool bf16 = i > 0 && enc.data.moments == Precision::bf16;
  if (enc.kind == ChainKind::delta) {
    for (const auto& p : enc.base_parts[i])
      w.dataset(group, p.name, p.type, {hsize_t(p.count)}, 0, p.data, p.crc, true, p.offset);
  } else if (enc.data.slabs) {  // they come tensor by tensor
    const TensorSlabs& mine = (*enc.data.slabs)[size_t(i)];
    std::vector<uint16_t> bits;
    if (bf16)
      std::transform(mine.values.begin(), mine.values.end(), std::back_inserter(bits), kernels::float_to_bf16_bits);
    const FrameSlab *s = mine.slabs.data(), *end = s + mine.slabs.size();
    for (size_t k = 0; k < enc.tensors.size(); ++k) {
      const auto& t = enc.tensors[k];
      const FrameSlab* first = s;
      while (s != end && s->tensor == k) ++s;
      const std::vector<hsize_t> dims(t.shape.begin(), t.shape.end());
      if (bf16) w.dataset_slabs(group, t.name, dims, first, s, bits, enc.slab_crcs[i][k], t.offset);
      else w.dataset_slabs(group, t.name, dims, first, s, mine.values, enc.slab_crcs[i][k], t.offset);
    }
  } else {
    std::vector<uint16_t> bits;
    for (const auto& t : enc.tensors) {
      std::vector<hsize_t> dims(t.shape.begin(), t.shape.end());
      const float* values = flat.data() + t.offset;
      const uint32_t crc = crc32c(values, size_t(t.size) * sizeof(float));
      if (!bf16) {
        w.dataset(group, t.name, H5T_NATIVE_FLOAT, dims, 0, values, crc, false, t.offset);
        continue;
      }
      bits.resize(size_t(t.size));
      std::transform(values, values + t.size, bits.begin(), kernels::float_to_bf16_bits);
      w.dataset(group, t.name, H5T_NATIVE_UINT16, dims, 0, bits.data(), crc, false, t.offset, "bfloat16");
    }
  }
}

// The base: /model, /optimizer, /buffers, /train.
void write_base(H5Writer& w, hid_t file, const EncodedCheckpoint& enc) {
  const auto& data = enc.data;
  H5 model = w.group(file, "model");
  write_base_group(w, model, enc, 0, data.params);
  H5 opt = w.group(file, "optimizer");
  w.string_attr(opt, "kind", "adamw");
  w.string_attr(opt, "moments", std::string(mode_name(data.moments)));
  w.sync();
  H5 m = w.group(opt, "m");
  write_base_group(w, m, enc, 1, data.adam_m);
  H5 v = w.group(opt, "v");
  write_base_group(w, v, enc, 2, data.adam_v);
  if (!data.buffers.empty()) {
    H5 buffers = w.group(file, "buffers");
    for (const auto& [n, values] : data.buffers)
      w.dataset(buffers, n, H5T_NATIVE_FLOAT, {hsize_t(values.size())}, 0, values.data(), crc_of(values));
  }
  H5 train = w.group(file, "train");
  for (const auto& f : kTrainFields)
    std::visit(
        [&](auto member) {
          using T = std::remove_cvref_t<decltype(data.state.*member)>;
          w.attr(train, f.attribute, h5::native<T>(), data.state.*member);
        },
        f.member);
  w.sync();
  for (const auto& [n, values] : data.series)
    w.dataset(train, n, H5T_NATIVE_DOUBLE, {hsize_t(values.size())}, 0, values.data(), crc_of(values));
}

// Each rank's own state: /ranks/<r>, from `ranks`.
void write_ranks(H5Writer& w, hid_t file, const EncodedCheckpoint& enc, int world, const RankParts& ranks) {
  H5 all = w.group(file, "ranks");
  for (int r = 0; r < world; ++r) {
    H5 group = w.group(all, std::to_string(r).c_str());
    w.attr(group, "sampler_batches", H5T_NATIVE_INT64, enc.batches[r]);
    w.sync();
    for (size_t i = 0; i < enc.parts.size(); ++i) {
      const auto& p = enc.parts[i];
      w.dataset(group, p.name, p.type, {hsize_t(enc.count(r, i))}, ranks.gathered ? 0 : r, ranks.at[r][i],
                enc.crc(r, i), p.codec.has_value());
    }
    for (const auto& p : enc.parts)
      if (p.codec) {
        const std::string tensor = p.name.substr(0, p.name.find('.'));
        if (H5Aexists(group, (tensor + ".codec").c_str()) <= 0)
          w.string_attr(group, (tensor + ".codec").c_str(), std::string(mode_name(*p.codec)));
      }
    w.sync();
  }
}

}  // namespace

void write_file(H5Writer& w, const EncodedCheckpoint& enc, int world, const RankParts& ranks) {
  const hid_t file = w.file();
  write_root(w, file, enc);
  write_base(w, file, enc);
  if (enc.has_ranks) write_ranks(w, file, enc, world, ranks);
  w.flush();
  w.sync();
  w.attr(file, "complete", H5T_NATIVE_INT, 1);  // last: a file without it never counts
  w.close();
}

TrainState read_train_state(hid_t train, const std::string& path) {
  TrainState s;
  for (const auto& f : kTrainFields)
    std::visit(
        [&](auto member) {
          using T = std::remove_reference_t<decltype(s.*member)>;
          if (!f.optional || H5Aexists(train, f.attribute) > 0)
            s.*member = h5::read_attr<T>(train, f.attribute, h5::native<T>(), path);
          if constexpr (std::is_integral_v<T>)
            if (f.least && int64_t(s.*member) < *f.least)
              input_error("{}: attribute '/train/{}' is {} (expected {} or more)", path, f.attribute, s.*member,
                          *f.least);
        },
        f.member);
  return s;
}

}  // namespace xx

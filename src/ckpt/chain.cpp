#include "ckpt/chain.h"
#include <filesystem>
#include "ckpt/h5.h"
#include "core/error.h"

namespace xx {
namespace fs = std::filesystem;

bool continues_chain(const ChainBase& chain, const CheckpointFormat& format, int64_t n, const std::string& name) {
  return !chain.name.empty() && chain.written < format.base_every && chain.format == format &&
         int64_t(chain.params.size()) == n && chain.name != name;
}

void advance_chain(ChainBase& chain, bool chained, bool delta, const std::string& name, const CheckpointFormat& format,
                   const CheckpointData& data, const RankState* mine) {
  if (chained && delta) return void(++chain.written);
  chain = ChainBase{};
  if (!chained) return;
  chain.name = name, chain.written = 1, chain.format = format;
  chain.params = data.params, chain.adam_m = data.adam_m, chain.adam_v = data.adam_v;
  if (mine && format.mode == CheckpointMode::full) chain.own_params = mine->params, chain.own_m = mine->adam_m, chain.own_v = mine->adam_v;
}

ChainLink chain_link(hid_t file, const std::string& path) {
  ChainLink link;
  if (H5Aexists(file, "chain_kind") > 0) {
    const std::string word = h5::read_string_attr(file, "chain_kind", path);
    const auto kind = mode_from_name<ChainKind>(word);
    if (!kind) input_error("{}: attribute 'chain_kind' is '{}' (expected base or delta)", path, word);
    link.kind = *kind;
  }
  if (H5Aexists(file, "chain_parent") > 0) link.parent = h5::read_string_attr(file, "chain_parent", path);
  if (link.kind == ChainKind::delta && link.parent.empty())
    input_error("{}: attribute 'chain_parent' is empty (expected the base file this delta is written against)", path);
  return link;
}

std::string chain_parent_path(const std::string& path, const ChainLink& link) {
  // A file name next to this one, not this one: a delta read from itself, or
  // from another delta, would recurse without end.
  if (link.parent.find('/') != std::string::npos || link.parent == "." || link.parent == ".." ||
      link.parent == fs::path(path).filename().string())
    input_error("{}: attribute 'chain_parent' is '{}' (expected the file name of another checkpoint next to it)", path,
                link.parent);
  const std::string parent = (fs::path(path).parent_path() / link.parent).string();
  if (!fs::exists(parent))
    input_error("{}: its chain base '{}' is missing (expected {} next to it: a delta checkpoint stores only the "
                "change since that file)", path, link.parent, parent);
  if (const ChainLink up = read_chain_link(parent); up.kind != ChainKind::base)
    input_error("{}: its chain base '{}' is a {} (expected a base file)", path, link.parent, mode_name(up.kind));
  return parent;
}

ChainLink read_chain_link(const std::string& path) {
  h5::H5 file = h5::open_read_only(path);
  if (file < 0) input_error("{}: cannot open (corrupt or truncated HDF5 file){}", path, h5::cause());
  return chain_link(file, path);
}

std::string chain_parent_of(const std::string& path) {
  h5::H5 file = h5::open_read_only(path);
  if (file < 0 || H5Aexists(file, "chain_parent") <= 0) return "";
  return h5::read_string_attr(file, "chain_parent", path);
}

}  // namespace xx

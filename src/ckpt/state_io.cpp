#include "ckpt/state_io.h"
#include <fmt/format.h>
#include <vector>
#include "core/error.h"

namespace xx {

void save_state(const StateRegistry& registry, CheckpointData& data, RankState& mine) {
  for (const auto& e : registry.entries()) {
    if (e.is_series()) {
      if (auto v = e.save_doubles ? e.save_doubles() : std::vector<double>{}; !v.empty()) {
        data.series[e.name] = v;
        data.state_index += "/train " + e.name + "\n";
      }
    } else if (auto v = e.save_floats ? e.save_floats() : std::vector<float>{}; !v.empty()) {
      const bool own = e.place == StatePlace::rank_buffer;
      (own ? mine.extra : data.buffers)[e.name] = std::move(v);
      data.state_index += (own ? "/ranks/* " : "/buffers ") + e.name + "\n";
    }
  }
}

void load_state(const StateRegistry& registry, const CheckpointData& data, const RankState* mine,
                const std::string& path, int rank) {
  for (const auto& e : registry.entries()) {
    const bool own = e.place == StatePlace::rank_buffer;
    if (own && !mine) continue;  // a file without per-rank state
    const std::string where = own ? fmt::format("/ranks/{}/{}", rank, e.name)
                              : e.is_series() ? "/train/" + e.name : "/buffers/" + e.name;
    if (e.is_series()) {
      const auto it = data.series.find(e.name);
      if (it == data.series.end()) {
        if (e.required) input_error("{}: dataset '{}' is missing (expected it for this deck)", path, where);
        continue;
      }
      if (e.load_doubles) e.load_doubles(it->second);
      continue;
    }
    const auto& values = own ? mine->extra : data.buffers;
    const auto it = values.find(e.name);
    if (it == values.end()) {
      if (e.required) input_error("{}: dataset '{}' is missing (expected it for this deck)", path, where);
      continue;
    }
    if (e.size >= 0 && int64_t(it->second.size()) != e.size)
      input_error("{}: dataset '{}' has {} values (expected {})", path, where, it->second.size(), e.size);
    if (e.load_floats) e.load_floats(it->second);
  }
}

RankState merged_rank_state(const std::string& path, const Frame& frame, const CheckpointData& base,
                            int old_world, int world, int rank, const std::map<std::string, int64_t>& own) {
  std::vector<int> sources;
  for (int r = 0; r < old_world; ++r)
    if (int64_t(r) * world / old_world == rank) sources.push_back(r);
  if (sources.empty())
    for (int r = 0; r < old_world; ++r) sources.push_back(r);
  RankState out = read_rank_state(path, frame, base, sources[0], own);
  if (sources.size() == 1) return out;
  auto average = [&](std::vector<float>& into, const std::string& what, auto get) {
    std::vector<double> sum(into.begin(), into.end());
    for (size_t i = 1; i < sources.size(); ++i) {
      RankState other = read_rank_state(path, frame, base, sources[i], own);
      const std::vector<float>* v = get(other);
      if (!v || v->size() != into.size())
        input_error("{}: rank {} holds {} values of '{}' (expected {}, as rank {} does, to merge them)", path,
                    sources[i], v ? v->size() : 0, what, into.size(), sources[0]);
      for (size_t j = 0; j < sum.size(); ++j) sum[j] += (*v)[j];
    }
    for (size_t j = 0; j < sum.size(); ++j) into[j] = float(sum[j] / double(sources.size()));
  };
  average(out.params, "params", [](RankState& s) { return &s.params; });
  average(out.adam_m, "adam_m", [](RankState& s) { return &s.adam_m; });
  average(out.adam_v, "adam_v", [](RankState& s) { return &s.adam_v; });
  for (auto& [name, values] : out.extra)  // optional buffers: any size, so every rank's must match the first's
    average(values, name, [name = name](RankState& s) -> std::vector<float>* {
      const auto it = s.extra.find(name);
      return it == s.extra.end() ? nullptr : &it->second;
    });
  return out;
}

}  // namespace xx

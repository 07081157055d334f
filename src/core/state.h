// Training state as one registry. Every owner of state a run needs to
// continue exactly (the model's gate biases, the optimizer, the sync
// strategy, the loss scaler, loss aggregation, warm restarts, the data
// streams) registers its named entries once, with how to read them out and
// put them back. Checkpoint save, restore and resharding walk this one list
// (src/train/trainer_checkpoint.cpp); the names are the datasets of
// docs/CHECKPOINT.md.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>
#include "core/views.h"

namespace xx {

// Where an entry lives in a checkpoint file.
enum class StatePlace {
  shared_buffer,  // /buffers/<name>: floats, one value for all ranks (MoE gate biases)
  shared_series,  // /train/<name>: doubles, one value for all ranks (LR restarts, loss scale)
  rank_buffer,    // /ranks/<r>/<name>: floats, each rank's own (compression residual, outer anchor)
};

struct StateEntry {
  StateEntry(std::string name_, StatePlace place_, int64_t size_ = -1, bool required_ = false)
      : name(std::move(name_)), place(place_), size(size_), required(required_) {}
  std::string name;
  StatePlace place = StatePlace::shared_series;
  int64_t size = -1;  // buffers: the length restore expects (-1: any)
  // A file without the entry is an error (required) or leaves the owner as it
  // is (optional: files written before the entry existed).
  bool required = false;
  // Buffers (floats) use the first pair, series (doubles) the second.
  std::function<std::vector<float>()> save_floats;
  std::function<void(const std::vector<float>&)> load_floats;
  std::function<std::vector<double>()> save_doubles;
  std::function<void(const std::vector<double>&)> load_doubles;
  bool is_series() const { return place == StatePlace::shared_series; }
};

// The list. Owners add entries at set-up, in the order save and restore visit them.
class StateRegistry {
 public:
  void add(StateEntry entry) { entries_.push_back(std::move(entry)); }
  const std::vector<StateEntry>& entries() const { return entries_; }
  std::vector<const StateEntry*> in(StatePlace place) const {
    std::vector<const StateEntry*> out;
    for (const auto& e : entries_)
      if (e.place == place) out.push_back(&e);
    return out;
  }

 private:
  std::vector<StateEntry> entries_;
};

// An entry for a device buffer held by its owner (a Buffer is a handle: the
// entry and the owner share the storage).
inline StateEntry buffer_entry(std::string name, StatePlace place, Buffer<float> buffer, bool required = true) {
  StateEntry e{std::move(name), place, int64_t(buffer.extent(0)), required};
  e.save_floats = [buffer] {
    std::vector<float> out(buffer.extent(0));
    Kokkos::deep_copy(Kokkos::View<float*, Kokkos::HostSpace, Unmanaged>(out.data(), out.size()), buffer);
    return out;
  };
  e.load_floats = [buffer](const std::vector<float>& v) {
    Kokkos::deep_copy(buffer, Kokkos::View<const float*, Kokkos::HostSpace, Unmanaged>(v.data(), v.size()));
  };
  return e;
}

}  // namespace xx

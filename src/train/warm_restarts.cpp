#include "train/warm_restarts.h"
#include <cmath>
#include <fmt/format.h>
#include "train/transfer.h"

namespace xx {
using namespace transfer;

WarmRestarts::WarmRestarts(const PlacementMpi& placed, const Program& program, Transformer<float>& model,
                           AdamW<float>& optimizer)
    : placed_(placed), program_(program), model_(model), optimizer_(optimizer) {
  for (const auto& p : program.phases)
    if (Schedule(p.config.optimizer, p.config.schedule, p.config.seed).restart_from_best() &&
        best_.params.extent(0) == 0) {
      // Where the fp32 weights are this rank's pieces, so is the copy: laid out as AdamW's moments.
      pieces_ = fp32_weights_in_pieces(p.config, optimizer_.owned().ranks());
      const int64_t P = pieces_ ? optimizer_.owned().shard_size() : model.layout().total();
      best_.params = Buffer<float>("WarmRestarts::best_params", P);
      best_.adam_m = optimizer_.m().like("WarmRestarts::best_adam_m");  // the shard, under shard; as AdamW keeps them
      best_.adam_v = optimizer_.v().like("WarmRestarts::best_adam_v");
    }
}

std::optional<Schedule> WarmRestarts::schedule_of(int64_t step) const {
  int64_t end = 0;
  for (const auto& p : program_.phases)
    if (step <= (end += p.steps)) return Schedule(p.config.optimizer, p.config.schedule, p.config.seed);
  return std::nullopt;
}

bool WarmRestarts::due(int64_t next) const {
  const auto s = schedule_of(next);
  return s && s->is_restart(next);
}

void WarmRestarts::note_validation(double val, int64_t step) {
  const auto current = schedule_of(step);
  if (!current || !current->restart_from_best()) return;
  if (best_.step >= 0 && !(val < best_.val_loss)) return;
  copy_best_weights(true);
  best_.adam_m.copy_from(optimizer_.m());
  best_.adam_v.copy_from(optimizer_.v());
  for (auto& [prefix, ffn] : model_.moe_layers()) best_.gate_bias[prefix] = to_host(ffn->bias());
  best_.step = step, best_.val_loss = val, best_.adam_steps = optimizer_.steps_taken();
}

// Between the weights and the best copy: whole, or this rank's pieces (the
// copy in shard order, the weights at their places). `keep`: into the copy.
void WarmRestarts::copy_best_weights(bool keep) {
  if (!pieces_) return keep ? Kokkos::deep_copy(best_.params, model_.params()) : Kokkos::deep_copy(model_.params(), best_.params);
  if (keep) pieces_to_shard(model_.params(), best_.params, optimizer_.owned());
  else shard_to_pieces(best_.params, model_.params(), optimizer_.owned());
}

void WarmRestarts::restart(int64_t next, double val, RunLog& log) {
  const Schedule schedule = *schedule_of(next);
  const int64_t step = next - 1;
  Record r;
  r.step = next, r.lr = schedule.lr(next), r.val_loss = val, r.cycle = schedule.cycle(next);
  if (schedule.restart_from_best() && best_.step >= 0 && best_.step != step) {
    copy_best_weights(false);
    optimizer_.m().copy_from(best_.adam_m);
    optimizer_.v().copy_from(best_.adam_v);
    for (auto& [prefix, ffn] : model_.moe_layers()) from_host(ffn->bias(), best_.gate_bias[prefix]);
    optimizer_.set_steps_taken(best_.adam_steps);
    r.restored_from = best_.step;
  }
  nlohmann::json record = {{"step", r.step}, {"lr", r.lr}, {"val_loss", r.val_loss}, {"cycle", r.cycle}};
  if (r.restored_from >= 0) record["restored_from"] = r.restored_from, record["restored_val_loss"] = best_.val_loss;
  log.restart(record);
  log.console(fmt::format("step {:>6} | warm restart: cycle {} at lr {:.2e} (val_loss {:.4f}){}", step, r.cycle, r.lr,
                          val,
                          r.restored_from >= 0 ? fmt::format(", back to step {} (val_loss {:.4f})", r.restored_from,
                                                             best_.val_loss)
                                               : ""));
  records_.push_back(r);
  best_.step = -1;  // a new cycle, a new best
}

void WarmRestarts::register_state(StateRegistry& registry) {
  // Five doubles per restart: step, lr, val_loss, cycle, restored_from.
  StateEntry restarts{"lr_restarts", StatePlace::shared_series};
  restarts.save_doubles = [this] {
    std::vector<double> out;
    for (const auto& r : records_)
      out.insert(out.end(), {double(r.step), r.lr, r.val_loss, double(r.cycle), double(r.restored_from)});
    return out;
  };
  restarts.load_doubles = [this](const std::vector<double>& v) {
    records_.clear();
    for (size_t i = 0; i + 5 <= v.size(); i += 5)
      records_.push_back({int64_t(v[i]), v[i + 1], v[i + 2], int(v[i + 3]), int64_t(v[i + 4])});
  };
  registry.add(std::move(restarts));
  if (best_.params.extent(0) == 0) return;
  // restart_from best: the cycle's best state so far (step -1: none yet).
  StateEntry best{"restart_best", StatePlace::shared_series};
  best.save_doubles = [this] { return std::vector<double>{double(best_.step), best_.val_loss, double(best_.adam_steps)}; };
  best.load_doubles = [this](const std::vector<double>& b) {
    best_.step = int64_t(b.at(0)), best_.val_loss = b.at(1), best_.adam_steps = int64_t(b.at(2));
  };
  registry.add(std::move(best));
  // The best moments are laid out like AdamW's: under shard this rank's
  // pieces. The file holds them whole, as it holds AdamW's (gathered: every
  // rank saves, collectively), and each rank takes its pieces back. So are
  // the best weights where a rank's fp32 weights are its pieces (shard params;
  // optimizer and gradients under 16-bit precision).
  if (!pieces_) registry.add(buffer_entry("restart_best.params", StatePlace::shared_buffer, best_.params));
  // The moments in fp32 as AdamW's are (bf16 widens exactly, and rounds back on load).
  if (pieces_) {
    StateEntry e{"restart_best.params", StatePlace::shared_buffer, optimizer_.owned().total()};
    e.save_floats = [this, shard = best_.params] { return placed_.gather_whole(to_host(shard)); };
    e.load_floats = [this, shard = best_.params](const std::vector<float>& v) mutable { from_host(shard, placed_.owned_part(v)); };
    registry.add(std::move(e));
  }
  for (auto [name, shard] : {std::pair{"restart_best.adam_m", best_.adam_m}, std::pair{"restart_best.adam_v", best_.adam_v}}) {
    StateEntry e{name, StatePlace::shared_buffer, optimizer_.owned().total()};
    e.save_floats = [this, shard] { return placed_.gather_whole(shard.to_host()); };
    e.load_floats = [this, shard](const std::vector<float>& v) mutable { shard.from_host(placed_.owned_part(v)); };
    registry.add(std::move(e));
  }
  for (auto& [prefix, ffn] : model_.moe_layers()) {
    // Absent until the cycle's first validation.
    StateEntry bias{"restart_best." + prefix + "ffn.gate_bias", StatePlace::shared_buffer,
                    int64_t(ffn->bias().extent(0)), false};
    bias.save_floats = [this, prefix = prefix] { return best_.gate_bias[prefix]; };
    bias.load_floats = [this, prefix = prefix](const std::vector<float>& v) { best_.gate_bias[prefix] = v; };
    registry.add(std::move(bias));
  }
}

}  // namespace xx

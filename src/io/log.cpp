#include "io/log.h"
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fmt/format.h>

namespace xx {

RunLog::RunLog(const std::string& run_dir, int rank, bool append, bool quiet, bool tensorboard)
    : dir_(run_dir), rank_(rank), quiet_(quiet) {
  const auto rank_dir = std::filesystem::path(run_dir) / fmt::format("rank{}", rank);
  std::filesystem::create_directories(rank_dir);
  const auto mode = append ? std::ios::app : std::ios::trunc;
  log_.open(rank_dir / "log.txt", std::ios::out | std::ios::app);  // rank logs only grow
  log_ << (append ? "# resumed\n" : "# run started\n");
  if (!log_) throw std::runtime_error("cannot open " + (rank_dir / "log.txt").string());
  if (rank == 0) {
    // A fresh run keeps an earlier run's metrics as metrics.jsonl.1, .2, ...
    // (and its lr_history.jsonl likewise)
    for (const char* name : {"metrics.jsonl", "lr_history.jsonl"}) {
      const auto path = std::filesystem::path(run_dir) / name;
      if (append || !std::filesystem::exists(path)) continue;
      int n = 1;
      while (std::filesystem::exists(path.string() + "." + std::to_string(n))) ++n;
      std::filesystem::rename(path, path.string() + "." + std::to_string(n));
    }
    const auto metrics = std::filesystem::path(run_dir) / "metrics.jsonl";
    metrics_.open(metrics, std::ios::out | mode);
    if (!metrics_) throw std::runtime_error("cannot open " + run_dir + "/metrics.jsonl");
  }
  if (tensorboard) {
    // Always a new events file, also on resume: TensorBoard reads every file
    // in a folder, in name order.
    const auto tb_dir = std::filesystem::path(run_dir) / "tb";
    const auto warn = [this](const std::string& line) { tensorboard_warning(line); };
    if (rank == 0) tb_run_ = std::make_unique<EventWriter>(event_file_path(tb_dir), warn);
    const auto own_dir = tb_dir / fmt::format("rank{}", rank);
    tb_rank_ = std::make_unique<EventWriter>(event_file_path(own_dir), warn);
  }
}

void RunLog::rank(const std::string& line) { log_ << line << '\n' << std::flush; }

void RunLog::console(const std::string& line) {
  if (rank_ != 0) return;
  if (progress_shown_) std::fputs("\r\033[K", stdout), progress_shown_ = false;
  if (!quiet_) std::fputs((line + "\n").c_str(), stdout);
  std::fflush(stdout);
  rank(line);
}

void RunLog::progress(const std::string& line) {
  if (!progress_on_) return;
  std::fputs(("\r" + line + "\033[K").c_str(), stdout);
  std::fflush(stdout);
  progress_shown_ = true;
}

void RunLog::metrics(const nlohmann::json& record) {
  if (rank_ != 0) return;
  metrics_ << record.dump() << '\n' << std::flush;
  if (!tb_run_ || !record.contains("step")) return;
  Scalars scalars;
  for (const auto& [key, value] : record.items()) {
    // lists (lossagg_weights) are left out, and so are values metrics.jsonl writes as null (NaN, inf)
    if (key == "step" || !value.is_number() || !std::isfinite(value.get<double>())) continue;
    const bool validation = key.rfind("val_", 0) == 0;
    scalars.emplace_back(validation ? "val/" + key.substr(4) : "train/" + key, value.get<double>());
  }
  tb_run_->scalars(record["step"].get<int64_t>(), scalars);
}

void RunLog::text(int64_t step, const std::string& tag, const std::string& text) {
  if (rank_ != 0) return;
  if (tb_run_) tb_run_->text(step, tag, text);
}

void RunLog::rank_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values) {
  if (!tb_rank_) return;
  Scalars scalars;
  for (const auto& [name, value] : values) scalars.emplace_back(fmt::format("rank{}/{}", rank_, name), value);
  tb_rank_->scalars(step, scalars);
}

void RunLog::tensorboard_warning(const std::string& line) {
  if (tb_warned_) return;
  tb_warned_ = true;
  if (rank_ == 0) console(line);
  else rank(line);
}

void RunLog::restart(const nlohmann::json& record) {
  if (rank_ != 0) return;
  if (!restarts_.is_open()) {
    const auto path = std::filesystem::path(dir_) / "lr_history.jsonl";
    restarts_.open(path, std::ios::out | std::ios::app);  // a fresh run moved an old one away
    if (!restarts_) throw std::runtime_error("cannot open " + path.string());
  }
  restarts_ << record.dump() << '\n' << std::flush;
}

}  // namespace xx

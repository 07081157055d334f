#include "io/log.h"
#include <cstdio>
#include <filesystem>
#include <fmt/format.h>

namespace xx {

RunLog::RunLog(const std::string& run_dir, int rank, bool append, bool quiet)
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
}

void RunLog::rank(const std::string& line) { log_ << line << '\n' << std::flush; }

void RunLog::console(const std::string& line) {
  if (rank_ != 0) return;
  if (!quiet_) std::fputs((line + "\n").c_str(), stdout);
  std::fflush(stdout);
  rank(line);
}

void RunLog::metrics(const nlohmann::json& record) {
  if (rank_ == 0) metrics_ << record.dump() << '\n' << std::flush;
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

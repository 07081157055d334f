// Where a run reports: rank 0's console, every rank's RUN_DIR/rank<r>/log.txt,
// rank 0's RUN_DIR/metrics.jsonl (one JSON object per logged step), and with
// `output tensorboard on` TensorBoard event files under RUN_DIR/tb
// (docs/OBSERVABILITY.md).
#pragma once
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>
#include <nlohmann/json.hpp>
#include "io/tensorboard.h"

namespace xx {

class RunLog {
 public:
  // A fresh run starts new files; a resumed run appends to them (and starts
  // new TensorBoard event files beside the old ones, which TensorBoard merges).
  RunLog(const std::string& run_dir, int rank, bool append, bool quiet = false, bool tensorboard = false);
  RunLog(const RunLog&) = delete;  // the event writers report through `this`
  RunLog& operator=(const RunLog&) = delete;

  void rank(const std::string& line);     // this rank's log only
  void console(const std::string& line);  // rank 0: stdout and its log
  // Rank 0, on a terminal: one line rewritten in place (step, ETA, tok/s);
  // console lines clear it first. Nothing unless show_progress(true).
  void show_progress(bool on) { progress_on_ = on && rank_ == 0 && !quiet_; }
  void progress(const std::string& line);
  // Rank 0: one line of metrics.jsonl and, with tensorboard, every numeric
  // field but "step" as a scalar: `val_X` as `val/X`, any other X as `train/X`.
  void metrics(const nlohmann::json& record);
  // Any rank: this rank's own scalars, as `rank<r>/<name>` in
  // RUN_DIR/tb/rank<r>/ (nothing without tensorboard).
  void rank_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values);
  // Rank 0: a text (a generated sample) in its log and, with tensorboard, as `tag`.
  void text(int64_t step, const std::string& tag, const std::string& text);
  void restart(const nlohmann::json& record);  // rank 0: one line of RUN_DIR/lr_history.jsonl per warm restart
  const std::string& dir() const { return dir_; }

 private:
  void tensorboard_warning(const std::string& line);  // the first one only

  std::string dir_;
  int rank_;
  bool quiet_;
  bool tb_warned_ = false;
  bool progress_on_ = false, progress_shown_ = false;
  std::ofstream log_, metrics_, restarts_;
  std::unique_ptr<EventWriter> tb_run_;   // rank 0: RUN_DIR/tb/events.out.tfevents.*
  std::unique_ptr<EventWriter> tb_rank_;  // RUN_DIR/tb/rank<r>/events.out.tfevents.*
};

}  // namespace xx

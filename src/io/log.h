// Where a run reports: rank 0's console, every rank's RUN_DIR/rank<r>/log.txt,
// and rank 0's RUN_DIR/metrics.jsonl (one JSON object per logged step).
#pragma once
#include <fstream>
#include <string>
#include <nlohmann/json.hpp>

namespace xx {

class RunLog {
 public:
  // A fresh run starts new files; a resumed run appends to them.
  RunLog(const std::string& run_dir, int rank, bool append, bool quiet = false);

  void rank(const std::string& line);     // this rank's log only
  void console(const std::string& line);  // rank 0: stdout and its log
  void metrics(const nlohmann::json& record);
  void restart(const nlohmann::json& record);  // rank 0: one line of RUN_DIR/lr_history.jsonl per warm restart
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  int rank_;
  bool quiet_;
  std::ofstream log_, metrics_, restarts_;
};

}  // namespace xx

// The watchdog: one thread per rank that watches the flight recorder and
// ends a job that stopped moving (docs/RESILIENCE.md).
//
// Every `poll` seconds it checks two things:
// 1. a collective in flight for longer than `timeout` seconds: this rank
//    waits for another one;
// 2. once the rank has made a collective, no collective started or finished
//    for longer than `timeout`: this rank itself is stuck outside MPI (a
//    hang in compute), and says so.
// On firing it writes RUN_DIR/rank<r>/flight.json, prints one line naming
// the rank and the call to stderr and the rank log, waits `grace` seconds so
// that the other ranks' watchdogs dump too, and aborts the job (exit 3).
#pragma once
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace xx {

struct WatchdogOptions {
  double poll = 0.5;   // seconds between checks
  double grace = 5.0;  // seconds between the dump and the abort
  // What firing does after the dump and the grace, given the line it printed.
  // Empty: PMPI_Abort(MPI_COMM_WORLD, 3). Tests catch it instead.
  std::function<void(const std::string& line)> fire;
};

class Watchdog {
 public:
  // Makes RUN_DIR/rank<r>/ the place for this process's flight.json (also
  // for MPI errors and exceptions). `timeout` <= 0: no thread.
  Watchdog(const std::string& run_dir, int rank, double timeout, WatchdogOptions options = {});
  ~Watchdog();  // stops the thread
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  bool fired() const;

 private:
  void watch();
  void fire(const std::string& what);

  int rank_;
  double timeout_;
  WatchdogOptions options_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false, fired_ = false;
  std::thread thread_;  // last: starts once the members above exist
};

}  // namespace xx

#include "resilience/watchdog.h"
#include <mpi.h>
#include <chrono>
#include <fmt/format.h>
#include "resilience/flight_recorder.h"

namespace xx {

Watchdog::Watchdog(const std::string& run_dir, int rank, double timeout, WatchdogOptions options)
    : rank_(rank), timeout_(timeout), options_(std::move(options)) {
  flight::set_run_dir(run_dir, rank);
  if (timeout_ > 0) thread_ = std::thread([this] { watch(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool Watchdog::fired() const {
  std::lock_guard lock(mutex_);
  return fired_;
}

void Watchdog::watch() {
  const auto poll = std::chrono::duration<double>(options_.poll);
  std::unique_lock lock(mutex_);
  while (!wake_.wait_for(lock, poll, [this] { return stop_; })) {
    const auto s = flight::recorder().status();
    const double t = flight::now();
    std::string what;
    if (s.in_flight && t - s.oldest.start > timeout_) {
      what = fmt::format("watchdog: {} #{} on {} not finished after {:.1f} s", s.oldest.op, s.oldest.seq, s.comm,
                         t - s.oldest.start);
    } else if (!s.in_flight && s.calls > 0 && t - s.last_activity > timeout_) {
      // Nothing in flight and nothing new: the rank is stuck in its own code.
      const flight::Entry last = flight::recorder().entry(s.calls);
      what = fmt::format("watchdog: no collective started or finished for {:.1f} s since {} #{} on {} ended: "
                         "this rank is stuck outside MPI",
                         t - s.last_activity, last.id ? last.op : "the last call", last.seq,
                         flight::recorder().comm_label(last.comm));
    }
    if (!what.empty()) {
      fired_ = true;
      lock.unlock();
      fire(what);
      return;
    }
  }
}

void Watchdog::fire(const std::string& what) {
  const std::string path = flight::dump(what);
  const std::string line = fmt::format("xuanxue: rank {}: {} (flight recorder: {})", rank_, what,
                                       path.empty() ? "not written" : path);
  flight::report(line);
  // The other ranks' watchdogs fire soon after this one (they wait on this
  // rank's call, or it on theirs): let them dump before the abort ends them.
  {
    std::unique_lock lock(mutex_);
    wake_.wait_for(lock, std::chrono::duration<double>(options_.grace), [this] { return stop_; });
  }
  if (options_.fire) return options_.fire(line);
  PMPI_Abort(MPI_COMM_WORLD, 3);
}

}  // namespace xx
